//! The consumer side: [`Worker`] fetches, runs, acks, retries and heartbeats.
//!
//! One fetcher task per queue. When the queue has jobs, a single script moves
//! and claims up to `fetch_batch` of them (LMOVE + claim, atomic, one round
//! trip). When it is empty, the fetcher blocks in BLMOVE on its own connection
//! (BLMOVE cannot run in a script) and claims the id it got with a second
//! script; a crash between the two leaves an unleased id that the watchdog
//! recovers (DESIGN rule 4).

use std::collections::HashMap;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt;
use redis::Value;
use tokio::sync::{watch, OwnedSemaphorePermit, Semaphore};
use tracing::{debug, error, info, info_span, warn, Instrument};

use crate::backoff::Backoff;
use crate::conn::{connect, ConnectionConfig, RedisConnection};
use crate::error::{QueueError, Result};
use crate::job::{ContextInner, JobContext, JobError, JobId};
use crate::keys::QueueKeys;
use crate::registry::Registration;
use crate::reply;
use crate::scripts;

/// Worker settings. The defaults suit most queues; see each field.
///
/// ```
/// let cfg = queue_core::WorkerConfig::default();
/// assert_eq!(cfg.concurrency, 16);
/// assert!(cfg.heartbeat_interval() < cfg.lease);
/// ```
#[derive(Debug, Clone)]
pub struct WorkerConfig {
    /// Jobs run at once, across all queues of the worker.
    pub concurrency: usize,
    /// Lease per delivery. A job whose worker stops heartbeating is returned
    /// by the watchdog once its lease expires.
    pub lease: Duration,
    /// Heartbeat period; `None`: a third of the lease.
    pub heartbeat: Option<Duration>,
    /// Extend leases while handlers run (default true). Turning it off makes
    /// any handler slower than the lease get reclaimed and redelivered.
    pub heartbeat_enabled: bool,
    /// How long one BLMOVE waits on an empty queue. Also bounds how long
    /// shutdown waits for the fetchers; an idle worker makes one call per period.
    pub block_timeout: Duration,
    /// Jobs moved and claimed per round trip when the queue is deep.
    pub fetch_batch: usize,
    /// On shutdown, how long in-flight jobs may take to finish before they
    /// are left leased for the watchdog.
    pub grace: Duration,
    /// How long completion records are kept (the window in which a redelivery
    /// or a re-enqueue of a finished job is recognised). Zero: no record.
    pub completion_retention: Duration,
    /// Retry backoff for retryable handler errors.
    pub backoff: Backoff,
    /// How often due delayed jobs (retries) are moved to main.
    pub promote_interval: Duration,
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
            fetch_batch: 16,
            grace: Duration::from_secs(30),
            completion_retention: Duration::from_secs(24 * 3600),
            backoff: Backoff::default(),
            promote_interval: Duration::from_millis(500),
            connection: ConnectionConfig::default(),
        }
    }
}

impl WorkerConfig {
    /// The effective heartbeat period.
    pub fn heartbeat_interval(&self) -> Duration {
        self.heartbeat
            .unwrap_or(self.lease / 3)
            .max(Duration::from_millis(10))
    }
}

/// Builds a [`Worker`]. Start with [`Worker::builder`].
#[derive(Debug)]
pub struct WorkerBuilder {
    url: String,
    config: WorkerConfig,
    registrations: Vec<Registration>,
    queues: Option<Vec<String>>,
    priorities: HashMap<String, i32>,
    limits: HashMap<String, usize>,
}

impl WorkerBuilder {
    /// Adds a job type (e.g. `send_welcome::handler()`).
    pub fn register(mut self, registration: Registration) -> Self {
        self.registrations.push(registration);
        self
    }

    /// Jobs run at once (default 16).
    pub fn concurrency(mut self, n: usize) -> Self {
        self.config.concurrency = n;
        self
    }

    /// Queues to fetch from. Default: every queue a registered job type uses.
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
    pub fn queue_priority(mut self, queue: impl Into<String>, priority: i32) -> Self {
        self.priorities.insert(queue.into(), priority);
        self
    }

    /// At most `limit` jobs of `queue` run at once on this worker (within the
    /// worker-wide concurrency).
    pub fn queue_concurrency(mut self, queue: impl Into<String>, limit: usize) -> Self {
        self.limits.insert(queue.into(), limit);
        self
    }

    /// Lease per delivery (default 30 s).
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

    /// Replaces the whole configuration.
    pub fn config(mut self, config: WorkerConfig) -> Self {
        self.config = config;
        self
    }

    /// Connects and validates the configuration.
    pub async fn build(self) -> Result<Worker> {
        let cfg = &self.config;
        if self.registrations.is_empty() {
            return Err(QueueError::Config(
                "a worker needs at least one registered job type".into(),
            ));
        }
        if cfg.concurrency == 0 || cfg.fetch_batch == 0 {
            return Err(QueueError::Config(
                "concurrency and fetch_batch must be at least 1".into(),
            ));
        }
        if cfg.lease < Duration::from_millis(100) {
            return Err(QueueError::Config("lease must be at least 100ms".into()));
        }
        if cfg.heartbeat_interval() >= cfg.lease {
            return Err(QueueError::Config(
                "heartbeat must be shorter than the lease".into(),
            ));
        }
        let mut handlers = HashMap::new();
        for reg in &self.registrations {
            let key = (reg.queue.to_string(), reg.name.to_string());
            if handlers.insert(key, reg.clone()).is_some() {
                return Err(QueueError::Config(format!(
                    "job type `{}` registered twice on queue `{}`",
                    reg.name, reg.queue
                )));
            }
        }
        let mut queues = self.queues.unwrap_or_else(|| {
            self.registrations
                .iter()
                .map(|r| r.queue.to_string())
                .collect()
        });
        queues.sort();
        queues.dedup();
        for (q, limit) in &self.limits {
            if *limit == 0 {
                return Err(QueueError::Config(format!(
                    "queue `{q}`: concurrency limit must be at least 1"
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
            .map(|q| WorkerQueue {
                keys: QueueKeys::new(q),
                priority: self.priorities.get(q).copied().unwrap_or(0),
                limit: self.limits.get(q).map(|n| Arc::new(Semaphore::new(*n))),
            })
            .collect();
        queues.sort_by(|a, b| {
            b.priority
                .cmp(&a.priority)
                .then(a.keys.queue.cmp(&b.keys.queue))
        });
        let periodic = Arc::new(crate::scheduler::parse(&self.registrations)?);
        let conn = connect(&self.url, &cfg.connection).await?;
        Ok(Worker {
            inner: Arc::new(Inner {
                url: self.url,
                conn,
                periodic,
                handlers,
                queues,
                config: self.config,
            }),
            shutdown: watch::channel(false).0,
        })
    }
}

struct Inner {
    url: String,
    conn: RedisConnection,
    periodic: Arc<Vec<crate::scheduler::Periodic>>,
    handlers: HashMap<(String, String), Registration>,
    /// Highest priority first.
    queues: Vec<WorkerQueue>,
    config: WorkerConfig,
}

/// Runs registered jobs from one or more queues.
///
/// ```
/// # use queue_core::{job, JobContext, JobError, Worker};
/// # #[job(queue = "reports")]
/// # async fn build_report(_ctx: JobContext, _id: u64) -> Result<(), JobError> { Ok(()) }
/// # #[tokio::main] async fn main() -> Result<(), queue_core::QueueError> {
/// # let server = queue_testkit::RedisServer::start().unwrap();
/// # let url = server.url();
/// let worker = Worker::builder(&url)
///     .register(build_report::handler())
///     .concurrency(8)
///     .build()
///     .await?;
/// let stop = worker.shutdown_handle();
/// let running = tokio::spawn(worker.run()); // stops on SIGTERM, ctrl-c or the handle
/// stop.shutdown();
/// running.await.unwrap()?;
/// # Ok(()) }
/// ```
pub struct Worker {
    inner: Arc<Inner>,
    shutdown: watch::Sender<bool>,
}

impl std::fmt::Debug for Worker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Worker")
            .field(
                "queues",
                &self
                    .inner
                    .queues
                    .iter()
                    .map(|q| &q.keys.queue)
                    .collect::<Vec<_>>(),
            )
            .field("config", &self.inner.config)
            .finish_non_exhaustive()
    }
}

/// Asks a running [`Worker`] to shut down gracefully. Cheap to clone.
#[derive(Debug, Clone)]
pub struct ShutdownHandle(watch::Sender<bool>);

impl ShutdownHandle {
    /// Stop fetching, let in-flight jobs finish within the grace period.
    /// A request made before the worker started running is kept: `run`
    /// then returns at once.
    pub fn shutdown(&self) {
        self.0.send_replace(true);
    }
}

impl Worker {
    /// Starts building a worker connected to `url`.
    pub fn builder(url: &str) -> WorkerBuilder {
        WorkerBuilder {
            url: url.to_string(),
            config: WorkerConfig::default(),
            registrations: Vec::new(),
            queues: None,
            priorities: HashMap::new(),
            limits: HashMap::new(),
        }
    }

    /// A handle that triggers graceful shutdown.
    pub fn shutdown_handle(&self) -> ShutdownHandle {
        ShutdownHandle(self.shutdown.clone())
    }

    /// Runs until SIGTERM, SIGINT (ctrl-c) or [`ShutdownHandle::shutdown`].
    pub async fn run(self) -> Result<()> {
        self.run_until(termination_signal()).await
    }

    /// Runs until `signal` completes (or the shutdown handle fires), then
    /// shuts down gracefully: stop fetching, wait up to the grace period for
    /// in-flight jobs, leave any still running leased for the watchdog.
    pub async fn run_until(self, signal: impl Future<Output = ()> + Send + 'static) -> Result<()> {
        let inner = self.inner;
        let cfg = &inner.config;
        let stop_tx = self.shutdown;
        let mut stop_rx = stop_tx.subscribe();
        let (hard_tx, hard_rx) = watch::channel(false);
        let sem = Arc::new(Semaphore::new(cfg.concurrency));

        let signal_tx = stop_tx.clone();
        let signal_task = tokio::spawn(async move {
            signal.await;
            signal_tx.send_replace(true);
        });

        info!(
            queues = ?inner.queues.iter().map(|q| &q.keys.queue).collect::<Vec<_>>(),
            concurrency = cfg.concurrency,
            "worker started"
        );

        let mut tasks = Vec::new();
        for me in 0..inner.queues.len() {
            let blocking = connect(
                &inner.url,
                &ConnectionConfig {
                    response_timeout: cfg.block_timeout + cfg.connection.response_timeout,
                    connection_timeout: cfg.connection.connection_timeout,
                },
            )
            .await?;
            let fetcher = Fetcher {
                inner: inner.clone(),
                me,
                blocking,
                sem: sem.clone(),
                stop: stop_tx.subscribe(),
                hard_stop: hard_rx.clone(),
            };
            tasks.push(tokio::spawn(fetcher.run()));
        }
        tasks.push(tokio::spawn(promoter(inner.clone(), stop_tx.subscribe())));
        tasks.push(tokio::spawn(crate::scheduler::run(
            inner.conn.clone(),
            inner.periodic.clone(),
            stop_tx.subscribe(),
        )));

        // Wait for the stop request.
        while !*stop_rx.borrow_and_update() {
            if stop_rx.changed().await.is_err() {
                break;
            }
        }
        info!("shutdown requested: no new fetches, waiting for in-flight jobs");
        for t in tasks {
            let _ = t.await;
        }
        let all = cfg.concurrency as u32;
        match tokio::time::timeout(cfg.grace, sem.acquire_many(all)).await {
            Ok(_) => info!("worker stopped: all in-flight jobs finished"),
            Err(_) => {
                let running = cfg.concurrency - sem.available_permits();
                warn!(
                    running,
                    grace_ms = cfg.grace.as_millis() as u64,
                    "grace period over: leaving running jobs leased; the watchdog returns them when their lease expires"
                );
                hard_tx.send_replace(true);
                let _ = tokio::time::timeout(Duration::from_secs(5), sem.acquire_many(all)).await;
            }
        }
        signal_task.abort();
        Ok(())
    }
}

async fn termination_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = term.recv() => info!("SIGTERM received"),
                    _ = tokio::signal::ctrl_c() => info!("SIGINT received"),
                }
            }
            Err(e) => {
                warn!(error = %e, "cannot listen for SIGTERM; only ctrl-c stops the worker");
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}

/// Moves due retries and delayed jobs to main, for every queue, until stopped.
async fn promoter(inner: Arc<Inner>, mut stop: watch::Receiver<bool>) {
    let mut conn = inner.conn.clone();
    loop {
        if *stop.borrow() {
            return;
        }
        for keys in inner.queues.iter().map(|q| &q.keys) {
            match promote(&mut conn, keys, 1000).await {
                Ok(n) if n > 0 => {
                    debug!(queue = %keys.queue, promoted = n, "due delayed jobs moved to main")
                }
                Ok(_) => {}
                Err(e) => warn!(queue = %keys.queue, error = %e, "promote failed; will retry"),
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(inner.config.promote_interval) => {}
            _ = stop.changed() => {}
        }
    }
}

/// Runs the promote script once.
pub(crate) async fn promote(
    conn: &mut RedisConnection,
    keys: &QueueKeys,
    limit: usize,
) -> Result<u64> {
    scripts::PROMOTE
        .key(&keys.delayed)
        .key(&keys.main)
        .key(&keys.dead)
        .key(&keys.stats)
        .key(&keys.guard)
        .arg(&keys.job_prefix)
        .arg(limit)
        .invoke_async(conn)
        .await
        .map_err(|e| QueueError::redis(&keys.queue, None, e))
}

/// One claimed delivery.
struct Delivery {
    id: JobId,
    token: String,
    job_type: String,
    version: u32,
    payload: Vec<u8>,
    attempt: u32,
    max_attempts: u32,
    enqueued_at_ms: i64,
    delivered_at_ms: i64,
}

/// A row of a fetch/claim reply.
enum ClaimRow {
    Claimed(Delivery),
    /// Not ours to run, with the reason for the log.
    Skipped(JobId, &'static str),
}

fn parse_claim_row(queue: &str, v: &Value) -> Result<ClaimRow> {
    let row = reply::array(v)
        .ok_or_else(|| QueueError::protocol(queue, None, format!("claim row {v:?}")))?;
    let tag = row.first().and_then(reply::text).unwrap_or_default();
    let id = JobId::from(
        row.get(1)
            .and_then(reply::bytes)
            .map(|b| String::from_utf8_lossy(&b).into_owned())
            .unwrap_or_default(),
    );
    let bad = |what: &str| {
        QueueError::protocol(queue, Some(&id), format!("claim row field {what}: {v:?}"))
    };
    Ok(match tag.as_str() {
        "claimed" => ClaimRow::Claimed(Delivery {
            token: row
                .get(2)
                .and_then(reply::text)
                .ok_or_else(|| bad("token"))?,
            job_type: row
                .get(3)
                .and_then(reply::text)
                .ok_or_else(|| bad("type"))?,
            version: row
                .get(4)
                .and_then(reply::int)
                .unwrap_or(0)
                .clamp(0, u32::MAX as i64) as u32,
            payload: row.get(5).and_then(reply::bytes).unwrap_or_default(),
            attempt: row
                .get(6)
                .and_then(reply::int)
                .ok_or_else(|| bad("attempts"))?
                .clamp(0, u32::MAX as i64) as u32,
            max_attempts: row
                .get(7)
                .and_then(reply::int)
                .unwrap_or(1)
                .clamp(1, u32::MAX as i64) as u32,
            enqueued_at_ms: row.get(8).and_then(reply::int).unwrap_or(0),
            delivered_at_ms: row.get(9).and_then(reply::int).unwrap_or(0),
            id,
        }),
        "done" => ClaimRow::Skipped(
            id,
            "completion record exists: acked without running the handler again",
        ),
        "missing" => ClaimRow::Skipped(id, "job hash missing: dead-lettered"),
        "busy" => ClaimRow::Skipped(id, "another delivery owns this job"),
        "gone" => ClaimRow::Skipped(id, "already returned by the watchdog before the claim"),
        other => {
            return Err(QueueError::protocol(
                queue,
                Some(&id),
                format!("unknown claim outcome {other:?}"),
            ))
        }
    })
}

/// A queue as a worker consumes it: its keys, priority and optional
/// concurrency limit.
struct WorkerQueue {
    keys: QueueKeys,
    priority: i32,
    limit: Option<Arc<Semaphore>>,
}

impl WorkerQueue {
    /// `Some(None)`: no limit; `Some(Some(p))`: a queue permit; `None`: at its limit.
    fn try_queue_permit(&self) -> Option<Option<OwnedSemaphorePermit>> {
        match &self.limit {
            None => Some(None),
            Some(sem) => sem.clone().try_acquire_owned().ok().map(Some),
        }
    }
}

/// The permits one running job holds: the worker-wide one and, for a queue
/// with a concurrency limit, the queue's.
struct Slot {
    global: OwnedSemaphorePermit,
    #[allow(dead_code)] // held (not read) until the job ends
    queue: Option<OwnedSemaphorePermit>,
}

struct Fetcher {
    inner: Arc<Inner>,
    /// Index of this fetcher's queue in `inner.queues`.
    me: usize,
    blocking: RedisConnection,
    sem: Arc<Semaphore>,
    stop: watch::Receiver<bool>,
    hard_stop: watch::Receiver<bool>,
}

impl Fetcher {
    fn queue(&self) -> &WorkerQueue {
        &self.inner.queues[self.me]
    }

    /// Waits for this queue's permit (if limited), then a worker-wide one.
    async fn wait_slot(&mut self) -> Option<Slot> {
        let queue = match self.inner.queues[self.me].limit.clone() {
            Some(limit) => tokio::select! {
                p = limit.acquire_owned() => Some(p.ok()?),
                _ = self.stop.changed() => return None,
            },
            None => None,
        };
        let global = tokio::select! {
            p = self.sem.clone().acquire_owned() => p.ok()?,
            _ = self.stop.changed() => return None,
        };
        Some(Slot { global, queue })
    }

    fn try_slot(&self) -> Option<Slot> {
        let queue = self.queue().try_queue_permit()?;
        let global = self.sem.clone().try_acquire_owned().ok()?;
        Some(Slot { global, queue })
    }

    async fn run(mut self) {
        let queue = self.queue().keys.queue.clone();
        let mut error_delay = Duration::from_millis(100);
        loop {
            if *self.stop.borrow() {
                break;
            }
            let Some(first) = self.wait_slot().await else {
                break;
            };
            // Strict priority: while a higher-priority queue has jobs (and room
            // under its own limit), take from it first, one job per check.
            let Some(first) = self.serve_higher_priority(first).await else {
                continue;
            };
            let mut slots = vec![first];
            while slots.len() < self.inner.config.fetch_batch {
                match self.try_slot() {
                    Some(s) => slots.push(s),
                    None => break,
                }
            }
            let keys = self.queue().keys.clone();
            let rows = match self.fetch_ready(&keys, slots.len()).await {
                Ok(rows) if !rows.is_empty() => rows,
                Ok(_) => {
                    slots.truncate(1);
                    match self.fetch_blocking().await {
                        Ok(Some(row)) => vec![row],
                        Ok(None) => continue,
                        Err(e) => {
                            self.pause_after_error(&e, &mut error_delay).await;
                            continue;
                        }
                    }
                }
                Err(e) => {
                    self.pause_after_error(&e, &mut error_delay).await;
                    continue;
                }
            };
            error_delay = Duration::from_millis(100);
            self.dispatch(&keys, rows, &mut slots);
        }
        debug!(queue = %queue, "fetcher stopped");
    }

    /// Tries the queues with a higher priority than this one; returns the
    /// slot back when none had a job for it.
    async fn serve_higher_priority(&self, slot: Slot) -> Option<Slot> {
        let mine = self.queue().priority;
        for (i, q) in self.inner.queues.iter().enumerate() {
            if i == self.me || q.priority <= mine {
                continue;
            }
            let Some(queue_permit) = q.try_queue_permit() else {
                continue;
            };
            match self.fetch_ready(&q.keys, 1).await {
                Ok(rows) if rows.iter().any(|r| matches!(r, ClaimRow::Claimed(_))) => {
                    let mut slots = vec![Slot {
                        global: slot.global,
                        queue: queue_permit,
                    }];
                    self.dispatch(&q.keys, rows, &mut slots);
                    return None;
                }
                Ok(rows) => self.dispatch(&q.keys, rows, &mut Vec::new()),
                Err(e) => warn!(queue = %q.keys.queue, error = %e, "priority fetch failed"),
            }
        }
        Some(slot)
    }

    /// Spawns a runner for each claimed row, each holding one slot.
    fn dispatch(&self, keys: &QueueKeys, rows: Vec<ClaimRow>, slots: &mut Vec<Slot>) {
        let queue = &keys.queue;
        for row in rows {
            match row {
                ClaimRow::Claimed(delivery) => {
                    let Some(slot) = slots.pop() else {
                        error!(queue = %queue, job_id = %delivery.id, "claimed more jobs than permits; leaving it leased");
                        continue;
                    };
                    let runner = JobRunner {
                        inner: self.inner.clone(),
                        keys: keys.clone(),
                        hard_stop: self.hard_stop.clone(),
                    };
                    let span = info_span!("job", queue = %queue, job_id = %delivery.id, job_type = %delivery.job_type, attempt = delivery.attempt);
                    tokio::spawn(
                        async move {
                            runner.run(delivery).await;
                            drop(slot);
                        }
                        .instrument(span),
                    );
                }
                ClaimRow::Skipped(id, why) => info!(queue = %queue, job_id = %id, "{why}"),
            }
        }
    }

    async fn pause_after_error(&mut self, e: &QueueError, delay: &mut Duration) {
        warn!(queue = %self.queue().keys.queue, error = %e, retry_in_ms = delay.as_millis() as u64, "fetch failed; reconnecting with backoff");
        tokio::select! {
            _ = tokio::time::sleep(*delay) => {}
            _ = self.stop.changed() => {}
        }
        *delay = (*delay * 2).min(Duration::from_secs(5));
    }

    /// LMOVE + claim of up to `count` jobs in one script.
    async fn fetch_ready(&self, k: &QueueKeys, count: usize) -> Result<Vec<ClaimRow>> {
        let mut conn = self.inner.conn.clone();
        let token_base = uuid::Uuid::new_v4().to_string();
        let reply: Value = scripts::FETCH
            .key(&k.main)
            .key(&k.processing)
            .key(&k.leases)
            .key(&k.dead)
            .key(&k.stats)
            .key(&k.guard)
            .arg(&k.job_prefix)
            .arg(&k.done_prefix)
            .arg(self.inner.config.lease.as_millis() as u64)
            .arg(&token_base)
            .arg(count)
            .invoke_async(&mut conn)
            .await
            .map_err(|e| QueueError::redis(&k.queue, None, e))?;
        let rows = reply::array(&reply).ok_or_else(|| {
            QueueError::protocol(&k.queue, None, format!("fetch reply {reply:?}"))
        })?;
        rows.iter().map(|r| parse_claim_row(&k.queue, r)).collect()
    }

    /// BLMOVE on the fetcher's own connection, then the claim script.
    async fn fetch_blocking(&mut self) -> Result<Option<ClaimRow>> {
        let k = self.queue().keys.clone();
        let moved: Option<Vec<u8>> = redis::cmd("BLMOVE")
            .arg(&k.main)
            .arg(&k.processing)
            .arg("RIGHT")
            .arg("LEFT")
            .arg(self.inner.config.block_timeout.as_secs_f64())
            .query_async(&mut self.blocking)
            .await
            .map_err(|e| QueueError::redis(&k.queue, None, e))?;
        let Some(id) = moved else { return Ok(None) };
        crate::failpoint::hit("after_blmove");
        // The window of DESIGN rule 4 is here: until the claim lands, the id
        // sits in processing with no lease. Retry the claim briefly; if it
        // never lands, the watchdog adopts the id and returns it.
        let token = uuid::Uuid::new_v4().to_string();
        let mut delay = Duration::from_millis(50);
        for attempt in 1..=5 {
            let mut conn = self.inner.conn.clone();
            let res: redis::RedisResult<Value> = scripts::CLAIM
                .key(&k.processing)
                .key(&k.leases)
                .key(&k.dead)
                .key(&k.stats)
                .key(&k.guard)
                .arg(&id)
                .arg(&k.job_prefix)
                .arg(&k.done_prefix)
                .arg(self.inner.config.lease.as_millis() as u64)
                .arg(&token)
                .invoke_async(&mut conn)
                .await;
            match res {
                Ok(v) => return parse_claim_row(&k.queue, &v).map(Some),
                Err(e) if attempt < 5 => {
                    warn!(queue = %k.queue, job_id = %String::from_utf8_lossy(&id), error = %e, "claim failed; retrying");
                    tokio::time::sleep(delay).await;
                    delay *= 2;
                }
                Err(e) => {
                    return Err(QueueError::redis(
                        &k.queue,
                        Some(&JobId::from(String::from_utf8_lossy(&id).into_owned())),
                        e,
                    ))
                }
            }
        }
        unreachable!("the claim loop returns on its last attempt")
    }
}

/// Runs one delivery: decode, heartbeat, handler, then ack or fail.
struct JobRunner {
    inner: Arc<Inner>,
    keys: QueueKeys,
    hard_stop: watch::Receiver<bool>,
}

/// What to tell Redis after the handler.
enum Outcome {
    /// Success, with the handler's result reference.
    Ack(Option<String>),
    Retry(String),
    Dead(String),
}

impl JobRunner {
    async fn run(mut self, d: Delivery) {
        let queue = self.keys.queue.clone();
        let Some(reg) = self
            .inner
            .handlers
            .get(&(queue.clone(), d.job_type.clone()))
            .cloned()
        else {
            let known: Vec<_> = self
                .inner
                .handlers
                .keys()
                .filter(|(q, _)| *q == queue)
                .map(|(_, n)| n.as_str())
                .collect();
            let reason = format!(
                "unknown job type `{}` on queue `{}` (this worker handles: {})",
                d.job_type,
                queue,
                known.join(", ")
            );
            self.finish(&d, Outcome::Dead(reason), None).await;
            return;
        };
        if d.version != reg.version {
            let reason = format!(
                "unknown schema version {} for job type `{}` (the handler expects version {})",
                d.version, d.job_type, reg.version
            );
            self.finish(&d, Outcome::Dead(reason), None).await;
            return;
        }
        let ctx = JobContext {
            inner: Arc::new(ContextInner {
                job_id: d.id.clone(),
                queue: queue.clone(),
                job_type: d.job_type.clone(),
                attempt: d.attempt,
                max_attempts: d.max_attempts,
                enqueued_at_ms: d.enqueued_at_ms,
                delivered_at_ms: d.delivered_at_ms,
                lease_lost: AtomicBool::new(false),
                conn: Some(self.inner.conn.clone()),
                result_ref: std::sync::Mutex::new(None),
            }),
        };
        let fut = match (reg.runner)(ctx.clone(), &d.payload) {
            Ok(f) => f,
            Err(msg) => {
                self.finish(
                    &d,
                    Outcome::Dead(format!(
                        "payload does not decode as `{}`: {msg}",
                        d.job_type
                    )),
                    None,
                )
                .await;
                return;
            }
        };
        crate::failpoint::hit("after_claim");
        crate::metrics::started(&queue, &d.job_type);
        debug!("started");
        let started = std::time::Instant::now();
        let heartbeat = tokio::spawn(
            heartbeat(
                self.inner.clone(),
                self.keys.clone(),
                d.id.clone(),
                d.token.clone(),
                ctx.clone(),
            )
            .in_current_span(),
        );

        let guarded = AssertUnwindSafe(fut).catch_unwind();
        let timed = async {
            match reg.timeout {
                Some(limit) => match tokio::time::timeout(limit, guarded).await {
                    Ok(r) => r,
                    Err(_) => Ok(Err(JobError::retryable(format!(
                        "handler timed out after {limit:?}"
                    )))),
                },
                None => guarded.await,
            }
        };
        let result = tokio::select! {
            r = timed => r,
            _ = wait_true(&mut self.hard_stop) => {
                heartbeat.abort();
                warn!("shutdown grace over: job left leased; the watchdog will return it");
                return;
            }
        };
        heartbeat.abort();
        let elapsed = started.elapsed();
        let elapsed_ms = elapsed.as_millis() as u64;
        let outcome = match result {
            Ok(Ok(())) => Outcome::Ack(ctx.take_result_ref()),
            Ok(Err(e)) if e.is_retryable() => Outcome::Retry(e.message().to_string()),
            Ok(Err(e)) => Outcome::Dead(format!("permanent error: {}", e.message())),
            Err(panic) => {
                let msg = panic
                    .downcast_ref::<&str>()
                    .map(|s| s.to_string())
                    .or_else(|| panic.downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "non-string panic payload".into());
                Outcome::Retry(format!("handler panicked: {msg}"))
            }
        };
        debug!(elapsed_ms, "handler returned");
        self.finish(&d, outcome, Some(elapsed)).await;
    }

    /// Ack / retry / dead-letter, retrying Redis errors until the lease would
    /// have expired anyway (after that the watchdog owns the job).
    /// `elapsed` is the handler's run time; `None` when it never started
    /// (unknown type or version, undecodable payload).
    async fn finish(&self, d: &Delivery, outcome: Outcome, elapsed: Option<Duration>) {
        let deadline = tokio::time::Instant::now() + self.inner.config.lease;
        let mut delay = Duration::from_millis(50);
        loop {
            crate::failpoint::hit(match &outcome {
                Outcome::Ack(_) => "before_ack",
                _ => "before_fail",
            });
            let res = match &outcome {
                Outcome::Ack(result_ref) => self.ack(d, result_ref.clone()).await,
                Outcome::Retry(msg) => self.fail(d, "retry", msg).await,
                Outcome::Dead(reason) => self.fail(d, "permanent", reason).await,
            };
            match res {
                Ok(label) => {
                    crate::metrics::finished(&self.keys.queue, &d.job_type, label, elapsed);
                    return;
                }
                Err(e) if e.is_lease_lost() => {
                    warn!(error = %e, "result discarded: lease lost");
                    return;
                }
                Err(e) if tokio::time::Instant::now() + delay < deadline => {
                    warn!(error = %e, retry_in_ms = delay.as_millis() as u64, "could not record the job's result; retrying");
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(Duration::from_secs(2));
                }
                Err(e) => {
                    error!(error = %e, "could not record the job's result before its lease expired; the watchdog will return it");
                    return;
                }
            }
        }
    }

    async fn ack(&self, d: &Delivery, result_ref: Option<String>) -> Result<&'static str> {
        let k = &self.keys;
        let mut conn = self.inner.conn.clone();
        let ok: i64 = scripts::ACK
            .key(&k.processing)
            .key(&k.leases)
            .key(k.job(d.id.as_str()))
            .key(k.done(d.id.as_str()))
            .key(&k.stats)
            .key(k.steps(d.id.as_str()))
            .arg(d.id.as_str())
            .arg(&d.token)
            .arg(self.inner.config.completion_retention.as_millis() as u64)
            .arg(result_ref.unwrap_or_default())
            .arg(&k.tput_prefix)
            .invoke_async(&mut conn)
            .await
            .map_err(|e| QueueError::redis(&k.queue, Some(&d.id), e))?;
        if ok == 1 {
            info!("completed");
            Ok("completed")
        } else {
            Err(QueueError::LeaseLost {
                queue: k.queue.clone(),
                job_id: d.id.clone(),
            })
        }
    }

    async fn fail(&self, d: &Delivery, kind: &str, message: &str) -> Result<&'static str> {
        let k = &self.keys;
        let delay = self.inner.config.backoff.delay(d.attempt);
        let mut conn = self.inner.conn.clone();
        let reply: Value = scripts::FAIL
            .key(&k.processing)
            .key(&k.leases)
            .key(k.job(d.id.as_str()))
            .key(&k.delayed)
            .key(&k.dead)
            .key(&k.stats)
            .arg(d.id.as_str())
            .arg(&d.token)
            .arg(kind)
            .arg(message)
            .arg(delay.as_millis() as u64)
            .invoke_async(&mut conn)
            .await
            .map_err(|e| QueueError::redis(&k.queue, Some(&d.id), e))?;
        let items = reply::array(&reply).unwrap_or(&[]);
        match items.first().and_then(reply::text).as_deref() {
            Some("retry") => {
                warn!(
                    error = message,
                    retry_in_ms = delay.as_millis() as u64,
                    "failed; will retry"
                );
                Ok("retried")
            }
            Some("dead") => {
                let reason = items.get(1).and_then(reply::text).unwrap_or_default();
                error!(reason = %reason, "dead-lettered");
                Ok("dead_lettered")
            }
            Some("lost") => Err(QueueError::LeaseLost {
                queue: k.queue.clone(),
                job_id: d.id.clone(),
            }),
            _ => Err(QueueError::protocol(
                &k.queue,
                Some(&d.id),
                format!("fail reply {reply:?}"),
            )),
        }
    }
}

async fn wait_true(rx: &mut watch::Receiver<bool>) {
    while !*rx.borrow_and_update() {
        if rx.changed().await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}

/// Extends the lease every heartbeat interval while the token matches; marks
/// the context lease-lost and stops when it no longer does.
async fn heartbeat(inner: Arc<Inner>, keys: QueueKeys, id: JobId, token: String, ctx: JobContext) {
    if !inner.config.heartbeat_enabled {
        return;
    }
    let every = inner.config.heartbeat_interval();
    let mut conn = inner.conn.clone();
    loop {
        tokio::time::sleep(every).await;
        let res: redis::RedisResult<i64> = scripts::EXTEND
            .key(&keys.leases)
            .key(keys.job(id.as_str()))
            .arg(id.as_str())
            .arg(&token)
            .arg(inner.config.lease.as_millis() as u64)
            .invoke_async(&mut conn)
            .await;
        match res {
            Ok(0) => {
                ctx.inner.lease_lost.store(true, Ordering::SeqCst);
                warn!("lease lost: the job was reclaimed; its result will be discarded");
                return;
            }
            Ok(until) => debug!(lease_until_ms = until, "lease extended"),
            Err(e) => warn!(error = %e, "heartbeat failed; retrying at the next interval"),
        }
    }
}
