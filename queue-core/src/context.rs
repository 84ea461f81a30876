//! [`JobContext`]: what a handler knows about the delivery it runs — the
//! stable job id, the attempt, the idempotency key and fencing token, lease
//! loss and cancel signals, and `ctx.step(..)` results written under the
//! delivery's token (DESIGN rules 3 and 7, docs/DESIGN.md).

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::job::{JobError, JobId};

/// What a handler knows about the delivery it is running.
///
/// Use [`idempotency_key`](Self::idempotency_key) for external APIs (payment
/// providers accept one) and [`attempt`](Self::attempt) to tell a first run
/// from a retry. A worker makes one per delivery; tests make one with
/// [`for_test`](Self::for_test) and call the handler directly:
///
/// ```
/// use queue_core::JobContext;
/// let ctx = JobContext::for_test("order-7", "billing", 2); // second delivery
/// assert_eq!((ctx.job_id().as_str(), ctx.queue(), ctx.attempt()), ("order-7", "billing", 2));
/// ```
#[derive(Clone)]
pub struct JobContext {
    pub(crate) inner: Arc<ContextInner>,
}

pub(crate) struct ContextInner {
    pub(crate) job_id: JobId,
    /// The delivery's queue and its keys (shared with the worker: no copy
    /// of the name per job, issue #12).
    pub(crate) keys: Arc<crate::keys::QueueKeys>,
    pub(crate) job_type: String,
    pub(crate) attempt: u32,
    pub(crate) max_attempts: u32,
    pub(crate) enqueued_at_ms: i64,
    pub(crate) delivered_at_ms: i64,
    pub(crate) fence: u64,
    /// This delivery's lease token (step results are fenced by it).
    pub(crate) token: String,
    /// This delivery's lease on the local clock (lost flag + deadline).
    pub(crate) lease: crate::lease_clock::LeaseClock,
    pub(crate) conn: Option<crate::conn::RedisConnection>,
    /// The `result` field of the completion record: [`JobContext::set_result_ref`]
    /// text, or the MessagePack of the handler's value ([`JobContext::set_output`]).
    pub(crate) result_ref: std::sync::Mutex<Option<Vec<u8>>>,
    /// Set by the heartbeat when an operator asked to cancel the job.
    pub(crate) cancel: CancelFlag,
}

/// An operator's cancel request for one delivery: set by the heartbeat
/// (worker/heartbeat.rs), read by the handler. A flag and a `Notify` rather
/// than a `watch` channel: a watch sender wakes its eight waiter lists when
/// it is dropped, ~420 instructions for every job, cancelled or not (issue
/// #12).
#[derive(Debug, Default)]
pub(crate) struct CancelFlag {
    set: AtomicBool,
    changed: tokio::sync::Notify,
}

impl CancelFlag {
    /// Marks the delivery cancelled and wakes its waiters; true when it
    /// already was.
    pub(crate) fn set(&self) -> bool {
        let was = self.set.swap(true, Ordering::AcqRel);
        if !was {
            self.changed.notify_waiters();
        }
        was
    }

    /// Whether the delivery was cancelled.
    pub(crate) fn is_set(&self) -> bool {
        self.set.load(Ordering::Acquire)
    }

    /// Resolves once the delivery is cancelled. The waiter is registered
    /// before the flag is read, so a `set` between the two is not missed.
    pub(crate) async fn wait(&self) {
        loop {
            let notified = self.changed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.is_set() {
                return;
            }
            notified.await;
        }
    }
}

impl fmt::Debug for JobContext {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("JobContext")
            .field("job_id", &self.inner.job_id)
            .field("queue", &self.inner.keys.queue)
            .field("job_type", &self.inner.job_type)
            .field("attempt", &self.inner.attempt)
            .field("max_attempts", &self.inner.max_attempts)
            .finish()
    }
}

impl JobContext {
    /// A context for calling a handler directly in unit tests, without Redis.
    ///
    /// ```
    /// let ctx = queue_core::JobContext::for_test("job-1", "emails", 1);
    /// assert_eq!(ctx.job_id().as_str(), "job-1");
    /// assert_eq!(ctx.attempt(), 1);
    /// ```
    pub fn for_test(job_id: impl Into<JobId>, queue: &str, attempt: u32) -> Self {
        Self::test_context("test", job_id.into(), queue, attempt)
    }

    /// [`for_test`](Self::for_test) with a job type (`for_test` says
    /// `"test"`), for code that tells job types apart.
    ///
    /// ```
    /// let ctx = queue_core::JobContext::for_test_of_type("send_invoice", "job-1", "emails", 1);
    /// assert_eq!(ctx.job_type(), "send_invoice");
    /// ```
    pub fn for_test_of_type(
        job_type: &str,
        job_id: impl Into<JobId>,
        queue: &str,
        attempt: u32,
    ) -> Self {
        Self::test_context(job_type, job_id.into(), queue, attempt)
    }

    fn test_context(job_type: &str, job_id: JobId, queue: &str, attempt: u32) -> Self {
        JobContext {
            inner: Arc::new(ContextInner {
                job_id,
                keys: Arc::new(crate::keys::QueueKeys::new(queue)),
                job_type: job_type.to_string(),
                attempt,
                max_attempts: attempt.max(1),
                enqueued_at_ms: 0,
                delivered_at_ms: 0,
                fence: attempt as u64,
                token: String::new(),
                lease: crate::lease_clock::LeaseClock::unbounded(),
                conn: None,
                result_ref: std::sync::Mutex::new(None),
                cancel: CancelFlag::default(),
            }),
        }
    }

    /// The job id: stable across retries and redeliveries.
    pub fn job_id(&self) -> &JobId {
        &self.inner.job_id
    }

    /// The queue the job came from.
    pub fn queue(&self) -> &str {
        &self.inner.keys.queue
    }

    /// The job type name.
    pub fn job_type(&self) -> &str {
        &self.inner.job_type
    }

    /// 1 on the first delivery, 2 on the first retry, ... (at most
    /// `u32::MAX`).
    pub fn attempt(&self) -> u32 {
        self.inner.attempt
    }

    /// The job's attempt limit. A larger stored limit (a producer in another
    /// language may store any non-negative integer) reads as `u32::MAX`; the
    /// retry decision uses the stored value.
    pub fn max_attempts(&self) -> u32 {
        self.inner.max_attempts
    }

    /// Enqueue time, milliseconds since the Unix epoch, Redis clock.
    pub fn enqueued_at_ms(&self) -> i64 {
        self.inner.enqueued_at_ms
    }

    /// This delivery's claim time, milliseconds since the Unix epoch, Redis clock.
    pub fn delivered_at_ms(&self) -> i64 {
        self.inner.delivered_at_ms
    }

    /// This delivery's fencing token: a number that grows with every delivery
    /// of this job (claims, retries, watchdog returns, replays) and is never
    /// reused. Pass it with a write to a system that keeps the highest token
    /// it has seen per job and refuses smaller ones: a stale worker whose
    /// lease was lost (and whose job now runs elsewhere with a larger token)
    /// is then refused instead of overwriting the newer delivery's work.
    /// [`lease_lost`](Self::lease_lost) tells the handler early; the fence
    /// is what makes the store itself safe, even against a worker that was
    /// paused between its check and its write.
    ///
    /// In SQL the guarded write is one statement:
    /// `UPDATE invoices SET status = $1, fence = $2 WHERE id = $3 AND fence < $2`
    /// (zero rows updated: a newer delivery already wrote; stop). The same
    /// rule with an in-memory store:
    ///
    /// ```
    /// use std::collections::HashMap;
    /// use queue_core::{JobContext, JobError};
    ///
    /// /// Keeps, per record, the highest fence that wrote it.
    /// #[derive(Default)]
    /// struct Store { rows: HashMap<String, (u64, String)> }
    /// impl Store {
    ///     fn write(&mut self, key: &str, fence: u64, value: &str) -> Result<(), JobError> {
    ///         match self.rows.get(key) {
    ///             Some((seen, _)) if *seen >= fence => Err(JobError::permanent(format!(
    ///                 "stale writer: fence {fence} <= {seen}"
    ///             ))),
    ///             _ => {
    ///                 self.rows.insert(key.into(), (fence, value.into()));
    ///                 Ok(())
    ///             }
    ///         }
    ///     }
    /// }
    ///
    /// let mut store = Store::default();
    /// // Delivery 1 stalls; the job is reclaimed and delivery 2 runs and writes.
    /// let stale = JobContext::for_test("invoice-7", "billing", 1);
    /// let fresh = JobContext::for_test("invoice-7", "billing", 2);
    /// assert!(fresh.fencing_token() > stale.fencing_token());
    /// store.write("invoice-7", fresh.fencing_token(), "sent").unwrap();
    /// // The stale delivery wakes up and tries to write: refused.
    /// assert!(store.write("invoice-7", stale.fencing_token(), "draft").is_err());
    /// assert_eq!(store.rows["invoice-7"].1, "sent");
    /// ```
    pub fn fencing_token(&self) -> u64 {
        self.inner.fence
    }

    /// A key that is the same on every delivery of this job: pass it to external
    /// APIs that deduplicate requests (`Idempotency-Key` headers). Its form
    /// is `<queue>:<job id>`, so a stable job id (a business key, see
    /// `enqueue_with_id`) gives a stable key across re-enqueues too.
    ///
    /// ```
    /// use queue_core::JobContext;
    /// let first = JobContext::for_test("order-7", "billing", 1);
    /// let retry = JobContext::for_test("order-7", "billing", 2);
    /// assert_eq!(first.idempotency_key(), "billing:order-7");
    /// assert_eq!(retry.idempotency_key(), first.idempotency_key());
    /// ```
    pub fn idempotency_key(&self) -> String {
        format!("{}:{}", self.inner.keys.queue, self.inner.job_id)
    }

    /// True once this delivery may no longer own its job, so another worker
    /// may be running it: either an extend found another token (the job was
    /// reclaimed), or the local lease deadline passed without a confirmed
    /// extend (Redis unreachable or too slow to answer the heartbeat).
    ///
    /// The deadline is kept on this process's monotonic clock, measured from
    /// *before* the claim (then each successful extend) was sent, and counts
    /// only 90 % of the lease, so it passes before Redis can give the job to
    /// anyone else. Once true it stays true. A long handler should check it
    /// before each side effect and stop early (return an error); its result
    /// will be discarded if the job was indeed reclaimed. Pair it with
    /// [`fencing_token`](Self::fencing_token) where the target store allows.
    ///
    /// ```
    /// let ctx = queue_core::JobContext::for_test("job-1", "emails", 1);
    /// assert!(!ctx.lease_lost()); // a test context has no deadline
    /// ```
    pub fn lease_lost(&self) -> bool {
        self.inner.lease.is_lost()
    }

    /// True once the heartbeat found that an operator asked to cancel this
    /// job ([`Queue::cancel`](crate::Queue::cancel)). A cooperative handler
    /// stops and returns an error: the job then ends cancelled, never retried
    /// nor dead-lettered. (A handler that returns `Ok` completes as usual.)
    pub fn cancelled(&self) -> bool {
        self.inner.cancel.is_set()
    }

    /// Resolves once an operator asked to cancel this job (seen at the next
    /// heartbeat); pending forever otherwise. Race it against the work:
    ///
    /// ```
    /// # use queue_core::{JobContext, JobError};
    /// async fn handler(ctx: JobContext) -> Result<(), JobError> {
    ///     tokio::select! {
    ///         _ = tokio::time::sleep(std::time::Duration::from_millis(10)) => Ok(()),
    ///         _ = ctx.until_cancelled() => Err(JobError::permanent("cancelled")),
    ///     }
    /// }
    /// # #[tokio::main] async fn main() {
    /// # assert!(handler(JobContext::for_test("j", "q", 1)).await.is_ok());
    /// # }
    /// ```
    pub async fn until_cancelled(&self) {
        self.inner.cancel.wait().await
    }

    /// An idempotency key for one named step of this job, e.g. for a second
    /// external call in the same handler: `"<queue>:<job id>:<step>"`.
    pub fn step_key(&self, step: &str) -> String {
        format!("{}:{}:{}", self.inner.keys.queue, self.inner.job_id, step)
    }

    /// Records a reference to the job's result (an invoice number, a storage
    /// path, ...) in the completion record written with the ack. At most
    /// [`MAX_RESULT_BYTES`](crate::MAX_RESULT_BYTES): a longer one is not
    /// kept (the job completes without it).
    pub fn set_result_ref(&self, reference: impl Into<String>) {
        if let Ok(mut slot) = self.inner.result_ref.lock() {
            *slot = Some(reference.into().into_bytes());
        }
    }

    pub(crate) fn take_result_ref(&self) -> Option<Vec<u8>> {
        self.inner
            .result_ref
            .lock()
            .ok()
            .and_then(|mut slot| slot.take())
    }

    /// Records the job's progress (`done`: in the handler's unit — percent,
    /// items, bytes — and a short message, at most 1024 bytes kept) on the
    /// job hash, where `queue-watchdog jobs show` and the dashboard's job
    /// page show it (fields `progress`, `progress_message`, `progress_at`).
    /// Token-checked (`progress.lua`): a stale delivery whose lease was lost
    /// writes nothing and gets an error (and [`lease_lost`](Self::lease_lost)
    /// turns true). One Redis call; outside a worker it does nothing.
    ///
    /// ```
    /// # use queue_core::{JobContext, JobError};
    /// async fn import(ctx: JobContext, rows: Vec<String>) -> Result<(), JobError> {
    ///     for (i, _row) in rows.iter().enumerate() {
    ///         // ... import one row ...
    ///         if i % 100 == 0 {
    ///             ctx.progress((i * 100 / rows.len()) as u64, "importing").await?;
    ///         }
    ///     }
    ///     Ok(())
    /// }
    /// # tokio::runtime::Runtime::new().unwrap().block_on(async {
    /// # import(JobContext::for_test("j", "q", 1), vec!["a".into()]).await.unwrap();
    /// # });
    /// ```
    pub async fn progress(&self, done: u64, message: &str) -> Result<(), JobError> {
        let Some(conn) = &self.inner.conn else {
            return Ok(());
        };
        let keys = &*self.inner.keys;
        let stored = crate::scripts::progress::Progress {
            keys,
            id: &self.inner.job_id,
            token: &self.inner.token,
            done,
            message,
        }
        .run(&mut conn.clone())
        .await
        .map_err(|e| JobError::retryable(format!("progress not stored: {e}")))?;
        if !stored {
            self.inner.lease.mark_lost();
            return Err(JobError::retryable(
                "progress not stored: this delivery lost its lease",
            ));
        }
        Ok(())
    }

    /// Runs `f` once per job: its result is stored in Redis under the job and
    /// step name, and a retried or redelivered job gets the stored result back
    /// without running `f` again.
    ///
    /// This makes a *completed* step safe to retry. A crash after `f`'s side
    /// effect and before the result is stored still runs `f` again, so pass
    /// [`step_key`](Self::step_key) to external APIs that deduplicate.
    /// The result is stored only while this delivery still owns the job
    /// (a token-checked script): a stale delivery gets an error, stores
    /// nothing and sees [`lease_lost`](Self::lease_lost) turn true. Step
    /// results expire 7 days after the last step at the latest, and with the
    /// completion record once the job completes. Outside a worker
    /// (a context from [`JobContext::for_test`]) `f` simply runs.
    ///
    /// A step's result type is a stored contract, like the job's args: a
    /// retry after a deploy reads the result the previous version stored.
    /// Adding a field with `#[serde(default)]` (or an `Option`) is safe; to
    /// change the type otherwise, rename the step (`"charge"` to
    /// `"charge_v2"`), so the new code runs it afresh (with a new
    /// [`step_key`](Self::step_key): the old side effect is not deduplicated
    /// against the new one). A stored result that does not decode fails the
    /// delivery with a *retryable* error naming the job, queue and step:
    /// during a rolling deploy a worker of the old version may still finish
    /// the job; once attempts run out it is dead-lettered with that message.
    ///
    /// ```
    /// # use queue_core::{JobContext, JobError};
    /// async fn charge(ctx: &JobContext, cents: u64) -> Result<String, JobError> {
    ///     ctx.step("charge", || async move {
    ///         // call the payment API with ctx.step_key("charge") as its idempotency key
    ///         Ok(format!("charge-{cents}"))
    ///     })
    ///     .await
    /// }
    /// # tokio::runtime::Runtime::new().unwrap().block_on(async {
    /// let ctx = JobContext::for_test("job-1", "billing", 1);
    /// assert_eq!(charge(&ctx, 500).await.unwrap(), "charge-500");
    /// # });
    /// ```
    pub async fn step<T, F, Fut>(&self, name: &str, f: F) -> Result<T, JobError>
    where
        T: Serialize + DeserializeOwned,
        F: FnOnce() -> Fut,
        Fut: std::future::Future<Output = Result<T, JobError>>,
    {
        let Some(conn) = &self.inner.conn else {
            return f().await;
        };
        let mut conn = conn.clone();
        let keys = &*self.inner.keys;
        let key = keys.steps(self.inner.job_id.as_str());
        let stored: Option<Vec<u8>> = redis::cmd("HGET")
            .arg(&key)
            .arg(name)
            .query_async(&mut conn)
            .await
            .map_err(|e| JobError::retryable(format!("cannot read step `{name}`: {e}")))?;
        if let Some(bytes) = stored {
            tracing::debug!(step = name, "step already done; using its stored result");
            return rmp_serde::from_slice(&bytes).map_err(|e| {
                let (id, queue) = (&self.inner.job_id, &keys.queue);
                tracing::warn!(
                    job_id = %id,
                    queue = %queue,
                    step = name,
                    error = %e,
                    "stored step result does not decode as the step's result type; retrying"
                );
                // Retryable, not permanent: during a rolling deploy the worker
                // that wrote the result (the previous version of this handler)
                // may still be running and can finish the job on a retry.
                JobError::retryable(format!(
                    "job {id} on queue `{queue}`: the stored result of step `{name}` does not \
                     decode as this handler's result type ({e}); a step's result type is a \
                     stored contract: to change it, rename the step (e.g. `{name}_v2`)"
                ))
            });
        }
        let value = f().await?;
        let bytes = rmp_serde::to_vec_named(&value).map_err(|e| {
            JobError::permanent(format!("result of step `{name}` does not encode: {e}"))
        })?;
        let record = crate::scripts::step_record::StepRecord {
            keys,
            id: &self.inner.job_id,
            token: &self.inner.token,
            name,
            value: &bytes,
            ttl: crate::scripts::step_record::STEP_TTL,
        };
        let reply = record.run(&mut conn).await.map_err(|e| {
            JobError::retryable(format!(
                "step `{name}` ran but its result could not be stored: {e}"
            ))
        })?;
        if reply == crate::scripts::step_record::StepReply::LeaseLost {
            self.inner.lease.mark_lost();
            tracing::warn!(
                step = name,
                "step result not stored: this delivery lost its lease"
            );
            return Err(JobError::retryable(format!(
                "step `{name}` ran but its result was not stored: the lease was lost (the job was reclaimed or finished elsewhere)"
            )));
        }
        tracing::debug!(step = name, "step done and recorded");
        Ok(value)
    }

    /// Acquires a distributed lock from inside a handler (same Redis as the
    /// queue). See [`Lock`](crate::Lock). Fails with a retryable error outside a worker
    /// or when Redis fails; a lock name or options `Lock::acquire` refuses
    /// is a permanent error (a retry is refused the same way).
    pub async fn lock(
        &self,
        name: &str,
        options: crate::LockOptions,
    ) -> Result<Option<crate::LockGuard>, JobError> {
        let Some(conn) = &self.inner.conn else {
            return Err(JobError::retryable(
                "locks need a worker's Redis connection",
            ));
        };
        crate::Lock::acquire(conn.clone(), name, options)
            .await
            .map_err(|e| match e {
                crate::LockError::Redis { .. } => JobError::retryable(e),
                _ => JobError::permanent(e),
            })
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use super::CancelFlag;

    /// A handler waiting on the flag wakes when the heartbeat sets it; one
    /// that looks after it was set does not wait; setting it twice reports
    /// the first.
    #[tokio::test]
    async fn a_cancel_reaches_a_waiter_registered_before_or_after_it() {
        let flag = Arc::new(CancelFlag::default());
        assert!(!flag.is_set());
        let waiter = tokio::spawn({
            let flag = flag.clone();
            async move { flag.wait().await }
        });
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!waiter.is_finished(), "no cancel yet");
        assert!(!flag.set(), "the first set");
        tokio::time::timeout(Duration::from_secs(5), waiter)
            .await
            .expect("the waiter wakes")
            .unwrap();
        assert!(flag.is_set());
        assert!(flag.set(), "already set");
        tokio::time::timeout(Duration::from_secs(5), flag.wait())
            .await
            .expect("a wait after the set returns at once");
    }
}
