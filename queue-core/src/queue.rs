//! The producer side: [`Queue`] enqueues jobs, alone or as a pipelined
//! batch, through `scripts/enqueue.rs`. An enqueue returns `Ok` only after
//! Redis confirmed the write (DESIGN rule 8, docs/DESIGN.md), and a stable id
//! makes a second enqueue a no-op that says so (rule 7).
//!
//! A call whose request may have reached Redis without an answer (timeout,
//! reset, broken pipe) is sent again, for at most [`Queue::retry_window`],
//! with the same id and the same per-call enqueue token (`enq_token`, stored
//! on the job): a retry that finds its own token reports `Created`, any other
//! call with the id still gets `Duplicate`. A job whose id the `Queue`
//! generated sends no token: that id exists only through this call, so a
//! retry that finds it reports `Created` (`EnqueueOutcome::of_call`).

use std::future::Future;
use std::ops::Range;
use std::time::Duration;

use redis::Value;
use tracing::{debug, warn};

use crate::conn::{connect, ConnectionConfig, RedisConnection};
use crate::enqueue_group::{send_alone, GroupCommit, PendingJob};
use crate::enqueue_options::{check_arg_lens, check_extra_fields, check_id, check_queue_name};
pub use crate::enqueue_options::{EnqueueOptions, EnqueueOutcome, Enqueued};
use crate::error::{QueueError, Result};
use crate::job::random_uuid;
use crate::job::{Job, JobId};
use crate::keys::QueueKeys;
use crate::keys_cache::KeysCache;
use crate::scripts::enqueue::Enqueue;
use crate::scripts::enqueue_many::{self, ManyJob, ManyReply, Mode, MAX_JOBS_PER_CALL};
use crate::scripts::{self, reply};

/// A handle for enqueuing jobs. Cheap to clone; share one per process
/// (e.g. in your web framework's state).
///
/// ```
/// # use queue_core::{BoxFuture, Job, JobContext, JobError, Queue};
/// # struct Ping;
/// # impl Job for Ping {
/// #     type Args = String;
/// #     const NAME: &'static str = "ping";
/// #     const QUEUE: &'static str = "default";
/// #     fn run(_: JobContext, _: String) -> BoxFuture<'static, Result<(), JobError>> { Box::pin(async { Ok(()) }) }
/// # }
/// # #[tokio::main] async fn main() -> Result<(), queue_core::QueueError> {
/// # let server = queue_testkit::RedisServer::start().unwrap();
/// # let url = server.url();
/// let queue = Queue::connect(&url).await?;
/// let id = queue.enqueue::<Ping>(&"hello".to_string()).await?;
/// // Same business key twice: the second call is a no-op that says so.
/// let first = queue.enqueue_with_id::<Ping>("order-7", &"hi".to_string()).await?;
/// let again = queue.enqueue_with_id::<Ping>("order-7", &"hi".to_string()).await?;
/// assert!(first.is_new() && !again.is_new());
/// # let _ = id; Ok(()) }
/// ```
#[derive(Clone)]
pub struct Queue {
    conn: RedisConnection,
    retry_window: Duration,
    /// The URL and settings it connected with (`None` from
    /// [`Queue::from_connection`]): where [`Queue::events`] and
    /// `wait_result` open their own blocking connection (docs/EVENTS.md,
    /// docs/RESULTS.md).
    pub(crate) origin: Option<std::sync::Arc<(String, ConnectionConfig)>>,
    /// The idle blocking connections of result waits (`wait_conns.rs`),
    /// shared by the clones; `None` with `origin`.
    pub(crate) waits: Option<crate::wait_conns::SharedWaitConnections>,
    /// Group commit of concurrent single enqueues (`enqueue_group.rs`),
    /// shared by the clones; `None`: every call is sent alone.
    group: Option<std::sync::Arc<GroupCommit>>,
    /// The keys of the queues enqueued to, built once each (`keys_cache.rs`),
    /// shared by the clones.
    keys: std::sync::Arc<KeysCache>,
    /// The longest argument (payload, extra field) sent
    /// ([`Queue::with_max_arg_len`]).
    max_arg_len: usize,
}

/// Default of [`Queue::max_arg_len`]: Redis' default `proto-max-bulk-len`.
const DEFAULT_MAX_ARG_LEN: usize = 512 << 20;

/// Default of [`Queue::retry_window`].
const DEFAULT_RETRY_WINDOW: Duration = Duration::from_secs(5);

impl std::fmt::Debug for Queue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Queue").finish_non_exhaustive()
    }
}

impl Queue {
    /// Connects to Redis (`redis://host:port/db`). Fails at once if Redis is unreachable.
    pub async fn connect(url: &str) -> Result<Self> {
        Self::connect_with(url, &ConnectionConfig::default()).await
    }

    /// Connects with explicit timeouts.
    pub async fn connect_with(url: &str, cfg: &ConnectionConfig) -> Result<Self> {
        Ok(Queue {
            conn: connect(url, cfg).await?,
            retry_window: DEFAULT_RETRY_WINDOW,
            group: Some(Default::default()),
            keys: Default::default(),
            max_arg_len: DEFAULT_MAX_ARG_LEN,
            origin: Some(std::sync::Arc::new((url.to_string(), cfg.clone()))),
            waits: Some(std::sync::Arc::new(
                crate::wait_conns::WaitConnections::new(url, cfg, crate::results::MAX_BLOCK),
            )),
        })
    }

    /// Wraps an existing connection.
    pub fn from_connection(conn: RedisConnection) -> Self {
        Queue {
            conn,
            retry_window: DEFAULT_RETRY_WINDOW,
            group: Some(Default::default()),
            keys: Default::default(),
            max_arg_len: DEFAULT_MAX_ARG_LEN,
            origin: None,
            waits: None,
        }
    }

    /// How long an enqueue keeps resending after a connection failure
    /// (default 5 s; zero: send once; `Duration::MAX`: no limit). Each attempt is bounded by
    /// [`ConnectionConfig::response_timeout`], so an enqueue returns within
    /// about `retry_window + response_timeout`. Retries reuse the id and the
    /// call's enqueue token, so they never create a second job.
    ///
    /// ```
    /// # #[tokio::main] async fn main() -> Result<(), queue_core::QueueError> {
    /// # let server = queue_testkit::RedisServer::start().unwrap();
    /// use std::time::Duration;
    /// let queue = queue_core::Queue::connect(&server.url())
    ///     .await?
    ///     .with_retry_window(Duration::from_secs(2));
    /// assert_eq!(queue.retry_window(), Duration::from_secs(2));
    /// # Ok(()) }
    /// ```
    pub fn with_retry_window(mut self, window: Duration) -> Self {
        self.retry_window = window;
        self
    }

    /// Group commit of concurrent single enqueues (default on): a call that
    /// finds another enqueue of its queue in flight on this `Queue` or its
    /// clones waits for it, then goes to Redis in one `enqueue_many.lua`
    /// call with every call that arrived meanwhile (at most 256), instead
    /// of one script call each. A call with nothing in flight is sent after
    /// one scheduler turn (a deferred wake, no timer: the calls that arrive
    /// in that turn go with it), so a trickle of enqueues sees no added latency
    /// beyond it. Each call still
    /// gets its own result, `Ok` only once Redis wrote its job; a job the
    /// script refuses fails only its own call. `false`: every call is sent
    /// alone (one script call per job, as before 0.2). The setting applies
    /// to this handle and the clones made from it afterwards.
    ///
    /// No call depends on another call's future being polled: every call
    /// waiting for a queue's next script call drives it, so an enqueue
    /// future kept alive unpolled (`tokio::select!` on `&mut fut`) holds up
    /// no other enqueue (it did until stop 44: docs/OPERATIONS.md, group
    /// commit). No task is spawned for it.
    ///
    /// ```
    /// # #[tokio::main] async fn main() -> Result<(), queue_core::QueueError> {
    /// # let server = queue_testkit::RedisServer::start().unwrap();
    /// let queue = queue_core::Queue::connect(&server.url()).await?;
    /// assert!(queue.group_commit());
    /// let alone = queue.clone().with_group_commit(false);
    /// assert!(!alone.group_commit());
    /// # Ok(()) }
    /// ```
    pub fn with_group_commit(mut self, on: bool) -> Self {
        match (on, &self.group) {
            (false, _) => self.group = None,
            (true, None) => self.group = Some(Default::default()),
            (true, Some(_)) => {}
        }
        self
    }

    /// Whether concurrent single enqueues share script calls (see
    /// [`with_group_commit`](Self::with_group_commit)).
    pub fn group_commit(&self) -> bool {
        self.group.is_some()
    }

    /// The longest argument an enqueue sends, in bytes: a job whose payload
    /// or an extra field's name or value is longer is refused before
    /// anything is sent ([`QueueError::ArgumentTooLarge`], naming queue and
    /// job; nothing written). Default 512 MiB, Redis' default
    /// `proto-max-bulk-len`; set it to the server's value when that is
    /// lower. Redis answers a longer argument "Protocol error: invalid bulk
    /// length" and closes the connection, which fails every request on it:
    /// the other enqueues of its group-commit call, and any other call of
    /// this `Queue` and its clones in flight.
    ///
    /// ```
    /// # #[tokio::main] async fn main() -> Result<(), queue_core::QueueError> {
    /// # let server = queue_testkit::RedisServer::start().unwrap();
    /// let queue = queue_core::Queue::connect(&server.url())
    ///     .await?
    ///     .with_max_arg_len(1 << 20);
    /// let err = queue
    ///     .enqueue_raw("tasks", "t", 1, 3, Default::default(), &vec![0; 2 << 20])
    ///     .await
    ///     .unwrap_err();
    /// assert!(matches!(err, queue_core::QueueError::ArgumentTooLarge { .. }));
    /// assert!(!err.outcome_unknown());
    /// # Ok(()) }
    /// ```
    pub fn with_max_arg_len(mut self, bytes: usize) -> Self {
        self.max_arg_len = bytes;
        self
    }

    /// The current argument limit (see [`with_max_arg_len`](Self::with_max_arg_len)).
    pub fn max_arg_len(&self) -> usize {
        self.max_arg_len
    }

    /// The current retry window (see [`with_retry_window`](Self::with_retry_window)).
    pub fn retry_window(&self) -> Duration {
        self.retry_window
    }

    /// The underlying connection (for admin calls).
    pub fn connection(&self) -> RedisConnection {
        self.conn.clone()
    }

    /// Enqueues a job with a fresh random id and returns the id.
    ///
    /// Returns `Ok` only after Redis confirmed the write; any failure is an error.
    ///
    /// # Errors: not enqueued, or unknown
    ///
    /// Connection failures are retried for [`retry_window`](Self::retry_window)
    /// first. When an `Err` is returned, [`QueueError::outcome_unknown`] says
    /// what it means for the job: `false` — it was **not enqueued** (invalid
    /// id, encoding error, Redis refused the command or the connection, OOM,
    /// read-only replica); `true` — **unknown**: a request may have reached
    /// Redis and its reply was lost. Enqueue again with the same id: a job
    /// that landed reports `Duplicate`, one that did not is created.
    /// `NotReplicated` means written on the primary, not yet replicated.
    /// All enqueue methods follow this rule.
    pub async fn enqueue<J: Job>(&self, args: &J::Args) -> Result<JobId> {
        Ok(self
            .enqueue_with::<J>(EnqueueOptions::new(), args)
            .await?
            .id)
    }

    /// Enqueues a job under a caller-chosen stable id (a business key).
    /// A second enqueue of the same id is a no-op reported in [`Enqueued::outcome`].
    pub async fn enqueue_with_id<J: Job>(
        &self,
        id: impl Into<JobId>,
        args: &J::Args,
    ) -> Result<Enqueued> {
        self.enqueue_with::<J>(EnqueueOptions::new().id(id), args)
            .await
    }

    /// Enqueues with full [`EnqueueOptions`].
    pub async fn enqueue_with<J: Job>(
        &self,
        opts: EnqueueOptions,
        args: &J::Args,
    ) -> Result<Enqueued> {
        let payload = crate::job::encode_args::<J>(args, opts.id.as_ref())?;
        let max_attempts = opts.max_attempts.unwrap_or(J::MAX_ATTEMPTS);
        let opts = crate::limits::with_rate_key::<J>(opts, args);
        self.enqueue_raw(
            J::QUEUE,
            J::NAME,
            J::SCHEMA_VERSION,
            max_attempts,
            opts,
            &payload,
        )
        .await
    }

    /// Enqueues already-encoded payload bytes. Used by the outbox relay and by
    /// tests that need a payload no handler can decode. `max_attempts` is
    /// the job type's limit: `opts.max_attempts`, when set, overrides it (as
    /// for every enqueue).
    ///
    /// The queue name, the id and the extra fields are checked before
    /// anything is sent ([`EnqueueOptions::validate`]).
    ///
    /// Concurrent calls on one `Queue` (and its clones) share script calls:
    /// see [`with_group_commit`](Self::with_group_commit).
    pub async fn enqueue_raw(
        &self,
        queue: &str,
        job_type: &str,
        schema_version: u32,
        max_attempts: u32,
        opts: EnqueueOptions,
        payload: &[u8],
    ) -> Result<Enqueued> {
        check_queue_name(queue)?;
        let opts = crate::trace_context::with_current(opts);
        if opts.replicas.is_some() {
            let mut out = self
                .enqueue_raw_batch(
                    queue,
                    job_type,
                    schema_version,
                    max_attempts,
                    vec![(opts, payload.to_vec())],
                )
                .await?;
            return out
                .pop()
                .ok_or_else(|| QueueError::protocol(queue, None, "empty batch reply"));
        }
        let generated = opts.id.is_none();
        let id = valid_id(queue, opts.id.clone())?;
        check_extra_fields(queue, Some(&id), &opts.extra_fields)?;
        check_arg_lens(queue, &id, &opts, payload, self.max_arg_len)?;
        let job = PendingJob {
            id: id.clone(),
            job_type: job_type.to_string(),
            schema_version,
            max_attempts: opts.max_attempts.unwrap_or(max_attempts),
            opts,
            payload: payload.to_vec(),
            token: enqueue_token(generated),
            generated,
            retry_window: self.retry_window,
        };
        let reply = match &self.group {
            None => send_alone(&self.conn, &self.keys.get(queue), &job).await,
            Some(group) => group.enqueue(&self.conn, self.keys.get(queue), job).await,
        }
        .inspect_err(|e| debug!(queue, job_id = %id, job_type, error = %e, "enqueue failed"))?;
        let outcome = EnqueueOutcome::from(reply).of_call(generated);
        if outcome == EnqueueOutcome::Created {
            crate::metrics::enqueued(queue, job_type, 1);
        }
        debug!(queue, job_id = %id, job_type, ?outcome, "enqueued");
        Ok(Enqueued { id, outcome })
    }

    /// Enqueues many jobs with random ids: one `enqueue_many.lua` call per
    /// 256 jobs, pipelined, one round trip per window of at most 8 calls
    /// (2,048 jobs) and 4 MiB (see [`Queue::enqueue_raw_batch`]). Each call
    /// validates all of its jobs before writing any.
    ///
    /// On `Err`, some jobs of the batch may have been written: retry with
    /// stable ids ([`Queue::enqueue_batch`]) when that matters.
    pub async fn enqueue_many<J: Job>(&self, args: &[J::Args]) -> Result<Vec<JobId>> {
        let batch = args.iter().map(|a| (EnqueueOptions::new(), a));
        Ok(self
            .enqueue_batch::<J, _>(batch)
            .await?
            .into_iter()
            .map(|e| e.id)
            .collect())
    }

    /// Enqueues many jobs, each with its own options, pipelined (see
    /// [`Queue::enqueue_raw_batch`]).
    pub async fn enqueue_batch<'a, J, I>(&self, jobs: I) -> Result<Vec<Enqueued>>
    where
        J: Job,
        I: IntoIterator<Item = (EnqueueOptions, &'a J::Args)>,
    {
        let mut items = Vec::new();
        for (opts, args) in jobs {
            let payload = crate::job::encode_args::<J>(args, opts.id.as_ref())?;
            items.push((crate::limits::with_rate_key::<J>(opts, args), payload));
        }
        self.enqueue_raw_batch(J::QUEUE, J::NAME, J::SCHEMA_VERSION, J::MAX_ATTEMPTS, items)
            .await
    }

    /// Batch [`Queue::enqueue_raw`]: one `enqueue_many.lua` call per 256
    /// jobs, pipelined in windows of at most 8 calls and 4 MiB of job data,
    /// one round trip each, each with its own response timeout and retries
    /// ([`retry_window`](Self::retry_window)), so that a batch of any size
    /// is sent (before, the whole batch was one pipeline under one response
    /// timeout). Every job is checked before anything is sent
    /// ([`EnqueueOptions::validate`], [`with_max_arg_len`](Self::with_max_arg_len));
    /// each call validates its jobs before writing any, and its reply is read
    /// on its own: when Redis refuses a call after others of the batch were
    /// written, one job's reply does not decode, or a window fails on the
    /// connection after earlier windows were written (the windows after it
    /// are not sent), the error is [`QueueError::PartialBatch`], listing the
    /// jobs written (and the outcomes the other jobs got).
    pub async fn enqueue_raw_batch(
        &self,
        queue: &str,
        job_type: &str,
        schema_version: u32,
        max_attempts: u32,
        items: Vec<(EnqueueOptions, Vec<u8>)>,
    ) -> Result<Vec<Enqueued>> {
        check_queue_name(queue)?;
        if items.is_empty() {
            return Ok(Vec::new());
        }
        #[cfg(feature = "opentelemetry")]
        let items: Vec<_> = items
            .into_iter()
            .map(|(o, p)| (crate::trace_context::with_current(o), p))
            .collect();
        let keys = self.keys.get(queue);
        let mut ids = Vec::with_capacity(items.len());
        let mut generated = Vec::with_capacity(items.len());
        let mut tokens = Vec::with_capacity(items.len());
        for (opts, payload) in &items {
            let is_generated = opts.id.is_none();
            generated.push(is_generated);
            let id = valid_id(queue, opts.id.clone())?;
            check_extra_fields(queue, Some(&id), &opts.extra_fields)?;
            check_arg_lens(queue, &id, opts, payload, self.max_arg_len)?;
            ids.push(id);
            tokens.push(enqueue_token(is_generated));
        }
        let wait = items
            .iter()
            .filter_map(|(o, _)| o.replicas)
            .max()
            .map(|(replicas, timeout)| (replicas, self.wait_ms(timeout)));
        // Bounded round trips (`windows`): each window is one pipeline with
        // its own response timeout and retries. Before, the whole batch was
        // one pipeline under one timeout: a batch of some 20,000 jobs or more
        // always timed out, was sent again whole, and ended "outcome
        // unknown" with every job written.
        let calls = call_ranges(&items, &ids);
        let windows = window_ranges(&calls, &items, &ids);
        let mut replies: Vec<Option<crate::scripts::enqueue::EnqueueReply>> =
            Vec::with_capacity(items.len());
        let (mut acked, mut refused, mut failed) = (None, None, None);
        for window in &windows {
            let window_calls = &calls[window.clone()];
            let (base, end) = (
                window_calls[0].start,
                window_calls[window_calls.len() - 1].end,
            );
            // `WAIT` with every window (only when replicas are asked for):
            // it counts the replicas that have this connection's writes,
            // and after a reconnect (a failover between windows) the new
            // connection's `WAIT` knows nothing of an earlier window the old
            // primary lost. The batch is replicated only as far as its least
            // replicated window (`least_acked`). A first version sent it with
            // the last window only.
            let first_id = Some(&ids[base]);
            let mut attempt = 0u32;
            let send = || {
                // Only the first attempt may skip the dedupe reads of
                // generated ids: a retry's first attempt may have written
                // them (and so may a resend by the connection itself:
                // `may_resend`).
                let fresh = attempt == 0 && !self.conn.may_resend();
                attempt += 1;
                let mut conn = self.conn.clone();
                let (keys, items, ids, generated, tokens) =
                    (&keys, &items, &ids, &generated, &tokens);
                async move {
                    let jobs: Vec<ManyJob<'_>> = (base..end)
                        .map(|i| {
                            let (opts, payload) = &items[i];
                            ManyJob {
                                job: script_job(
                                    keys,
                                    &ids[i],
                                    job_type,
                                    schema_version,
                                    opts.max_attempts.unwrap_or(max_attempts),
                                    opts,
                                    payload,
                                ),
                                token: &tokens[i],
                                fresh: fresh && generated[i],
                            }
                        })
                        .collect();
                    let chunks: Vec<&[ManyJob<'_>]> = window_calls
                        .iter()
                        .map(|c| &jobs[c.start - base..c.end - base])
                        .collect();
                    let (replies, acked) =
                        send_chunks(&mut conn, keys, &chunks, wait, queue, first_id).await?;
                    let (out, refused) = read_replies(queue, &chunks, replies)?;
                    Ok((out, acked, refused))
                }
            };
            match with_retries(self.retry_window, queue, &ids[base], send).await {
                Ok((out, window_acked, window_refused)) => {
                    replies.extend(out);
                    if wait.is_some() {
                        acked = Some(least_acked(acked, window_acked));
                    }
                    if let Some(e) = window_refused {
                        refused.get_or_insert(e);
                    }
                }
                // The windows after it are not sent; those before it were
                // written (`PartialBatch` below).
                Err(e) => {
                    debug!(queue, job_type, jobs = ids.len(), first_job = %ids[base],
                        error = %e, "batch enqueue failed");
                    failed = Some(e);
                    break;
                }
            }
        }
        let total = ids.len();
        let out: Vec<Enqueued> = ids
            .into_iter()
            .zip(replies)
            .zip(generated)
            .filter_map(|((id, r), generated)| {
                Some(Enqueued {
                    id,
                    outcome: EnqueueOutcome::from(r?).of_call(generated),
                })
            })
            .collect();
        let created = out.iter().filter(|e| e.is_new()).count() as u64;
        crate::metrics::enqueued(queue, job_type, created);
        // A window that failed names the jobs whose outcome is unknown: it
        // is the source; a refusal of an earlier window goes with it
        // (`refused`). Before, that refusal was only logged at debug level,
        // and the caller never learnt of it.
        let earlier_refusal = failed.is_some().then(|| refused.take()).flatten();
        if let Some(source) = failed.or(refused) {
            debug!(queue, job_type, jobs = total, written = out.len(), error = %source,
                "batch enqueue refused");
            if out.is_empty() && earlier_refusal.is_none() {
                return Err(source);
            }
            return Err(QueueError::PartialBatch {
                queue: queue.to_string(),
                written: out,
                total,
                source: Box::new(source),
                refused: earlier_refusal.map(Box::new),
            });
        }
        if let Some((wanted, _)) = wait {
            // Read strictly: a `WAIT` Redis refused (an ACL user without
            // `+wait`, `BUSY`) confirmed no replica, so the batch — written
            // on the primary — is `NotReplicated`, never `Ok`.
            let (acked, wait_refused) = match acked {
                Some(Ok(n)) => (n.clamp(0, i64::from(u32::MAX)) as u32, None),
                Some(Err(reply)) => (0, Some(reply)),
                None => (0, Some("no reply".to_string())),
            };
            if acked < wanted || wait_refused.is_some() {
                debug!(
                    queue,
                    job_type,
                    jobs = out.len(),
                    acked,
                    wanted,
                    wait_refused = wait_refused.as_deref(),
                    "batch enqueued but not replicated"
                );
                return Err(QueueError::NotReplicated {
                    queue: queue.to_string(),
                    job_id: out[0].id.clone(),
                    acked,
                    wanted,
                    wait_refused,
                });
            }
        }
        debug!(queue, job_type, jobs = out.len(), "batch enqueued");
        Ok(out)
    }
}

impl Queue {
    /// The `WAIT` timeout (ms) of [`EnqueueOptions::wait_for_replicas`]'s
    /// `timeout`: at least 1 ms, at most three quarters of the connection's
    /// response timeout (the default one for a `Queue` made
    /// [`from_connection`](Self::from_connection)). `WAIT n 0` blocks until
    /// `n` replicas answer, for ever without them, and holds every call
    /// queued behind it on the shared connection; a `WAIT` as long as the
    /// response timeout would lose its own reply (an "outcome unknown"
    /// error instead of `NotReplicated`).
    fn wait_ms(&self, timeout: Duration) -> u64 {
        let response_timeout = self.origin.as_ref().map_or_else(
            || ConnectionConfig::default().response_timeout,
            |o| o.1.response_timeout,
        );
        let cap = scripts::ms(response_timeout.saturating_mul(3) / 4).max(1);
        scripts::ms(timeout).clamp(1, cap)
    }
}

/// The replication of a batch so far (`so_far`, `None` before its first
/// window) and one more window's `WAIT` reply: the least replicas count, or
/// the first refusal (a window without a `WAIT` reply counts as refused).
fn least_acked(so_far: Option<WaitReply>, window: Option<WaitReply>) -> WaitReply {
    let window = window.unwrap_or_else(|| Err("no reply".to_string()));
    match (so_far, window) {
        (Some(Err(e)), _) | (_, Err(e)) => Err(e),
        (Some(Ok(a)), Ok(b)) => Ok(a.min(b)),
        (None, Ok(b)) => Ok(b),
    }
}

/// Sends the `enqueue_many.lua` calls of a batch (`chunks`) and `WAIT` (when
/// asked) in one pipeline and answers each call's reply as Redis gave it, an
/// error reply included (`ignore_errors`: before, one refused call failed the
/// whole pipeline's result, hiding the calls written before and after it).
/// The calls answered "function not found" (first use on this server, or
/// after a restart or a flush) are sent again, alone, after loading the
/// library: only those, since another client may have loaded it in between
/// and the others ran. Returns the replies in call order and `WAIT`'s answer
/// (when asked): its count, or the text of a reply that is not one (an error
/// reply such as `NOPERM`), so that a refused `WAIT` is never read as
/// "confirmed".
async fn send_chunks(
    conn: &mut RedisConnection,
    keys: &QueueKeys,
    chunks: &[&[ManyJob<'_>]],
    wait: Option<(u32, u64)>,
    queue: &str,
    first_id: Option<&JobId>,
) -> Result<(Vec<Value>, Option<WaitReply>)> {
    let mut replies: Vec<Option<Value>> = vec![None; chunks.len()];
    let mut acked = None;
    let mut loaded = false;
    loop {
        let pending: Vec<usize> = (0..chunks.len())
            .filter(|&k| replies[k].is_none())
            .collect();
        let mut pipe = redis::pipe();
        pipe.ignore_errors();
        for &k in &pending {
            enqueue_many::add_to(&mut pipe, keys, Mode::All, chunks[k]);
        }
        if let Some((replicas, timeout_ms)) = wait {
            pipe.cmd("WAIT").arg(replicas).arg(timeout_ms);
        }
        let sent = std::time::Instant::now();
        let mut got: Vec<Value> = pipe
            .query_async(conn)
            .await
            .map_err(|e| QueueError::redis(queue, first_id, e))?;
        if wait.is_some() {
            acked = got.pop().map(|v| match (reply::int(&v), v) {
                (Some(n), _) => Ok(n),
                (None, Value::ServerError(e)) => {
                    Err(format!("{} {}", e.code(), e.details().unwrap_or_default()))
                }
                (None, other) => Err(format!("unexpected reply {other:?}")),
            });
        }
        if got.len() != pending.len() {
            return Err(QueueError::protocol(
                queue,
                first_id,
                format!(
                    "{} replies for {} enqueue_many calls",
                    got.len(),
                    pending.len()
                ),
            ));
        }
        let mut unloaded = false;
        for (k, v) in pending.into_iter().zip(got) {
            let missing = matches!(&v, Value::ServerError(e)
                if scripts::is_unloaded(&redis::RedisError::from(e.clone())));
            if missing && !loaded {
                unloaded = true;
            } else {
                replies[k] = Some(v);
            }
        }
        if !unloaded {
            return Ok((
                replies
                    .into_iter()
                    .map(|r| r.unwrap_or(Value::Nil))
                    .collect(),
                acked,
            ));
        }
        enqueue_many::load(conn, sent)
            .await
            .map_err(|e| QueueError::redis(queue, first_id, e))?;
        loaded = true;
    }
}

/// Jobs of a batch sent in one round trip at most: [`MAX_CALLS_PER_WINDOW`]
/// script calls, and no more than [`WINDOW_BYTES`] of job data (unless one
/// job alone is larger). Each window has its own response timeout and
/// retries, so a batch of any size is sent; a window is small enough for
/// Redis to run well within the default 5 s timeout (2,048 small jobs take
/// some 10 ms of Redis time).
const MAX_CALLS_PER_WINDOW: usize = 8;

/// Bytes of job data (payloads, ids, extra fields) in one window, and in one
/// script call.
const WINDOW_BYTES: usize = 4 << 20;

/// The job data of one job of a batch, as counted against [`WINDOW_BYTES`]
/// (the script's other arguments of a job: some 64 bytes).
fn job_bytes(opts: &EnqueueOptions, payload: &[u8], id: &JobId) -> usize {
    let extra: usize = opts
        .extra_fields
        .iter()
        .map(|(name, value)| name.len() + value.len())
        .sum();
    64 + payload.len() + id.as_str().len() + extra
}

/// The script calls of a batch, as ranges of its jobs: at most
/// [`MAX_JOBS_PER_CALL`] jobs and [`WINDOW_BYTES`] each (one job at least).
fn call_ranges(items: &[(EnqueueOptions, Vec<u8>)], ids: &[JobId]) -> Vec<Range<usize>> {
    let mut calls = Vec::new();
    let (mut start, mut bytes) = (0, 0);
    for (i, ((opts, payload), id)) in items.iter().zip(ids).enumerate() {
        let b = job_bytes(opts, payload, id);
        if i > start && (i - start == MAX_JOBS_PER_CALL || bytes + b > WINDOW_BYTES) {
            calls.push(start..i);
            (start, bytes) = (i, 0);
        }
        bytes += b;
    }
    if start < items.len() {
        calls.push(start..items.len());
    }
    calls
}

/// The windows of a batch (one round trip each), as ranges of its `calls`:
/// at most [`MAX_CALLS_PER_WINDOW`] calls and [`WINDOW_BYTES`] each (one
/// call at least).
fn window_ranges(
    calls: &[Range<usize>],
    items: &[(EnqueueOptions, Vec<u8>)],
    ids: &[JobId],
) -> Vec<Range<usize>> {
    let call_bytes = |c: &Range<usize>| -> usize {
        c.clone()
            .map(|i| job_bytes(&items[i].0, &items[i].1, &ids[i]))
            .sum()
    };
    let mut windows = Vec::new();
    let (mut start, mut bytes) = (0, 0);
    for (k, call) in calls.iter().enumerate() {
        let b = call_bytes(call);
        if k > start && (k - start == MAX_CALLS_PER_WINDOW || bytes + b > WINDOW_BYTES) {
            windows.push(start..k);
            (start, bytes) = (k, 0);
        }
        bytes += b;
    }
    if start < calls.len() {
        windows.push(start..calls.len());
    }
    windows
}

/// Each call's reply of one window on its own: a call Redis refused leaves
/// its jobs `None` and its error in the second value (the first refusal);
/// the calls before and after it were written. Each job's reply on its own
/// too: one that does not decode is that job's error (the batch a
/// `PartialBatch`), the others keep their outcomes. Before, it failed the
/// whole batch with a plain protocol error ("not enqueued") while the call
/// had written the others.
fn read_replies(
    queue: &str,
    chunks: &[&[ManyJob<'_>]],
    replies: Vec<Value>,
) -> Result<(
    Vec<Option<crate::scripts::enqueue::EnqueueReply>>,
    Option<QueueError>,
)> {
    let mut out = Vec::with_capacity(chunks.iter().map(|c| c.len()).sum());
    let mut refused = None;
    for (chunk, reply) in chunks.iter().zip(replies) {
        if let Value::ServerError(e) = reply {
            let first = chunk.first().map(|m| m.job.id);
            refused.get_or_insert(QueueError::redis(queue, first, e.into()));
            out.extend(chunk.iter().map(|_| None));
            continue;
        }
        for (m, r) in chunk
            .iter()
            .zip(enqueue_many::decode(queue, chunk, &reply)?)
        {
            match r {
                Ok(ManyReply::Enqueued(r)) => out.push(Some(r)),
                Ok(ManyReply::Invalid(reason)) => {
                    refused.get_or_insert(QueueError::protocol(
                        queue,
                        Some(m.job.id),
                        format!("invalid in mode all: {reason}"),
                    ));
                    out.push(None);
                }
                Err(e) => {
                    refused.get_or_insert(e);
                    out.push(None);
                }
            }
        }
    }
    Ok((out, refused))
}

/// `WAIT`'s answer to a batch: the replicas that confirmed it, or the text of
/// a reply that is not a count (Redis refused the command).
type WaitReply = std::result::Result<i64, String>;

/// The enqueue token of a call (kept across its retries): none for an id the
/// `Queue` generated, which only this call can have written (see
/// `EnqueueOutcome::of_call`); a random one for a caller's id.
fn enqueue_token(generated: bool) -> String {
    match generated {
        true => String::new(),
        false => random_uuid(),
    }
}

/// Runs `send` until it succeeds, fails for a reason other than the
/// connection, or `window` has passed ([`Queue::retry_window`]). When any
/// attempt's outcome was unknown, the error returned says so
/// ([`QueueError::outcome_unknown`]) even if a later attempt failed
/// definitely (e.g. connection refused while Redis restarts).
pub(crate) async fn with_retries<T, F, Fut>(
    window: Duration,
    queue: &str,
    id: &JobId,
    mut send: F,
) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T>>,
{
    // `None`: a window too long for the clock (`Duration::MAX`), no deadline.
    let deadline = tokio::time::Instant::now().checked_add(window);
    let mut delay = Duration::from_millis(50);
    let mut unknown: Option<QueueError> = None;
    loop {
        let err = match send().await {
            Ok(v) => return Ok(v),
            Err(e) => e,
        };
        let retry = err.is_connection_failure()
            && deadline.is_none_or(|d| tokio::time::Instant::now() + delay < d);
        if !retry {
            return Err(match unknown {
                Some(first) if !err.outcome_unknown() => first,
                _ => err,
            });
        }
        warn!(queue, job_id = %id, error = %err, retry_in_ms = delay.as_millis() as u64,
            "enqueue failed on the connection; sending it again with the same id and token");
        if err.outcome_unknown() {
            unknown = Some(err);
        }
        tokio::time::sleep(delay).await;
        delay = (delay * 2).min(Duration::from_secs(1));
    }
}

/// The caller's id, or a random one; checked before anything is sent.
fn valid_id(queue: &str, id: Option<JobId>) -> Result<JobId> {
    let id = id.unwrap_or_else(JobId::random);
    check_id(queue, &id)?;
    Ok(id)
}

/// The script arguments of one job, for a single enqueue and for each job of
/// a batch.
pub(crate) fn script_job<'a>(
    keys: &'a QueueKeys,
    id: &'a JobId,
    job_type: &'a str,
    schema_version: u32,
    max_attempts: u32,
    opts: &'a EnqueueOptions,
    payload: &'a [u8],
) -> Enqueue<'a> {
    Enqueue {
        keys,
        id,
        job_type,
        schema_version,
        payload,
        max_attempts,
        delay: opts.delay,
        run_at: opts.run_at,
        once_for: opts.once_for,
        extra: &opts.extra_fields,
    }
}
