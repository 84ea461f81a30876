//! [`QueueStats`]: a queue's lengths, lifetime counters and throughput, read
//! by one script (`scripts/stats.lua`), and the gauges published from them.

use std::collections::BTreeMap;

use serde::Serialize;

use super::Admin;
use crate::error::Result;
use crate::keys::QueueKeys;
use crate::queue::Queue;
use crate::scripts::stats::{Stats, StatsReply};

/// Lengths and lifetime counters of one queue.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct QueueStats {
    /// Queue name.
    pub queue: String,
    /// Jobs waiting in main.
    pub main: u64,
    /// Jobs taken by workers (running, or waiting for the watchdog).
    pub processing: u64,
    /// Retries and delayed jobs.
    pub delayed: u64,
    /// Dead-lettered jobs.
    pub dead: u64,
    /// Lifetime counters: enqueued, completed, failed, retried, dead,
    /// reclaimed, adopted, skipped_done, replayed, purged.
    pub counters: BTreeMap<String, i64>,
    /// How long the oldest job waiting in main has waited (Redis clock), if
    /// any waits: since it became ready to run, its `ready_at` (a job that
    /// was delayed, scheduled or retried counts from its due time, a
    /// replayed or repaired one from then), else since its enqueue.
    pub oldest_waiting_ms: Option<u64>,
    /// Completions in the last 60 s (from per-minute counters; the previous
    /// minute is weighted by how much of it falls in the window, rounded up).
    pub completed_last_minute: u64,
    /// Redis time (ms) since which the queue is paused; `None`: not paused
    /// ([`Queue::pause`]).
    pub paused_since_ms: Option<i64>,
    /// Jobs waiting in the groups' lists (enqueued with
    /// [`EnqueueOptions::group`](crate::EnqueueOptions::group),
    /// docs/GROUPS.md) of the ring's groups and the paused ones; not counted
    /// in `main`. A group with jobs that is neither in the ring nor paused is
    /// not counted (finding it needs a `SCAN`): `check` reports it. At most
    /// [`STATS_GROUP_LIMIT`] groups are read ([`grouped_partial`](Self::grouped_partial)).
    pub grouped: u64,
    /// Group keys holding another type (corrupt data), each with a warning
    /// in the Redis log: a group's list (not a list; its jobs are left out of
    /// `grouped`, fetches skip the group), the ring `q:{Q}:groups` (not a
    /// list; its groups are not read, fetches serve main only) and the pause
    /// hash `q:{Q}:gpaused` (not a hash; the paused groups are not read,
    /// fetches read it as no group paused). `check` names each.
    pub grouped_unreadable: u64,
    /// More groups than the stats read ([`STATS_GROUP_LIMIT`], or the limit
    /// given to [`Queue::stats_with_group_limit`]): `grouped` counts the
    /// jobs of those read only, a lower bound.
    pub grouped_partial: bool,
}

/// The most group lists [`Queue::stats`] reads: each costs Redis one `LLEN`
/// inside the stats script (about 1.7 µs a group, docs/GROUPS.md), so the
/// script stays a few milliseconds however many groups a queue has.
pub const STATS_GROUP_LIMIT: u64 = 10_000;

impl QueueStats {
    /// A lifetime counter, 0 when never incremented.
    pub fn counter(&self, name: &str) -> i64 {
        self.counters.get(name).copied().unwrap_or(0)
    }

    /// Sets the queue's gauges (`queue_depth` per list,
    /// `queue_oldest_job_age_seconds`, `queue_completed_last_minute`) on the
    /// installed `metrics` recorder. A no-op without a recorder.
    pub fn publish_gauges(&self) {
        crate::metrics::depth(self);
    }
}

impl Queue {
    /// Lengths and counters of `queue`, read by one script (a consistent snapshot).
    ///
    /// ```
    /// # #[tokio::main] async fn main() -> Result<(), queue_core::QueueError> {
    /// # let server = queue_testkit::RedisServer::start().unwrap();
    /// let queue = queue_core::Queue::connect(&server.url()).await?;
    /// let stats = queue.stats("emails").await?;
    /// assert_eq!(stats.main, 0);
    /// assert_eq!(stats.counter("completed"), 0);
    /// # Ok(()) }
    /// ```
    pub async fn stats(&self, queue: &str) -> Result<QueueStats> {
        self.stats_with_group_limit(queue, STATS_GROUP_LIMIT).await
    }

    /// [`stats`](Self::stats), reading at most `max_groups` group lists for
    /// `grouped` (`grouped_partial` when there are more). `0` reads none, so
    /// the snapshot costs the same whatever the number of groups: what a
    /// sampler that exports no group figure asks every interval.
    pub async fn stats_with_group_limit(&self, queue: &str, max_groups: u64) -> Result<QueueStats> {
        let k = QueueKeys::new(queue);
        let StatsReply {
            main,
            processing,
            delayed,
            dead,
            counters,
            now_ms: now,
            oldest_ready_ms: oldest,
            completed_this_minute: cur,
            completed_previous_minute: prev,
            paused_since_ms: paused,
            grouped,
            grouped_unreadable,
            grouped_partial,
        } = Stats {
            keys: &k,
            group_limit: max_groups,
        }
        .run(&mut self.connection())
        .await?;
        let into_minute = (now.rem_euclid(60_000)) as f64 / 60_000.0;
        Ok(QueueStats {
            queue: queue.to_string(),
            main,
            processing,
            delayed,
            dead,
            counters,
            oldest_waiting_ms: (oldest > 0 && main > 0).then(|| (now - oldest).max(0) as u64),
            completed_last_minute: cur + (prev as f64 * (1.0 - into_minute)).ceil() as u64,
            paused_since_ms: (paused > 0).then_some(paused),
            grouped,
            grouped_unreadable,
            grouped_partial,
        })
    }
}

impl Admin {
    /// Lengths and counters of `queue`: [`Queue::stats`].
    pub async fn stats(&self, queue: &str) -> super::Result<QueueStats> {
        Ok(self.queue.stats(queue).await?)
    }
}
