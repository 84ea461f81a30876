//! Inspection and operator actions on a queue: counts, job details,
//! dead-letter listing and replay.

use std::collections::BTreeMap;

use redis::Value;

use crate::error::{QueueError, Result};
use crate::job::JobId;
use crate::keys::QueueKeys;
use crate::queue::Queue;
use crate::reply;
use crate::scripts;

/// Lengths and lifetime counters of one queue.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
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
    /// reclaimed, adopted, skipped_done, replayed.
    pub counters: BTreeMap<String, i64>,
    /// Age of the oldest job waiting in main (Redis clock), if any waits.
    pub oldest_waiting_ms: Option<u64>,
    /// Completions in the last 60 s (from per-minute counters; the previous
    /// minute is weighted by how much of it falls in the window, rounded up).
    pub completed_last_minute: u64,
}

impl QueueStats {
    /// A lifetime counter, 0 when never incremented.
    pub fn counter(&self, name: &str) -> i64 {
        self.counters.get(name).copied().unwrap_or(0)
    }
}

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
        let k = QueueKeys::new(queue);
        let mut conn = self.connection();
        type Reply = (
            u64,
            u64,
            u64,
            u64,
            BTreeMap<String, i64>,
            i64,
            i64,
            u64,
            u64,
        );
        let (main, processing, delayed, dead, counters, now, oldest, cur, prev): Reply =
            scripts::STATS
                .key(&k.main)
                .key(&k.processing)
                .key(&k.delayed)
                .key(&k.dead)
                .key(&k.stats)
                .key(&k.guard)
                .arg(&k.job_prefix)
                .arg(&k.tput_prefix)
                .invoke_async(&mut conn)
                .await
                .map_err(|e| QueueError::redis(queue, None, e))?;
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
        })
    }

    /// The job hash of `id`, or `None` when it does not exist (never enqueued,
    /// or completed: see [`Queue::completion`]).
    pub async fn job(&self, queue: &str, id: impl Into<JobId>) -> Result<Option<JobInfo>> {
        let id = id.into();
        let k = QueueKeys::new(queue);
        let mut conn = self.connection();
        let raw: Vec<(String, Vec<u8>)> = redis::cmd("HGETALL")
            .arg(k.job(id.as_str()))
            .query_async(&mut conn)
            .await
            .map_err(|e| QueueError::redis(queue, Some(&id), e))?;
        if raw.is_empty() {
            return Ok(None);
        }
        let mut info = JobInfo {
            id,
            fields: BTreeMap::new(),
            payload: Vec::new(),
        };
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
    /// if it completed within the retention window.
    pub async fn completion(
        &self,
        queue: &str,
        id: impl Into<JobId>,
    ) -> Result<Option<BTreeMap<String, String>>> {
        let id = id.into();
        let k = QueueKeys::new(queue);
        let mut conn = self.connection();
        let rec: BTreeMap<String, String> = redis::cmd("HGETALL")
            .arg(k.done(id.as_str()))
            .query_async(&mut conn)
            .await
            .map_err(|e| QueueError::redis(queue, Some(&id), e))?;
        Ok(if rec.is_empty() { None } else { Some(rec) })
    }

    /// Dead-lettered jobs, newest first: `count` entries from `offset`.
    pub async fn dead_letters(&self, queue: &str, offset: u64, count: u64) -> Result<Vec<JobInfo>> {
        let k = QueueKeys::new(queue);
        let mut conn = self.connection();
        if count == 0 {
            return Ok(Vec::new());
        }
        let ids: Vec<String> = redis::cmd("LRANGE")
            .arg(&k.dead)
            .arg(offset)
            .arg(offset + count - 1)
            .query_async(&mut conn)
            .await
            .map_err(|e| QueueError::redis(queue, None, e))?;
        let mut out = Vec::with_capacity(ids.len());
        for id in ids {
            let info = self
                .job(queue, id.as_str())
                .await?
                .unwrap_or_else(|| JobInfo {
                    id: JobId::from(id),
                    fields: BTreeMap::new(),
                    payload: Vec::new(),
                });
            out.push(info);
        }
        Ok(out)
    }

    /// Moves a dead-lettered job back to main. With `reset_attempts` its
    /// attempt count restarts at 0. Returns false when `id` is not dead-lettered.
    pub async fn replay_dead(
        &self,
        queue: &str,
        id: impl Into<JobId>,
        reset_attempts: bool,
    ) -> Result<bool> {
        let id = id.into();
        let k = QueueKeys::new(queue);
        let mut conn = self.connection();
        let v: Value = scripts::REPLAY
            .key(&k.dead)
            .key(&k.main)
            .key(k.job(id.as_str()))
            .key(&k.stats)
            .arg(id.as_str())
            .arg(if reset_attempts { "1" } else { "0" })
            .invoke_async(&mut conn)
            .await
            .map_err(|e| QueueError::redis(queue, Some(&id), e))?;
        Ok(reply::int(&v) == Some(1))
    }
}
