//! [`HistoryEntry`]: each delivery of a job and what ended it (docs/EVENTS.md).
//! The unusual transitions (retry, lease return, defer, dead-letter, replay,
//! cancel) are read from the job's history list `q:{Q}:hist:<id>`, which the
//! scripts append to (`ev_hist()` in `scripts/prelude.lua`, capped, expiring
//! with the job); the happy path costs no write and is read back from the
//! job hash (the running delivery) and the completion record (the last one).

use std::collections::BTreeMap;

use serde::Deserialize;

use super::{parse_ms, Admin, Result};
use crate::error::QueueError;
use crate::events::EventKind;
use crate::job::JobId;
use crate::keys::QueueKeys;

/// One line of a job's history.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HistoryEntry {
    /// When it happened (Redis clock, ms): the end of the delivery for the
    /// kinds that end one, its start for [`HistoryEntry::running`].
    pub at: i64,
    /// What happened: `Enqueued`, `Started` (the delivery still running),
    /// `Completed`, `Retried`, `Reclaimed`, `Deferred`, `DeadLettered`,
    /// `Replayed`, `CancelRequested`, `Cancelled`.
    pub kind: EventKind,
    /// The delivery (attempt number) it concerns.
    pub attempt: Option<u32>,
    /// The worker of that delivery, when the entry ends or is one.
    pub worker: Option<String>,
    /// When that delivery started, when the entry ends or is one.
    pub started_at: Option<i64>,
    /// The error, dead-letter reason, or other detail.
    pub detail: Option<String>,
}

impl HistoryEntry {
    /// True for the delivery that is running now.
    pub fn running(&self) -> bool {
        self.kind == EventKind::Started
    }

    /// True when the entry is one delivery (a start and, unless running, its end).
    pub fn is_delivery(&self) -> bool {
        self.started_at.is_some()
    }
}

/// One entry of the history list as `ev_hist()` writes it (JSON).
#[derive(Deserialize)]
struct Stored {
    e: String,
    t: i64,
    a: Option<u32>,
    w: Option<String>,
    s: Option<i64>,
    d: Option<String>,
}

/// The history of a job: enqueued (hash or record), the stored entries, the
/// running delivery (hash), the completion (record), oldest first.
pub(super) fn journal(
    fields: &BTreeMap<String, String>,
    completion: Option<&BTreeMap<String, String>>,
    stored: &[String],
) -> Vec<HistoryEntry> {
    let job = |name: &str| fields.get(name).filter(|v| !v.is_empty());
    let done = |name: &str| {
        completion
            .and_then(|c| c.get(name))
            .filter(|v| !v.is_empty())
    };
    let number = |v: Option<&String>| v.and_then(|v| v.trim().parse::<u32>().ok());
    let time = |v: Option<&String>| v.and_then(|v| parse_ms(v)).filter(|t| *t > 0);
    let entry = |at, kind| HistoryEntry {
        at,
        kind,
        attempt: None,
        worker: None,
        started_at: None,
        detail: None,
    };
    let mut out = Vec::new();
    if let Some(at) = time(job("enqueued_at")).or_else(|| time(done("enqueued_at"))) {
        out.push(HistoryEntry {
            detail: job("type").or_else(|| done("type")).cloned(),
            ..entry(at, EventKind::Enqueued)
        });
    }
    for raw in stored {
        // An entry that does not decode is shown as it is, never dropped.
        out.push(match serde_json::from_str::<Stored>(raw) {
            Ok(s) => HistoryEntry {
                at: s.t,
                kind: EventKind::parse(&s.e),
                attempt: s.a.filter(|a| *a > 0),
                worker: s.w.filter(|w| !w.is_empty()),
                started_at: s.s.filter(|t| *t > 0),
                detail: s.d.filter(|d| !d.is_empty()),
            },
            Err(_) => HistoryEntry {
                detail: Some(raw.clone()),
                ..entry(0, EventKind::Other("unreadable".into()))
            },
        });
    }
    if job("state").map(String::as_str) == Some("active") {
        if let Some(at) = time(job("delivered_at")) {
            out.push(HistoryEntry {
                attempt: number(job("attempts")),
                worker: job("worker").cloned(),
                started_at: Some(at),
                ..entry(at, EventKind::Started)
            });
        }
    }
    // A cancelled record has its `cancelled` entry in the list already.
    if done("status").map(String::as_str) == Some("done") {
        if let Some(at) = time(done("finished_at")) {
            out.push(HistoryEntry {
                attempt: number(done("attempts")),
                worker: done("worker").cloned(),
                started_at: time(done("delivered_at")),
                ..entry(at, EventKind::Completed)
            });
        }
    }
    out.sort_by_key(|e| e.at);
    out
}

impl Admin {
    /// The history of job `id` of `queue`, oldest first: enqueued, each
    /// delivery (worker, start, end, error) and what ended it, lease returns,
    /// retries, dead-letter, replays, cancel. Empty when Redis knows nothing
    /// of the job (also shown by [`Admin::job_detail`]).
    ///
    /// ```
    /// # #[tokio::main] async fn main() -> Result<(), queue_core::admin::AdminError> {
    /// # let server = queue_testkit::RedisServer::start().unwrap();
    /// use queue_core::admin::Admin;
    /// use queue_core::{EnqueueOptions, EventKind};
    ///
    /// let admin = Admin::connect(&server.url()).await?;
    /// let opts = EnqueueOptions::new().id("invoice-42");
    /// admin.queue().enqueue_raw("billing", "send_invoice", 1, 5, opts, b"\x80").await?;
    /// let history = admin.job_history("billing", "invoice-42").await?;
    /// assert_eq!(history[0].kind, EventKind::Enqueued);
    /// # Ok(()) }
    /// ```
    pub async fn job_history(
        &self,
        queue: &str,
        id: impl Into<JobId>,
    ) -> Result<Vec<HistoryEntry>> {
        let id = id.into();
        let job = self.queue.job(queue, &id).await?;
        let completion = self.queue.completion(queue, &id).await?;
        let stored = self.stored_history(queue, &id).await?;
        let empty = BTreeMap::new();
        let fields = job.as_ref().map_or(&empty, |j| &j.fields);
        Ok(journal(fields, completion.as_ref(), &stored))
    }

    /// The raw entries of the history list of `id`, each decoded lossily
    /// (as `events.rs` and `Queue::job` read text): an entry that is not
    /// valid UTF-8 (a reason cut inside a character by a script of an older
    /// version, another writer's bytes) is read, not a failure of the whole
    /// history.
    pub(super) async fn stored_history(&self, queue: &str, id: &JobId) -> Result<Vec<String>> {
        let stored: Vec<Vec<u8>> = redis::cmd("LRANGE")
            .arg(QueueKeys::new(queue).hist(id.as_str()))
            .arg(0)
            .arg(-1)
            .query_async(&mut self.queue.connection())
            .await
            .map_err(|e| QueueError::redis(queue, Some(id), e))?;
        Ok(stored
            .iter()
            .map(|b| String::from_utf8_lossy(b).into_owned())
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn the_happy_path_is_read_from_the_completion_record() {
        let done = map(&[
            ("status", "done"),
            ("enqueued_at", "100"),
            ("delivered_at", "150"),
            ("finished_at", "200"),
            ("attempts", "1"),
            ("worker", "w1"),
        ]);
        let h = journal(&BTreeMap::new(), Some(&done), &[]);
        assert_eq!(h.len(), 2);
        assert_eq!(h[0].kind, EventKind::Enqueued);
        assert_eq!(h[1].kind, EventKind::Completed);
        assert_eq!(h[1].started_at, Some(150));
        assert_eq!(h[1].worker.as_deref(), Some("w1"));
    }

    #[test]
    fn stored_entries_and_the_running_delivery_are_in_time_order() {
        let job = map(&[
            ("state", "active"),
            ("enqueued_at", "100"),
            ("delivered_at", "500"),
            ("attempts", "2"),
            ("worker", "w2"),
        ]);
        let stored = vec![
            r#"{"e":"retried","t":300,"a":1,"w":"w1","s":200,"d":"boom"}"#.to_string(),
            "not json".to_string(),
        ];
        let h = journal(&job, None, &stored);
        let kinds: Vec<&str> = h.iter().map(|e| e.kind.as_str()).collect();
        assert_eq!(kinds, ["unreadable", "enqueued", "retried", "started"]);
        assert_eq!(h[2].detail.as_deref(), Some("boom"));
        assert_eq!(h[2].started_at, Some(200));
        assert!(h[3].running());
        assert_eq!(h[3].attempt, Some(2));
    }
}
