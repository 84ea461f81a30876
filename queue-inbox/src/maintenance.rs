//! Retention and counts: pruning done rows, per-queue statistics.

use std::time::{Duration, SystemTime};

use tokio_postgres::GenericClient;
use tracing::debug;

use crate::error::{InboxError, Result};
use crate::inbox::Inbox;
use crate::table;

/// Rows deleted per statement by [`Inbox::prune`].
const PRUNE_CHUNK: i64 = 10_000;

/// Counts of one queue's inbox rows.
#[derive(Debug, Clone, PartialEq)]
pub struct InboxQueueStats {
    /// The queue.
    pub queue: String,
    /// Rows committed as `running` (claimed, never completed).
    pub running: u64,
    /// Rows `done`.
    pub done: u64,
    /// Age of the oldest `running` row (PostgreSQL clock).
    pub oldest_running: Option<Duration>,
    /// Time since the last completion.
    pub last_done_ago: Option<Duration>,
}

fn secs(v: Option<f64>) -> Option<Duration> {
    v.and_then(|s| Duration::try_from_secs_f64(s.max(0.0)).ok())
}

impl Inbox {
    /// Deletes `done` rows that finished more than `finished_before` ago, in
    /// chunks of 10 000; returns how many were deleted. Ages use the
    /// PostgreSQL clock.
    ///
    /// A pruned row no longer stops a redelivery: keep rows longer than any
    /// job can be delivered again (the workers' completion retention, 24 h by
    /// default, plus the outbox's re-send horizon).
    ///
    /// ```no_run
    /// # async fn f(client: &tokio_postgres::Client) -> Result<(), queue_inbox::InboxError> {
    /// let week = std::time::Duration::from_secs(7 * 24 * 3600);
    /// let deleted = queue_inbox::Inbox::new().prune(client, week).await?;
    /// # let _ = deleted; Ok(()) }
    /// ```
    pub async fn prune(
        &self,
        client: &impl GenericClient,
        finished_before: Duration,
    ) -> Result<u64> {
        let now: SystemTime = client
            .query_one("SELECT now()", &[])
            .await
            .and_then(|r| r.try_get(0))
            .map_err(|e| InboxError::pg(self.table(), "reading the clock", e))?;
        let cutoff = now
            .checked_sub(finished_before)
            .unwrap_or(SystemTime::UNIX_EPOCH);
        let sql = table::prune_sql(&self.table);
        let mut total = 0;
        loop {
            let n = client
                .execute(&sql, &[&cutoff, &PRUNE_CHUNK])
                .await
                .map_err(|e| InboxError::pg(self.table(), "pruning done rows", e))?;
            total += n;
            if n < PRUNE_CHUNK as u64 {
                break;
            }
        }
        debug!(table = %self.table(), deleted = total, "inbox pruned");
        Ok(total)
    }

    /// Row counts per queue, queues in name order.
    pub async fn stats(&self, client: &impl GenericClient) -> Result<Vec<InboxQueueStats>> {
        let err = |e| InboxError::pg(self.table(), "counting rows", e);
        let rows = client
            .query(&table::stats_sql(&self.table), &[])
            .await
            .map_err(err)?;
        rows.iter()
            .map(|r| {
                let running: i64 = r.try_get(1).map_err(err)?;
                let done: i64 = r.try_get(2).map_err(err)?;
                Ok(InboxQueueStats {
                    queue: r.try_get(0).map_err(err)?,
                    running: running.max(0) as u64,
                    done: done.max(0) as u64,
                    oldest_running: secs(r.try_get(3).map_err(err)?),
                    last_done_ago: secs(r.try_get(4).map_err(err)?),
                })
            })
            .collect()
    }
}
