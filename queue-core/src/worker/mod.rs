//! The consumer side: [`Worker`] fetches, runs, acks, retries and
//! heartbeats; this module owns its lifecycle (start the tasks, wait for the
//! stop signal, graceful shutdown: DESIGN rule 10, docs/DESIGN.md).
//!
//! | file | owns |
//! |---|---|
//! | `builder.rs` | [`WorkerConfig`], [`WorkerBuilder`] and its validation |
//! | `slots.rs` | concurrency permits (worker-wide and per queue) |
//! | `fetcher.rs` | one task per queue: batch fetch, priority, blocking fallback + claim |
//! | `runner.rs` | one delivery: handler, timeout, panic, ack / retry / dead-letter |
//! | `acker.rs` | one task per queue: batched acks (`ack_batch`, `ack_window`) |
//! | `heartbeat.rs` | extending a running job's lease |
//! | `handler_guard.rs` | what ends with a run however it ends: the handler's future (panics caught when polled and when dropped), the heartbeat task (aborted on drop) |
//! | `paused.rs` | a fetcher's wait while its queue is paused |
//! | `cancel.rs` | ending a cancelled delivery |
//! | `identity.rs` | [`WorkerIdentity`]: the name on the job span and in the job hash |
//! | `defer.rs` | a newer payload version: left for an upgraded worker; the versions this worker announces |
//!
//! The promoter and the cron scheduler it also starts live in
//! `crate::background`.

mod acker;
mod builder;
mod cancel;
mod defer;
mod fetcher;
mod handler_guard;
mod heartbeat;
mod identity;
mod paused;
mod runner;
mod slots;

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{watch, Semaphore};
use tokio::task::JoinHandle;
use tracing::{error, info, warn};

pub(crate) use builder::MAX_LEASE;
pub use builder::{WorkerBuilder, WorkerConfig};
pub use identity::WorkerIdentity;

use crate::background::scheduler::Periodic;
use crate::background::{promoter, scheduler, supervised};
use crate::conn::{connect, ConnectionConfig, RedisConnection};
use crate::error::Result;
use crate::registry::Registration;
use fetcher::Fetcher;
use slots::WorkerQueue;

/// Handlers by `(queue, job type)`, hashed with foldhash: the keys are the
/// registrations' names, and a SipHash per lookup was ~3.6% of a worker's
/// instructions (issue #12).
type Handlers = HashMap<(&'static str, &'static str), Registration, foldhash::fast::RandomState>;

/// What the worker's tasks share.
struct Inner {
    url: String,
    conn: RedisConnection,
    periodic: Arc<Vec<Periodic>>,
    /// By `(queue, job type)`: the registrations' own `&'static str`s, so a
    /// lookup per job borrows the delivery's strings instead of copying them.
    handlers: Handlers,
    /// Metric labels of the registered job types (and `unknown`), per queue.
    labels: crate::metrics::LabelCache,
    /// Highest priority first.
    queues: Vec<WorkerQueue>,
    config: WorkerConfig,
    /// Who this worker is: on every job span and in each claimed job's hash.
    identity: WorkerIdentity,
}

/// Runs registered jobs from one or more queues.
///
/// A worker does not reclaim expired leases: the jobs a worker was running
/// when its process died stay in the processing list until a **watchdog**
/// returns them (`queue-watchdog run --queue <name>`, or an embedded
/// [`Watchdog`](crate::Watchdog) with [`run_until`](crate::Watchdog::run_until)).
/// Run one wherever workers run; without it a crashed worker's jobs are
/// never retried.
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
        WorkerBuilder::new(url)
    }

    /// Who this worker is (see [`WorkerBuilder::name`]).
    pub fn identity(&self) -> &WorkerIdentity {
        &self.inner.identity
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
    /// Returns within the grace period plus 5 s (and about a second for the
    /// ackers' last log lines), also when Redis hangs: results not recorded
    /// by then stay leased for the watchdog.
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
        // Dropped before it returns (a `select!` or `timeout` around it): the
        // worker stops fetching as if asked to, instead of running on
        // detached (its signal task kept the stop channel open for ever).
        let _stop_on_drop = StopOnDrop {
            stop: stop_tx.clone(),
            signal: signal_task.abort_handle(),
        };

        info!(
            queues = ?inner.queues.iter().map(|q| &q.keys.queue).collect::<Vec<_>>(),
            concurrency = cfg.concurrency,
            "worker started"
        );

        // Turned true when the shutdown's time is up: the ackers stop
        // retrying and leave what they have not recorded leased.
        let (ackers_stop, ackers_stop_rx) = watch::channel(false);
        let (senders, ackers): (Vec<_>, Vec<_>) = inner
            .queues
            .iter()
            .map(|q| acker::spawn(inner.clone(), q.keys.clone(), ackers_stop_rx.clone()))
            .unzip();
        // On a failed start the senders are dropped with the fetchers that
        // were never started, so the ackers (with nothing to ack) end too.
        let mut tasks = match spawn_tasks(&inner, &sem, &stop_tx, &hard_rx, Arc::new(senders)).await
        {
            Ok(tasks) => tasks,
            Err(e) => {
                signal_task.abort();
                return Err(e);
            }
        };

        // Wait for the stop request.
        while !*stop_rx.borrow_and_update() {
            if stop_rx.changed().await.is_err() {
                break;
            }
        }
        info!("shutdown requested: no new fetches, waiting for in-flight jobs");
        // Everything the shutdown waits for ends by then: the grace period,
        // then the hard stop's wait (docs/ARCHITECTURE.md "Shutdown").
        // A grace beyond the clock (it is not bounded) waits as long as
        // `timeout` does with it: about for ever.
        let now = tokio::time::Instant::now();
        let time_up = now
            .checked_add(cfg.grace.saturating_add(HARD_STOP_WAIT))
            .unwrap_or_else(|| now + Duration::from_secs(86_400 * 365 * 30));
        // The grace period covers the tasks' end too: a fetcher of a worker
        // that runs one job at a time runs that job itself (fetcher.rs) and
        // ends with it.
        // `concurrency` is at most `u32::MAX` (validated at build).
        let all = u32::try_from(cfg.concurrency).unwrap_or(u32::MAX);
        let drained = drain(&mut tasks, &sem, all);
        match tokio::time::timeout(cfg.grace, drained).await {
            Ok(()) => info!("worker stopped: all in-flight jobs finished"),
            Err(_) => {
                let running = cfg.concurrency - sem.available_permits();
                warn!(
                    running,
                    grace_ms = cfg.grace.as_millis() as u64,
                    "grace period over: leaving running jobs leased; the watchdog returns them when their lease expires"
                );
                hard_tx.send_replace(true);
                if tokio::time::timeout(HARD_STOP_WAIT, drain(&mut tasks, &sem, all))
                    .await
                    .is_err()
                {
                    warn!(
                        tasks = tasks.len(),
                        running = cfg.concurrency - sem.available_permits(),
                        wait_ms = HARD_STOP_WAIT.as_millis() as u64,
                        "worker tasks still running after the hard stop: leaving them; their jobs stay leased for the watchdog"
                    );
                }
            }
        }
        // Every runner has handed over its ack (the fetchers and runners
        // dropped their senders), or was left at the hard stop: the ackers
        // flush what is left and end, all within the shutdown's time. Then
        // they are stopped: an acker still retrying against a hung Redis
        // leaves its jobs leased (the watchdog returns them, as after a
        // SIGKILL). Before, each acker in turn was waited for up to a lease.
        stop_ackers(ackers, time_up, &ackers_stop).await;
        signal_task.abort();
        Ok(())
    }
}

/// Requests the stop and ends the signal task when `run_until` ends or is
/// dropped (after a normal return the stop was requested already).
struct StopOnDrop {
    stop: watch::Sender<bool>,
    signal: tokio::task::AbortHandle,
}

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        self.stop.send_replace(true);
        self.signal.abort();
    }
}

/// How long the worker waits for its tasks after the grace period, once
/// told to leave running jobs leased.
const HARD_STOP_WAIT: Duration = Duration::from_secs(5);

/// How long a stopped acker gets to log what it leaves and end (no Redis
/// call: only log lines).
const ACKER_STOP_WAIT: Duration = Duration::from_secs(1);

/// Waits for every acker together until `time_up`, then stops those still
/// running (`stop`) and gives them [`ACKER_STOP_WAIT`] to log the jobs they
/// leave leased. Logs, with its queue, an acker that ended with a panic
/// and one still running at the end.
async fn stop_ackers(
    ackers: Vec<acker::Acker>,
    time_up: tokio::time::Instant,
    stop: &watch::Sender<bool>,
) {
    // One deadline for all: a timeout polls its task first, so an acker
    // that ended is seen even after the deadline.
    let mut running = Vec::new();
    for mut a in ackers {
        match tokio::time::timeout_at(time_up, &mut a.task).await {
            Ok(ended) => acker_ended(&a, ended),
            Err(_) => running.push(a),
        }
    }
    if running.is_empty() {
        return;
    }
    for a in &running {
        match a.pending() {
            // Only waiting for its senders: a task left running holds one.
            0 => {
                info!(queue = %a.keys.queue, "shutdown's time is up: stopping the acker (no ack pending)")
            }
            pending => warn!(
                queue = %a.keys.queue,
                pending,
                "acks still pending when the shutdown's time is up (grace + {}s): leaving them; each job's ack may have landed, else the watchdog returns it when its lease expires",
                HARD_STOP_WAIT.as_secs()
            ),
        }
    }
    stop.send_replace(true);
    let until = tokio::time::Instant::now() + ACKER_STOP_WAIT;
    for mut a in running {
        match tokio::time::timeout_at(until, &mut a.task).await {
            Ok(ended) => acker_ended(&a, ended),
            Err(_) => {
                warn!(queue = %a.keys.queue, "acker still running after its stop: leaving it")
            }
        }
    }
}

/// Logs an acker's end when it was not a normal one.
fn acker_ended(a: &acker::Acker, ended: std::result::Result<(), tokio::task::JoinError>) {
    if let Err(e) = ended {
        error!(queue = %a.keys.queue, error = %e, "the acker ended abnormally: the acks it held were not recorded; the watchdog returns those jobs when their leases expire");
    }
}

/// The message of a caught panic's payload.
pub(crate) fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "non-string panic payload".into())
}

/// Waits for the worker's tasks to end (each handle is awaited until it
/// completes, then dropped: safe to call again after a timeout) and for every
/// slot to be free.
async fn drain(tasks: &mut Vec<tokio::task::JoinHandle<()>>, sem: &Semaphore, all: u32) {
    while let Some(t) = tasks.last_mut() {
        let _ = t.await;
        tasks.pop();
    }
    let _ = sem.acquire_many(all).await;
}

/// Starts one fetcher and one promoter per queue (each with its own
/// blocking connection) and the cron scheduler. Every blocking connection is made
/// before any task starts: a queue whose connection fails leaves nothing
/// running (no detached fetcher outlives the returned error).
async fn spawn_tasks(
    inner: &Arc<Inner>,
    sem: &Arc<Semaphore>,
    stop_tx: &watch::Sender<bool>,
    hard_rx: &watch::Receiver<bool>,
    ackers: Arc<Vec<acker::AckSender>>,
) -> Result<Vec<JoinHandle<()>>> {
    let cfg = &inner.config;
    let blocking_for = |block: Duration| ConnectionConfig {
        // Saturating: `block` is validated (at most a day), the response
        // timeout is the user's; `Duration::MAX` means no timeout.
        response_timeout: block.saturating_add(cfg.connection.response_timeout),
        connection_timeout: cfg.connection.connection_timeout,
    };
    let mut blocking = Vec::with_capacity(inner.queues.len());
    let mut promoting = Vec::with_capacity(inner.queues.len());
    for _ in &inner.queues {
        blocking.push(connect(&inner.url, &blocking_for(cfg.block_timeout)).await?);
        promoting.push(connect(&inner.url, &blocking_for(cfg.promote_interval)).await?);
    }
    // Each loop runs under `supervised`: started again after a panic
    // (background/supervise.rs), each start with its own receiver of the
    // stop.
    let mut tasks = Vec::new();
    for (me, blocking) in blocking.into_iter().enumerate() {
        let fetcher = Fetcher {
            inner: inner.clone(),
            me,
            blocking,
            sem: sem.clone(),
            stop: stop_tx.subscribe(),
            hard_stop: hard_rx.clone(),
            ackers: ackers.clone(),
        };
        let queue = inner.queues[me].keys.queue.clone();
        tasks.push(tokio::spawn(supervised(
            "fetcher",
            queue,
            stop_tx.subscribe(),
            move |stop| {
                Fetcher {
                    stop,
                    ..fetcher.clone()
                }
                .run()
            },
        )));
    }
    let mut announced = defer::announced_fields(inner).into_iter();
    for (q, promoting) in inner.queues.iter().zip(promoting) {
        let fields = announced.next().map(|(_, f)| f).unwrap_or_default();
        let announcement = promoter::Announcement {
            fields,
            ttl: cfg.announce_ttl(),
        };
        let (conn, keys, every) = (inner.conn.clone(), q.keys.clone(), cfg.promote_interval);
        tasks.push(tokio::spawn(supervised(
            "promoter",
            q.keys.queue.clone(),
            stop_tx.subscribe(),
            move |stop| {
                promoter::run(
                    conn.clone(),
                    promoting.clone(),
                    crate::keys::QueueKeys::clone(&keys),
                    every,
                    announcement.clone(),
                    stop,
                )
            },
        )));
    }
    for q in &inner.queues {
        let (conn, queue) = (inner.conn.clone(), q.keys.queue.clone());
        tasks.push(tokio::spawn(supervised(
            "relay",
            q.keys.queue.clone(),
            stop_tx.subscribe(),
            move |stop| crate::workflow::relay::run_for_worker(conn.clone(), queue.clone(), stop),
        )));
    }
    let (conn, periodic) = (inner.conn.clone(), inner.periodic.clone());
    tasks.push(tokio::spawn(supervised(
        "scheduler",
        String::new(),
        stop_tx.subscribe(),
        move |stop| scheduler::run(conn.clone(), periodic.clone(), stop),
    )));
    Ok(tasks)
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

/// Completes once the flag is true (never, if its sender is gone first).
async fn wait_true(rx: &mut watch::Receiver<bool>) {
    while !*rx.borrow_and_update() {
        if rx.changed().await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}
