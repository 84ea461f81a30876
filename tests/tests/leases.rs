//! Leases, heartbeats and the watchdog, with worker processes killed by SIGKILL.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use queue_core::{
    BoxFuture, Job, JobContext, JobError, JobId, QueueError, Registration, WorkerConfig,
};
use queue_tests::WorkerHandle;
use queue_tests::{
    fast_config, fast_watchdog, lease_config, wait_until, Task, TestEnv, WorkerProcess, BOUND,
};
use redis::AsyncCommands;

const WORKER_BIN: &str = env!("CARGO_BIN_EXE_test-worker");

/// Enqueues a job that runs `sleep_ms` and starts a worker with a lease of
/// `lease_ms` and a heartbeat every 100 ms.
async fn slow_job_heartbeating(
    env: &TestEnv,
    sleep_ms: u64,
    lease_ms: u64,
) -> (JobId, WorkerHandle) {
    let id = env
        .enqueue(Task {
            sleep_ms,
            ..env.task(0)
        })
        .await;
    let cfg = lease_config(
        Duration::from_millis(lease_ms),
        Some(Duration::from_millis(100)),
    );
    (id, env.spawn_worker(cfg).await)
}

#[tokio::test]
async fn heartbeat_keeps_a_slow_job_from_being_reclaimed() {
    let env = TestEnv::start().await;
    // The job runs more than three leases; a heartbeat every 100 ms keeps a
    // 1 s lease with room for a 900 ms stall of a loaded machine (with a
    // 300 ms lease, a 200 ms stall let the watchdog reclaim it).
    let (id, worker) = slow_job_heartbeating(&env, 3500, 1000).await;
    let watchdog = env.spawn_watchdog("tasks").await;

    env.wait_completed("tasks", 1).await;
    let report = watchdog.stop().await;
    worker.stop().await;
    assert_eq!(report.reclaimed, 0, "a heartbeating job is never reclaimed");
    let ledger = env.ledger().await;
    assert_eq!(ledger.started.get(id.as_str()), Some(&1));
    assert_eq!(ledger.effects.get(id.as_str()), Some(&1));
}

#[tokio::test]
async fn stale_worker_cannot_ack_after_its_lease_was_reclaimed() {
    let env = TestEnv::start().await;
    let (id, worker) = slow_job_heartbeating(&env, 1200, 600).await;
    env.wait_ledger("first start", |l| !l.started.is_empty())
        .await;
    let job = env.queue.job("tasks", &id).await.unwrap().unwrap();
    let stale = job.field("token").map(str::to_string);
    assert!(stale.is_some(), "the first delivery holds a token");

    // Force the first delivery's lease to expire and let the watchdog reclaim it,
    // as if the worker had stalled. (Retry: a heartbeat may slip in between.)
    let watchdog = env.watchdog("tasks").await;
    wait_until(BOUND, "reclaim of the first delivery", || async {
        env.set_lease("tasks", id.as_str(), 0).await;
        watchdog.run_once().await.unwrap().reclaimed == 1
    })
    .await;
    // The reclaim put it in the delayed set for a backoff of a few ms: by
    // now the worker may have taken it again (a new delivery, a new token).
    // Either way the stale token is no longer the job's.
    let job = env.queue.job("tasks", &id).await.unwrap().unwrap();
    assert!(
        matches!(job.state(), Some("delayed" | "queued" | "active")),
        "{:?}",
        job.state()
    );
    assert_ne!(
        job.field("token").map(str::to_string),
        stale,
        "the stale token was revoked"
    );

    // The stale delivery finishes (lease lost) and is redelivered; the second
    // delivery acks. Only one completion is recorded, by attempt 2.
    env.wait_completed("tasks", 1).await;
    worker.stop().await;
    assert_eq!(env.completion_attempts("tasks", &id).await, 2);
    let lost: Vec<String> = env
        .conn()
        .await
        .smembers("ledger:lease_lost")
        .await
        .unwrap();
    assert_eq!(
        lost,
        vec![id.to_string()],
        "the first delivery saw ctx.lease_lost()"
    );
    let stats = env.stats("tasks").await;
    assert_eq!(stats.counter("completed"), 1);
    assert_eq!((stats.processing, stats.main, stats.delayed), (0, 0, 0));
}

#[tokio::test]
async fn watchdog_returns_a_sigkilled_workers_job_and_it_completes_once() {
    let env = TestEnv::start().await;
    let id = env
        .enqueue(Task {
            sleep_ms: 60_000,
            sleep_attempts: 1,
            ..env.task(0)
        })
        .await;
    let mut proc = WorkerProcess::start(WORKER_BIN, &env.url, 2, 800, 5000);
    env.wait_ledger("the job starts in the worker process", |l| {
        !l.started.is_empty()
    })
    .await;
    proc.kill();
    assert_eq!(
        env.stats("tasks").await.processing,
        1,
        "the dead worker's job is still in processing"
    );

    env.reclaim("tasks", 1).await;
    env.run_until_completed("tasks", 1).await;
    let ledger = env.ledger().await;
    assert_eq!(ledger.started.get(id.as_str()), Some(&2));
    assert_eq!(
        ledger.effects.get(id.as_str()),
        Some(&1),
        "side effect exactly once"
    );
    assert_eq!(env.stats("tasks").await.counter("reclaimed"), 1);
}

#[tokio::test]
async fn id_left_between_blmove_and_claim_is_recovered() {
    let env = TestEnv::start().await;
    let id = env.enqueue(env.task(0)).await;
    // A worker did BLMOVE main -> processing and died before its claim.
    assert_eq!(env.orphan("tasks").await.as_deref(), Some(id.as_str()));

    let watchdog = env.watchdog("tasks").await;
    let first = watchdog.run_once().await.unwrap();
    assert_eq!(
        (first.adopted, first.reclaimed),
        (1, 0),
        "first sight: provisional lease"
    );
    let second = watchdog.run_once().await.unwrap();
    assert_eq!(
        (second.adopted, second.reclaimed),
        (0, 0),
        "within the grace: left alone"
    );
    wait_until(BOUND, "reclaim after the orphan grace", || async {
        watchdog.run_once().await.unwrap().reclaimed == 1
    })
    .await;
    let job = env.queue.job("tasks", &id).await.unwrap().unwrap();
    assert_eq!(job.attempts(), 0, "it never ran, so no attempt was used");

    env.run_until_completed("tasks", 1).await;
    assert_eq!(env.ledger().await.effects.get(id.as_str()), Some(&1));
}

#[tokio::test]
async fn concurrent_watchdogs_do_not_duplicate_jobs() {
    let env = TestEnv::start().await;
    const N: u64 = 40;
    env.enqueue_tasks(N, |t| Task {
        sleep_ms: 60_000,
        sleep_attempts: 1,
        ..t
    })
    .await;
    let mut proc = WorkerProcess::start(WORKER_BIN, &env.url, N as usize, 500, 5000);
    env.wait_ledger("all jobs started", |l| l.started.len() >= N as usize)
        .await;
    proc.kill();
    env.wait_leases_expired("tasks").await;

    let mut dogs = Vec::new();
    for _ in 0..3 {
        let mut cfg = fast_watchdog();
        cfg.batch = 3; // small batches so the three interleave
        dogs.push(
            queue_core::Watchdog::connect(&env.url, ["tasks"], cfg)
                .await
                .unwrap(),
        );
    }
    let reports = futures::future::join_all(dogs.iter().map(|d| d.run_once())).await;
    let reclaimed: u64 = reports.into_iter().map(|r| r.unwrap().reclaimed).sum();
    assert_eq!(
        reclaimed, N,
        "each expired job reclaimed exactly once across three watchdogs"
    );
    let s = env.stats("tasks").await;
    assert_eq!((s.processing, s.delayed + s.main), (0, N));

    let mut cfg = fast_config();
    cfg.concurrency = 16;
    env.run_until_completed_with("tasks", N as i64, cfg).await;
    let ledger = env.ledger().await;
    assert_eq!(ledger.effects.len() as u64, N);
    assert!(
        ledger.duplicates().is_empty(),
        "no side effect twice: {:?}",
        ledger.duplicates()
    );
}

/// A heartbeat of half the trusted lease or more is refused at build: one
/// failed extend then lost the lease, and a beat near the whole lease was
/// never sent (the local deadline had passed), so a long job was reclaimed
/// and ran twice at once.
#[tokio::test]
async fn a_heartbeat_one_failed_extend_would_undo_is_refused() {
    let env = TestEnv::start().await;
    let lease = Duration::from_secs(1);
    for refused_ms in [950, 450] {
        let cfg = lease_config(lease, Some(Duration::from_millis(refused_ms)));
        let err = env.worker("tasks", cfg).build().await.unwrap_err();
        assert!(
            matches!(&err, QueueError::Config(m) if m.contains("heartbeat")),
            "{refused_ms} ms: {err}"
        );
    }
    // Under half of the 900 ms trusted, and the default (a third), build.
    for cfg in [
        lease_config(lease, Some(Duration::from_millis(440))),
        WorkerConfig {
            lease,
            ..fast_config()
        },
    ] {
        env.worker("tasks", cfg).build().await.expect("accepted");
    }
}

/// Starts of [`SlowToDecode`] handlers: (key, attempt).
static SLOW_STARTS: Mutex<Vec<(String, u32)>> = Mutex::new(Vec::new());
/// Keys [`SlowArgs`] decoded at least once.
static SLOW_DECODED: Mutex<Vec<String>> = Mutex::new(Vec::new());
/// Gates the test opened ([`open_gate`]): `"{key}/decode"`, `"{key}/run"`.
static OPEN_GATES: Mutex<Vec<String>> = Mutex::new(Vec::new());

/// Lets the decode or the handler waiting at `gate` go on.
fn open_gate(gate: String) {
    OPEN_GATES.lock().unwrap().push(gate);
}

fn gate_is_open(gate: &str) -> bool {
    OPEN_GATES.lock().unwrap().iter().any(|g| g == gate)
}

/// Arguments whose first decode of `key` blocks until the test opens
/// `"{key}/decode"` (a large payload, a starved runtime): the handler
/// starts when the test lets it, at a point of the lease it observed in
/// Redis. Later decodes of `key` do not wait. With `gated_run`, the
/// handler waits for `"{key}/run"` after recording its start.
#[derive(serde::Serialize, serde::Deserialize)]
#[serde(from = "SlowWire")]
struct SlowArgs {
    key: String,
    gated_run: bool,
}

#[derive(serde::Deserialize)]
struct SlowWire {
    key: String,
    gated_run: bool,
}

impl From<SlowWire> for SlowArgs {
    fn from(w: SlowWire) -> Self {
        let first = {
            let mut seen = SLOW_DECODED.lock().unwrap();
            let first = !seen.contains(&w.key);
            seen.push(w.key.clone());
            first
        };
        let gate = format!("{}/decode", w.key);
        let since = std::time::Instant::now();
        // Bounded: a test that failed before opening it must still end.
        while first && !gate_is_open(&gate) && since.elapsed() < BOUND {
            std::thread::sleep(Duration::from_millis(5));
        }
        SlowArgs {
            key: w.key,
            gated_run: w.gated_run,
        }
    }
}

/// Records its start, then waits for its run gate if it has one. Two
/// attempts at most.
struct SlowToDecode;
impl Job for SlowToDecode {
    type Args = SlowArgs;
    const NAME: &'static str = "slow_to_decode";
    const QUEUE: &'static str = "slow";
    const MAX_ATTEMPTS: u32 = 2;
    fn run(ctx: JobContext, args: SlowArgs) -> BoxFuture<'static, Result<(), JobError>> {
        Box::pin(async move {
            let start = (args.key.clone(), ctx.attempt());
            SLOW_STARTS.lock().unwrap().push(start);
            let gate = format!("{}/run", args.key);
            if args.gated_run {
                wait_until(BOUND, "the run gate", || async { gate_is_open(&gate) }).await;
            }
            Ok(())
        })
    }
}

/// A [`SlowToDecode`] job of `key` whose first decode waits for the test,
/// on a worker with `cfg`.
struct SlowRun {
    env: TestEnv,
    key: String,
    id: JobId,
    worker: WorkerHandle,
    /// The first delivery's token.
    token: String,
    /// When the first delivery was claimed (ms, Redis clock): its lease
    /// expiry less the lease.
    claimed_ms: u64,
}

impl SlowRun {
    async fn start(key: &str, gated_run: bool, cfg: WorkerConfig) -> SlowRun {
        let env = TestEnv::start().await;
        let args = SlowArgs {
            key: key.into(),
            gated_run,
        };
        let id = env.queue.enqueue::<SlowToDecode>(&args).await.unwrap();
        let lease_ms = cfg.lease.as_millis() as u64;
        let worker = env
            .spawn_worker_for(Registration::of::<SlowToDecode>(), cfg)
            .await;
        let (token, lease_until) = env.wait_delivery(SlowToDecode::QUEUE, id.as_str()).await;
        SlowRun {
            env,
            key: key.into(),
            id,
            worker,
            token,
            claimed_ms: lease_until as u64 - lease_ms,
        }
    }

    /// Lets the first decode end `after_ms` after the claim (Redis clock):
    /// the handler starts after that, however slow the machine.
    async fn decode_ends(&self, after_ms: u64) {
        self.env.wait_redis_clock(self.claimed_ms + after_ms).await;
        open_gate(format!("{}/decode", self.key));
    }

    /// Stops the worker (its in-flight deliveries end first); the attempts
    /// of the handler's starts and of the completion (0: none).
    async fn stop(self) -> (Vec<u32>, u32) {
        self.worker.stop().await;
        let starts = SLOW_STARTS.lock().unwrap().clone();
        let starts = starts
            .into_iter()
            .filter(|(k, _)| *k == self.key)
            .map(|(_, a)| a);
        let done = self
            .env
            .stats(SlowToDecode::QUEUE)
            .await
            .counter("completed");
        let attempts = match done {
            0 => 0,
            _ => {
                let q = SlowToDecode::QUEUE;
                self.env.completion_attempts(q, &self.id).await
            }
        };
        (starts.collect(), attempts)
    }
}

/// A handler that starts late (its decode held until 2.85 s after the
/// claim, by the Redis clock) on a 6 s lease with a beat every 2.6 s: the
/// first beat was due at 2.6 s, so it goes out as the handler starts and
/// extends the first delivery's lease, which is never reclaimed; the job
/// runs once. Timed from the handler's start (at 5.45 s or later, past the
/// 5.4 s deadline) the beat was never sent: the watchdog reclaimed the
/// delivery while it ran, and a second one ran it again.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_late_start_still_heartbeats_from_the_claim() {
    let cfg = lease_config(Duration::from_secs(6), Some(Duration::from_millis(2600)));
    let run = SlowRun::start("late-start", true, cfg).await;
    let watchdog = run.env.spawn_watchdog(SlowToDecode::QUEUE).await;
    run.decode_ends(2850).await;
    let (q, id) = (SlowToDecode::QUEUE, run.id.as_str());
    let first_lease = run.claimed_ms as f64 + 6000.0;
    let seen = Arc::new(Mutex::new(None));
    wait_until(BOUND, "the lease extended or the job reclaimed", || async {
        let d = run.env.delivery_of(q, id).await;
        let moved = d
            .as_ref()
            .is_none_or(|(t, l)| *t != run.token || *l > first_lease);
        *seen.lock().unwrap() = Some(d);
        moved
    })
    .await;
    let seen = seen.lock().unwrap().take().flatten();
    assert!(
        matches!(&seen, Some((t, l)) if *t == run.token && *l > first_lease),
        "the first delivery's lease was not extended: {seen:?}"
    );
    open_gate(format!("{}/run", run.key));
    run.env.wait_completed(q, 1).await;
    let reclaimed = watchdog.stop().await.reclaimed;
    let (starts, attempts) = run.stop().await;
    assert_eq!(starts, [1], "one start, no second delivery");
    assert_eq!((attempts, reclaimed), (1, 0));
}

/// A delivery decoded after the trusted part of its lease (its decode held
/// until 1.85 s after the claim on a 2 s lease), whose lease is still its
/// own in Redis (no watchdog runs): one extend keeps it and the handler
/// runs, once, before the worker's graceful stop ends. Before, the handler
/// was skipped, the claim's attempt spent: the job waited for the
/// watchdog, which with one attempt dead-lettered a job that never ran.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_late_start_whose_lease_is_still_its_own_runs() {
    let cfg = WorkerConfig {
        lease: Duration::from_secs(2),
        ..fast_config()
    };
    let run = SlowRun::start("late-but-kept", false, cfg).await;
    run.decode_ends(1850).await;
    let (starts, attempts) = run.stop().await;
    assert_eq!((starts, attempts), (vec![1], 1));
}

/// A delivery decoded only after the watchdog returned its job, which a
/// second delivery then ran: its one extend finds another token, so its
/// handler is not started and the job ran once, on delivery 2. Before,
/// the first delivery's handler started anyway.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_delivery_whose_lease_ran_out_before_its_start_is_not_run() {
    let cfg = WorkerConfig {
        lease: Duration::from_secs(1),
        ..fast_config()
    };
    let run = SlowRun::start("lost-before-start", false, cfg).await;
    let q = SlowToDecode::QUEUE;
    let reclaimed = run.env.reclaim(q, 1).await.reclaimed;
    run.env.wait_completed(q, 1).await;
    open_gate(format!("{}/decode", run.key));
    let (starts, attempts) = run.stop().await;
    assert_eq!(starts, [2], "only the second delivery started");
    assert_eq!((attempts, reclaimed), (2, 1));
}

/// A watchdog is refused a queue name an enqueue refuses (a trailing space,
/// braces): it would watch keys no enqueue creates, so the jobs of dead
/// workers on the queue meant were never returned. Before, `connect`
/// accepted any name.
#[tokio::test]
async fn a_watchdog_for_a_queue_name_enqueues_refuse_is_refused() {
    let env = TestEnv::start().await;
    for bad in ["tasks ", "{tasks}"] {
        let err = queue_core::Watchdog::connect(&env.url, ["tasks", bad], fast_watchdog())
            .await
            .unwrap_err();
        assert!(
            matches!(&err, QueueError::InvalidQueueName { .. }),
            "{bad:?}: {err}"
        );
        assert_eq!(err.queue(), Some(bad));
    }
}

/// A watchdog configured to scan no processing entries for orphans is
/// refused: `reclaim.lua` would fail every pass of every queue after its
/// moves (`LRANGE processing -0 -1`), so no orphan was ever adopted and the
/// promotion and dead-letter trim of each queue never ran. Before, `connect`
/// accepted it.
#[tokio::test]
async fn a_watchdog_with_an_orphan_scan_of_zero_is_refused() {
    let env = TestEnv::start().await;
    let config = queue_core::WatchdogConfig {
        orphan_scan: 0,
        ..fast_watchdog()
    };
    let err = queue_core::Watchdog::connect(&env.url, ["tasks"], config)
        .await
        .unwrap_err();
    assert!(
        matches!(&err, QueueError::Config(m) if m.contains("orphan_scan")),
        "{err}"
    );
}
