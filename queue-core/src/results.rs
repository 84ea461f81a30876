//! Typed job results (docs/RESULTS.md): [`JobOutput`] (the value type a
//! `#[job]` fn returns), [`JobContext::set_output`] (the value, MessagePack,
//! in the completion record the ack writes), and waiting for a job's outcome
//! without polling: [`Queue::wait_result`] / [`Queue::enqueue_and_wait`]
//! check the job (`result_wait.lua`, which registers the waiter in the same
//! step), then block in `BLPOP` on `q:{Q}:notify:<id>`, which the script that
//! finishes the job (ack, dead-letter, cancel) pushes to.

use std::any::TypeId;
use std::collections::BTreeMap;
use std::time::Duration;

use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::conn::RedisConnection;
use crate::error::QueueError;
use crate::job::{Job, JobContext, JobError, JobId};
use crate::keys::QueueKeys;
use crate::queue::Queue;
use crate::scripts::result_wait::{ResultWait, WaitState};
use crate::wait_conns::{worth_waiting_out, Taken, WaitConnections};

/// The value a job type produces: `T` of a `#[job]` fn returning
/// `Result<T, JobError>` (`()` for `Result<(), JobError>`). `#[job]`
/// implements it; for a hand-written [`Job`], implement it and call
/// [`JobContext::set_output`] in `run`.
pub trait JobOutput: Job {
    /// The handler's value, stored as MessagePack in the completion record.
    type Output: Serialize + DeserializeOwned + Send + 'static;
}

/// Why [`Queue::wait_result`] has no value.
#[derive(Debug, thiserror::Error)]
pub enum WaitError {
    /// The job was dead-lettered (`reason` starts with `expired` for a job
    /// not started before its deadline, `deadline exceeded` for one past its
    /// execution deadline).
    #[error("job {id} of queue `{queue}` was dead-lettered: {reason}")]
    Dead {
        /// Queue name.
        queue: String,
        /// Job id.
        id: JobId,
        /// The dead-letter reason.
        reason: String,
    },
    /// The job was cancelled ([`Queue::cancel`]).
    #[error("job {id} of queue `{queue}` was cancelled")]
    Cancelled {
        /// Queue name.
        queue: String,
        /// Job id.
        id: JobId,
    },
    /// No outcome within the timeout; the job may still finish later.
    #[error("job {id} of queue `{queue}` did not finish within {waited:?}")]
    Timeout {
        /// Queue name.
        queue: String,
        /// Job id.
        id: JobId,
        /// How long the call waited.
        waited: Duration,
    },
    /// Redis knows nothing of the job: never enqueued, purged, finished
    /// longer ago than the completion retention, or acked with no record.
    #[error("job {id} of queue `{queue}` is unknown (never enqueued, purged, or its completion record expired)")]
    NotFound {
        /// Queue name.
        queue: String,
        /// Job id.
        id: JobId,
    },
    /// The stored result does not decode as the job type's output.
    #[error("the result of job {id} of queue `{queue}` does not decode: {detail}")]
    Decode {
        /// Queue name.
        queue: String,
        /// Job id.
        id: JobId,
        /// The decoding error.
        detail: String,
    },
    /// Redis failed, or the queue has no URL to open a blocking connection.
    #[error(transparent)]
    Queue(#[from] QueueError),
}

impl WaitError {
    /// True when the job was dead-lettered as expired (not started before
    /// its deadline, `EnqueueOptions::expires_in` / `deadline`).
    pub fn is_expired(&self) -> bool {
        matches!(self, WaitError::Dead { reason, .. } if reason.starts_with("expired"))
    }
}

impl JobContext {
    /// Stores the handler's value (MessagePack) for the completion record
    /// the ack writes, where [`Queue::wait_result`] reads it. `#[job]` calls
    /// it with the `T` of a fn returning `Result<T, JobError>`; it replaces
    /// a [`set_result_ref`](Self::set_result_ref). At most
    /// [`MAX_RESULT_BYTES`]: a larger value is not kept (the job completes
    /// without it).
    ///
    /// ```
    /// let ctx = queue_core::JobContext::for_test("job-1", "reports", 1);
    /// ctx.set_output(&42u32).unwrap();
    /// ```
    pub fn set_output<T: Serialize + ?Sized>(&self, value: &T) -> Result<(), JobError> {
        let mut bytes = vec![OUTPUT_MARK];
        rmp_serde::encode::write_named(&mut bytes, value)
            .map_err(|e| JobError::permanent(format!("the job's result does not encode: {e}")))?;
        if let Ok(mut slot) = self.inner.result_ref.lock() {
            *slot = Some(bytes);
        }
        Ok(())
    }
}

/// The largest result a job may leave in its completion record
/// ([`JobContext::set_output`], [`JobContext::set_result_ref`]): 511 MiB,
/// below Redis's default 512 MB argument limit (`proto-max-bulk-len`). A
/// larger one is not kept: the job completes without it (an error is logged
/// with its size), since its work is done. Acks are sent at most 64 MiB of
/// results per `ack.lua` call (a larger result alone), so large results do
/// not fail the acks of the jobs batched with them. Keep results small: they
/// live in Redis memory for the completion retention. docs/RESULTS.md.
pub const MAX_RESULT_BYTES: usize = 511 * 1024 * 1024;

/// The first byte of a `result` field that holds a typed value: `0xc1`,
/// which MessagePack never uses and UTF-8 never starts with, so the value
/// cannot be mistaken for a [`JobContext::set_result_ref`] text.
pub(crate) const OUTPUT_MARK: u8 = 0xc1;

/// A completion-record field as text: UTF-8 as is; a typed value
/// ([`OUTPUT_MARK`]) as `msgpack:<hex>`; other bytes lossily.
pub(crate) fn record_text(value: &[u8]) -> String {
    match value.split_first() {
        Some((&OUTPUT_MARK, msgpack)) => {
            let hex: String = msgpack.iter().map(|b| format!("{b:02x}")).collect();
            format!("msgpack:{hex}")
        }
        _ => String::from_utf8_lossy(value).into_owned(),
    }
}

/// What `#[job]` generates for a fn returning `Result<T, JobError>`.
#[doc(hidden)]
pub fn store_output<T: Serialize>(
    ctx: &JobContext,
    result: Result<T, JobError>,
) -> Result<(), JobError> {
    ctx.set_output(&result?)
}

/// The return type of a `#[job]` fn that the macro cannot read as
/// `Result<T, JobError>` (its last path segment is not `Result`: a type
/// alias such as `JobResult<T>`): it must be `Result<(), JobError>`, as the
/// generated `Job::run` takes it; any other type is this trait's error,
/// which says what to write. Before, such an alias of `Result<T, JobError>`
/// failed with an error about a `Result<(), JobError>` the user never wrote.
#[doc(hidden)]
#[diagnostic::on_unimplemented(
    message = "#[job] cannot read the value type of the return type `{Self}`",
    label = "write the return type as `Result<T, JobError>`",
    note = "#[job] reads the value `T` it stores from the tokens `Result<T, JobError>`: \
            through a type alias (`JobResult<T>`) it sees none, and then the type must be \
            `Result<(), JobError>`"
)]
pub trait UnreadJobResult {
    /// The fn's result, as `Job::run` returns it.
    fn into_job_result(self) -> Result<(), JobError>;
}

impl UnreadJobResult for Result<(), JobError> {
    fn into_job_result(self) -> Result<(), JobError> {
        self
    }
}

/// What `#[job]` generates for a fn whose return type it cannot read
/// ([`UnreadJobResult`]).
#[doc(hidden)]
pub fn unread_result<R: UnreadJobResult>(result: R) -> Result<(), JobError> {
    result.into_job_result()
}

impl Queue {
    /// Waits for job `id` of `J`'s queue to finish and returns its value,
    /// without polling: the job is checked, then this call blocks (its own
    /// connection, `BLPOP`) until the script that finishes the job wakes it
    /// or `timeout` passes. A job that already finished answers at once (for
    /// the completion retention, 24 h by default).
    ///
    /// Errors: [`WaitError::Dead`] (with the reason; `is_expired()` for a
    /// job not started before its deadline), [`WaitError::Cancelled`],
    /// [`WaitError::Timeout`], [`WaitError::NotFound`].
    ///
    /// ```
    /// use std::time::Duration;
    /// use queue_core::{job, JobContext, JobError, Queue, Worker};
    ///
    /// #[job(queue = "math")]
    /// async fn add(_ctx: JobContext, args: (u32, u32)) -> Result<u32, JobError> {
    ///     Ok(args.0 + args.1)
    /// }
    ///
    /// # #[tokio::main] async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let server = queue_testkit::RedisServer::start().unwrap();
    /// let queue = Queue::connect(&server.url()).await?;
    /// let worker = Worker::builder(&server.url()).register(add::handler()).build().await?;
    /// let shutdown = worker.shutdown_handle();
    /// let running = tokio::spawn(worker.run());
    ///
    /// let id = add::enqueue(&queue, (2, 3)).await?;
    /// let sum = queue.wait_result::<add::Job>(id, Duration::from_secs(10)).await?;
    /// assert_eq!(sum, 5);
    /// // Or both in one call:
    /// let sum = queue.enqueue_and_wait::<add::Job>(&(4, 5), Duration::from_secs(10)).await?;
    /// assert_eq!(sum, 9);
    /// # shutdown.shutdown(); running.await??; Ok(()) }
    /// ```
    pub async fn wait_result<J: JobOutput>(
        &self,
        id: impl Into<JobId>,
        timeout: Duration,
    ) -> Result<J::Output, WaitError> {
        let id = id.into();
        let record = self.wait_completion(J::QUEUE, &id, timeout).await?;
        decode_output::<J::Output>(J::QUEUE, &id, &record)
    }

    /// Enqueues a `J` job (random id) and waits for its value:
    /// [`enqueue`](Self::enqueue), then [`wait_result`](Self::wait_result).
    ///
    /// A `Queue` that cannot wait (made with
    /// [`from_connection`](Self::from_connection): it has no URL to open the
    /// blocking connection) is refused before anything is enqueued
    /// ([`QueueError::Config`]). Every error after the enqueue names the
    /// job: its id is the only handle on a job that was written.
    pub async fn enqueue_and_wait<J: JobOutput>(
        &self,
        args: &J::Args,
        timeout: Duration,
    ) -> Result<J::Output, WaitError> {
        // Checked first: before, the job was enqueued, then the wait failed
        // with this error, which names no job, leaving a job in main that
        // the caller could neither wait for nor find.
        self.wait_pool(J::QUEUE)?;
        let id = self.enqueue::<J>(args).await?;
        self.wait_result::<J>(id, timeout).await
    }

    /// The untyped [`wait_result`](Self::wait_result): the completion record
    /// (field → raw value; `result` holds the MessagePack value) of a job
    /// that completed, or the same errors.
    pub async fn wait_completion(
        &self,
        queue: &str,
        id: &JobId,
        timeout: Duration,
    ) -> Result<BTreeMap<String, Vec<u8>>, WaitError> {
        let keys = QueueKeys::new(queue);
        // None: a timeout too long to add to the clock (`Duration::MAX`),
        // which is no deadline at all.
        let until = tokio::time::Instant::now().checked_add(timeout);
        let mut conn = self.connection();
        let mut blocking: Option<Taken<'_>> = None;
        let mut woken = false;
        let mut pending = false;
        // A failure worth waiting out (`worth_waiting_out`: a broken
        // connection, a failover) is retried until the deadline, for at
        // most RECONNECT_WINDOW in a row; before, the first one ended the
        // wait with an error although the job went on and completed.
        let mut failing_since: Option<tokio::time::Instant> = None;
        let mut backoff = RECONNECT_FIRST;
        loop {
            let step = self
                .wait_step(&keys, id, &mut conn, &mut blocking, woken, pending, until)
                .await;
            match step {
                Ok(Step::Done(outcome)) => {
                    return outcome.map_err(|e| e.into_wait_error(queue, id, timeout))
                }
                Ok(Step::Again {
                    woken: w,
                    pending: p,
                }) => {
                    (woken, pending) = (w, p);
                    failing_since = None;
                    backoff = RECONNECT_FIRST;
                }
                Err(e) if worth_waiting_out(&e) => {
                    // The connection it failed on is not given back, nor the
                    // idle ones, most likely broken by the same cause.
                    if let Some(mut taken) = blocking.take() {
                        taken.forget();
                    }
                    if let Some(pool) = self.waits.as_deref() {
                        pool.clear();
                    }
                    let now = tokio::time::Instant::now();
                    let since = *failing_since.get_or_insert(now);
                    let give_up = since + RECONNECT_WINDOW;
                    let give_up = until.map_or(give_up, |u| u.min(give_up));
                    if now >= give_up {
                        return Err(e.into());
                    }
                    tracing::warn!(queue = %queue, job_id = %id, error = %e,
                        "result wait: the connection failed; checking the job again");
                    tokio::time::sleep(backoff.min(give_up - now)).await;
                    backoff = (backoff * 2).min(RECONNECT_MAX);
                    // A wake-up may have been pushed while the connection was
                    // down: the check after a failure treats it as a wake.
                    woken = true;
                }
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// One check of the job and, when it is not finished, one `BLPOP`.
    #[allow(clippy::too_many_arguments)]
    async fn wait_step<'p>(
        &'p self,
        keys: &QueueKeys,
        id: &JobId,
        conn: &mut RedisConnection,
        blocking: &mut Option<Taken<'p>>,
        woken: bool,
        pending: bool,
        until: Option<tokio::time::Instant>,
    ) -> Result<Step, QueueError> {
        let queue = keys.queue.as_str();
        let state = ResultWait {
            keys,
            id,
            woken,
            was_pending: pending,
        }
        .run(conn)
        .await?;
        let pending = match state {
            WaitState::Finished(record) => {
                return Ok(Step::Done(match record.get("status").map(Vec::as_slice) {
                    Some(b"cancelled") => Err(Ended::Cancelled),
                    _ => Ok(record),
                }))
            }
            WaitState::Dead(reason) => return Ok(Step::Done(Err(Ended::Dead(reason)))),
            WaitState::Unknown => return Ok(Step::Done(Err(Ended::NotFound))),
            WaitState::Waiting => false,
            WaitState::Pending => true,
        };
        let left = match until {
            Some(until) => until.saturating_duration_since(tokio::time::Instant::now()),
            None => MAX_BLOCK,
        };
        if left.is_zero() {
            return Ok(Step::Done(Err(Ended::Timeout)));
        }
        // Each BLPOP blocks at most MAX_BLOCK; a longer wait loops. A
        // callback not created yet is checked again every PENDING_RECHECK:
        // a batch fired by an older queue-core version (rolling deploy)
        // creates it without waking this waiter.
        let cap = if pending { PENDING_RECHECK } else { MAX_BLOCK };
        let block = left.min(cap);
        // Asked for only now that the wait blocks: a `Queue` without one
        // (made from a connection) still answers a job that already finished.
        let pool = self.wait_pool(queue)?;
        let taken = match blocking {
            Some(taken) => taken,
            None => blocking.insert(pool.take(queue, id).await?),
        };
        let secs = block.max(Duration::from_millis(1)).as_secs_f64();
        let mut cmd = redis::cmd("BLPOP");
        cmd.arg(keys.notify(id.as_str())).arg(format!("{secs:.3}"));
        let blpop = cmd.query_async::<Option<(String, String)>>(taken.for_blpop());
        // Bounded here, not by the connection: a pooled connection serves
        // blocks of every length.
        let bound = pool.blpop_bound(block);
        let popped = match tokio::time::timeout(bound, blpop).await {
            Ok(reply) => reply.map_err(|e| QueueError::redis(queue, Some(id), e))?,
            Err(_) => {
                return Err(QueueError::redis(
                    queue,
                    Some(id),
                    redis::RedisError::from(std::io::Error::new(
                        std::io::ErrorKind::TimedOut,
                        "no answer to BLPOP within its block and the response timeout",
                    )),
                ))
            }
        };
        taken.answered();
        let woken = popped.is_some();
        tracing::debug!(queue = %queue, job_id = %id, woken, "result wait: re-checking the job");
        Ok(Step::Again { woken, pending })
    }

    /// The idle blocking connections of this `Queue`'s waits; a `Queue`
    /// made [`from_connection`](Self::from_connection) has none
    /// ([`QueueError::Config`]).
    fn wait_pool(&self, queue: &str) -> Result<&WaitConnections, QueueError> {
        self.waits.as_deref().ok_or_else(|| {
            QueueError::Config(format!(
                "queue `{queue}`: waiting for a result needs a Queue made with Queue::connect (it opens its own connection to block on)"
            ))
        })
    }
}

/// The longest one `BLPOP` of [`Queue::wait_completion`] blocks (a longer
/// wait, up to `Duration::MAX`, blocks again): its seconds stay a number
/// Redis takes, and the blocking connection's response timeout one the
/// clock can add.
pub(crate) const MAX_BLOCK: Duration = Duration::from_secs(24 * 3600);

/// The longest one `BLPOP` of [`Queue::wait_completion`] blocks while the
/// job is a callback of a sealed batch not created yet: the fire of an
/// older queue-core version (during a rolling deploy) neither moves the
/// waiter onto the job it creates nor wakes it, so the waiter looks again.
const PENDING_RECHECK: Duration = Duration::from_secs(2);

/// The first pause of a wait after a failure worth waiting out; doubled
/// after each further one, up to [`RECONNECT_MAX`].
const RECONNECT_FIRST: Duration = Duration::from_millis(100);
/// The longest pause between two checks of a wait whose connection fails.
const RECONNECT_MAX: Duration = Duration::from_secs(2);
/// How long a wait goes on checking again through failures worth waiting
/// out, in a row (a Sentinel failover takes seconds; a Redis gone for
/// longer is reported, the deadline permitting).
const RECONNECT_WINDOW: Duration = Duration::from_secs(30);

/// What one check-and-block of a wait came to.
enum Step {
    /// The wait is over.
    Done(Result<BTreeMap<String, Vec<u8>>, Ended>),
    /// Check again (`woken`: the `BLPOP` popped a wake-up).
    Again { woken: bool, pending: bool },
}

/// Why a wait ended without a record.
enum Ended {
    Cancelled,
    Dead(String),
    NotFound,
    Timeout,
}

impl Ended {
    fn into_wait_error(self, queue: &str, id: &JobId, waited: Duration) -> WaitError {
        let (queue, id) = (queue.to_string(), id.clone());
        match self {
            Ended::Cancelled => WaitError::Cancelled { queue, id },
            Ended::Dead(reason) => WaitError::Dead { queue, id, reason },
            Ended::NotFound => WaitError::NotFound { queue, id },
            Ended::Timeout => WaitError::Timeout { queue, id, waited },
        }
    }
}

/// The `T` of a completion record: its `result` field as MessagePack; a
/// `()` output ignores the field (it may hold a `set_result_ref` text).
fn decode_output<T: DeserializeOwned + 'static>(
    queue: &str,
    id: &JobId,
    record: &BTreeMap<String, Vec<u8>>,
) -> Result<T, WaitError> {
    const NIL: &[u8] = &[0xc0];
    let bytes = match record.get("result").and_then(|b| b.split_first()) {
        _ if TypeId::of::<T>() == TypeId::of::<()>() => NIL,
        Some((&OUTPUT_MARK, msgpack)) => msgpack,
        _ => NIL,
    };
    rmp_serde::from_slice(bytes).map_err(|e| WaitError::Decode {
        queue: queue.to_string(),
        id: id.clone(),
        detail: format!(
            "{e} (the completion record has no MessagePack value of the job's output type)"
        ),
    })
}
