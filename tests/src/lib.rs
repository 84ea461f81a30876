//! Shared pieces of the integration and fault tests: the test job, the
//! side-effect ledger it writes, and small helpers.
//!
//! The ledger lives in the same Redis under `ledger:*` keys, written by the
//! handler itself, so a test can count how often a job's side effect ran.
//!
//! The tests are written over [`env`] (`TestEnv`: server, queue, waits,
//! seeding), [`handles`] (worker and watchdog handles) and [`process`]
//! (`test-worker` child processes).

pub mod dag_jobs;
pub mod env;
pub mod handles;
pub mod limited;
pub mod panicking_layer;
pub mod process;
pub mod results_jobs;
pub mod workflow_jobs;

pub use env::{TestEnv, BOUND};
pub use handles::{WatchdogHandle, WorkerHandle};
pub use process::WorkerProcess;

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use queue_core::{job, JobContext, JobError};
use redis::aio::{ConnectionLike, MultiplexedConnection};
use redis::{AsyncCommands, RedisFuture};
use serde::{Deserialize, Serialize};

/// The payload of the test job. Each field steers the handler; missing
/// fields take their default (payloads from older senders still decode).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct Task {
    /// Redis URL of the ledger (the test's own server).
    pub ledger: String,
    /// Sequence number, appended to `ledger:order` on every start.
    pub seq: u64,
    /// Sleep this long before the side effect.
    pub sleep_ms: u64,
    /// Sleep only on attempts `1..=sleep_attempts` (0: on every attempt).
    pub sleep_attempts: u32,
    /// Fail (retryable) on attempts `1..=fail_first`.
    pub fail_first: u32,
    /// Fail permanently.
    pub permanent: bool,
    /// Track how many `task`s run at once (`ledger:running`, `ledger:max_running`).
    pub probe_concurrency: bool,
    /// With `probe_concurrency`: once counted as running, wait until this
    /// many `task`s have run at once (`ledger:max_running`; at most a
    /// minute) before the sleep, so a cap of that many is reached however
    /// slow the machine is. Only the first jobs wait.
    pub hold_until_running: u64,
    /// During the sleep, stop when an operator cancels the job: record it in
    /// `ledger:cancelled` and return a retryable error.
    pub cooperative_cancel: bool,
}

/// The test job: records its start, may fail or sleep, then records its side effect.
#[job(queue = "tasks", max_attempts = 3, timeout = "60s")]
pub async fn task(ctx: JobContext, t: Task) -> Result<(), JobError> {
    let mut c = ledger_conn(&t.ledger).await?;
    let id = ctx.job_id().to_string();
    let _: () = c.hincr("ledger:started", &id, 1).await?;
    let _: () = c.rpush("ledger:order", t.seq).await?;
    if ctx.attempt() <= t.fail_first {
        return Err(JobError::retryable(format!(
            "planned failure on attempt {}",
            ctx.attempt()
        )));
    }
    if t.permanent {
        return Err(JobError::permanent("planned permanent failure"));
    }
    if t.probe_concurrency {
        let _: () = redis::Script::new(
            "local n = redis.call('INCR', KEYS[1]) \
             if n > tonumber(redis.call('GET', KEYS[2]) or '0') then redis.call('SET', KEYS[2], n) end",
        )
        .key("ledger:running")
        .key("ledger:max_running")
        .invoke_async(&mut c)
        .await?;
        let held = std::time::Instant::now();
        while t.hold_until_running > 0 && held.elapsed() < Duration::from_secs(60) {
            let most: u64 = c.get("ledger:max_running").await?;
            if most >= t.hold_until_running {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    if t.sleep_ms > 0 && (t.sleep_attempts == 0 || ctx.attempt() <= t.sleep_attempts) {
        let sleep = tokio::time::sleep(Duration::from_millis(t.sleep_ms));
        if t.cooperative_cancel {
            tokio::select! {
                _ = sleep => {}
                _ = ctx.until_cancelled() => {
                    let _: () = c.sadd("ledger:cancelled", &id).await?;
                    return Err(JobError::retryable("stopped: cancelled by an operator"));
                }
            }
        } else {
            sleep.await;
        }
    }
    if t.probe_concurrency {
        let _: () = c.decr("ledger:running", 1).await?;
    }
    if ctx.lease_lost() {
        let _: () = c.sadd("ledger:lease_lost", &id).await?;
    }
    let _: () = c.hincr("ledger:effects", &id, 1).await?;
    let _: () = c.hset("ledger:attempt", &id, ctx.attempt()).await?;
    Ok(())
}

/// A connection to the ledger at `url`, cached per URL and Tokio runtime.
///
/// The cache is shared by every test of a binary, and a multiplexed
/// connection only works while the runtime that created it runs (its driver
/// is a task of that runtime): an entry whose runtime is gone (an earlier
/// test, whose server had the port this test's server got) is replaced, not
/// handed out. A connection that fails with an I/O error (its server
/// restarted) leaves the cache, and so do the entries of a URL a new
/// [`TestEnv`] starts a server on ([`forget_ledger_conn`]).
pub async fn ledger_conn(url: &str) -> redis::RedisResult<LedgerConn> {
    {
        let mut map = ledger_conns().lock().expect("ledger map");
        match map.get(url) {
            Some(c) if !c.runtime_alive.is_finished() => {
                return Ok(LedgerConn {
                    conn: c.conn.clone(),
                    url: url.to_string(),
                    id: c.id,
                });
            }
            Some(_) => {
                map.remove(url);
            }
            None => {}
        }
    }
    let client = redis::Client::open(url)?;
    let conn = client.get_multiplexed_async_connection().await?;
    let id = NEXT_LEDGER_CONN.fetch_add(1, Ordering::Relaxed);
    // Finishes (cancelled) when this runtime shuts down, taking the
    // connection's driver with it.
    let runtime_alive = tokio::spawn(std::future::pending::<()>());
    ledger_conns().lock().expect("ledger map").insert(
        url.to_string(),
        CachedLedgerConn {
            conn: conn.clone(),
            id,
            runtime_alive,
        },
    );
    Ok(LedgerConn {
        conn,
        url: url.to_string(),
        id,
    })
}

/// Drops the cached ledger connection of `url` (a new server on its port).
pub fn forget_ledger_conn(url: &str) {
    ledger_conns().lock().expect("ledger map").remove(url);
}

/// A ledger connection from [`ledger_conn`]: a multiplexed connection that
/// takes itself out of the cache when a call fails with an I/O error, so
/// the next [`ledger_conn`] connects afresh.
#[derive(Clone)]
pub struct LedgerConn {
    conn: MultiplexedConnection,
    url: String,
    id: u64,
}

impl LedgerConn {
    fn forget_if_broken<T>(&self, r: &redis::RedisResult<T>) {
        if let Err(e) = r {
            if e.is_io_error() || e.is_unrecoverable_error() {
                let mut map = ledger_conns().lock().expect("ledger map");
                if map.get(&self.url).is_some_and(|c| c.id == self.id) {
                    map.remove(&self.url);
                }
            }
        }
    }
}

impl ConnectionLike for LedgerConn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a redis::Cmd) -> RedisFuture<'a, redis::Value> {
        Box::pin(async move {
            let r = self.conn.req_packed_command(cmd).await;
            self.forget_if_broken(&r);
            r
        })
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a redis::Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<redis::Value>> {
        Box::pin(async move {
            let r = self.conn.req_packed_commands(pipeline, offset, count).await;
            self.forget_if_broken(&r);
            r
        })
    }

    fn get_db(&self) -> i64 {
        self.conn.get_db()
    }
}

/// One cached ledger connection and a task of the runtime that made it.
struct CachedLedgerConn {
    conn: MultiplexedConnection,
    id: u64,
    runtime_alive: tokio::task::JoinHandle<()>,
}

impl Drop for CachedLedgerConn {
    fn drop(&mut self) {
        self.runtime_alive.abort();
    }
}

static NEXT_LEDGER_CONN: AtomicU64 = AtomicU64::new(0);

fn ledger_conns() -> &'static Mutex<HashMap<String, CachedLedgerConn>> {
    static CONNS: OnceLock<Mutex<HashMap<String, CachedLedgerConn>>> = OnceLock::new();
    CONNS.get_or_init(Default::default)
}

/// Reads the ledger.
#[derive(Debug, Clone, Default)]
pub struct Ledger {
    /// job id -> handler starts.
    pub started: HashMap<String, u64>,
    /// job id -> side effects.
    pub effects: HashMap<String, u64>,
    /// Sequence numbers in start order.
    pub order: Vec<u64>,
}

impl Ledger {
    /// Reads all ledger keys from `url` with a fresh connection.
    pub async fn read(url: &str) -> Ledger {
        let client = redis::Client::open(url).expect("url");
        let mut c = client
            .get_multiplexed_async_connection()
            .await
            .expect("ledger connection");
        Ledger {
            started: c.hgetall("ledger:started").await.expect("started"),
            effects: c.hgetall("ledger:effects").await.expect("effects"),
            order: c.lrange("ledger:order", 0, -1).await.expect("order"),
        }
    }

    /// Side effects summed over jobs.
    pub fn total_effects(&self) -> u64 {
        self.effects.values().sum()
    }

    /// Jobs whose side effect ran more than once.
    pub fn duplicates(&self) -> Vec<(&String, &u64)> {
        self.effects.iter().filter(|(_, n)| **n > 1).collect()
    }
}

/// Installs a test tracing subscriber once (RUST_LOG controls it; default warn).
pub fn init_tracing() {
    static ONCE: OnceLock<()> = OnceLock::new();
    ONCE.get_or_init(|| {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(
                tracing_subscriber::EnvFilter::try_from_default_env()
                    .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
            )
            .with_test_writer()
            .try_init();
    });
}

/// Polls `cond` every 20 ms until it returns true; panics with `what` after `limit`.
pub async fn wait_until<F, Fut>(limit: Duration, what: &str, mut cond: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let start = Instant::now();
    loop {
        if cond().await {
            return;
        }
        if start.elapsed() > limit {
            panic!("timed out after {limit:?} waiting for: {what}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A numeric field (`finished_at`, `enqueued_at`, ...) of job `id`'s
/// completion record on queue `q`, whichever form it was written in (a
/// hash, or the compact string: `Queue::completion` reads both); `None`
/// without a record or that field.
pub async fn record_number(
    queue: &queue_core::Queue,
    q: &str,
    id: &str,
    field: &str,
) -> Option<i64> {
    let record = queue.completion(q, id).await.ok().flatten()?;
    record.get(field)?.parse().ok()
}

/// A plain Redis connection for assertions.
pub async fn redis_conn(url: &str) -> MultiplexedConnection {
    redis::Client::open(url)
        .expect("url")
        .get_multiplexed_async_connection()
        .await
        .expect("redis connection")
}

/// Worker settings that make tests fast: short backoff, short blocking,
/// frequent promotion.
pub fn fast_config() -> queue_core::WorkerConfig {
    queue_core::WorkerConfig {
        concurrency: 4,
        lease: Duration::from_secs(2),
        block_timeout: Duration::from_millis(200),
        promote_interval: Duration::from_millis(50),
        grace: Duration::from_secs(5),
        backoff: queue_core::Backoff {
            base: Duration::from_millis(20),
            max: Duration::from_millis(200),
        },
        ..queue_core::WorkerConfig::default()
    }
}

/// [`fast_config`] with lease `lease` and a heartbeat every `heartbeat`
/// (`None`: no heartbeat at all, so a job slower than its lease loses it).
pub fn lease_config(lease: Duration, heartbeat: Option<Duration>) -> queue_core::WorkerConfig {
    queue_core::WorkerConfig {
        lease,
        heartbeat,
        heartbeat_enabled: heartbeat.is_some(),
        ..fast_config()
    }
}

/// Watchdog settings for tests: frequent passes, short backoff.
pub fn fast_watchdog() -> queue_core::WatchdogConfig {
    queue_core::WatchdogConfig {
        interval: Duration::from_millis(50),
        orphan_grace: Duration::from_millis(300),
        backoff: queue_core::Backoff {
            base: Duration::from_millis(20),
            max: Duration::from_millis(100),
        },
        ..queue_core::WatchdogConfig::default()
    }
}

/// Starts a worker for the `task` job in the background; returns its
/// shutdown handle and join handle (see [`TestEnv::spawn_worker`] for a
/// [`WorkerHandle`]).
pub async fn spawn_worker(
    url: &str,
    config: queue_core::WorkerConfig,
) -> (
    queue_core::ShutdownHandle,
    tokio::task::JoinHandle<queue_core::Result<()>>,
) {
    let builder = env::worker_on(url, [task::handler()], config);
    WorkerHandle::start(builder).await.into_parts()
}

/// Payload of the billing test job.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Bill {
    /// Redis URL of the ledger.
    pub ledger: String,
    /// Amount in cents.
    pub cents: u64,
    /// Fail (retryable) after the charge step on attempts `1..=fail_after_charge`.
    pub fail_after_charge: u32,
    /// Sleep after the charge step on the first attempt (a window in which
    /// to kill the worker).
    pub sleep_after_charge_ms: u64,
    /// With `sleep_after_charge_ms`: the first attempt's sleep also ends
    /// once another delivery of the job recorded its receipt, so the first
    /// delivery outlives its redelivery however slow the machine is.
    #[serde(default)]
    pub until_redelivered: bool,
}

/// A fake payment API: deduplicates by idempotency key, like real providers.
/// Records every call (`ledger:charge_calls`) and every charge actually made
/// (`ledger:charges`, one per key).
pub async fn fake_charge(
    ledger: &str,
    idempotency_key: &str,
    cents: u64,
) -> Result<String, JobError> {
    let mut c = ledger_conn(ledger).await?;
    let _: () = c.hincr("ledger:charge_calls", idempotency_key, 1).await?;
    let charge_id = format!("ch_{}", uuid::Uuid::new_v4().simple());
    let created: bool = redis::cmd("SET")
        .arg(format!("ledger:charge:{idempotency_key}"))
        .arg(&charge_id)
        .arg("NX")
        .query_async::<Option<String>>(&mut c)
        .await?
        .is_some();
    if created {
        let _: () = c.hincr("ledger:charges", idempotency_key, cents).await?;
        Ok(charge_id)
    } else {
        Ok(c.get(format!("ledger:charge:{idempotency_key}")).await?)
    }
}

/// The billing job: charge (a step, with the step's idempotency key), then
/// e-mail the receipt (another step), then record the charge as the result.
#[job(queue = "billing", max_attempts = 5)]
pub async fn bill(ctx: JobContext, b: Bill) -> Result<(), JobError> {
    let key = ctx.step_key("charge");
    let charge_id = ctx
        .step("charge", || async {
            fake_charge(&b.ledger, &key, b.cents).await
        })
        .await?;
    if b.sleep_after_charge_ms > 0 && ctx.attempt() == 1 {
        let sleep = tokio::time::sleep(Duration::from_millis(b.sleep_after_charge_ms));
        if b.until_redelivered {
            tokio::select! {
                _ = sleep => {}
                r = receipt_recorded(&b.ledger, ctx.job_id().as_str()) => r?,
            }
        } else {
            sleep.await;
        }
    }
    if ctx.attempt() <= b.fail_after_charge {
        return Err(JobError::retryable("mail provider unavailable"));
    }
    let mut c = ledger_conn(&b.ledger).await?;
    ctx.step("receipt", || async {
        let _: () = c.hincr("ledger:receipts", ctx.job_id().as_str(), 1).await?;
        Ok(())
    })
    .await?;
    ctx.set_result_ref(charge_id);
    Ok(())
}

/// Returns once job `id`'s receipt is in the ledger (polled every 20 ms).
async fn receipt_recorded(ledger: &str, id: &str) -> Result<(), JobError> {
    let mut c = ledger_conn(ledger).await?;
    loop {
        let recorded: bool = c.hexists("ledger:receipts", id).await?;
        if recorded {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A job on queue `high`, for priority tests: appends `high:<seq>` to `ledger:prio`.
#[job(queue = "high")]
pub async fn urgent(_ctx: JobContext, t: Task) -> Result<(), JobError> {
    let mut c = ledger_conn(&t.ledger).await?;
    let _: () = c.rpush("ledger:prio", format!("high:{}", t.seq)).await?;
    Ok(())
}

/// A job on queue `low`, for priority tests: appends `low:<seq>` to `ledger:prio`.
#[job(queue = "low")]
pub async fn routine(_ctx: JobContext, t: Task) -> Result<(), JobError> {
    let mut c = ledger_conn(&t.ledger).await?;
    let _: () = c.rpush("ledger:prio", format!("low:{}", t.seq)).await?;
    Ok(())
}

/// Where the periodic `tick` job records its runs (set by the test before workers start).
pub static TICK_LEDGER: OnceLock<String> = OnceLock::new();

/// Payload of the periodic job (none).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Tick {}

/// A periodic job firing every second: counts runs per firing id in `ledger:ticks`.
#[job(queue = "cron", cron = "*/1 * * * * *")]
pub async fn tick(ctx: JobContext, _t: Tick) -> Result<(), JobError> {
    let url = TICK_LEDGER
        .get()
        .ok_or_else(|| JobError::permanent("TICK_LEDGER not set"))?;
    let mut c = ledger_conn(url).await?;
    let _: () = c.hincr("ledger:ticks", ctx.job_id().as_str(), 1).await?;
    Ok(())
}

/// A throwaway redis-server, its URL and a [`queue_core::Queue`] on it, with
/// test tracing installed: the start of most scenarios.
pub async fn redis_and_queue() -> (queue_testkit::RedisServer, String, queue_core::Queue) {
    init_tracing();
    let server = queue_testkit::RedisServer::start().expect("redis-server starts");
    let url = server.url();
    let queue = queue_core::Queue::connect(&url).await.expect("connect");
    (server, url, queue)
}

/// The connection settings of the reconnect-bound tests: a 1 s response
/// timeout, a 10 s connect timeout (longer than the bound, so only the
/// response timeout can end the wait).
pub fn reconnect_bound_config() -> queue_core::ConnectionConfig {
    queue_core::ConnectionConfig {
        response_timeout: Duration::from_secs(1),
        connection_timeout: Duration::from_secs(10),
    }
}

/// Connects `url` (through `proxy`) with [`reconnect_bound_config`] and a
/// 1 s retry window, then loses the next reply and leaves every new
/// connection unanswered: an enqueue must fail, outcome unknown, within
/// retry window + response timeout (+5 s of slack for a loaded machine; a
/// hang detector, not a timing check). Returns the queue for the caller's
/// own checks.
pub async fn enqueue_fails_within_the_bound_while_reconnecting(
    url: &str,
    proxy: &queue_testkit::proxy::ReplyDropper,
) -> queue_core::Queue {
    let cfg = reconnect_bound_config();
    let queue = queue_core::Queue::connect_with(url, &cfg)
        .await
        .unwrap()
        .with_retry_window(Duration::from_secs(1));
    assert_eq!(queue.stats("hung").await.unwrap().main, 0);
    proxy.hang_new_connections();
    proxy.drop_next_reply();
    let bound = queue.retry_window() + cfg.response_timeout + Duration::from_secs(5);
    let enqueue = queue.enqueue_raw(
        "hung",
        "task",
        1,
        3,
        queue_core::EnqueueOptions::default(),
        b"payload".as_slice(),
    );
    let err = tokio::time::timeout(bound, enqueue)
        .await
        .unwrap_or_else(|_| panic!("the enqueue still waited after {bound:?}"))
        .expect_err("nothing answers");
    assert!(err.outcome_unknown(), "the first reply was lost: {err}");
    assert_eq!(proxy.dropped(), 1);
    queue
}

#[cfg(test)]
mod tests {
    use super::ledger_conn;
    use queue_testkit::RedisServer;
    use redis::AsyncCommands;

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime")
    }

    /// A test's runtime ends with its ledger connection cached; a later test
    /// whose server got the same port (so the same URL) writes its ledger in
    /// its own runtime. Before, it was handed the dead runtime's connection:
    /// every write failed ("broken pipe"), its jobs retried until dead.
    #[test]
    fn a_ledger_connection_is_not_handed_out_after_its_runtime_ended() {
        let server = RedisServer::start().expect("redis-server starts");
        let url = server.url();
        let first = runtime();
        first.block_on(async {
            let mut c = ledger_conn(&url).await.expect("ledger connection");
            let _: () = c.incr("ledger:writes", 1).await.expect("first write");
        });
        drop(first);
        runtime().block_on(async {
            let mut c = ledger_conn(&url).await.expect("ledger connection");
            let n: u64 = c
                .incr("ledger:writes", 1)
                .await
                .expect("a write from the second runtime");
            assert_eq!(n, 2);
        });
    }

    /// The ledger's server restarts on its port within one test: the
    /// connection that saw the I/O error leaves the cache and the next
    /// `ledger_conn` connects afresh. Before, every later write failed.
    #[test]
    fn a_ledger_connection_that_failed_with_an_io_error_is_replaced() {
        let mut server = RedisServer::start().expect("redis-server starts");
        let url = server.url();
        runtime().block_on(async {
            let mut c = ledger_conn(&url).await.expect("ledger connection");
            let _: () = c.incr("ledger:writes", 1).await.expect("first write");
            server.restart().expect("redis-server restarts");
            // The old connection's socket is gone: this write may fail.
            let _ = c.incr::<_, _, u64>("ledger:writes", 1).await;
            let mut c = ledger_conn(&url).await.expect("ledger connection");
            let _: u64 = c
                .incr("ledger:writes", 1)
                .await
                .expect("a write after the restart");
        });
    }
}
