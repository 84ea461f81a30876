//! Flow control: pausing and resuming a queue, cancelling a job
//! (docs/FLOW-CONTROL.md). The typed results ([`PauseChange`],
//! [`CancelOutcome`]) and the [`Queue`] methods; each action is one script
//! (`scripts/pause.lua`, `resume.lua`, `cancel.lua`), enforced inside Redis
//! for every worker process.

use serde::Serialize;

use crate::error::Result;
use crate::job::JobId;
use crate::keys::QueueKeys;
use crate::queue::Queue;
use crate::scripts::cancel::Cancel;
use crate::scripts::pause::Pause;
use crate::scripts::resume::Resume;
use crate::state::JobState;
use crate::worker::WorkerConfig;

/// What a pause or resume found and did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PauseChange {
    /// Queue name.
    pub queue: String,
    /// The queue was paused before the call.
    pub was_paused: bool,
    /// Redis time (ms) of the pause: after `pause`, when the queue was paused
    /// (the earlier time if it already was); after `resume`, when the pause
    /// that ended began (`None`: it was not paused).
    pub paused_since_ms: Option<i64>,
}

/// What [`Queue::cancel`] did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub enum CancelOutcome {
    /// The job was waiting (`from` = [`JobState::Queued`]) or delayed: it was
    /// removed, and its completion record says `cancelled`.
    Cancelled {
        /// Where it was.
        from: JobState,
    },
    /// The job is running: the handler sees [`JobContext::cancelled`](crate::JobContext::cancelled)
    /// at its next heartbeat; if it then returns an error the job ends
    /// cancelled (never retried). `first`: false when a cancel was already requested.
    Requested {
        /// This call set the request.
        first: bool,
    },
    /// The job already finished: `status` of its completion record
    /// (`done` or `cancelled`).
    AlreadyFinished {
        /// The record's status.
        status: String,
    },
    /// The job is dead-lettered: replay or purge it instead.
    Dead,
    /// No job with this id (never enqueued, or its record expired).
    NotFound,
    /// The job's hash says a state this version cannot cancel from (or the
    /// id is not where its state says); nothing was changed.
    Unexpected {
        /// The stored state.
        state: JobState,
    },
}

impl Queue {
    /// Pauses `queue`: no worker starts a job of it until [`resume`](Self::resume).
    /// Enqueues are still accepted, running jobs finish, and the watchdog
    /// still returns expired leases.
    ///
    /// ```
    /// # #[tokio::main] async fn main() -> Result<(), queue_core::QueueError> {
    /// # let server = queue_testkit::RedisServer::start().unwrap();
    /// let queue = queue_core::Queue::connect(&server.url()).await?;
    /// let paused = queue.pause("emails").await?;
    /// assert!(!paused.was_paused);
    /// assert!(queue.stats("emails").await?.paused_since_ms.is_some());
    /// let resumed = queue.resume("emails").await?;
    /// assert!(resumed.was_paused);
    /// assert_eq!(resumed.paused_since_ms, paused.paused_since_ms);
    /// # Ok(()) }
    /// ```
    pub async fn pause(&self, queue: &str) -> Result<PauseChange> {
        let keys = QueueKeys::new(queue);
        let change = Pause { keys: &keys }.run(&mut self.connection()).await?;
        tracing::info!(queue, was_paused = change.was_paused, "queue paused");
        Ok(change)
    }

    /// Resumes a paused `queue` (a no-op, `was_paused: false`, if it was not).
    pub async fn resume(&self, queue: &str) -> Result<PauseChange> {
        let keys = QueueKeys::new(queue);
        let change = Resume { keys: &keys }.run(&mut self.connection()).await?;
        tracing::info!(queue, was_paused = change.was_paused, "queue resumed");
        Ok(change)
    }

    /// Cancels job `id` of `queue`: see [`CancelOutcome`]. A cancelled job's
    /// completion record is kept for the default completion retention (24 h).
    ///
    /// ```
    /// # #[tokio::main] async fn main() -> Result<(), queue_core::QueueError> {
    /// # let server = queue_testkit::RedisServer::start().unwrap();
    /// use queue_core::{CancelOutcome, EnqueueOptions, JobState, Queue};
    /// let queue = Queue::connect(&server.url()).await?;
    /// let job = queue.enqueue_raw("emails", "send", 1, 3, EnqueueOptions::new(), b"\x80").await?;
    /// assert_eq!(
    ///     queue.cancel("emails", job.id.clone()).await?,
    ///     CancelOutcome::Cancelled { from: JobState::Queued }
    /// );
    /// assert_eq!(
    ///     queue.cancel("emails", job.id).await?,
    ///     CancelOutcome::AlreadyFinished { status: "cancelled".into() }
    /// );
    /// # Ok(()) }
    /// ```
    pub async fn cancel(&self, queue: &str, id: impl Into<JobId>) -> Result<CancelOutcome> {
        let id = id.into();
        let keys = QueueKeys::new(queue);
        let outcome = Cancel {
            keys: &keys,
            id: &id,
            retention: WorkerConfig::default().completion_retention,
        }
        .run(&mut self.connection())
        .await?;
        tracing::info!(queue, job_id = %id, outcome = ?outcome, "cancel");
        Ok(outcome)
    }
}
