//! Paged listings of the jobs in processing (with their lease), waiting in
//! main and waiting in the delayed set, each read by one script
//! (`processing.lua`, `waiting.lua`, `delayed.lua`). Dead letters are in `dead.rs`.

use serde::Serialize;

use super::{admin_script, parse_ms, Admin, Result, READ_ONLY};
use crate::error::QueueError;
use crate::job::JobId;
use crate::keys::QueueKeys;

admin_script!(PROCESSING, "processing.lua", READ_ONLY);
admin_script!(WAITING, "waiting.lua", READ_ONLY);
admin_script!(DELAYED, "delayed.lua", READ_ONLY);

/// Which part of a list to read: skip `offset` entries, return at most `limit`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Page {
    /// Entries to skip, in the listing's order.
    pub offset: u64,
    /// Entries to return at most.
    pub limit: u64,
}

impl Page {
    /// The first `limit` entries.
    pub fn first(limit: u64) -> Self {
        Page { offset: 0, limit }
    }

    /// `limit` entries after skipping `offset`.
    pub fn new(offset: u64, limit: u64) -> Self {
        Page { offset, limit }
    }

    /// Offset and limit as script arguments: Lua numbers are doubles, so both
    /// are capped far above any real list length.
    fn script_args(self) -> (u64, u64) {
        const CAP: u64 = 1 << 40;
        (self.offset.min(CAP), self.limit.min(CAP))
    }
}

/// One page of a listing.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Listing<T> {
    /// Redis clock when the page was read.
    pub now_ms: i64,
    /// Length of the whole list or set.
    pub total: u64,
    /// The page's jobs, in the listing's order.
    pub jobs: Vec<T>,
}

/// Where a processing entry's lease stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum LeaseStatus {
    /// The lease runs: the worker is alive (its heartbeat extends it).
    Running,
    /// The lease expired: the worker died or stalled; the job is lost until
    /// the watchdog returns it.
    Expired,
    /// Taken from main but never claimed (the worker died between BLMOVE and
    /// claim, or is about to claim); the watchdog gives it a provisional lease.
    Unleased,
}

impl LeaseStatus {
    /// The status of a lease expiring at `lease_until` (none: unleased) at `now`.
    pub fn at(lease_until: Option<i64>, now: i64) -> Self {
        match lease_until {
            Some(t) if t > now => LeaseStatus::Running,
            Some(_) => LeaseStatus::Expired,
            None => LeaseStatus::Unleased,
        }
    }
}

/// One job in processing.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ProcessingJob {
    /// Job id.
    pub id: JobId,
    /// The hash's `state` (`active` once claimed); none when the hash is missing.
    pub state: Option<String>,
    /// Job type.
    pub job_type: Option<String>,
    /// Deliveries so far.
    pub attempts: Option<u32>,
    /// Deliveries allowed.
    pub max_attempts: Option<u32>,
    /// When the current delivery was claimed (Redis clock, ms).
    pub delivered_at: Option<i64>,
    /// When its lease expires (none: no lease).
    pub lease_until: Option<i64>,
    /// Lease time left in ms (negative: expired that long ago).
    pub lease_left_ms: Option<i64>,
    /// Running, expired (lost) or unleased.
    pub status: LeaseStatus,
    /// Why the entry's job key cannot be read (corrupt data: a key of
    /// another type), with the job's fields `None`: one such key is listed,
    /// not a failed page.
    pub unreadable: Option<String>,
}

/// A job waiting in main or in the delayed set.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct WaitingJob {
    /// Job id.
    pub id: JobId,
    /// `enqueued_at` (main) or the run time (delayed), Redis clock ms.
    pub at: Option<i64>,
    /// Job type.
    pub job_type: Option<String>,
    /// Deliveries so far.
    pub attempts: Option<u32>,
    /// The error of the latest failed delivery.
    pub last_error: Option<String>,
    /// Why the entry's job key cannot be read (corrupt data: a key of
    /// another type), with the job's fields `None`: one such key is listed,
    /// not a failed page.
    pub unreadable: Option<String>,
}

/// A script row, each field as bytes: a job's type or error need not be
/// UTF-8 (a producer in another language, a job the worker is about to
/// dead-letter as unreadable), and one such row must not fail the page.
type Row = Vec<Vec<u8>>;

/// Field `i` of a script row as text (bytes that are not UTF-8 shown as
/// U+FFFD); `""` (missing) is none.
fn text(row: &Row, i: usize) -> Option<String> {
    let b = row.get(i).filter(|b| !b.is_empty())?;
    Some(String::from_utf8_lossy(b).into_owned())
}

/// Field `i` as strict UTF-8 (numbers: anything else is none).
fn utf8(row: &Row, i: usize) -> Option<&str> {
    std::str::from_utf8(row.get(i)?).ok()
}

fn number<T: std::str::FromStr>(row: &Row, i: usize) -> Option<T> {
    utf8(row, i)?.trim().parse().ok()
}

fn ms(row: &Row, i: usize) -> Option<i64> {
    parse_ms(utf8(row, i)?)
}

/// The row's id (field 0), in its lossy form when it is not UTF-8.
fn id(row: &Row) -> JobId {
    JobId::from(text(row, 0).unwrap_or_default())
}

impl Admin {
    /// The processing list, oldest delivery first: `page` of it, with each
    /// entry's lease (one script: the leases and `now_ms` agree).
    pub async fn processing(&self, queue: &str, page: Page) -> Result<Listing<ProcessingJob>> {
        let k = QueueKeys::new(queue);
        let keys = [&k.processing, &k.leases, &k.guard];
        self.page(queue, &PROCESSING, &keys, page, |r, now| {
            let lease_until = ms(r, 1);
            ProcessingJob {
                id: id(r),
                state: text(r, 2),
                job_type: text(r, 3),
                attempts: number(r, 4),
                max_attempts: number(r, 5),
                delivered_at: ms(r, 6),
                lease_until,
                lease_left_ms: lease_until.map(|t| t - now),
                status: LeaseStatus::at(lease_until, now),
                unreadable: text(r, 7),
            }
        })
        .await
    }

    /// The main list, next to run first: `page` of it.
    pub async fn waiting(&self, queue: &str, page: Page) -> Result<Listing<WaitingJob>> {
        let k = QueueKeys::new(queue);
        self.page(queue, &WAITING, &[&k.main, &k.guard], page, waiting_job)
            .await
    }

    /// The delayed set (retries and scheduled jobs), soonest first: `page` of it.
    pub async fn delayed(&self, queue: &str, page: Page) -> Result<Listing<WaitingJob>> {
        let k = QueueKeys::new(queue);
        self.page(queue, &DELAYED, &[&k.delayed, &k.guard], page, waiting_job)
            .await
    }

    /// Runs a listing script (KEYS `keys`, ARGV job prefix, offset, limit;
    /// reply `{now_ms, total, rows}`) and turns each row into a `T`.
    async fn page<T>(
        &self,
        queue: &str,
        script: &redis::Script,
        keys: &[&String],
        page: Page,
        row: impl Fn(&Row, i64) -> T,
    ) -> Result<Listing<T>> {
        let (offset, limit) = page.script_args();
        let mut call = script.prepare_invoke();
        for key in keys {
            call.key(key.as_str());
        }
        let (now, total, rows): (i64, u64, Vec<Row>) = call
            .arg(QueueKeys::new(queue).job_prefix)
            .arg(offset)
            .arg(limit)
            .invoke_async(&mut self.queue.connection())
            .await
            .map_err(|e| QueueError::redis(queue, None, e))?;
        Ok(Listing {
            now_ms: now,
            total,
            jobs: rows.iter().map(|r| row(r, now)).collect(),
        })
    }
}

fn waiting_job(r: &Row, _now: i64) -> WaitingJob {
    WaitingJob {
        id: id(r),
        at: ms(r, 1),
        job_type: text(r, 2),
        attempts: number(r, 3),
        last_error: text(r, 4),
        unreadable: text(r, 5),
    }
}
