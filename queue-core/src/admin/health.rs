//! [`QueueHealth`]: a queue's stats plus the health of its leases and of its
//! delayed set (`health.lua`): lost deliveries, unclaimed ids, overdue retries.

use serde::Serialize;

use super::{admin_script, Admin, Result, READ_ONLY};
use crate::error::QueueError;
use crate::keys::QueueKeys;

admin_script!(HEALTH, "health.lua", READ_ONLY);

use super::QueueStats;

/// One queue's numbers: [`QueueStats`] plus lease and delay health.
/// Serializes as one flat object (the stats fields first).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct QueueHealth {
    /// Lengths, counters, oldest waiting age, throughput.
    #[serde(flatten)]
    pub stats: QueueStats,
    /// Processing entries whose lease expired: lost deliveries (worker died or
    /// stalled) that a running watchdog returns within one pass.
    pub expired_leases: u64,
    /// Processing entries without a lease yet (taken, not claimed).
    pub unleased: u64,
    /// Delayed jobs whose run time has come but that are not promoted yet.
    pub delayed_due: u64,
    /// Time since the oldest processing entry was delivered.
    pub oldest_processing_ms: Option<u64>,
    /// Time until the next delayed job is due (negative: overdue).
    pub next_delayed_in_ms: Option<i64>,
    /// Redis clock at the snapshot.
    pub now_ms: i64,
}

impl Admin {
    /// Stats and lease health of `queue`.
    ///
    /// ```
    /// # #[tokio::main] async fn main() -> Result<(), queue_core::admin::AdminError> {
    /// # let server = queue_testkit::RedisServer::start().unwrap();
    /// let admin = queue_core::admin::Admin::connect(&server.url()).await?;
    /// let h = admin.health("emails").await?;
    /// if h.expired_leases > 0 {
    ///     println!("{} job(s) lost in processing: is a watchdog running?", h.expired_leases);
    /// }
    /// assert_eq!((h.stats.processing, h.unleased, h.delayed_due), (0, 0, 0));
    /// # Ok(()) }
    /// ```
    pub async fn health(&self, queue: &str) -> Result<QueueHealth> {
        self.health_with_group_limit(queue, super::STATS_GROUP_LIMIT)
            .await
    }

    /// [`health`](Self::health) reading at most `max_groups` group lists
    /// ([`Queue::stats_with_group_limit`](crate::Queue::stats_with_group_limit)):
    /// `0` for a sampler that exports no group figure, so that its snapshot
    /// costs Redis the same however many groups the queue has.
    pub async fn health_with_group_limit(
        &self,
        queue: &str,
        max_groups: u64,
    ) -> Result<QueueHealth> {
        let stats = self.queue.stats_with_group_limit(queue, max_groups).await?;
        let k = QueueKeys::new(queue);
        let (now, expired, leased, due, oldest, next): (i64, u64, u64, u64, i64, i64) = HEALTH
            .key(&k.processing)
            .key(&k.leases)
            .key(&k.delayed)
            .key(&k.guard)
            .arg(&k.job_prefix)
            .invoke_async(&mut self.queue.connection())
            .await
            .map_err(|e| QueueError::redis(queue, None, e))?;
        Ok(QueueHealth {
            expired_leases: expired,
            unleased: stats.processing.saturating_sub(leased),
            delayed_due: due,
            oldest_processing_ms: (oldest > 0 && stats.processing > 0)
                .then(|| (now - oldest).max(0) as u64),
            next_delayed_in_ms: (next > 0).then_some(next - now),
            now_ms: now,
            stats,
        })
    }
}
