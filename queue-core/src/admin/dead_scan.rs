//! Reading a long dead-letter list in chunks, filtered inside Redis
//! (`dead_scan.lua`, read-only): one call reads at most 1000 entries and
//! returns only the matching ones, so a 100k-entry list is paged or counted
//! without one long command and without moving every entry to the client.

use serde::Serialize;

use super::{admin_script, Admin, Result, READ_ONLY};
use crate::error::QueueError;
use crate::keys::QueueKeys;

admin_script!(DEAD_SCAN, "dead_scan.lua", READ_ONLY);

/// Entries one [`Admin::scan_dead`] call reads at most.
pub const DEAD_SCAN_CHUNK: u64 = 1000;

/// A dead letter as a scan returns it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DeadRow {
    /// Job id.
    pub id: String,
    /// Job type (`None` when the hash or field is gone).
    pub job_type: Option<String>,
    /// Why it was dead-lettered.
    pub reason: Option<String>,
    /// `dead_at` as stored (ms): pass it to [`Admin::purge_dead`] so a purge
    /// only deletes that dead-lettering.
    pub dead_at: Option<String>,
    /// Attempts made, as stored.
    pub attempts: Option<String>,
}

/// One chunk of a scan.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeadScan {
    /// Length of the dead-letter list.
    pub total: u64,
    /// Entries read from `from` (continue at `from + read`).
    pub read: u64,
    /// The matching entries, in list order (newest first).
    pub rows: Vec<DeadRow>,
}

type Row = (String, String, String, String, String);

impl Admin {
    /// Reads at most [`DEAD_SCAN_CHUNK`] entries of the dead-letter list of
    /// `queue` from position `from` and keeps those whose type is `job_type`
    /// (exact) and whose dead reason contains `contains` (case-insensitive);
    /// `None` means any. Stops early after `want` matches.
    ///
    /// ```
    /// # #[tokio::main] async fn main() -> Result<(), queue_core::admin::AdminError> {
    /// # let server = queue_testkit::RedisServer::start().unwrap();
    /// use queue_core::admin::Admin;
    ///
    /// let admin = Admin::connect(&server.url()).await?;
    /// let chunk = admin.scan_dead("emails", 0, 1000, Some("send"), Some("timeout"), 100).await?;
    /// assert_eq!((chunk.total, chunk.read, chunk.rows.len()), (0, 0, 0));
    /// # Ok(()) }
    /// ```
    pub async fn scan_dead(
        &self,
        queue: &str,
        from: u64,
        count: u64,
        job_type: Option<&str>,
        contains: Option<&str>,
        want: u64,
    ) -> Result<DeadScan> {
        const CAP: u64 = 1 << 40;
        let k = QueueKeys::new(queue);
        let (total, read, rows): (u64, u64, Vec<Row>) = DEAD_SCAN
            .key(&k.dead)
            .key(&k.guard)
            .arg(k.job(""))
            .arg(from.min(CAP))
            .arg(count.clamp(1, DEAD_SCAN_CHUNK))
            .arg(job_type.unwrap_or(""))
            .arg(contains.unwrap_or("").to_lowercase())
            .arg(want.clamp(1, CAP))
            .invoke_async(&mut self.queue.connection())
            .await
            .map_err(|e| QueueError::redis(queue, None, e))?;
        let opt = |s: String| (!s.is_empty()).then_some(s);
        Ok(DeadScan {
            total,
            read,
            rows: rows
                .into_iter()
                .map(|(id, job_type, reason, dead_at, attempts)| DeadRow {
                    id,
                    job_type: opt(job_type),
                    reason: opt(reason),
                    dead_at: opt(dead_at),
                    attempts: opt(attempts),
                })
                .collect(),
        })
    }
}
