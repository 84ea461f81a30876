//! # queue-core
//!
//! A reliable Redis job queue: at-least-once delivery with leases, retries
//! with jittered exponential backoff, a dead-letter list, and a watchdog that
//! returns jobs whose worker died. See `docs/ARCHITECTURE.md` for the design.
//!
//! Most users write handlers with the [`job`](macro@job) attribute, enqueue through a
//! [`Queue`] and run them with a [`Worker`]:
//!
//! ```
//! use std::time::Duration;
//! use queue_core::{job, JobContext, JobError, Queue, Worker};
//! use serde::{Deserialize, Serialize};
//!
//! #[derive(Serialize, Deserialize)]
//! pub struct Welcome { pub email: String }
//!
//! #[job(queue = "emails", max_attempts = 5, timeout = "30s")]
//! async fn send_welcome(ctx: JobContext, args: Welcome) -> Result<(), JobError> {
//!     println!("job {} attempt {}: mail {}", ctx.job_id(), ctx.attempt(), args.email);
//!     Ok(())
//! }
//!
//! # #[tokio::main] async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # let server = queue_testkit::RedisServer::start().unwrap();
//! # let url = server.url();
//! // One `Queue` per process, shared (it is cheap to clone), e.g. as axum state:
//! let queue = Queue::connect(&url).await?;
//! let id = send_welcome::enqueue(&queue, Welcome { email: "a@example.com".into() }).await?;
//!
//! let worker = Worker::builder(&url)
//!     .register(send_welcome::handler())
//!     .concurrency(4)
//!     .build()
//!     .await?;
//! let handle = worker.shutdown_handle();
//! // In production `worker.run().await?` in main: it stops on SIGTERM / ctrl-c.
//! let running = tokio::spawn(worker.run());
//!
//! // Wait for the job to complete (no polling), then stop the worker.
//! queue.wait_completion("emails", &id, Duration::from_secs(10)).await?;
//! handle.shutdown();
//! running.await??;
//! # Ok(()) }
//! ```
//!
//! **Run a watchdog too.** Workers never take back a job whose lease expired:
//! if a worker process dies (crash, SIGKILL, OOM, lost machine) its in-flight
//! jobs stay in the processing list until a watchdog returns them. Run
//! `queue-watchdog run --redis <url> --queue <name>` next to the workers (as
//! many as you like), or embed a [`Watchdog`] and call
//! [`run_until`](Watchdog::run_until) in one of your processes. Without
//! either, a crashed worker's jobs are never retried.

#![warn(missing_docs)]

pub mod admin;
mod background;
mod backoff;
mod conn;
mod context;
mod enqueue_group;
mod enqueue_options;
mod error;
mod events;
mod failpoint;
mod flow;
mod groups;
mod job;
mod keys;
mod keys_cache;
mod lease_clock;
mod limits;
mod lock;
mod metrics;
mod queue;
mod record;
mod registry;
mod results;
mod scripts;
mod state;
#[cfg(feature = "failpoints")]
#[doc(hidden)]
pub mod testing;
pub mod trace_context;
mod wait_conns;
mod watchdog;
mod worker;
mod workflow;

pub use admin::{JobInfo, QueueStats};
pub use backoff::{Backoff, MAX_BACKOFF};
pub use conn::{ConnectionConfig, RedisConnection};
pub use enqueue_options::CORE_JOB_FIELDS;
pub use error::{QueueError, Result};
pub use events::{EventKind, EventsFrom, EventsPage, QueueEvent, DEFAULT_EVENTS_MAXLEN};
pub use flow::{CancelOutcome, PauseChange};
pub use groups::{GroupInfo, GroupListing, GROUP_LIST_LIMIT};
pub use job::{BoxFuture, Job, JobContext, JobError, JobErrorKind, JobId};
pub use keys::{validate_queue_name, QueueKeys};
pub use limits::{KeyLimits, LimitKind, LimitScope, QueueLimits, RateLimit};
pub use lock::{Lock, LockError, LockGuard, LockOptions};
pub use queue::{EnqueueOptions, EnqueueOutcome, Enqueued, Queue};
pub use registry::Registration;
pub use results::{JobOutput, WaitError, MAX_RESULT_BYTES};
pub use state::JobState;
pub use watchdog::{ReclaimReport, Watchdog, WatchdogConfig};
pub use worker::{ShutdownHandle, Worker, WorkerBuilder, WorkerConfig, WorkerIdentity};
pub use workflow::{
    Batch, BatchCreated, BatchSummary, ChildPolicy, ChildResult, Dag, DagCreated, DagError,
    DeadNotice, Flow, FlowCreated, JobSpec, RelayReport, RelayRetryReport, DEFAULT_OPEN_TTL,
};

/// The `#[job]` attribute macro. See the crate docs for an example.
pub use queue_macros::job;

/// Items used by code that `#[job]` generates. Not a public API.
///
/// Versioned: a `queue-macros` that generates code for another version of
/// this module fails to compile against this `queue-core` instead of
/// misbehaving.
#[doc(hidden)]
pub mod __private_v1 {
    pub use crate::results::{store_output, unread_result, UnreadJobResult};
    pub use std::time::Duration;
}
