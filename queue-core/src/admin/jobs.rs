//! One job: [`JobInfo`] (its hash as stored), the completion record, and
//! [`JobDetail`] (everything known about it: location, history, steps), the
//! lookup behind `queue-watchdog jobs show`.

use std::collections::BTreeMap;

use super::history::{history, JobEvent};
use super::journal::{journal, HistoryEntry};
use super::{Admin, Location, Result};
use crate::error::QueueError;
use crate::job::JobId;
use crate::keys::QueueKeys;
use crate::queue::Queue;

/// A job's hash, as stored (payload as raw bytes).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobInfo {
    /// Job id.
    pub id: JobId,
    /// Every field except `payload`, as text.
    pub fields: BTreeMap<String, String>,
    /// The MessagePack payload.
    pub payload: Vec<u8>,
}

impl JobInfo {
    /// A hash-less entry: an id found in a list whose hash is gone.
    pub(super) fn empty(id: JobId) -> Self {
        JobInfo {
            id,
            fields: BTreeMap::new(),
            payload: Vec::new(),
        }
    }

    /// A field of the job hash (`state`, `attempts`, `last_error`, `dead_reason`, ...).
    pub fn field(&self, name: &str) -> Option<&str> {
        self.fields.get(name).map(String::as_str)
    }

    /// The job's state: queued, delayed, active or dead.
    pub fn state(&self) -> Option<&str> {
        self.field("state")
    }

    /// Deliveries so far.
    pub fn attempts(&self) -> u32 {
        self.field("attempts")
            .and_then(|a| a.parse().ok())
            .unwrap_or(0)
    }
}

impl Queue {
    /// The job hash of `id`, or `None` when it does not exist (never enqueued,
    /// or completed: see [`Queue::completion`]).
    pub async fn job(&self, queue: &str, id: impl Into<JobId>) -> crate::Result<Option<JobInfo>> {
        let id = id.into();
        let k = QueueKeys::new(queue);
        let raw: Vec<(String, Vec<u8>)> = redis::cmd("HGETALL")
            .arg(k.job(id.as_str()))
            .query_async(&mut self.connection())
            .await
            .map_err(|e| QueueError::redis(queue, Some(&id), e))?;
        if raw.is_empty() {
            return Ok(None);
        }
        let mut info = JobInfo::empty(id);
        for (field, value) in raw {
            if field == "payload" {
                info.payload = value;
            } else {
                info.fields
                    .insert(field, String::from_utf8_lossy(&value).into_owned());
            }
        }
        Ok(Some(info))
    }

    /// The completion record of `id` (`status`, `finished_at`, `attempts`),
    /// if it completed within the retention window, whichever form it was
    /// written in (a hash, or the compact string of
    /// [`WorkerConfig::compact_records`](crate::WorkerConfig::compact_records)).
    pub async fn completion(
        &self,
        queue: &str,
        id: impl Into<JobId>,
    ) -> crate::Result<Option<BTreeMap<String, String>>> {
        let id = id.into();
        let k = QueueKeys::new(queue);
        let key = k.done(id.as_str());
        let mut conn = self.connection();
        let hash: redis::RedisResult<Vec<(String, Vec<u8>)>> =
            redis::cmd("HGETALL").arg(&key).query_async(&mut conn).await;
        let raw = match hash {
            Ok(raw) => raw,
            // Not a hash: the compact string (WorkerConfig::compact_records).
            Err(e) if e.code() == Some("WRONGTYPE") => {
                let s: Option<Vec<u8>> = redis::cmd("GET")
                    .arg(&key)
                    .query_async(&mut conn)
                    .await
                    .map_err(|e| QueueError::redis(queue, Some(&id), e))?;
                s.map(|s| crate::record::unpack(&s)).unwrap_or_default()
            }
            Err(e) => return Err(QueueError::redis(queue, Some(&id), e)),
        };
        // A typed result (docs/RESULTS.md) reads as `msgpack:<hex>`.
        let rec: BTreeMap<String, String> = raw
            .into_iter()
            .map(|(k, v)| (k, crate::results::record_text(&v)))
            .collect();
        Ok(if rec.is_empty() { None } else { Some(rec) })
    }
}

/// Everything known about one job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobDetail {
    /// Queue name.
    pub queue: String,
    /// Job id.
    pub id: JobId,
    /// Redis clock when it was located.
    pub now_ms: i64,
    /// Where it is now.
    pub location: Location,
    /// Its hash (none once completed, or when the hash is gone).
    pub job: Option<JobInfo>,
    /// Its completion record, if it completed within the retention.
    pub completion: Option<BTreeMap<String, String>>,
    /// Names of the `ctx.step(..)` results stored for it.
    pub steps: Vec<String>,
    /// Events, oldest first (see [`JobEvent`]).
    pub history: Vec<JobEvent>,
    /// Each delivery and what ended it, oldest first ([`Admin::job_history`]).
    pub journal: Vec<HistoryEntry>,
}

impl JobDetail {
    /// A field of the job hash.
    pub fn field(&self, name: &str) -> Option<&str> {
        self.job.as_ref()?.field(name)
    }
}

impl Admin {
    /// The job hash of `id`: [`Queue::job`].
    pub async fn job(&self, queue: &str, id: impl Into<JobId>) -> Result<Option<JobInfo>> {
        Ok(self.queue.job(queue, id).await?)
    }

    /// Everything about job `id` of `queue`, or `None` when Redis knows
    /// nothing about it (never enqueued, purged, or completed longer ago than
    /// the retention).
    ///
    /// ```
    /// # #[tokio::main] async fn main() -> Result<(), queue_core::admin::AdminError> {
    /// # let server = queue_testkit::RedisServer::start().unwrap();
    /// use queue_core::admin::{Admin, JobEventKind, Location};
    /// use queue_core::EnqueueOptions;
    ///
    /// let admin = Admin::connect(&server.url()).await?;
    /// let opts = EnqueueOptions::new().id("invoice-42");
    /// admin.queue().enqueue_raw("billing", "send_invoice", 1, 5, opts, b"\x80").await?;
    ///
    /// let job = admin.job_detail("billing", "invoice-42").await?.expect("known id");
    /// assert_eq!(job.location, Location::Main { ahead: 0, at_least: false });
    /// assert_eq!(job.field("state"), Some("queued"));
    /// assert!(matches!(job.history[0].kind, JobEventKind::Enqueued { .. }));
    /// assert!(admin.job_detail("billing", "nope").await?.is_none());
    /// # Ok(()) }
    /// ```
    pub async fn job_detail(&self, queue: &str, id: impl Into<JobId>) -> Result<Option<JobDetail>> {
        let id = id.into();
        let (now_ms, Some(location)) = self.locate_at(queue, &id).await? else {
            return Ok(None);
        };
        let job = self.queue.job(queue, &id).await?;
        let completion = self.queue.completion(queue, &id).await?;
        let steps: Vec<String> = redis::cmd("HKEYS")
            .arg(QueueKeys::new(queue).steps(id.as_str()))
            .query_async(&mut self.queue.connection())
            .await
            .map_err(|e| QueueError::redis(queue, Some(&id), e))?;
        let empty = BTreeMap::new();
        let fields = job.as_ref().map_or(&empty, |j| &j.fields);
        let history = history(fields, completion.as_ref());
        let journal = journal(
            fields,
            completion.as_ref(),
            &self.stored_history(queue, &id).await?,
        );
        Ok(Some(JobDetail {
            queue: queue.to_string(),
            id,
            now_ms,
            location,
            job,
            completion,
            steps,
            history,
            journal,
        }))
    }

    /// Job `id` in each of `queues` that knows it (an id may be reused across queues).
    pub async fn find_job(
        &self,
        queues: &[String],
        id: impl Into<JobId>,
    ) -> Result<Vec<JobDetail>> {
        let id = id.into();
        let mut found = Vec::new();
        for queue in queues {
            if let Some(d) = self.job_detail(queue, &id).await? {
                found.push(d);
            }
        }
        Ok(found)
    }
}
