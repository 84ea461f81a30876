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
    /// Why the entry's job key cannot be read (corrupt data: a key of
    /// another type), with every other field `None`. Such a row is returned
    /// whatever the filter (its type and reason are unknown): skip it and
    /// report it; a replay or purge of it would be refused.
    pub unreadable: Option<String>,
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

type Row = (String, String, String, String, String, String);

impl Admin {
    /// Reads at most [`DEAD_SCAN_CHUNK`] entries of the dead-letter list of
    /// `queue` from position `from` and keeps those whose type is `job_type`
    /// (exact) and whose dead reason contains `contains` (case-insensitive);
    /// `None` means any. Stops early after `want` matches. An entry whose job
    /// key cannot be read comes back as a row with
    /// [`unreadable`](DeadRow::unreadable) set, whatever the filter.
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
                .map(|(id, job_type, reason, dead_at, attempts, bad)| DeadRow {
                    id,
                    job_type: opt(job_type),
                    reason: opt(reason),
                    dead_at: opt(dead_at),
                    attempts: opt(attempts),
                    unreadable: opt(bad),
                })
                .collect(),
        })
    }
}

#[cfg(test)]
mod tests {
    use queue_testkit::RedisServer;

    use super::*;

    /// `d1`…`d6` dead in list order; even ones are `render` jobs that timed out.
    async fn seeded(server: &RedisServer) -> Admin {
        let admin = Admin::connect(&server.url()).await.unwrap();
        let k = QueueKeys::new("q");
        let mut conn = admin.queue().connection();
        for i in 1..=6 {
            let id = format!("d{i}");
            let (t, reason) = if i % 2 == 0 {
                ("render", "Upstream TIMEOUT after 30s")
            } else {
                ("send", "refused")
            };
            let _: () = redis::pipe()
                .cmd("HSET")
                .arg(k.job(&id))
                .arg(&[
                    "type",
                    t,
                    "dead_reason",
                    reason,
                    "dead_at",
                    "7",
                    "attempts",
                    "3",
                ])
                .ignore()
                .cmd("RPUSH")
                .arg(&k.dead)
                .arg(&id)
                .ignore()
                .query_async(&mut conn)
                .await
                .unwrap();
        }
        admin
    }

    #[tokio::test]
    async fn filters_in_redis_and_continues_where_it_stopped() {
        let server = RedisServer::start().unwrap();
        let admin = seeded(&server).await;
        let all = admin
            .scan_dead("q", 0, 1000, None, None, 100)
            .await
            .unwrap();
        assert_eq!((all.total, all.read, all.rows.len()), (6, 6, 6));
        assert_eq!(all.rows[0].dead_at.as_deref(), Some("7"));

        let ids = |s: &DeadScan| s.rows.iter().map(|r| r.id.clone()).collect::<Vec<_>>();
        let timeouts = admin
            .scan_dead("q", 0, 1000, Some("render"), Some("timeout"), 100)
            .await
            .unwrap();
        assert_eq!(ids(&timeouts), ["d2", "d4", "d6"], "case-insensitive text");
        assert!(
            admin
                .scan_dead("q", 0, 1000, Some("rend"), None, 100)
                .await
                .unwrap()
                .rows
                .is_empty(),
            "the type is exact"
        );

        // Stops after `want` matches; `read` says where to continue.
        let first = admin
            .scan_dead("q", 0, 1000, None, Some("timeout"), 1)
            .await
            .unwrap();
        assert_eq!((ids(&first), first.read), (vec!["d2".to_string()], 2));
        let rest = admin
            .scan_dead("q", 2, 1000, None, Some("timeout"), 10)
            .await
            .unwrap();
        assert_eq!(
            (ids(&rest), rest.read),
            (vec!["d4".to_string(), "d6".to_string()], 4)
        );
        // At most `count` entries read per call.
        let small = admin.scan_dead("q", 0, 3, None, None, 100).await.unwrap();
        assert_eq!(small.read, 3);
        // A hash that is gone: the row is still listed, fields empty.
        let _: () = redis::cmd("DEL")
            .arg(QueueKeys::new("q").job("d1"))
            .query_async(&mut admin.queue().connection())
            .await
            .unwrap();
        let gone = admin.scan_dead("q", 0, 1, None, None, 1).await.unwrap();
        assert_eq!(gone.rows[0].job_type, None);
    }

    /// An entry whose job key holds another type (corrupt data) is a row
    /// saying so, whatever the filter, and the chunk goes on. Before, its
    /// `HMGET` failed the whole call with WRONGTYPE: the dashboard's page and
    /// bulk actions, and the CLI's selection, stopped there.
    #[tokio::test]
    async fn an_unreadable_entry_is_a_row_not_a_failed_scan() {
        let server = RedisServer::start().unwrap();
        let admin = seeded(&server).await;
        let k = QueueKeys::new("q");
        let _: () = redis::pipe()
            .cmd("DEL")
            .arg(k.job("d3"))
            .ignore()
            .cmd("SET")
            .arg(k.job("d3"))
            .arg("x")
            .ignore()
            .query_async(&mut admin.queue().connection())
            .await
            .unwrap();
        let chunk = admin
            .scan_dead("q", 0, 1000, Some("render"), None, 100)
            .await
            .unwrap();
        let rows: Vec<(&str, bool)> = chunk
            .rows
            .iter()
            .map(|r| (r.id.as_str(), r.unreadable.is_some()))
            .collect();
        assert_eq!(
            rows,
            [("d2", false), ("d3", true), ("d4", false), ("d6", false)]
        );
        let bad = chunk.rows[1].unreadable.as_deref().unwrap();
        assert!(bad.contains("holds a string"), "{bad}");
        let all = admin
            .select_dead("q", &super::super::DeadSelection::All)
            .await
            .unwrap();
        assert_eq!(all.len(), 6);
        assert!(all[2].unreadable.is_some() && all[2].id.as_str() == "d3");
    }
}
