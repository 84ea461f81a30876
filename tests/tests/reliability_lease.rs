//! Reliability of leases, step results, enqueue and connections when Redis
//! stops answering (issue #11 items 5, 6, 8, 9, 10, 11): each scenario runs
//! against its own redis-server, which it pauses (SIGSTOP: connections stay
//! open, nothing is answered) or restarts.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use queue_core::{
    job, ConnectionConfig, EnqueueOptions, EnqueueOutcome, JobContext, JobError, Lock, LockOptions,
    Queue, QueueKeys, Watchdog, WatchdogConfig, Worker, WorkerConfig,
};
use queue_testkit::RedisServer;
use queue_tests::{fast_config, init_tracing, redis_conn, wait_until};
use redis::AsyncCommands;
use serde::{Deserialize, Serialize};

const T: Duration = Duration::from_secs(30);

async fn setup() -> (RedisServer, String, Queue) {
    init_tracing();
    let server = RedisServer::start().expect("redis-server starts");
    let url = server.url();
    let queue = Queue::connect(&url).await.expect("connect");
    (server, url, queue)
}

/// A redis-server paused with SIGSTOP: it keeps its connections open and
/// answers nothing. Resumed (SIGCONT) on drop.
struct Paused(u32);

impl Paused {
    fn pause(server: &RedisServer) -> Paused {
        let pid = server.pid().expect("server runs");
        signal(pid, "STOP");
        Paused(pid)
    }
}

impl Drop for Paused {
    fn drop(&mut self) {
        signal(self.0, "CONT");
    }
}

fn signal(pid: u32, sig: &str) {
    let status = std::process::Command::new("kill")
        .arg(format!("-{sig}"))
        .arg(pid.to_string())
        .status()
        .expect("kill(1) runs");
    assert!(status.success(), "kill -{sig} {pid} failed");
}

// ---- item 5: lease loss is visible without Redis -------------------------

#[derive(Debug, Default, Serialize, Deserialize)]
struct Probe {}

static PROBE_STARTED: AtomicBool = AtomicBool::new(false);
/// Milliseconds into the handler at which `lease_lost()` turned true (0: not yet).
static PROBE_LOST_AT_MS: AtomicU64 = AtomicU64::new(0);

/// Watches `ctx.lease_lost()` for up to 30 s and records when it turns true.
#[job(queue = "lease-probe", max_attempts = 1, timeout = "60s")]
async fn probe(ctx: JobContext, _p: Probe) -> Result<(), JobError> {
    PROBE_STARTED.store(true, Ordering::SeqCst);
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(30) {
        if ctx.lease_lost() {
            PROBE_LOST_AT_MS.store(start.elapsed().as_millis().max(1) as u64, Ordering::SeqCst);
            return Err(JobError::retryable("lease lost"));
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    Ok(())
}

async fn start_worker(
    url: &str,
    builder: impl FnOnce(queue_core::WorkerBuilder) -> queue_core::WorkerBuilder,
    config: WorkerConfig,
) -> (
    queue_core::ShutdownHandle,
    tokio::task::JoinHandle<queue_core::Result<()>>,
) {
    let worker = builder(Worker::builder(url))
        .config(config)
        .build()
        .await
        .expect("worker builds");
    let handle = worker.shutdown_handle();
    (
        handle,
        tokio::spawn(worker.run_until(std::future::pending())),
    )
}

/// A heartbeat that cannot reach Redis never confirms an extend: the
/// handler must see `lease_lost()` once the local lease deadline passes,
/// before the watchdog could give the job to another worker.
#[tokio::test]
async fn lease_lost_turns_true_when_redis_stops_answering_the_heartbeat() {
    let (server, url, queue) = setup().await;
    // A heartbeat every 200 ms keeps a 2 s lease through a stall of ~1.6 s
    // of a loaded machine (a 1 s lease left 700 ms).
    let lease = Duration::from_secs(2);
    let cfg = WorkerConfig {
        lease,
        heartbeat: Some(Duration::from_millis(200)),
        ..fast_config()
    };
    let (stop, join) = start_worker(&url, |b| b.register(probe::handler()), cfg).await;
    let id = probe::enqueue(&queue, Probe {}).await.unwrap();
    wait_until(T, "probe started", || async {
        PROBE_STARTED.load(Ordering::SeqCst)
    })
    .await;
    // While the heartbeat works, the lease holds: the lease in Redis moves
    // forward three times (three confirmed extends, over more than one
    // lease), and the handler never saw it lost.
    let leases = QueueKeys::new("lease-probe").leases;
    let mut c = redis_conn(&url).await;
    let mut seen: Vec<f64> = Vec::new();
    let started = Instant::now();
    while seen.len() <= 3 {
        assert!(
            started.elapsed() < T,
            "three extends of the lease: {seen:?}"
        );
        let at: Option<f64> = c.zscore(&leases, id.as_str()).await.unwrap();
        if let Some(at) = at.filter(|at| seen.last().is_none_or(|last| at > last)) {
            seen.push(at);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        PROBE_LOST_AT_MS.load(Ordering::SeqCst),
        0,
        "a heartbeating lease is not lost"
    );
    let paused = Paused::pause(&server);
    let stopped_at = Instant::now();
    // Nothing but the local deadline can turn it true now: no extend gets
    // an answer (before, nothing did: it never turned true).
    wait_until(T, "lease_lost() after Redis stopped answering", || async {
        PROBE_LOST_AT_MS.load(Ordering::SeqCst) > 0
    })
    .await;
    // The bound is part of the property (lost before the watchdog could
    // give the job away, about one lease): the deadline (90 % of the lease
    // after the last confirmed extend was sent) is at most one lease after
    // the pause; 5 leases leave 8 s for stalls of a loaded 2-core machine.
    assert!(
        stopped_at.elapsed() < lease * 5,
        "noticed {:?} after the pause",
        stopped_at.elapsed()
    );
    drop(paused);
    stop.shutdown();
    join.await.unwrap().unwrap();
}

/// `no_renew()`: the guard stops claiming the lock once its TTL ran out
/// (it used to say "held" forever).
#[tokio::test]
async fn a_lock_without_renewal_is_not_held_after_its_ttl() {
    let (_server, _url, queue) = setup().await;
    let ttl = Duration::from_millis(400);
    let guard = Lock::acquire(
        queue.connection(),
        "no-renew",
        LockOptions::default().ttl(ttl).no_renew(),
    )
    .await
    .unwrap()
    .expect("free");
    assert!(guard.is_held());
    tokio::time::sleep(ttl).await;
    assert!(!guard.is_held(), "its TTL ran out");
    // Its deadline passed already: nothing else could complete it (no
    // renewal runs). The wait only bounds a hang.
    tokio::time::timeout(T, guard.lost())
        .await
        .expect("lost() completes once the deadline passed");
    // An explicit extend of a lock whose local deadline passed does not
    // revive the guard (someone else may have held it in between).
    let _ = guard.extend(ttl).await.unwrap();
    assert!(!guard.is_held());
}

/// Auto-renew against a paused Redis: the renewal hangs until the response
/// timeout, but the guard turns "not held" when its TTL runs out, and
/// `lost()` completes. The response timeout (5 min) is longer than every
/// wait of the test: no renewal fails while it runs, so only the local
/// deadline can end the guard (before, a 3 s wall-clock bound stood for
/// "before the 5 s response timeout").
#[tokio::test]
async fn a_renewed_lock_is_not_held_once_its_ttl_passes_without_a_renewal() {
    init_tracing();
    let server = RedisServer::start().expect("redis-server starts");
    let cfg = ConnectionConfig {
        response_timeout: Duration::from_secs(300),
        ..ConnectionConfig::default()
    };
    let queue = Queue::connect_with(&server.url(), &cfg).await.unwrap();
    let ttl = Duration::from_millis(600);
    let guard = Lock::acquire(
        queue.connection(),
        "paused",
        LockOptions::default().ttl(ttl),
    )
    .await
    .unwrap()
    .expect("free");
    let paused = Paused::pause(&server);
    tokio::time::sleep(ttl).await;
    assert!(
        !guard.is_held(),
        "no renewal could be confirmed within the TTL"
    );
    tokio::time::timeout(T, guard.lost())
        .await
        .expect("lost() completes while the renewal still waits for its reply");
    drop(paused);
}

// ---- item 6: step results are fenced by the lease token ------------------

#[derive(Debug, Default, Serialize, Deserialize)]
struct Steps {}

static STEP1_DONE: AtomicBool = AtomicBool::new(false);
static STEP2_GO: AtomicBool = AtomicBool::new(false);
/// 1: the second step was refused and `lease_lost()` was true; 2: it was stored.
static STEP2_OUTCOME: AtomicU64 = AtomicU64::new(0);

/// Records step `first`, waits for the test, then tries step `second`.
#[job(queue = "steps", max_attempts = 1, timeout = "60s")]
async fn stepper(ctx: JobContext, _s: Steps) -> Result<(), JobError> {
    ctx.step("first", || async { Ok(1u32) }).await?;
    STEP1_DONE.store(true, Ordering::SeqCst);
    let start = Instant::now();
    while !STEP2_GO.load(Ordering::SeqCst) && start.elapsed() < Duration::from_secs(30) {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let second = ctx.step("second", || async { Ok(2u32) }).await;
    let outcome = if second.is_err() && ctx.lease_lost() {
        1
    } else {
        2
    };
    STEP2_OUTCOME.store(outcome, Ordering::SeqCst);
    second.map(drop)
}

/// A step write carries a TTL, and a delivery that no longer owns its job
/// (here: the job finished elsewhere with retention 0, which deletes the
/// hash and the step results) stores nothing, gets an error and sees
/// `lease_lost()`; it used to recreate the step results with no TTL.
#[tokio::test]
async fn a_stale_step_write_stores_nothing_and_every_step_write_has_a_ttl() {
    let (_server, url, queue) = setup().await;
    let cfg = WorkerConfig {
        lease: Duration::from_secs(60),
        heartbeat_enabled: false, // only the step write may notice the loss
        ..fast_config()
    };
    let (stop, join) = start_worker(&url, |b| b.register(stepper::handler()), cfg).await;
    let id = stepper::enqueue_with_id(&queue, "order-1", Steps {})
        .await
        .unwrap()
        .id;
    let keys = QueueKeys::new("steps");
    let mut c = redis_conn(&url).await;
    wait_until(T, "first step recorded", || async {
        STEP1_DONE.load(Ordering::SeqCst)
    })
    .await;
    let ttl: i64 = c.pttl(keys.steps(id.as_str())).await.unwrap();
    assert!(ttl > 0, "step results carry a TTL, got PTTL {ttl}");
    // Another delivery completed the job with retention 0.
    let _: () = c
        .del(&[keys.job(id.as_str()), keys.steps(id.as_str())])
        .await
        .unwrap();
    STEP2_GO.store(true, Ordering::SeqCst);
    wait_until(T, "second step tried", || async {
        STEP2_OUTCOME.load(Ordering::SeqCst) != 0
    })
    .await;
    assert_eq!(
        STEP2_OUTCOME.load(Ordering::SeqCst),
        1,
        "the stale step write is refused and the lease is reported lost"
    );
    let exists: bool = c.exists(keys.steps(id.as_str())).await.unwrap();
    assert!(!exists, "a stale step write recreated the step results");
    stop.shutdown();
    join.await.unwrap().unwrap();
}

// ---- item 11: an enqueue survives a lost connection or a lost reply -----

/// Enqueues an empty payload of type `t` under `id` on queue `enq`.
async fn enqueue_id(queue: &Queue, id: &str) -> queue_core::Result<queue_core::Enqueued> {
    queue
        .enqueue_raw("enq", "t", 1, 1, EnqueueOptions::new().id(id), b"")
        .await
}

/// A restart breaks the client's connection; the next enqueue used to fail
/// with "broken pipe". It is now sent again once the client reconnected.
#[tokio::test]
async fn the_first_enqueue_after_a_redis_restart_succeeds() {
    let (mut server, _url, queue) = setup().await;
    assert!(enqueue_id(&queue, "before").await.unwrap().is_new());
    server.restart().expect("redis restarts");
    let after = enqueue_id(&queue, "after")
        .await
        .expect("the first enqueue after the restart succeeds");
    assert!(after.is_new());
}

/// A redis-server and a `Queue` on it whose response timeout (300 ms) runs
/// out several times while the server is paused, with one job enqueued.
async fn queue_with_short_timeouts() -> (RedisServer, Queue) {
    init_tracing();
    let server = RedisServer::start().expect("redis-server starts");
    let cfg = ConnectionConfig {
        response_timeout: Duration::from_millis(300),
        ..ConnectionConfig::default()
    };
    let queue = Queue::connect_with(&server.url(), &cfg).await.unwrap();
    assert!(enqueue_id(&queue, "warm-up").await.unwrap().is_new());
    (server, queue)
}

/// Runs `call` while `server` is paused for several response timeouts: the
/// first request reaches Redis but its reply is lost, and the client sends
/// it again until Redis, resumed, answers.
async fn through_a_pause<T: Send + 'static>(
    server: &RedisServer,
    call: impl std::future::Future<Output = T> + Send + 'static,
) -> T {
    let paused = Paused::pause(server);
    let call = tokio::spawn(call);
    tokio::time::sleep(Duration::from_millis(1200)).await; // several timeouts
    drop(paused);
    call.await.unwrap()
}

/// The enqueue reaches a paused Redis, the client times out and sends it
/// again; when Redis resumes, the first request writes the job and the
/// retries find their own token: the call reports `Created`, exactly one job
/// exists, and another call with the same id gets `Duplicate`.
#[tokio::test]
async fn an_enqueue_whose_reply_was_lost_reports_created_once() {
    let (server, queue) = queue_with_short_timeouts().await;
    let q = queue.clone();
    let first = through_a_pause(&server, async move { enqueue_id(&q, "order-1").await })
        .await
        .expect("retried until Redis answered");
    assert_eq!(first.outcome, EnqueueOutcome::Created);
    let again = enqueue_id(&queue, "order-1").await.unwrap();
    assert!(
        matches!(again.outcome, EnqueueOutcome::Duplicate { .. }),
        "{again:?}"
    );
    let stats = queue.stats("enq").await.unwrap();
    assert_eq!(stats.counter("enqueued"), 2, "warm-up + order-1, once");
    assert_eq!(stats.main, 2);
}

/// The same with ids the `Queue` generates, alone and in a batch: those
/// calls send no enqueue token (stop 32: one job field less), and a retry
/// that finds the job it generated the id for reports `Created`, never
/// `Duplicate`; each job exists once and carries no `enq_token`.
#[tokio::test]
async fn an_enqueue_with_a_generated_id_whose_reply_was_lost_reports_created_once() {
    let (server, queue) = queue_with_short_timeouts().await;
    let q = queue.clone();
    let one = through_a_pause(&server, async move {
        q.enqueue_raw("enq", "t", 1, 1, EnqueueOptions::new(), b"")
            .await
    })
    .await
    .expect("retried until Redis answered");
    let q = queue.clone();
    let batch = through_a_pause(&server, async move {
        let jobs = vec![
            (EnqueueOptions::new(), b"a".to_vec()),
            (EnqueueOptions::new(), b"b".to_vec()),
        ];
        q.enqueue_raw_batch("enq", "t", 1, 1, jobs).await
    })
    .await
    .expect("retried until Redis answered");
    let mut c = redis_conn(&server.url()).await;
    let keys = QueueKeys::new("enq");
    for e in std::iter::once(&one).chain(&batch) {
        assert_eq!(e.outcome, EnqueueOutcome::Created, "{e:?}");
        let token: Option<String> = c.hget(keys.job(e.id.as_str()), "enq_token").await.unwrap();
        assert_eq!(token, None, "{e:?}");
    }
    let stats = queue.stats("enq").await.unwrap();
    assert_eq!(stats.counter("enqueued"), 4, "warm-up + three, once each");
    assert_eq!(stats.main, 4);
}

/// Producers in other languages send the 8 documented arguments: the
/// optional enqueue token must not be required, and without it a second
/// call with the id is a duplicate as before.
#[tokio::test]
async fn an_enqueue_without_the_optional_token_still_works() {
    let (_server, url, queue) = setup().await;
    let script = redis::Script::new(&format!(
        "{}\n{}",
        include_str!("../../queue-core/src/scripts/prelude.lua"),
        include_str!("../../queue-core/src/scripts/enqueue.lua")
    ));
    let keys = QueueKeys::new("enq");
    let id = "foreign-1";
    let mut c = redis_conn(&url).await;
    for expected in ["new", "exists"] {
        let reply: Vec<redis::Value> = script
            .key(&keys.main)
            .key(keys.job(id))
            .key(keys.done(id))
            .key(&keys.delayed)
            .key(&keys.stats)
            .key(keys.once(id))
            .arg(id)
            .arg("t")
            .arg(1)
            .arg(b"".as_slice())
            .arg(3)
            .arg(0)
            .arg(0)
            .arg(0)
            .invoke_async(&mut c)
            .await
            .unwrap();
        assert_eq!(reply[0], redis::Value::BulkString(expected.into()));
    }
    assert_eq!(queue.stats("enq").await.unwrap().main, 1);
}

// ---- item 10: connecting to a hung Redis fails within the timeout --------

/// A SIGSTOPped Redis accepts TCP connections (the kernel does) but never
/// answers. `Queue::connect_with`, `Worker::build` and `Watchdog::connect`
/// must give up within `connection_timeout`, not a multiple of it.
#[tokio::test]
async fn connecting_to_a_hung_redis_fails_within_the_connection_timeout() {
    init_tracing();
    let server = RedisServer::start().expect("redis-server starts");
    let url = server.url();
    // The bound is the property (the whole connect within the timeout, not
    // a multiple of it: the old code took about 4x, retrying). A 4 s timeout
    // leaves 6 s for stalls of a loaded 2-core machine under the bound, and
    // the old code's 16 s well above it.
    let timeout = Duration::from_secs(4);
    let connection = ConnectionConfig {
        connection_timeout: timeout,
        response_timeout: timeout,
    };
    let limit = timeout + Duration::from_secs(6);
    let _paused = Paused::pause(&server);

    let t0 = Instant::now();
    let res = Queue::connect_with(&url, &connection).await;
    assert!(
        res.is_err(),
        "Queue::connect_with answered against a paused Redis"
    );
    assert!(
        t0.elapsed() < limit,
        "Queue::connect_with took {:?}",
        t0.elapsed()
    );

    let t0 = Instant::now();
    let cfg = WorkerConfig {
        connection: connection.clone(),
        ..fast_config()
    };
    let res = Worker::builder(&url)
        .register(probe::handler())
        .config(cfg)
        .build()
        .await;
    assert!(
        res.is_err(),
        "Worker::build answered against a paused Redis"
    );
    assert!(
        t0.elapsed() < limit,
        "Worker::build took {:?}",
        t0.elapsed()
    );

    let t0 = Instant::now();
    let cfg = WatchdogConfig {
        connection,
        ..WatchdogConfig::default()
    };
    let res = Watchdog::connect(&url, ["tasks"], cfg).await;
    assert!(
        res.is_err(),
        "Watchdog::connect answered against a paused Redis"
    );
    assert!(
        t0.elapsed() < limit,
        "Watchdog::connect took {:?}",
        t0.elapsed()
    );
}

// ---- item 8: dead letters and lock fences do not grow forever -----------

/// Writes a dead letter as `dead_letter()` leaves it: id at the head of the
/// dead list, its hash (state dead, `dead_at`) and a step result.
async fn dead_letter(
    c: &mut redis::aio::MultiplexedConnection,
    keys: &QueueKeys,
    id: &str,
    dead_at_ms: u64,
) {
    let _: () = c.lpush(&keys.dead, id).await.unwrap();
    let _: () = c
        .hset_multiple(
            keys.job(id),
            &[
                ("id", id),
                ("state", "dead"),
                ("dead_at", &dead_at_ms.to_string()),
            ],
        )
        .await
        .unwrap();
    let _: () = c.hset(keys.steps(id), "charge", "x").await.unwrap();
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

async fn exists(c: &mut redis::aio::MultiplexedConnection, key: String) -> bool {
    c.exists(key).await.unwrap()
}

/// Each watchdog pass deletes the oldest dead letters beyond `dead_max_len`
/// (at most `batch` per script call) and those older than `dead_retention`, with
/// their hashes and step results, and counts them.
#[tokio::test]
async fn the_watchdog_trims_dead_letters_by_length_and_age_a_bounded_number_per_pass() {
    let (_server, url, _queue) = setup().await;
    let keys = QueueKeys::new("trim");
    let mut c = redis_conn(&url).await;
    let now = now_ms();
    let ten_days = 10 * 24 * 3600 * 1000;
    for (i, age) in [ten_days, ten_days, 0, 0, 0].into_iter().enumerate() {
        dead_letter(&mut c, &keys, &format!("d{i}"), now - age).await;
    }
    // By length: keep 4, one id per pass.
    let by_length = Watchdog::connect(
        &url,
        ["trim"],
        WatchdogConfig {
            dead_max_len: 4,
            dead_retention: Duration::ZERO,
            batch: 1,
            ..WatchdogConfig::default()
        },
    )
    .await
    .unwrap();
    assert_eq!(by_length.run_once().await.unwrap().trimmed, 1);
    assert_eq!(by_length.run_once().await.unwrap().trimmed, 0);
    assert!(!exists(&mut c, keys.job("d0")).await && !exists(&mut c, keys.steps("d0")).await);
    // By age: the other ten-day-old one goes, the recent ones stay.
    let by_age = Watchdog::connect(&url, ["trim"], WatchdogConfig::default())
        .await
        .unwrap();
    assert_eq!(by_age.run_once().await.unwrap().trimmed, 1);
    assert!(!exists(&mut c, keys.job("d1")).await && !exists(&mut c, keys.steps("d1")).await);
    let left: Vec<String> = c.lrange(&keys.dead, 0, -1).await.unwrap();
    assert_eq!(left, ["d4", "d3", "d2"]);
    assert!(exists(&mut c, keys.job("d2")).await && exists(&mut c, keys.steps("d2")).await);
    let trimmed: u64 = c.hget(&keys.stats, "trimmed").await.unwrap();
    assert_eq!(trimmed, 2);
}

/// Scenario: a dead-letter storm leaves 3 × `batch` dead letters on a
/// queue whose cap is `batch`. One watchdog pass brings the list back to
/// the cap: the trim calls again while a call deleted its whole batch and
/// the list is still over the cap. Before, a pass made one call: 30 over a
/// cap of 10 left 20 (3,000 over 1,000 left 2,500 with the default batch).
#[tokio::test]
async fn one_watchdog_pass_trims_a_dead_letter_storm_back_to_the_cap() {
    let (_server, url, _queue) = setup().await;
    let keys = QueueKeys::new("storm");
    let mut c = redis_conn(&url).await;
    let batch = 10;
    for i in 0..3 * batch {
        dead_letter(&mut c, &keys, &format!("d{i}"), now_ms()).await;
    }
    let dog = Watchdog::connect(
        &url,
        ["storm"],
        WatchdogConfig {
            dead_max_len: batch,
            dead_retention: Duration::ZERO,
            batch,
            ..WatchdogConfig::default()
        },
    )
    .await
    .unwrap();
    let report = dog.run_once().await.unwrap();
    assert_eq!(report.trimmed, 2 * batch as u64);
    let len: usize = c.llen(&keys.dead).await.unwrap();
    assert!(
        len <= batch,
        "{len} dead letters left over a cap of {batch}"
    );
    // The newest stay (dead_letter pushes at the head).
    let left: Vec<String> = c.lrange(&keys.dead, 0, -1).await.unwrap();
    let newest: Vec<String> = (2 * batch..3 * batch)
        .rev()
        .map(|i| format!("d{i}"))
        .collect();
    assert_eq!(left, newest);
}

/// Scenario: a queue whose earliest delayed job is due at +inf (another
/// producer, a hand edit) and whose dead list is over its cap. The pass
/// takes the job as far away and goes on to trim. Before, the promote step
/// failed ("negative wait") and so did the whole pass, every time: no trim,
/// relay or gauges for that queue.
#[tokio::test]
async fn a_delayed_job_due_at_infinity_does_not_stop_the_watchdogs_pass() {
    let (_server, url, _queue) = setup().await;
    let keys = QueueKeys::new("trim");
    let mut c = redis_conn(&url).await;
    for i in 0..2 {
        dead_letter(&mut c, &keys, &format!("d{i}"), now_ms()).await;
    }
    let _: () = c.hset(keys.job("far"), "state", "delayed").await.unwrap();
    let _: () = redis::cmd("ZADD")
        .arg(&keys.delayed)
        .arg("+inf")
        .arg("far")
        .query_async(&mut c)
        .await
        .unwrap();
    let dog = Watchdog::connect(
        &url,
        ["trim"],
        WatchdogConfig {
            dead_max_len: 1,
            dead_retention: Duration::ZERO,
            ..WatchdogConfig::default()
        },
    )
    .await
    .unwrap();
    let report = dog.run_once().await.unwrap();
    assert_eq!((report.failed_queue_passes, report.trimmed), (0, 1));
    let left: Vec<String> = c.lrange(&keys.dead, 0, -1).await.unwrap();
    assert_eq!(left, ["d1"]);
    let far: Option<f64> = c.zscore(&keys.delayed, "far").await.unwrap();
    assert_eq!(far, Some(f64::INFINITY), "left where it was");
}

/// The fencing counter of a lock expires, and a recreated one starts above
/// every number the old one handed out.
#[tokio::test]
async fn a_lock_fence_expires_and_a_recreated_one_still_grows() {
    let (_server, url, queue) = setup().await;
    let take = || async {
        Lock::acquire(queue.connection(), "fenced", LockOptions::default())
            .await
            .unwrap()
            .expect("free")
    };
    let first = take().await;
    let first_fence = first.fencing();
    assert!(first.release().await.unwrap());
    let mut c = redis_conn(&url).await;
    let ttl: i64 = c.pttl("lock:{fenced}:fence").await.unwrap();
    assert!(ttl > 0, "the fencing counter has a TTL, got PTTL {ttl}");
    // It expired (a day without acquisitions): the next one starts anew.
    let _: () = c.del("lock:{fenced}:fence").await.unwrap();
    let second = take().await;
    assert!(
        second.fencing() > first_fence,
        "{} after {first_fence}",
        second.fencing()
    );
}

// ---- a stop during a pass against a hung Redis --------------------------

/// Scenario: Redis hangs (SIGSTOP) while a watchdog of three queues is in a
/// pass, and the watchdog is told to stop. `run_until` abandons the pass in
/// flight (each script is atomic) and returns. Before, it checked the stop
/// only between passes: it waited out the response timeout of every queue
/// first, about 3 × `response_timeout` (a SIGTERM to `queue-watchdog run`
/// took that long).
#[tokio::test]
async fn a_stop_during_a_pass_against_a_hung_redis_does_not_wait_out_every_queue() {
    init_tracing();
    let server = RedisServer::start().expect("redis-server starts");
    // Long enough that returning within one response timeout proves the
    // pass was abandoned (the stop itself takes next to nothing).
    let timeout = Duration::from_secs(20);
    let cfg = WatchdogConfig {
        connection: ConnectionConfig {
            connection_timeout: timeout,
            response_timeout: timeout,
        },
        interval: Duration::from_millis(50),
        ..WatchdogConfig::default()
    };
    let dog = Watchdog::connect(&server.url(), ["hang-1", "hang-2", "hang-3"], cfg)
        .await
        .expect("watchdog connects");
    // A first pass against the live server: the connection is up and used.
    dog.run_once().await.expect("a pass");

    let _paused = Paused::pause(&server);
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let run = tokio::spawn(async move {
        dog.run_until(async {
            let _ = stop_rx.await;
        })
        .await;
        Instant::now()
    });
    // The pass after the pause is in flight (hung on the first queue).
    tokio::time::sleep(Duration::from_millis(500)).await;
    let stopped_at = Instant::now();
    stop_tx.send(()).expect("run_until still runs");
    // The bound is the property (the stop does not wait for the hung
    // pass): one response timeout, 20 s for a stop that takes next to
    // nothing, where the old code takes about 3 × timeout.
    let bound = timeout;
    let returned_at = tokio::time::timeout(bound * 6, run)
        .await
        .expect("run_until returned at all")
        .expect("the task did not panic");
    let took = returned_at - stopped_at;
    assert!(
        took < bound,
        "run_until took {took:?} after the stop (response timeout {timeout:?}, 3 queues)"
    );
}

/// Scenario: Redis hangs (SIGSTOP) and a watchdog pass starts. The first
/// step of the queue's pass (the reclaim) times out; the queue's pass ends
/// there, counted as failed, instead of trying promote, dead-letter trim
/// and relay, each of which would wait out its own response timeout (a pass
/// over many queues during an outage then took steps × queues × timeout).
/// A step refused for the queue's data still lets the others run
/// (`reliability.rs::a_failing_step_after_the_reclaim_keeps_its_count`).
#[tokio::test]
async fn a_pass_against_a_hung_redis_ends_the_queues_pass_at_its_first_timeout() {
    init_tracing();
    let server = RedisServer::start().expect("redis-server starts");
    let timeout = Duration::from_secs(5);
    let cfg = WatchdogConfig {
        connection: ConnectionConfig {
            // A reconnect against the paused server adds at most this.
            connection_timeout: Duration::from_secs(1),
            response_timeout: timeout,
        },
        ..WatchdogConfig::default()
    };
    let dog = Watchdog::connect(&server.url(), ["hang-1"], cfg)
        .await
        .expect("watchdog connects");
    dog.run_once()
        .await
        .expect("a pass against the live server");

    let paused = Paused::pause(&server);
    let started = Instant::now();
    let report = dog.run_once().await.expect("run_once reports");
    let took = started.elapsed();
    drop(paused);
    assert_eq!(report.failed_queue_passes, 1, "{report:?}");
    // The bound is the property (one step's timeout, not one per step):
    // one response timeout and at most a reconnect (6 s) with 8 s for
    // stalls of a loaded 2-core machine; a pass that tries every step waits
    // at least four response timeouts (20 s).
    let bound = timeout + Duration::from_secs(9);
    assert!(
        took < bound,
        "the pass took {took:?} against a hung Redis (response timeout {timeout:?})"
    );
}

// ---- a shutdown against a hung Redis ends within grace + the hard stop ----

#[derive(Debug, Default, Serialize, Deserialize)]
struct Held {
    /// Whose job it is: the tests that use `held` run at once, each with
    /// its own tag (its started and released flags).
    tag: String,
    /// Return a retryable error instead of `Ok`.
    fail: bool,
}

/// The tags of `held` jobs whose handler started, and of those released.
static HELD_STARTED: Mutex<BTreeSet<String>> = Mutex::new(BTreeSet::new());
static HELD_RELEASED: Mutex<BTreeSet<String>> = Mutex::new(BTreeSet::new());

fn held_started(tag: &str) -> bool {
    HELD_STARTED.lock().unwrap().contains(tag)
}

fn release_held(tag: &str) {
    HELD_RELEASED.lock().unwrap().insert(tag.to_string());
}

/// Runs until the test releases its tag, then returns `Ok` (or fails, retryable).
#[job(queue = "held", max_attempts = 3, timeout = "60s")]
async fn held(_ctx: JobContext, h: Held) -> Result<(), JobError> {
    HELD_STARTED.lock().unwrap().insert(h.tag.clone());
    while !HELD_RELEASED.lock().unwrap().contains(&h.tag) {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    if h.fail {
        return Err(JobError::retryable("planned failure after Redis hung"));
    }
    Ok(())
}

/// Scenario: a job's handler returns (`Ok`, then a retryable error) after
/// Redis hung (SIGSTOP), and the worker is told to shut down. Its result
/// cannot be recorded; the worker ends within the grace period plus the hard
/// stop's 5 s (docs/ARCHITECTURE.md "Shutdown": what a systemd
/// `TimeoutStopSec` is sized from) and leaves the job leased for the
/// watchdog (or its result landed once Redis resumed: nothing is lost).
/// Before, the acker retried the ack until one lease after the handler
/// returned and the shutdown waited for it (the fail path: the runner's
/// retry loop ignored the hard stop and held the acker's channel open):
/// about a lease (120 s here; 60 s in production for a SIGTERM).
#[tokio::test]
async fn a_shutdown_against_a_hung_redis_ends_within_the_grace_and_the_hard_stop() {
    for fail in [false, true] {
        let tag = format!("hung-redis-shutdown-{fail}");
        let (server, url, queue) = setup().await;
        let response_timeout = Duration::from_secs(2);
        let grace = Duration::from_secs(1);
        // The old code waited out about a lease: a long one keeps it far
        // above the bound.
        let cfg = WorkerConfig {
            lease: Duration::from_secs(120),
            grace,
            connection: ConnectionConfig {
                connection_timeout: response_timeout,
                response_timeout,
            },
            ..fast_config()
        };
        let (stop, join) = start_worker(&url, |b| b.register(held::handler()), cfg).await;
        let job = Held {
            tag: tag.clone(),
            fail,
        };
        held::enqueue(&queue, job).await.unwrap();
        wait_until(T, "the handler started", || async { held_started(&tag) }).await;
        let paused = Paused::pause(&server);
        release_held(&tag);
        // The handler returns; its result is on its way to the hung Redis.
        tokio::time::sleep(Duration::from_millis(300)).await;
        stop.shutdown();
        // The bound is the property (a shutdown must not hang): the grace,
        // the hard stop's 5 s and a response timeout (8 s), with 24 s for
        // stalls of a loaded 2-core machine (x4): far under the 120 s lease
        // the old code waited out.
        let bound = grace + Duration::from_secs(5) + response_timeout + Duration::from_secs(24);
        tokio::time::timeout(bound, join)
            .await
            .unwrap_or_else(|_| {
                panic!("fail {fail}: the worker did not stop within {bound:?} of the shutdown")
            })
            .expect("the worker task did not panic")
            .expect("the worker returns Ok");
        drop(paused);
        // Nothing lost: the job is leased for the watchdog, or its result
        // (a call sent before the stop) landed once Redis resumed.
        wait_until(T, "the job is leased, retried or complete", || async {
            let s = queue.stats("held").await.expect("stats");
            let completed = s.counters.get("completed").copied().unwrap_or(0);
            s.processing + s.delayed + completed as u64 == 1
        })
        .await;
    }
}

/// Scenario: Redis refuses writes (it became a replica of a server that is
/// not there: every script answers READONLY at once) when a handler fails,
/// and the worker is told to shut down. Its runner retries the retry call
/// until the grace period's hard stop, then leaves the job leased and ends:
/// once Redis takes writes again, no runner of the stopped worker records
/// anything (the watchdog returns the job). Before, the runner's retry loop
/// ignored the hard stop and outlived the worker's `run_until` (which left
/// it running), retrying for a lease after the handler returned.
#[tokio::test]
async fn a_runner_retrying_its_result_stops_at_the_hard_stop() {
    let tag = "retrying-runner";
    let (_server, url, queue) = setup().await;
    let cfg = WorkerConfig {
        lease: Duration::from_secs(20),
        grace: Duration::from_secs(1),
        ..fast_config()
    };
    let (stop, join) = start_worker(&url, |b| b.register(held::handler()), cfg).await;
    let job = Held {
        tag: tag.into(),
        fail: true,
    };
    held::enqueue(&queue, job).await.unwrap();
    wait_until(T, "the handler started", || async { held_started(tag) }).await;
    let mut c = redis_conn(&url).await;
    // A primary that never answers a sync: a listener bound for the whole
    // test (no redis-server another test starts can take its port), never
    // accepting. Before, the port was only picked free and then released.
    let nobody = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let nobody_port = nobody.local_addr().unwrap().port();
    let _: () = redis::cmd("REPLICAOF")
        .arg("127.0.0.1")
        .arg(nobody_port)
        .query_async(&mut c)
        .await
        .unwrap();
    release_held(tag);
    // The handler failed; its retry call is refused and retried.
    tokio::time::sleep(Duration::from_millis(300)).await;
    stop.shutdown();
    tokio::time::timeout(T, join)
        .await
        .expect("the worker stopped")
        .unwrap()
        .unwrap();
    let _: () = redis::cmd("REPLICAOF")
        .arg("NO")
        .arg("ONE")
        .query_async(&mut c)
        .await
        .unwrap();
    // Longer than a retrying runner's longest pause (2 s): one left running
    // would have recorded the retry by now.
    tokio::time::sleep(Duration::from_secs(4)).await;
    let s = queue.stats("held").await.expect("stats");
    assert_eq!(
        (s.processing, s.delayed),
        (1, 0),
        "the job stays leased for the watchdog: {s:?}"
    );
    drop(nobody);
}

/// A `redis://` enqueue whose reply is lost (the connection dropped at the
/// `FCALL`) while every new connection is accepted and never answered (a
/// node that came back half up, an address whose proxy forwards nowhere):
/// the retry waits for the client's reconnect, and returns within
/// `retry_window + response_timeout` (1 s + 1 s here, checked with 5 s of
/// margin as a hang detector), its outcome unknown (the job was written).
/// Before, nothing bounded a call's wait for the reconnect but the
/// client's own 4 attempts of `connection_timeout` (10 s here, as a slow
/// network may need) and their backoff: over 40 s. (The reviewer's repro,
/// with the default 5 s timeouts: 21 s instead of 10 s.)
#[tokio::test]
async fn an_enqueue_is_bounded_while_the_client_reconnects_to_a_server_that_never_answers() {
    init_tracing();
    let server = RedisServer::start().expect("redis-server starts");
    let proxy = queue_testkit::proxy::ReplyDropper::start(server.port()).unwrap();
    queue_tests::enqueue_fails_within_the_bound_while_reconnecting(&proxy.url(), &proxy).await;
    let mut conn = redis_conn(&server.url()).await;
    let main: i64 = conn.llen(QueueKeys::new("hung").main).await.unwrap();
    assert_eq!(main, 1, "the first send wrote the job");
}

/// Runs of [`blocker`].
static BLOCKER_STARTED: AtomicBool = AtomicBool::new(false);

/// Runs past its first heartbeat, then blocks its thread for 10 s (a
/// deadlock, a blocking driver call) with a timeout of 1 s. Blocked inside
/// `block_in_place`, so that the runtime hands the thread's other tasks (a
/// connection's driver among them) to another thread: a plain blocking call
/// can also hold tasks queued on that thread, which made the scenario
/// depend on where the scheduler put them.
#[job(queue = "blocker", max_attempts = 1, timeout = "1s")]
async fn blocker(_ctx: JobContext, _p: Probe) -> Result<(), JobError> {
    BLOCKER_STARTED.store(true, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(600)).await;
    tokio::task::block_in_place(|| std::thread::sleep(Duration::from_secs(10)));
    Ok(())
}

/// A handler that blocks its thread after its heartbeat started: the
/// runner cannot enforce the 1 s timeout (it is never polled), but the
/// heartbeat stops a lease after it, so the lease lapses and the watchdog
/// returns the job (here dead-lettered: one attempt) while the thread still
/// blocks. Before, the heartbeat, on another runtime thread, extended the
/// lease for as long as the handler blocked: the job stayed active, its
/// slot taken, with nothing running it (stop 48 review).
#[tokio::test(flavor = "multi_thread", worker_threads = 3)]
async fn a_handler_blocking_its_thread_past_its_timeout_loses_its_lease() {
    let (_server, url, queue) = setup().await;
    let config =
        queue_tests::lease_config(Duration::from_secs(1), Some(Duration::from_millis(300)));
    let (handle, _join) = start_worker(&url, |b| b.register(blocker::handler()), config).await;
    blocker::enqueue(&queue, Probe {}).await.unwrap();
    let watchdog = Watchdog::connect(&url, ["blocker"], queue_tests::fast_watchdog())
        .await
        .unwrap();
    let watchdog = tokio::spawn(async move { watchdog.run_until(std::future::pending()).await });
    let started = Instant::now();
    wait_until(
        Duration::from_secs(6),
        "the blocked job returned by the watchdog",
        || async { queue.stats("blocker").await.unwrap().dead == 1 },
    )
    .await;
    assert!(BLOCKER_STARTED.load(Ordering::SeqCst));
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "returned while the thread still blocked"
    );
    watchdog.abort();
    handle.shutdown();
}
