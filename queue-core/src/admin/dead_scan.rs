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

/// How much of each row's dead reason a scan sends back. The filter
/// (`contains`) reads the whole reason inside Redis either way.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum DeadReasons {
    /// Each reason whole (up to 4 KB as the scripts store it).
    #[default]
    Whole,
    /// The first [`SELECTED_TEXT_CHARS`](super::SELECTED_TEXT_CHARS)
    /// characters, `…` marking a cut: enough for a listing line.
    Preview,
    /// No reason ([`DeadRow::reason`] is `None`): for a caller that needs
    /// only ids and `dead_at` (a bulk selection).
    Omitted,
}

impl DeadReasons {
    /// The script's ARGV 7: '' whole, else the characters sent per reason.
    fn script_arg(self) -> String {
        match self {
            DeadReasons::Whole => String::new(),
            DeadReasons::Preview => super::SELECTED_TEXT_CHARS.to_string(),
            DeadReasons::Omitted => "0".to_string(),
        }
    }
}

/// One [`Admin::scan_dead_rows`] call: a chunk of the dead-letter list from
/// `from`, filtered inside Redis.
#[derive(Debug, Clone, Copy)]
pub struct DeadScanQuery<'a> {
    /// List position to read from (0: the newest).
    pub from: u64,
    /// Entries to read, at most [`DEAD_SCAN_CHUNK`].
    pub count: u64,
    /// Job type, exact (`None`: any).
    pub job_type: Option<&'a str>,
    /// Text the dead reason contains, case-insensitive (`None`: any).
    pub contains: Option<&'a str>,
    /// Stop after this many matches.
    pub want: u64,
    /// How much of each reason comes back.
    pub reasons: DeadReasons,
}

impl Default for DeadScanQuery<'_> {
    fn default() -> Self {
        DeadScanQuery {
            from: 0,
            count: DEAD_SCAN_CHUNK,
            job_type: None,
            contains: None,
            want: DEAD_SCAN_CHUNK,
            reasons: DeadReasons::Whole,
        }
    }
}

/// A dead letter as a scan returns it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DeadRow {
    /// Job id.
    pub id: String,
    /// Job type (`None` when the hash or field is gone). Here and in the
    /// other text fields, bytes that are not UTF-8 are shown as U+FFFD.
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
    /// report it; a replay or purge of it would be refused. Also set (to
    /// `job id is not UTF-8`, every other field `None`, [`id`](Self::id) in
    /// its lossy form) for a matching entry whose id is not UTF-8: no
    /// [`JobId`](crate::JobId) names it.
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

/// A row as the script returns it, every field as bytes: a dead job's type
/// or reason need not be UTF-8 (the worker dead-letters a job whose claim
/// row does not decode on purpose), and one such row must not fail the
/// chunk (a `String` decode of the tuple fails the whole reply).
type Row = (Vec<u8>, Vec<u8>, Vec<u8>, Vec<u8>, Vec<u8>, Vec<u8>);

/// Why a row whose id is not UTF-8 is unreadable: no [`JobId`](crate::JobId)
/// names it, so a replay or purge of it would not find it.
pub(super) const ID_NOT_UTF8: &str = "job id is not UTF-8";

impl DeadRow {
    /// The row of one script row: text fields decoded lossily (U+FFFD for
    /// bytes that are not UTF-8), `""` as none; an id that is not UTF-8 is
    /// an [`unreadable`](DeadRow::unreadable) row under its lossy form.
    fn from_script(row: Row) -> Self {
        let (id, job_type, reason, dead_at, attempts, bad) = row;
        let opt = |b: Vec<u8>| (!b.is_empty()).then(|| lossy(b));
        match utf8_id(id) {
            Ok(id) => DeadRow {
                id,
                job_type: opt(job_type),
                reason: opt(reason),
                dead_at: opt(dead_at),
                attempts: opt(attempts),
                unreadable: opt(bad),
            },
            Err(shown) => DeadRow {
                id: shown,
                job_type: None,
                reason: None,
                dead_at: None,
                attempts: None,
                unreadable: Some(ID_NOT_UTF8.to_string()),
            },
        }
    }
}

/// `bytes` as text, each sequence that is not UTF-8 replaced by U+FFFD.
fn lossy(bytes: Vec<u8>) -> String {
    String::from_utf8(bytes).unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned())
}

/// A dead entry's id: `Ok` when it is UTF-8, else `Err` with its lossy form
/// (no [`JobId`](crate::JobId) names it: listed as unreadable, [`ID_NOT_UTF8`]).
pub(super) fn utf8_id(bytes: Vec<u8>) -> Result<String, String> {
    String::from_utf8(bytes).map_err(|e| lossy(e.into_bytes()))
}

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
        let query = DeadScanQuery {
            from,
            count,
            job_type,
            contains,
            want,
            reasons: DeadReasons::Whole,
        };
        self.scan_dead_rows(queue, &query).await
    }

    /// [`Admin::scan_dead`] sending back only as much of each reason as
    /// `query.reasons` asks for ([`DeadReasons::Preview`] for a listing,
    /// [`DeadReasons::Omitted`] for a selection by id and `dead_at`): the
    /// filter still reads the whole reason inside Redis.
    ///
    /// ```
    /// # #[tokio::main] async fn main() -> Result<(), queue_core::admin::AdminError> {
    /// # let server = queue_testkit::RedisServer::start().unwrap();
    /// use queue_core::admin::{Admin, DeadReasons, DeadScanQuery};
    ///
    /// let admin = Admin::connect(&server.url()).await?;
    /// let query = DeadScanQuery { contains: Some("timeout"), reasons: DeadReasons::Omitted, ..Default::default() };
    /// let chunk = admin.scan_dead_rows("emails", &query).await?;
    /// assert_eq!((chunk.total, chunk.read, chunk.rows.len()), (0, 0, 0));
    /// # Ok(()) }
    /// ```
    pub async fn scan_dead_rows(&self, queue: &str, query: &DeadScanQuery<'_>) -> Result<DeadScan> {
        const CAP: u64 = 1 << 40;
        let DeadScanQuery {
            from,
            count,
            job_type,
            contains,
            want,
            reasons,
        } = *query;
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
            .arg(reasons.script_arg())
            .invoke_async(&mut self.queue.connection())
            .await
            .map_err(|e| QueueError::redis(queue, None, e))?;
        Ok(DeadScan {
            total,
            read,
            rows: rows.into_iter().map(DeadRow::from_script).collect(),
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

    /// A preview sends each reason's first 200 characters (`…` marking the
    /// cut, multi-byte characters whole), an omitted reason none; the
    /// filter matches text beyond the cut either way (it reads the whole
    /// reason in Redis).
    #[tokio::test]
    async fn a_scan_sends_as_much_of_each_reason_as_asked() {
        let server = RedisServer::start().unwrap();
        let admin = seeded(&server).await;
        let k = QueueKeys::new("q");
        let long = format!("{}needle at the end", "é".repeat(300));
        let _: () = redis::cmd("HSET")
            .arg(k.job("d1"))
            .arg("dead_reason")
            .arg(&long)
            .query_async(&mut admin.queue().connection())
            .await
            .unwrap();
        let scan = async |reasons| {
            let query = DeadScanQuery {
                contains: Some("needle"),
                reasons,
                ..Default::default()
            };
            let chunk = admin.scan_dead_rows("q", &query).await.unwrap();
            assert_eq!(chunk.rows.len(), 1, "{chunk:?}");
            chunk.rows[0].reason.clone()
        };
        assert_eq!(
            scan(DeadReasons::Whole).await.as_deref(),
            Some(long.as_str())
        );
        let preview = format!("{}…", "é".repeat(super::super::SELECTED_TEXT_CHARS));
        assert_eq!(scan(DeadReasons::Preview).await, Some(preview));
        assert_eq!(scan(DeadReasons::Omitted).await, None);
        // A short reason is sent whole in a preview.
        let short = DeadScanQuery {
            contains: Some("refused"),
            reasons: DeadReasons::Preview,
            ..Default::default()
        };
        let chunk = admin.scan_dead_rows("q", &short).await.unwrap();
        assert_eq!(chunk.rows[0].reason.as_deref(), Some("refused"));
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

    /// A dead job whose type is not UTF-8 (the worker dead-letters such a
    /// job on purpose: its claim row does not decode) is a row like any
    /// other, its type shown lossily, and the chunk goes on; an entry whose
    /// id is not UTF-8 is a row marked unreadable. Before, the rows were
    /// decoded as `String`s: one such row failed the whole scan, and with it
    /// `dead replay/purge --all/--filter` and the dashboard's dead pages.
    #[tokio::test]
    async fn a_dead_job_whose_type_is_not_utf8_is_a_row_not_a_failed_scan() {
        let server = RedisServer::start().unwrap();
        let admin = seeded(&server).await;
        let k = QueueKeys::new("q");
        let odd_id = b"odd-\xff".as_slice();
        let mut odd_key = k.job("").into_bytes();
        odd_key.extend_from_slice(odd_id);
        let _: () = redis::pipe()
            .cmd("HSET")
            .arg(k.job("d2"))
            .arg("type")
            .arg(b"\xff\xfe".as_slice())
            .ignore()
            .cmd("HSET")
            .arg(odd_key)
            .arg(&["state", "dead", "type", "send", "dead_reason", "refused"])
            .ignore()
            .cmd("RPUSH")
            .arg(&k.dead)
            .arg(odd_id)
            .ignore()
            .query_async(&mut admin.queue().connection())
            .await
            .unwrap();
        let all = admin
            .scan_dead("q", 0, 1000, None, None, 100)
            .await
            .unwrap();
        assert_eq!((all.total, all.read, all.rows.len()), (7, 7, 7));
        let d2 = &all.rows[1];
        assert_eq!(d2.id, "d2");
        assert_eq!(d2.job_type.as_deref(), Some("\u{FFFD}\u{FFFD}"));
        assert_eq!(d2.reason.as_deref(), Some("Upstream TIMEOUT after 30s"));
        assert_eq!(d2.unreadable, None);
        let odd = &all.rows[6];
        assert_eq!(odd.id, "odd-\u{FFFD}");
        assert_eq!(odd.unreadable.as_deref(), Some(ID_NOT_UTF8));
        assert_eq!(odd.job_type, None);

        let timeouts = admin
            .scan_dead("q", 0, 1000, None, Some("timeout"), 100)
            .await
            .unwrap();
        let ids: Vec<&str> = timeouts.rows.iter().map(|r| r.id.as_str()).collect();
        assert_eq!(ids, ["d2", "d4", "d6"]);
        // The list of `dead list` and the dashboard's queue page too.
        let listed = admin
            .dead_letters("q", None, super::super::Page::first(10))
            .await
            .unwrap();
        assert_eq!(listed.jobs.len(), 7);
        assert_eq!(listed.jobs[1].field("type"), Some("\u{FFFD}\u{FFFD}"));
        assert_eq!(listed.jobs[6].field("unreadable"), Some(ID_NOT_UTF8));
    }
}
