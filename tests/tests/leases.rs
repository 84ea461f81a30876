//! Leases, heartbeats and the watchdog, with worker processes killed by SIGKILL.

use std::sync::Mutex;
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
    let (id, worker) = slow_job_heartbeating(&env, 1500, 300).await;
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

    // Force the first delivery's lease to expire and let the watchdog reclaim it,
    // as if the worker had stalled. (Retry: a heartbeat may slip in between.)
    let watchdog = env.watchdog("tasks").await;
    wait_until(BOUND, "reclaim of the first delivery", || async {
        env.set_lease("tasks", id.as_str(), 0).await;
        watchdog.run_once().await.unwrap().reclaimed == 1
    })
    .await;
    let job = env.queue.job("tasks", &id).await.unwrap().unwrap();
    assert_eq!(job.state(), Some("delayed"));
    assert!(job.field("token").is_none(), "the stale token was revoked");

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

/// Arguments whose decode blocks for `decode_ms` (a large payload), on the
/// first decode of `key` only or on every one: the handler starts that long
/// after its claim.
#[derive(serde::Serialize, serde::Deserialize)]
#[serde(from = "SlowWire")]
struct SlowArgs {
    key: String,
    decode_ms: u64,
    every_time: bool,
    run_ms: u64,
}

#[derive(serde::Deserialize)]
struct SlowWire {
    key: String,
    decode_ms: u64,
    every_time: bool,
    run_ms: u64,
}

impl From<SlowWire> for SlowArgs {
    fn from(w: SlowWire) -> Self {
        let first = {
            let mut seen = SLOW_DECODED.lock().unwrap();
            let first = !seen.contains(&w.key);
            seen.push(w.key.clone());
            first
        };
        if first || w.every_time {
            std::thread::sleep(Duration::from_millis(w.decode_ms));
        }
        SlowArgs {
            key: w.key,
            decode_ms: w.decode_ms,
            every_time: w.every_time,
            run_ms: w.run_ms,
        }
    }
}

/// Records its start, then runs `run_ms`. Two attempts at most.
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
            tokio::time::sleep(Duration::from_millis(args.run_ms)).await;
            Ok(())
        })
    }
}

/// Runs `args` on a worker with `cfg` and a watchdog until it completed or
/// was dead-lettered; the attempts of its handler's starts, its completion's
/// attempt and the watchdog's reclaims.
async fn run_slow_to_decode(args: SlowArgs, cfg: WorkerConfig) -> (Vec<u32>, u32, u64) {
    let env = TestEnv::start().await;
    let key = args.key.clone();
    let id = env.queue.enqueue::<SlowToDecode>(&args).await.unwrap();
    let worker = env
        .spawn_worker_for(Registration::of::<SlowToDecode>(), cfg)
        .await;
    let watchdog = env.spawn_watchdog(SlowToDecode::QUEUE).await;
    env.wait_stats(SlowToDecode::QUEUE, "completed or dead", |s| {
        s.counter("completed") + s.dead as i64 >= 1
    })
    .await;
    let report = watchdog.stop().await;
    worker.stop().await;
    let starts = SLOW_STARTS.lock().unwrap().clone();
    let starts = starts
        .into_iter()
        .filter(|(k, _)| *k == key)
        .map(|(_, a)| a);
    let attempts = match env.stats(SlowToDecode::QUEUE).await.dead {
        0 => env.completion_attempts(SlowToDecode::QUEUE, &id).await,
        _ => 0,
    };
    (starts.collect(), attempts, report.reclaimed)
}

/// A handler that starts 1.1 s after its claim (a slow decode), on a 2 s
/// lease with a beat every 850 ms: the first beat is due 850 ms after the
/// claim, so it goes out as the handler starts, and the 3 s job runs once.
/// Timed from the handler's start (1.95 s after the claim, past the 1.8 s
/// deadline) the beat was never sent: every delivery was reclaimed while it
/// ran, and a second one ran at the same time.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_late_start_still_heartbeats_from_the_claim() {
    let args = SlowArgs {
        key: "late-start".into(),
        decode_ms: 1100,
        every_time: true,
        run_ms: 3000,
    };
    let cfg = lease_config(Duration::from_secs(2), Some(Duration::from_millis(850)));
    let (starts, attempts, reclaimed) = run_slow_to_decode(args, cfg).await;
    assert_eq!(starts, [1], "one start, no second delivery");
    assert_eq!((attempts, reclaimed), (1, 0));
}

/// A delivery whose decode outlasted the trusted part of its lease (1.3 s
/// of 1 s) may already be another worker's: its handler is not started,
/// the watchdog returns the job, and only the second delivery runs it.
/// Before, the first delivery's handler started anyway.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_delivery_whose_lease_ran_out_before_its_start_is_not_run() {
    let args = SlowArgs {
        key: "lost-before-start".into(),
        decode_ms: 1300,
        every_time: false,
        run_ms: 0,
    };
    let cfg = WorkerConfig {
        lease: Duration::from_secs(1),
        ..fast_config()
    };
    let (starts, attempts, reclaimed) = run_slow_to_decode(args, cfg).await;
    assert_eq!(starts, [2], "only the second delivery started");
    assert_eq!((attempts, reclaimed), (2, 1));
}
