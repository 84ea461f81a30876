//! Configuring a worker: [`WorkerConfig`] (the settings and their
//! defaults) and [`WorkerBuilder`] (registrations, queues, priorities and
//! limits, validated by [`WorkerBuilder::build`]).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{watch, Semaphore};
use tracing::warn;

use super::slots::WorkerQueue;
use super::{Inner, Worker, WorkerIdentity};
use crate::backoff::Backoff;
use crate::conn::{connect, ConnectionConfig};
use crate::error::{QueueError, Result};
use crate::keys::QueueKeys;
use crate::registry::Registration;

/// The longest lease a worker takes ([`WorkerConfig::lease`]): 7 days. The
/// checker's repair of an orphan trusts no lease further ahead
/// (`admin/repair_orphan.lua`).
pub(crate) const MAX_LEASE: Duration = Duration::from_secs(7 * 24 * 3600);

/// The longest [`WorkerConfig::block_timeout`] and
/// [`WorkerConfig::promote_interval`]: a day. Longer ones overflowed the
/// blocking connections' response timeout (`block + response_timeout`) and
/// the announcement TTL (`promote_interval * 4`) and panicked at start.
const MAX_WAIT: Duration = Duration::from_secs(24 * 3600);

/// The most acks per `ack.lua` call ([`WorkerConfig::ack_batch`]): the acker
/// reserves room for a whole batch up front (a huge value aborted the
/// process), and a batch far above the fetch sizes (at most 64 by default)
/// only makes one script call longer.
const MAX_ACK_BATCH: usize = 10_000;

/// The most jobs a worker (or one queue of it) runs at once: what a
/// semaphore holds and what shutdown counts in a `u32`. Above it
/// `Semaphore::new` panicked, or shutdown waited for fewer slots than there
/// are (`concurrency as u32` truncated).
const MAX_CONCURRENCY: usize = if (u32::MAX as usize) < Semaphore::MAX_PERMITS {
    u32::MAX as usize
} else {
    Semaphore::MAX_PERMITS
};

/// Worker settings. The defaults suit most queues; see each field.
///
/// ```
/// let cfg = queue_core::WorkerConfig::default();
/// assert_eq!(cfg.concurrency, 16);
/// assert!(cfg.heartbeat_interval() < cfg.lease);
/// ```
#[derive(Debug, Clone)]
pub struct WorkerConfig {
    /// Jobs run at once, across all queues of the worker. 1 to `u32::MAX`.
    pub concurrency: usize,
    /// Lease per delivery. A job whose worker stops heartbeating is returned
    /// by the watchdog once its lease expires. 100 ms to 7 days.
    pub lease: Duration,
    /// Heartbeat period; `None`: a third of the lease. Less than half of
    /// the part of the lease the worker trusts (90 %, see `lease_clock.rs`),
    /// i.e. under 45 % of the lease, so that one failed extend still leaves
    /// time for the next before the lease could be taken over; beats are
    /// timed from the claim (the first one interval after the claim was
    /// sent, each next one interval after the previous was sent).
    pub heartbeat: Option<Duration>,
    /// Extend leases while handlers run (default true). Turning it off makes
    /// any handler slower than the lease get reclaimed and redelivered.
    pub heartbeat_enabled: bool,
    /// How long one BLMOVE waits on an empty queue. Also bounds how long
    /// shutdown waits for the fetchers; an idle worker makes one call per period.
    /// More than zero (zero would block for ever on the server), at most a day.
    pub block_timeout: Duration,
    /// Jobs moved and claimed per round trip when the queue is deep.
    ///
    /// `0` (the default): half the jobs the queue may run at once (its own
    /// limit, else [`concurrency`](Self::concurrency)), from 1 to 64
    /// ([`WorkerConfig::fetch_batch_for`]). While a backlog lasts a fetcher
    /// keeps two fetches in flight, each for at most this many jobs, so half
    /// the slots keeps every slot fed while the other fetch is on its way: at
    /// concurrency 64, 32 per fetch ran 43–51k jobs/s where 16 ran 33–36k
    /// (docs/BENCHMARKS.md, "Stop 25").
    pub fetch_batch: usize,
    /// On shutdown, how long in-flight jobs may take to finish before they
    /// are left leased for the watchdog.
    pub grace: Duration,
    /// How long completion records are kept (the window in which a redelivery
    /// or a re-enqueue of a finished job is recognised). Zero: no record.
    pub completion_retention: Duration,
    /// Write each completion record as one compact string instead of a hash
    /// (default true since stop 48; false before). Fewer instructions per
    /// ack and less memory per completed job (docs/BENCHMARKS.md, "Stop
    /// 27", "Stop 48"); every reader since stop 27 reads both forms. A
    /// deployment that still runs a process older than stop 27 that reads
    /// records (workers, producers waiting for results, `queue-watchdog`)
    /// sets it to false until that process is gone: it fails on a string
    /// record (docs/OPERATIONS.md, "Compact completion records").
    pub compact_records: bool,
    /// Retry backoff for retryable handler errors. `base` at most `max`,
    /// `max` at most 30 days (checked by [`WorkerBuilder::build`]).
    pub backoff: Backoff,
    /// The longest the promoter sleeps when nothing wakes it (default 2 s).
    /// It otherwise sleeps until the next delayed job is due, and a job
    /// scheduled sooner (enqueue, retry, watchdog return) wakes it through
    /// the queue's wake list, so this only bounds a lost wake-up (see
    /// `background/promoter.rs`). At most a day.
    pub promote_interval: Duration,
    /// Most acks sent in one `ack.lua` call (default 64, at most 10,000). A finished job's
    /// ack joins its queue's batch, which is flushed when this many wait or
    /// [`ack_window`](Self::ack_window) after the first.
    pub ack_batch: usize,
    /// How long the first ack of a batch may wait for more (default 2 ms;
    /// zero: flush at once with whatever is already waiting). A longer
    /// window means fewer calls per job, but a worker that crashes loses
    /// the acks still waiting: those jobs run again (at-least-once). At most
    /// a third of the lease: the heartbeat stops when the handler returns,
    /// so a window near the lease let the lease expire before the ack was
    /// sent and the finished job ran again.
    pub ack_window: Duration,
    /// Rolling deploys: how long a payload whose schema version is newer
    /// than this worker's handler is left for an upgraded worker while no
    /// live worker has announced that version (default 5 minutes). Within
    /// it the job is given back without using an attempt; after it, it is
    /// dead-lettered with a reason saying so. While a live worker has
    /// announced the version the job is always given back, even with 0.
    pub newer_version_wait: Duration,
    /// How long such a job waits in the delayed set before it is offered
    /// again the first time (default 1 s); each next give-back of the same
    /// job waits twice as long as the one before, up to a minute (or this
    /// delay when longer), until a delivery of it runs.
    pub newer_version_delay: Duration,
    /// Redis timeouts.
    pub connection: ConnectionConfig,
}

impl Default for WorkerConfig {
    fn default() -> Self {
        WorkerConfig {
            concurrency: 16,
            lease: Duration::from_secs(30),
            heartbeat: None,
            heartbeat_enabled: true,
            block_timeout: Duration::from_secs(2),
            fetch_batch: 0,
            grace: Duration::from_secs(30),
            completion_retention: Duration::from_secs(24 * 3600),
            compact_records: true,
            backoff: Backoff::default(),
            promote_interval: Duration::from_secs(2),
            ack_batch: 64,
            ack_window: Duration::from_millis(2),
            newer_version_wait: Duration::from_secs(5 * 60),
            newer_version_delay: Duration::from_secs(1),
            connection: ConnectionConfig::default(),
        }
    }
}

impl WorkerConfig {
    /// How long a worker's announcement of the payload versions it handles
    /// lasts (refreshed every `promote_interval`): four intervals, at least
    /// 2 s.
    pub fn announce_ttl(&self) -> Duration {
        (self.promote_interval.saturating_mul(4)).max(Duration::from_secs(2))
    }

    /// Jobs per fetch for a queue that may run `slots` jobs at once (its
    /// own limit, or the worker's concurrency): [`fetch_batch`](Self::fetch_batch),
    /// or when that is `0`, half of `slots`, from 1 to 64.
    ///
    /// ```
    /// use queue_core::WorkerConfig;
    ///
    /// let cfg = WorkerConfig::default();
    /// assert_eq!(cfg.fetch_batch_for(64), 32);
    /// assert_eq!(cfg.fetch_batch_for(1), 1);
    /// assert_eq!(cfg.fetch_batch_for(1000), 64);
    /// let fixed = WorkerConfig { fetch_batch: 16, ..WorkerConfig::default() };
    /// assert_eq!(fixed.fetch_batch_for(64), 16);
    /// ```
    pub fn fetch_batch_for(&self, slots: usize) -> usize {
        match self.fetch_batch {
            0 => (slots / 2).clamp(1, 64),
            n => n,
        }
    }

    /// The effective heartbeat period.
    pub fn heartbeat_interval(&self) -> Duration {
        self.heartbeat
            .unwrap_or(self.lease / 3)
            .max(Duration::from_millis(10))
    }
}

/// Builds a [`Worker`]. Start with [`Worker::builder`]. The setters only
/// record; [`build`](Self::build) checks everything at once and refuses
/// (with [`QueueError::Config`] or [`QueueError::InvalidQueueName`]) what
/// would fail while the worker runs.
///
/// A worker serving two queues, `emails` before `reports`, with at most two
/// reports at once; a queue in `queues(..)` that none of its job types is on
/// is refused (every job taken from it would be dead-lettered):
///
/// ```
/// # use queue_core::{job, JobContext, JobError, QueueError, Worker};
/// #[job(queue = "emails")]
/// async fn send_receipt(_ctx: JobContext, order: u64) -> Result<(), JobError> {
///     Ok(())
/// }
/// #[job(queue = "reports")]
/// async fn build_report(_ctx: JobContext, day: u32) -> Result<(), JobError> {
///     Ok(())
/// }
/// # #[tokio::main] async fn main() -> Result<(), QueueError> {
/// # let server = queue_testkit::RedisServer::start().unwrap();
/// # let url = server.url();
/// let worker = Worker::builder(&url)
///     .register(send_receipt::handler())
///     .register(build_report::handler())
///     .queues(["emails", "reports"]) // the default: every registered type's queue
///     .queue_priority("emails", 10) // free slots go to waiting emails first
///     .queue_concurrency("reports", 2) // within the worker's 16
///     .build()
///     .await?;
/// # drop(worker);
///
/// let refused = Worker::builder(&url)
///     .register(send_receipt::handler())
///     .queues(["emails", "audit"]) // no registered type is on `audit`
///     .build()
///     .await;
/// assert!(matches!(refused, Err(QueueError::Config(m)) if m.contains("`audit`")));
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct WorkerBuilder {
    url: String,
    config: WorkerConfig,
    registrations: Vec<Registration>,
    queues: Option<Vec<String>>,
    priorities: HashMap<String, i32>,
    limits: HashMap<String, usize>,
    /// `None`: `<hostname>:<pid>`.
    name: Option<String>,
    /// Handler timeouts by job type, replacing `#[job(timeout)]`.
    timeouts: HashMap<String, Duration>,
}

impl WorkerBuilder {
    pub(super) fn new(url: &str) -> Self {
        WorkerBuilder {
            url: url.to_string(),
            config: WorkerConfig::default(),
            registrations: Vec::new(),
            queues: None,
            priorities: HashMap::new(),
            limits: HashMap::new(),
            name: None,
            timeouts: HashMap::new(),
        }
    }

    /// Adds a job type (e.g. `send_welcome::handler()`).
    pub fn register(mut self, registration: Registration) -> Self {
        self.registrations.push(registration);
        self
    }

    /// Jobs run at once, across all queues (default 16; 1 to `u32::MAX`,
    /// checked by [`build`](Self::build)).
    pub fn concurrency(mut self, n: usize) -> Self {
        self.config.concurrency = n;
        self
    }

    /// Queues to fetch from. Default: every queue a registered job type uses.
    ///
    /// [`build`](Self::build) refuses a listed queue that no job type
    /// registered on this worker is on (handlers are found by queue and
    /// type: it could run no job taken from it), and a name an enqueue refuses
    /// ([`validate_queue_name`](crate::validate_queue_name)). A registered
    /// type whose queue is left out is logged as a warning: this worker
    /// never runs it (fine when other workers consume that queue).
    pub fn queues<I, S>(mut self, queues: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.queues = Some(queues.into_iter().map(Into::into).collect());
        self
    }

    /// Strict priority of `queue` among this worker's queues (default 0):
    /// while a higher-priority queue has jobs, free slots go to it first.
    /// `queue` must be one the worker consumes (checked by [`build`](Self::build)).
    pub fn queue_priority(mut self, queue: impl Into<String>, priority: i32) -> Self {
        self.priorities.insert(queue.into(), priority);
        self
    }

    /// At most `limit` jobs of `queue` run at once on this worker (within the
    /// worker-wide concurrency). `limit` from 1 to `u32::MAX`, and `queue` one
    /// the worker consumes (checked by [`build`](Self::build)).
    pub fn queue_concurrency(mut self, queue: impl Into<String>, limit: usize) -> Self {
        self.limits.insert(queue.into(), limit);
        self
    }

    /// The worker's name (default `<hostname>:<pid>`): on every log line of
    /// a job's life (the `job` span's `worker` field) and in the `worker`
    /// field of each job it claims, which `queue-watchdog jobs show` prints.
    ///
    /// ```
    /// # fn f(b: queue_core::WorkerBuilder) -> queue_core::WorkerBuilder {
    /// b.name("billing-7")
    /// # }
    /// ```
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = Some(name.into());
        self
    }

    /// Handler timeout of the job type `job_type` on this worker, replacing
    /// the one of `#[job(timeout)]` (or adding one where it has none). A
    /// handler that runs longer fails with a retryable error. The type must
    /// be registered (checked by [`build`](Self::build)).
    ///
    /// ```
    /// # use std::time::Duration;
    /// # fn f(b: queue_core::WorkerBuilder) -> queue_core::WorkerBuilder {
    /// b.timeout_for("send_welcome", Duration::from_secs(5))
    /// # }
    /// ```
    pub fn timeout_for(mut self, job_type: impl Into<String>, timeout: Duration) -> Self {
        self.timeouts.insert(job_type.into(), timeout);
        self
    }

    /// Lease per delivery (default 30 s; 100 ms to 7 days, checked by
    /// [`build`](Self::build)). The heartbeat ([`WorkerConfig::heartbeat`],
    /// default a third of the lease) must stay under 45 % of it, and
    /// [`ack_window`](Self::ack_window) at most a third of it.
    pub fn lease(mut self, lease: Duration) -> Self {
        self.config.lease = lease;
        self
    }

    /// Shutdown grace period (default 30 s).
    pub fn grace(mut self, grace: Duration) -> Self {
        self.config.grace = grace;
        self
    }

    /// Retry backoff for retryable handler errors.
    pub fn backoff(mut self, backoff: Backoff) -> Self {
        self.config.backoff = backoff;
        self
    }

    /// Most acks per `ack.lua` call (default 64; 1 to 10,000, checked by
    /// [`build`](Self::build)).
    pub fn ack_batch(mut self, n: usize) -> Self {
        self.config.ack_batch = n;
        self
    }

    /// How long a finished job's ack may wait for others to share one
    /// `ack.lua` call (default 2 ms; zero: send at once; at most a third of
    /// the lease, checked by [`build`](Self::build): the heartbeat stops when
    /// the handler returns). The job's concurrency slot is free as soon as
    /// the handler returns, whatever the window.
    ///
    /// ```
    /// # use std::time::Duration;
    /// # fn f(b: queue_core::WorkerBuilder) -> queue_core::WorkerBuilder {
    /// b.ack_window(Duration::ZERO) // one call per finished job, or per jobs already waiting
    /// # }
    /// ```
    pub fn ack_window(mut self, window: Duration) -> Self {
        self.config.ack_window = window;
        self
    }

    /// Completion records as one compact string ([`WorkerConfig::compact_records`],
    /// the default) or, with `false`, as a hash: the form processes older
    /// than stop 27 read, for a deployment that still runs one.
    ///
    /// ```
    /// # fn f(b: queue_core::WorkerBuilder) -> queue_core::WorkerBuilder {
    /// b.compact_records(false) // a process older than stop 27 still reads records
    /// # }
    /// ```
    pub fn compact_records(mut self, on: bool) -> Self {
        self.config.compact_records = on;
        self
    }

    /// Rolling deploys: how long a job whose payload schema version is newer
    /// than this worker's handler may wait for a worker that announces that
    /// version (default 5 minutes). Until then this worker gives it back
    /// without using an attempt; after it, the job is dead-lettered. While a
    /// live worker has announced the version the job is always given back
    /// (for it), even with a wait of 0.
    ///
    /// ```
    /// # use std::time::Duration;
    /// # fn f(b: queue_core::WorkerBuilder) -> queue_core::WorkerBuilder {
    /// b.newer_version_wait(Duration::from_secs(15 * 60)) // a slow rollout
    /// # }
    /// ```
    pub fn newer_version_wait(mut self, wait: Duration) -> Self {
        self.config.newer_version_wait = wait;
        self
    }

    /// Replaces the whole configuration, including what earlier setters
    /// (`concurrency`, `lease`, `grace`, `backoff`, `ack_batch`, `ack_window`,
    /// `compact_records`, `newer_version_wait`) set: call it first, then
    /// those setters. [`build`](Self::build) checks the limits of each field
    /// ([`WorkerConfig`]).
    pub fn config(mut self, config: WorkerConfig) -> Self {
        self.config = config;
        self
    }

    /// Connects and validates the configuration.
    pub async fn build(self) -> Result<Worker> {
        self.validate_config()?;
        let handlers = self.handlers()?;
        let queues = self.worker_queues()?;
        let periodic = Arc::new(crate::background::scheduler::parse(&self.registrations)?);
        let conn = connect(&self.url, &self.config.connection).await?;
        let labels = crate::metrics::LabelCache::new(handlers.keys().copied());
        Ok(Worker {
            inner: Arc::new(Inner {
                url: self.url,
                conn,
                periodic,
                handlers,
                labels,
                queues,
                config: self.config,
                identity: match self.name {
                    Some(name) => WorkerIdentity::current().named(name),
                    None => WorkerIdentity::current(),
                },
            }),
            shutdown: watch::channel(false).0,
        })
    }

    fn validate_config(&self) -> Result<()> {
        let cfg = &self.config;
        if self.registrations.is_empty() {
            return Err(QueueError::Config(
                "a worker needs at least one registered job type".into(),
            ));
        }
        if cfg.concurrency == 0 || cfg.ack_batch == 0 {
            return Err(QueueError::Config(
                "concurrency and ack_batch must be at least 1".into(),
            ));
        }
        if cfg.concurrency > MAX_CONCURRENCY {
            return Err(QueueError::Config(format!(
                "concurrency {} is more than {MAX_CONCURRENCY}, the most jobs a worker can count",
                cfg.concurrency
            )));
        }
        if cfg.ack_batch > MAX_ACK_BATCH {
            return Err(QueueError::Config(format!(
                "ack_batch {} is more than {MAX_ACK_BATCH} acks per call",
                cfg.ack_batch
            )));
        }
        let receipt = crate::scripts::fetch::receipt_life(cfg.lease);
        if cfg.connection.response_timeout >= receipt {
            warn!(lease_ms = cfg.lease.as_millis() as u64,
                response_timeout_ms = cfg.connection.response_timeout.as_millis() as u64,
                receipt_ms = receipt.as_millis() as u64,
                "response_timeout is not shorter than a fetch's receipt (half the lease, at least 11 s): a fetch whose reply is lost is not retried, and its jobs spend an attempt unrun; lower response_timeout or raise the lease");
        }
        if cfg.lease < Duration::from_millis(100) {
            return Err(QueueError::Config("lease must be at least 100ms".into()));
        }
        // A lease of "for ever" overflowed the local lease clock (`Instant`
        // plus the lease) and panicked in every job's runner, leaving the
        // job leased for the longest time a script keeps: lost.
        if cfg.lease > MAX_LEASE {
            return Err(QueueError::Config(
                "lease must be at most 7 days (a heartbeat keeps a longer job's lease)".into(),
            ));
        }
        // BLMOVE with a timeout of 0 blocks for ever: the client gives up at
        // its response timeout, and the next job the pending BLMOVE moves
        // lands in processing with its reply thrown away.
        if cfg.block_timeout.is_zero() {
            return Err(QueueError::Config(
                "block_timeout must be more than zero".into(),
            ));
        }
        if cfg.block_timeout > MAX_WAIT || cfg.promote_interval > MAX_WAIT {
            return Err(QueueError::Config(format!(
                "block_timeout ({:?}) and promote_interval ({:?}) must be at most a day",
                cfg.block_timeout, cfg.promote_interval
            )));
        }
        // The worker counts on 90 % of the lease from each request's send
        // time (lease_clock.rs). A beat every half of that or more could not
        // survive one failed extend; one near the whole of it was refused
        // locally (the deadline had passed) and never sent, so the job was
        // reclaimed and ran twice at once.
        let trusted = crate::lease_clock::trusted(cfg.lease);
        if cfg.heartbeat_interval() >= trusted / 2 {
            return Err(QueueError::Config(format!(
                "heartbeat ({:?}) must be shorter than {:?}, half of the 90 % of the lease ({:?}) \
                 the worker counts on, so that one failed extend is survived (default: a third of the lease)",
                cfg.heartbeat_interval(),
                trusted / 2,
                cfg.lease
            )));
        }
        // The watchdog makes the same check (Backoff::validate).
        cfg.backoff.validate()?;
        // The heartbeat stops when the handler returns: an ack that waits
        // most of a lease for its batch finds the lease expired.
        if cfg.ack_window > cfg.lease / 3 {
            return Err(QueueError::Config(format!(
                "ack_window ({:?}) must be at most a third of the lease ({:?})",
                cfg.ack_window, cfg.lease
            )));
        }
        Ok(())
    }

    /// Handlers by `(queue, job type)`, with the timeouts of
    /// [`timeout_for`](Self::timeout_for); a type registered twice, or a
    /// timeout for a type not registered, is an error.
    fn handlers(&self) -> Result<super::Handlers> {
        if let Some(name) = self
            .timeouts
            .keys()
            .find(|n| !self.registrations.iter().any(|r| r.name == n.as_str()))
        {
            return Err(QueueError::Config(format!(
                "timeout_for(`{name}`): no such job type is registered"
            )));
        }
        if let Some((name, _)) = self.timeouts.iter().find(|(_, t)| t.is_zero()) {
            return Err(QueueError::Config(format!(
                "timeout_for(`{name}`): the timeout must be more than zero"
            )));
        }
        let mut handlers = super::Handlers::default();
        for reg in &self.registrations {
            let key = (reg.queue, reg.name);
            let mut run = reg.clone();
            if let Some(limit) = self.timeouts.get(reg.name) {
                run.timeout = Some(*limit);
            }
            // A hand-written `Job` impl is not checked by `#[job]`: a zero
            // timeout failed every attempt ("timed out after 0ns"), a zero
            // deadline dead-lettered every job ("deadline exceeded").
            for (what, limit) in [("TIMEOUT", run.timeout), ("DEADLINE", run.deadline)] {
                if limit.is_some_and(|d| d.is_zero()) {
                    return Err(QueueError::Config(format!(
                        "job type `{}` on queue `{}`: its {what} must be more than zero \
                         (None for no limit)",
                        reg.name, reg.queue
                    )));
                }
            }
            if handlers.insert(key, run).is_some() {
                return Err(QueueError::Config(format!(
                    "job type `{}` registered twice on queue `{}`",
                    reg.name, reg.queue
                )));
            }
        }
        Ok(handlers)
    }

    /// The consumed queues, highest priority first (then by name). Every
    /// queue name, consumed (`queues`), registered (a job type's `QUEUE`,
    /// where its enqueues go) or given a priority or limit, must be one an
    /// enqueue accepts ([`validate_queue_name`](crate::validate_queue_name)):
    /// before, a hand-written `QUEUE = "emails high"` built a worker that
    /// consumed a queue no enqueue could reach.
    ///
    /// A consumed queue no registered type uses is refused: handlers are
    /// looked up by `(queue, type)`, so it could run no job it took: it
    /// would only give each back for a worker that has the type (once
    /// dead-lettered at once as an unknown type). A registered type whose
    /// queue is left out of `queues` is logged: this worker never runs it
    /// (legitimate when other workers consume that queue).
    fn worker_queues(&self) -> Result<Vec<WorkerQueue>> {
        let registered = self.registrations.iter().map(|r| r.queue);
        for q in registered
            .clone()
            .chain(self.queues.iter().flatten().map(String::as_str))
            .chain(self.priorities.keys().map(String::as_str))
            .chain(self.limits.keys().map(String::as_str))
        {
            crate::enqueue_options::check_queue_name(q)?;
        }
        let mut queues = self
            .queues
            .clone()
            .unwrap_or_else(|| registered.clone().map(str::to_string).collect());
        queues.sort();
        queues.dedup();
        if let Some(q) = queues.iter().find(|q| !registered.clone().any(|r| r == *q)) {
            return Err(QueueError::Config(format!(
                "queue `{q}` is in queues(..) but no job type registered on this worker is on it: \
                 it could run no job it takes (each would be given back as an unknown type); register its \
                 job types on this worker or leave it out of queues(..)"
            )));
        }
        for reg in &self.registrations {
            if !queues.iter().any(|q| q == reg.queue) {
                warn!(
                    queue = reg.queue,
                    job_type = reg.name,
                    "job type registered but its queue is not in queues(..): this worker never runs it"
                );
            }
        }
        for (q, limit) in &self.limits {
            if *limit == 0 || *limit > MAX_CONCURRENCY {
                return Err(QueueError::Config(format!(
                    "queue `{q}`: concurrency limit must be from 1 to {MAX_CONCURRENCY}"
                )));
            }
        }
        for q in self.priorities.keys().chain(self.limits.keys()) {
            if !queues.contains(q) {
                return Err(QueueError::Config(format!(
                    "queue `{q}` has a priority or limit but the worker does not consume it"
                )));
            }
        }
        let mut queues: Vec<WorkerQueue> = queues
            .iter()
            .map(|q| {
                let limit = self.limits.get(q).copied();
                let slots =
                    limit.map_or(self.config.concurrency, |l| l.min(self.config.concurrency));
                WorkerQueue::new(
                    QueueKeys::new(q),
                    self.priorities.get(q).copied().unwrap_or(0),
                    limit,
                    self.config.fetch_batch_for(slots),
                )
            })
            .collect();
        queues.sort_by(|a, b| {
            b.priority
                .cmp(&a.priority)
                .then(a.keys.queue.cmp(&b.keys.queue))
        });
        Ok(queues)
    }
}
