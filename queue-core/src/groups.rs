//! Fair queuing between groups (tenants), docs/GROUPS.md: the job field that
//! names a job's group, per-group pause and resume ([`Queue::pause_group`],
//! [`Queue::resume_group`], script `scripts/group_pause.lua`) and the listing
//! of a queue's groups ([`Queue::groups`]). The routing itself lives in the
//! prelude's `-- ==== groups ====` functions, called by enqueue, fetch,
//! promote, replay, cancel and the checker's repair.

use std::collections::{HashMap, HashSet};

use redis::Value;
use serde::Serialize;

use crate::error::{QueueError, Result};
use crate::flow::PauseChange;
use crate::keys::QueueKeys;
use crate::queue::Queue;
use crate::scripts::group_pause::GroupPause;
use crate::scripts::reply;

/// The job-hash field holding a job's group (set by
/// [`EnqueueOptions::group`](crate::EnqueueOptions::group)).
pub(crate) const GROUP_FIELD: &str = "group";

/// One group of a queue, as [`Queue::groups`] lists it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct GroupInfo {
    /// Group name.
    pub group: String,
    /// Jobs waiting in the group's list.
    pub waiting: u64,
    /// Redis time (ms) of the group's pause; `None` when it is not paused.
    /// A stored time that is not an integer (corrupt data) reads as its
    /// integer part, or 0 when it is not a number.
    pub paused_since_ms: Option<i64>,
    /// The group's list key holds another type (corrupt data): `waiting` is
    /// 0, fetches skip the group, `check` reports it (`corrupt_group_list`).
    /// Added with the corrupt-key hardening; always serialized.
    pub unreadable: bool,
}

/// The most groups [`Queue::groups`] lists (one `LLEN` each): as many as
/// `stats` reads ([`STATS_GROUP_LIMIT`](crate::admin::STATS_GROUP_LIMIT)).
pub const GROUP_LIST_LIMIT: u64 = crate::admin::STATS_GROUP_LIMIT;

/// What [`Queue::groups_with_limit`] lists, and what it left out.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct GroupListing {
    /// The groups listed: the ring's, then the paused ones out of the ring.
    pub groups: Vec<GroupInfo>,
    /// More groups than the limit: those listed are the first ones.
    pub partial: bool,
    /// The group ring `q:{Q}:groups` holds another type (corrupt data): its
    /// groups are not listed (fetches serve main only).
    pub ring_unreadable: bool,
    /// The group pause hash `q:{Q}:gpaused` holds another type (corrupt
    /// data): no group is shown paused, paused groups out of the ring are
    /// not listed (fetches read it as no group paused).
    pub paused_unreadable: bool,
}

impl Queue {
    /// Pauses group `group` of `queue`: no worker starts a job of that group
    /// until [`resume_group`](Self::resume_group); the other groups and the
    /// jobs without a group keep running, enqueues of the group are accepted
    /// and wait. A paused group with nothing waiting is still listed by
    /// [`groups`](Self::groups).
    ///
    /// ```
    /// # #[tokio::main] async fn main() -> Result<(), queue_core::QueueError> {
    /// # let server = queue_testkit::RedisServer::start().unwrap();
    /// use queue_core::{EnqueueOptions, Queue};
    /// let queue = Queue::connect(&server.url()).await?;
    /// let opts = EnqueueOptions::new().group("tenant-a");
    /// queue.enqueue_raw("emails", "send", 1, 3, opts, b"\x80").await?;
    /// let paused = queue.pause_group("emails", "tenant-a").await?;
    /// assert!(!paused.was_paused);
    /// let groups = queue.groups("emails").await?;
    /// assert_eq!((groups[0].group.as_str(), groups[0].waiting), ("tenant-a", 1));
    /// assert_eq!(groups[0].paused_since_ms, paused.paused_since_ms);
    /// assert!(queue.resume_group("emails", "tenant-a").await?.was_paused);
    /// # Ok(()) }
    /// ```
    pub async fn pause_group(&self, queue: &str, group: &str) -> Result<PauseChange> {
        self.group_pause(queue, group, true).await
    }

    /// Resumes group `group` of `queue`: puts it back in the ring while its
    /// list has jobs. A group that was not paused answers `was_paused: false`
    /// and is only put back in the ring if its jobs wait outside it (an older
    /// version's resume during a rolling deploy leaves that: docs/GROUPS.md).
    pub async fn resume_group(&self, queue: &str, group: &str) -> Result<PauseChange> {
        self.group_pause(queue, group, false).await
    }

    async fn group_pause(&self, queue: &str, group: &str, pause: bool) -> Result<PauseChange> {
        let keys = QueueKeys::new(queue);
        let change = GroupPause {
            keys: &keys,
            group,
            pause,
        }
        .run(&mut self.connection())
        .await?;
        tracing::info!(
            queue,
            group,
            pause,
            was_paused = change.was_paused,
            "group pause"
        );
        Ok(change)
    }

    /// The groups of `queue` that have waiting jobs or are paused: the ring's
    /// groups in the order workers serve them next, then the paused groups
    /// out of the ring (a fetch takes a paused group out, with or without
    /// jobs). Two or three pipelined reads, not one snapshot: a listing for
    /// operators. At most [`GROUP_LIST_LIMIT`] groups, read with one `LLEN`
    /// each; with more, the first ones (a warning is logged; see
    /// [`groups_with_limit`](Self::groups_with_limit) for a listing that says
    /// so). A group whose list key holds another type (corrupt data) is
    /// listed with [`GroupInfo::unreadable`]; a group ring or pause hash of
    /// another type leaves its groups out (logged) instead of failing the
    /// listing.
    ///
    /// A group with jobs that is neither in the ring nor paused (left by an
    /// older version's resume) is not listed, nor counted by `stats().grouped`:
    /// finding it takes a `SCAN` of the group lists, too costly here.
    /// [`Admin::check`](crate::admin::Admin::check) reports it
    /// (`group_out_of_ring`) and its repair puts it back in the ring.
    pub async fn groups(&self, queue: &str) -> Result<Vec<GroupInfo>> {
        let listing = self.groups_with_limit(queue, GROUP_LIST_LIMIT).await?;
        if listing.partial {
            tracing::warn!(
                queue,
                listed = listing.groups.len(),
                limit = GROUP_LIST_LIMIT,
                "groups: more groups than the listing reads; the first ones listed"
            );
        }
        Ok(listing.groups)
    }

    /// [`groups`](Self::groups), listing at most `max_groups` groups (one
    /// `LLEN` each), and saying what was left out: more groups than that
    /// ([`GroupListing::partial`]; a paused-groups hash larger than
    /// `max_groups` is then not read whole: only the pause times of the
    /// ring's groups listed are), or a ring or pause hash of another type.
    pub async fn groups_with_limit(&self, queue: &str, max_groups: u64) -> Result<GroupListing> {
        let keys = QueueKeys::new(queue);
        let mut conn = self.connection();
        let limit = usize::try_from(max_groups).unwrap_or(usize::MAX);
        let redis_err = |e| QueueError::redis(queue, None, e);
        let (ring_key, paused_key) = (keys.groups(), keys.groups_paused());
        // 1: the ring's head (main's turn "" and up to `limit` groups), its
        // length, the pause hash's size. Each reply alone (ignore_errors):
        // a key of another type answers an error for its own command only.
        let head = isize::try_from(max_groups).unwrap_or(isize::MAX);
        let mut pipe = redis::pipe();
        pipe.ignore_errors()
            .lrange(&ring_key, 0, head)
            .llen(&ring_key)
            .hlen(&paused_key);
        let first: Vec<Value> = pipe.query_async(&mut conn).await.map_err(redis_err)?;
        let [ring, ring_len, paused_len] = <[Value; 3]>::try_from(first).map_err(|r| {
            QueueError::protocol(queue, None, format!("groups: {} replies for 3", r.len()))
        })?;
        let mut listing = GroupListing::default();
        let mut names: Vec<String> = Vec::new();
        let mut seen: HashSet<String> = HashSet::new();
        match reply::array(&ring) {
            Some(entries) => {
                let mut cut = false;
                for g in entries.iter().map(name).filter(|g| !g.is_empty()) {
                    if names.len() >= limit {
                        cut = true;
                        break;
                    }
                    if seen.insert(g.clone()) {
                        names.push(g);
                    }
                }
                // Left out: groups past the limit, or a ring longer than the
                // head read. Not a group listed twice (a group may have two
                // entries for a while: docs/GROUPS.md), which made a ring
                // of two groups read as "more groups than listed".
                let ring_len = reply::int(&ring_len).unwrap_or(0).max(0) as u64;
                if cut || ring_len > entries.len() as u64 {
                    listing.partial = true;
                }
            }
            None => listing.ring_unreadable = true,
        }
        let paused_count = match reply::int(&paused_len) {
            Some(n) => n.max(0) as u64,
            None => {
                listing.paused_unreadable = true;
                0
            }
        };
        // 2: the pause times (the whole hash while it is within the limit,
        // else only those of the ring's groups listed) and the lengths of
        // the ring's groups listed.
        let read_all_paused = !listing.paused_unreadable && paused_count <= max_groups;
        if !listing.paused_unreadable && !read_all_paused {
            listing.partial = true;
        }
        let mut pipe = redis::pipe();
        pipe.ignore_errors();
        let asked_pauses = if read_all_paused {
            pipe.hgetall(&paused_key);
            true
        } else if !listing.paused_unreadable && !names.is_empty() {
            pipe.cmd("HMGET").arg(&paused_key).arg(&names);
            true
        } else {
            false
        };
        for g in &names {
            pipe.llen(keys.group(g));
        }
        let mut second: Vec<Value> = if asked_pauses || !names.is_empty() {
            pipe.query_async(&mut conn).await.map_err(redis_err)?
        } else {
            Vec::new()
        };
        let pauses = if asked_pauses && !second.is_empty() {
            Some(second.remove(0))
        } else {
            None
        };
        let mut paused: HashMap<String, i64> = HashMap::new();
        match pauses {
            Some(Value::ServerError(_)) => listing.paused_unreadable = true,
            Some(v) if read_all_paused => paused.extend(pairs(v)),
            Some(v) => {
                for (g, since) in names.iter().zip(reply::into_array(v).unwrap_or_default()) {
                    if !matches!(since, Value::Nil) {
                        paused.insert(g.clone(), pause_time(&since));
                    }
                }
            }
            None => {}
        }
        let mut lens = second;
        // 3: the paused groups out of the ring, within what the limit leaves.
        let mut out_of_ring: Vec<String> = paused
            .keys()
            .filter(|g| !seen.contains(*g))
            .cloned()
            .collect();
        out_of_ring.sort();
        let room = limit.saturating_sub(names.len());
        if out_of_ring.len() > room {
            listing.partial = true;
            out_of_ring.truncate(room);
        }
        if !out_of_ring.is_empty() {
            let mut pipe = redis::pipe();
            pipe.ignore_errors();
            for g in &out_of_ring {
                pipe.llen(keys.group(g));
            }
            let more: Vec<Value> = pipe.query_async(&mut conn).await.map_err(redis_err)?;
            lens.extend(more);
            names.extend(out_of_ring);
        }
        if lens.len() != names.len() {
            return Err(QueueError::protocol(
                queue,
                None,
                format!("groups: {} lengths for {} groups", lens.len(), names.len()),
            ));
        }
        listing.groups = names
            .into_iter()
            .zip(lens)
            .map(|(group, len)| {
                let waiting = reply::int(&len);
                if waiting.is_none() {
                    tracing::warn!(
                        queue,
                        group,
                        key = keys.group(&group),
                        "groups: a group's list holds another type (corrupt data)"
                    );
                }
                GroupInfo {
                    paused_since_ms: paused.get(&group).copied(),
                    waiting: waiting.unwrap_or(0).max(0) as u64,
                    unreadable: waiting.is_none(),
                    group,
                }
            })
            .collect();
        if listing.ring_unreadable {
            tracing::warn!(queue, key = ring_key, "groups: the group ring holds another type (corrupt data): its groups are not listed");
        }
        if listing.paused_unreadable {
            tracing::warn!(queue, key = paused_key, "groups: the group pause hash holds another type (corrupt data): no group is shown paused");
        }
        Ok(listing)
    }
}

/// A group name as Redis sent it (bytes that are not UTF-8 replaced).
fn name(v: &Value) -> String {
    reply::bytes(v)
        .map(|b| String::from_utf8_lossy(&b).into_owned())
        .or_else(|| reply::text(v))
        .unwrap_or_default()
}

/// A stored pause time, leniently: an integer, or a number's integer part;
/// anything else (corrupt data) reads 0 (the group is still paused).
fn pause_time(v: &Value) -> i64 {
    if let Some(n) = reply::int(v) {
        return n;
    }
    reply::text(v)
        .and_then(|t| t.trim().parse::<f64>().ok())
        .filter(|f| f.is_finite())
        .map_or(0, |f| f as i64)
}

/// The field/value pairs of an `HGETALL` reply (flat array in RESP2, a map
/// in RESP3), values read by [`pause_time`].
fn pairs(v: Value) -> Vec<(String, i64)> {
    match v {
        Value::Map(m) => m.iter().map(|(k, v)| (name(k), pause_time(v))).collect(),
        other => reply::into_array(other)
            .unwrap_or_default()
            .chunks(2)
            .filter(|p| p.len() == 2)
            .map(|p| (name(&p[0]), pause_time(&p[1])))
            .collect(),
    }
}
