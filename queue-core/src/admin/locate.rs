//! [`Location`]: where one job id is now (`locate.lua`, one snapshot). The
//! job hash's `state` names the one list searched (none for a job without a
//! hash); main is searched from its tail, dead from its head and processing
//! from the end a job of its state is nearest, at most [`LOCATE_SEARCH`]
//! entries each, so a lookup never scans a whole long list.

use serde::Serialize;

use super::{admin_script, parse_ms, Admin, LeaseStatus, Result, READ_ONLY};
use crate::error::QueueError;
use crate::job::JobId;
use crate::keys::QueueKeys;

admin_script!(LOCATE, "locate.lua", READ_ONLY);

/// Entries of main (from its tail, where the next job to run is), of the
/// dead-letter list (from its head, the newest) or of processing (from its
/// head for a job not claimed yet, else from its tail, the oldest
/// deliveries) one lookup searches at most. A job further in is reported as
/// [`Location::Main`] / [`Location::Dead`] with `at_least` set (its `ahead`
/// / `position` is this bound), or, for an `active` job, as
/// [`Location::Processing`] with `unconfirmed` set (a `queued` one not seen
/// in processing is looked for in main, or is [`Location::Nowhere`]).
pub const LOCATE_SEARCH: u64 = 100_000;

fn is_false(b: &bool) -> bool {
    !*b
}

/// Where a job is.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
#[serde(tag = "list", rename_all = "snake_case")]
pub enum Location {
    /// Waiting in main; `ahead` jobs run before it.
    Main {
        /// Jobs that run before it (with `at_least`: at least that many).
        ahead: u64,
        /// Not among the [`LOCATE_SEARCH`] entries searched from main's
        /// tail: at least `ahead` jobs run before it (or, in a long main, a
        /// queued job lost from it: `check` finds that). Left out of JSON
        /// when false.
        #[serde(default, skip_serializing_if = "is_false")]
        at_least: bool,
    },
    /// Taken by a worker.
    Processing {
        /// When the lease expires (none: not claimed yet).
        lease_until: Option<i64>,
        /// Lease time left (negative: expired that long ago).
        lease_left_ms: Option<i64>,
        /// Running, expired (lost) or unleased.
        status: LeaseStatus,
        /// Not among the [`LOCATE_SEARCH`] entries searched of a longer
        /// processing list: its hash's state says it is taken (`active`,
        /// or no readable state) and the lease fields say how, but its
        /// entry was not seen (it may also have been lost from the list:
        /// `check` finds that). Never set for a `queued` job: one not seen
        /// there is looked for in main, or is [`Location::Nowhere`] (a
        /// grouped job waiting in its group's list). Left out of JSON when
        /// false.
        #[serde(default, skip_serializing_if = "is_false")]
        unconfirmed: bool,
    },
    /// In the delayed set until `run_at`.
    Delayed {
        /// When it is due (Redis clock, ms).
        run_at: i64,
    },
    /// Dead-lettered; `position` 0 is the newest.
    Dead {
        /// Index in the dead-letter list (with `at_least`: at least that).
        position: u64,
        /// Not among the [`LOCATE_SEARCH`] newest entries searched: its
        /// position is at least `position`. Left out of JSON when false.
        #[serde(default, skip_serializing_if = "is_false")]
        at_least: bool,
    },
    /// Completed (only the completion record is left).
    Completed,
    /// Not in the list its hash's `state` names (e.g. a hash whose id was
    /// lost from the lists, or a grouped job waiting in its group's list).
    Nowhere,
}

/// The raw reply of `locate.lua` (an index: -1 absent or not searched,
/// -2 beyond the [`LOCATE_SEARCH`] entries searched).
struct Found {
    now: i64,
    in_main: i64,
    main_len: u64,
    in_processing: i64,
    delayed_at: Option<i64>,
    in_dead: i64,
    lease_until: Option<i64>,
    has_hash: bool,
    has_completion: bool,
}

impl Found {
    fn location(&self) -> Option<Location> {
        let listed = self.in_main != -1 || self.in_processing != -1 || self.in_dead != -1;
        if !self.has_hash && !self.has_completion && !listed {
            return None;
        }
        let processing = |unconfirmed| Location::Processing {
            lease_until: self.lease_until,
            lease_left_ms: self.lease_until.map(|t| t - self.now),
            status: LeaseStatus::at(self.lease_until, self.now),
            unconfirmed,
        };
        Some(if self.in_processing >= 0 {
            processing(false)
        } else if self.in_main >= 0 {
            Location::Main {
                ahead: self.main_len.saturating_sub(self.in_main as u64 + 1),
                at_least: false,
            }
        } else if self.in_main == -2 {
            Location::Main {
                ahead: LOCATE_SEARCH,
                at_least: true,
            }
        } else if self.in_processing == -2 {
            processing(true)
        } else if let Some(run_at) = self.delayed_at {
            Location::Delayed { run_at }
        } else if self.in_dead >= 0 {
            Location::Dead {
                position: self.in_dead as u64,
                at_least: false,
            }
        } else if self.in_dead == -2 {
            Location::Dead {
                position: LOCATE_SEARCH,
                at_least: true,
            }
        } else if !self.has_hash && self.has_completion {
            Location::Completed
        } else {
            Location::Nowhere
        })
    }
}

impl Admin {
    /// Where job `id` of `queue` is now, or `None` when Redis knows nothing
    /// about it (never enqueued, purged, or completed longer ago than the
    /// retention; also an id left in a list without its hash: `check`
    /// reports that). Only the list its hash's `state` names is searched,
    /// at most [`LOCATE_SEARCH`] entries of it.
    pub async fn locate(&self, queue: &str, id: impl Into<JobId>) -> Result<Option<Location>> {
        Ok(self.locate_at(queue, &id.into()).await?.1)
    }

    /// [`Admin::locate`] with the Redis clock of the snapshot.
    pub(super) async fn locate_at(
        &self,
        queue: &str,
        id: &JobId,
    ) -> Result<(i64, Option<Location>)> {
        let k = QueueKeys::new(queue);
        type Reply = (i64, i64, u64, i64, String, i64, String, i64, i64);
        let (now, in_main, main_len, in_processing, delayed, in_dead, lease, hash, done): Reply =
            LOCATE
                .key(&k.main)
                .key(&k.processing)
                .key(&k.delayed)
                .key(&k.dead)
                .key(&k.leases)
                .key(k.job(id.as_str()))
                .key(k.done(id.as_str()))
                .arg(id.as_str())
                .arg(LOCATE_SEARCH)
                .invoke_async(&mut self.queue.connection())
                .await
                .map_err(|e| QueueError::redis(queue, Some(id), e))?;
        let found = Found {
            now,
            in_main,
            main_len,
            in_processing,
            delayed_at: parse_ms(&delayed),
            in_dead,
            lease_until: parse_ms(&lease),
            has_hash: hash == 1,
            has_completion: done == 1,
        };
        Ok((now, found.location()))
    }
}
