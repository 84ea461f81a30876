//! Flow control across several worker processes (docs/FLOW-CONTROL.md):
//! pausing and resuming a queue, cancelling waiting, delayed, running and
//! finished jobs. Workers are `test-worker` processes (block timeout 200 ms).

use std::collections::HashMap;
use std::time::{Duration, Instant};

use queue_core::{
    CancelOutcome, EnqueueOptions, JobId, JobState, Queue, QueueKeys, Watchdog, WatchdogConfig,
    Worker,
};
use queue_testkit::RedisServer;
use queue_tests::{
    fast_config, init_tracing, redis_conn, routine, task, urgent, wait_until, Ledger, Task,
    WorkerProcess,
};
use redis::AsyncCommands;

const T: Duration = Duration::from_secs(60);
const WORKER_BIN: &str = env!("CARGO_BIN_EXE_test-worker");
const QUEUE: &str = "tasks";

struct Scenario {
    _server: RedisServer,
    url: String,
    queue: Queue,
    workers: Vec<WorkerProcess>,
}

impl Scenario {
    /// A fresh server and `processes` test-workers (concurrency 2, lease 900 ms:
    /// a heartbeat every 300 ms).
    async fn start(processes: usize) -> Scenario {
        init_tracing();
        let server = RedisServer::start().expect("redis-server starts");
        let url = server.url();
        let queue = Queue::connect(&url).await.expect("connect");
        let workers = (0..processes)
            .map(|_| WorkerProcess::start(WORKER_BIN, &url, 2, 900, 5000))
            .collect();
        Scenario {
            _server: server,
            url,
            queue,
            workers,
        }
    }

    fn task(&self) -> Task {
        Task {
            ledger: self.url.clone(),
            ..Task::default()
        }
    }

    async fn enqueue(&self, t: Task) -> JobId {
        task::enqueue(&self.queue, t).await.expect("enqueue")
    }

    async fn info(&self, section: &str) -> String {
        let mut c = redis_conn(&self.url).await;
        redis::cmd("INFO")
            .arg(section)
            .query_async(&mut c)
            .await
            .expect("INFO")
    }

    /// Fetchers blocked in BLMOVE (the promoters' BLPOP is not counted).
    async fn blocked_clients(&self) -> u64 {
        queue_tests::env::blocked_clients(&self.url).await.len() as u64
    }

    /// Calls of `command` since the last `CONFIG RESETSTAT` (commands run
    /// inside scripts are counted under their own names, not here).
    async fn calls_of(&self, command: &str) -> u64 {
        let stats = self.info("commandstats").await;
        stats
            .lines()
            .find_map(|l| l.strip_prefix(&format!("cmdstat_{command}:calls=")))
            .and_then(|v| v.split(',').next()?.parse().ok())
            .unwrap_or(0)
    }

    async fn reset_command_stats(&self) {
        let mut c = redis_conn(&self.url).await;
        let _: () = redis::cmd("CONFIG")
            .arg("RESETSTAT")
            .query_async(&mut c)
            .await
            .expect("CONFIG RESETSTAT");
    }

    async fn completion_status(&self, id: &JobId) -> Option<String> {
        let record = self
            .queue
            .completion(QUEUE, id.clone())
            .await
            .expect("read");
        record.and_then(|r| r.get("status").cloned())
    }

    async fn started(&self) -> HashMap<String, u64> {
        Ledger::read(&self.url).await.started
    }
}

/// The pause lands while every worker is blocked in BLMOVE: the jobs enqueued
/// afterwards wake a BLMOVE, but its claim puts them back unclaimed. For a
/// window no job starts, the enqueues are accepted, no attempt is used and
/// Redis is not polled in a loop; after resume every job runs exactly once,
/// on its first attempt.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pause_stops_blocked_workers_until_resume_then_every_job_runs_once() {
    let processes = 3;
    let s = Scenario::start(processes).await;
    // Each test-worker blocks on two queues (`tasks` and `billing`).
    wait_until(T, "every worker blocked in BLMOVE", || async {
        s.blocked_clients().await >= 2 * processes as u64
    })
    .await;
    let paused = s.queue.pause(QUEUE).await.unwrap();
    assert!(!paused.was_paused && paused.paused_since_ms.is_some());
    let again = s.queue.pause(QUEUE).await.unwrap();
    assert!(again.was_paused, "a second pause says it was paused");
    assert_eq!(again.paused_since_ms, paused.paused_since_ms);

    s.reset_command_stats().await;
    let window_start = Instant::now();
    let mut ids = Vec::new();
    for seq in 0..20 {
        ids.push(s.enqueue(Task { seq, ..s.task() }).await);
    }
    tokio::time::sleep(Duration::from_millis(2000)).await;
    let window = window_start.elapsed();
    // The workers' own round trips: scripts (functions of the library, or
    // EVALSHA) and BLMOVEs (minus our enqueues).
    let calls =
        s.calls_of("fcall").await + s.calls_of("evalsha").await + s.calls_of("blmove").await
            - ids.len() as u64;

    assert!(s.started().await.is_empty(), "no job starts while paused");
    let stats = s.queue.stats(QUEUE).await.unwrap();
    assert_eq!((stats.main, stats.processing), (20, 0), "{stats:?}");
    assert_eq!(stats.counter("enqueued"), 20, "enqueues are accepted");
    assert_eq!(stats.paused_since_ms, paused.paused_since_ms);
    for id in &ids {
        let job = s.queue.job(QUEUE, id.clone()).await.unwrap().expect("job");
        assert_eq!(job.attempts(), 0, "{id}: no attempt used while paused");
        assert_eq!(job.state(), Some("queued"));
    }
    // An idle worker makes about one call per queue per block timeout (200 ms;
    // test-worker serves two queues) plus its promoter (2 queues every 500 ms):
    // about 19 a second. Polling in a loop would be thousands.
    let per_process_per_s = calls as f64 / window.as_secs_f64() / processes as f64;
    println!("paused: {calls} script calls and BLMOVEs in {window:?} from {processes} workers ({per_process_per_s:.1}/s each)");
    assert!(
        per_process_per_s < 30.0,
        "paused workers poll Redis: {per_process_per_s:.1} commands/s per process"
    );

    let resumed = s.queue.resume(QUEUE).await.unwrap();
    assert!(resumed.was_paused);
    assert_eq!(s.queue.stats(QUEUE).await.unwrap().paused_since_ms, None);
    wait_until(T, "all 20 jobs complete", || async {
        s.queue.stats(QUEUE).await.unwrap().counter("completed") == 20
    })
    .await;
    let ledger = Ledger::read(&s.url).await;
    assert_eq!(ledger.total_effects(), 20);
    assert!(ledger.duplicates().is_empty(), "{:?}", ledger.duplicates());
    let mut c = redis_conn(&s.url).await;
    let attempts: HashMap<String, u32> = c.hgetall("ledger:attempt").await.unwrap();
    assert!(
        attempts.values().all(|a| *a == 1),
        "each job ran on its first attempt: {attempts:?}"
    );
    drop(s.workers);
}

/// While paused, the watchdog still returns the job of a worker that died;
/// the returned job does not start until resume, then completes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_watchdog_reclaims_while_paused() {
    let mut s = Scenario::start(1).await;
    let id = s
        .enqueue(Task {
            sleep_ms: 60_000,
            sleep_attempts: 1,
            ..s.task()
        })
        .await;
    wait_until(T, "the job starts", || async {
        !s.started().await.is_empty()
    })
    .await;
    s.queue.pause(QUEUE).await.unwrap();
    s.workers[0].kill();
    s.workers
        .push(WorkerProcess::start(WORKER_BIN, &s.url, 2, 900, 5000));
    let watchdog = Watchdog::connect(
        &s.url,
        [QUEUE],
        WatchdogConfig {
            backoff: queue_core::Backoff {
                base: Duration::from_millis(10),
                max: Duration::from_millis(20),
            },
            ..WatchdogConfig::default()
        },
    )
    .await
    .unwrap();
    wait_until(T, "the watchdog returns the job to main", || async {
        watchdog.run_once().await.unwrap();
        s.queue.stats(QUEUE).await.unwrap().main == 1
    })
    .await;
    let stats = s.queue.stats(QUEUE).await.unwrap();
    assert_eq!(stats.counter("reclaimed"), 1, "{stats:?}");
    tokio::time::sleep(Duration::from_millis(1000)).await;
    assert_eq!(
        s.started().await.get(id.as_str()),
        Some(&1),
        "the returned job does not start again while paused"
    );
    s.queue.resume(QUEUE).await.unwrap();
    wait_until(T, "the job completes after resume", || async {
        s.completion_status(&id).await.as_deref() == Some("done")
    })
    .await;
    assert_eq!(s.started().await.get(id.as_str()), Some(&2));
}

/// Cancel of a waiting, a delayed, a running, a finished, a dead and an
/// unknown job, with two worker processes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_waiting_delayed_running_and_finished_jobs() {
    let s = Scenario::start(2).await;
    cancel_waiting_and_delayed(&s).await;
    let running = cancel_running(&s).await;
    cancel_finished_dead_and_unknown(&s, running).await;
}

async fn cancel_waiting_and_delayed(s: &Scenario) {
    // Waiting and delayed: removed, with a completion record that says cancelled.
    s.queue.pause(QUEUE).await.unwrap();
    let waiting = s.enqueue(s.task()).await;
    let delayed = task::enqueue_with(
        &s.queue,
        EnqueueOptions::new().delay(Duration::from_secs(3600)),
        s.task(),
    )
    .await
    .unwrap()
    .id;
    assert_eq!(
        s.queue.cancel(QUEUE, waiting.clone()).await.unwrap(),
        CancelOutcome::Cancelled {
            from: JobState::Queued
        }
    );
    assert_eq!(
        s.queue.cancel(QUEUE, delayed.clone()).await.unwrap(),
        CancelOutcome::Cancelled {
            from: JobState::Delayed
        }
    );
    let stats = s.queue.stats(QUEUE).await.unwrap();
    assert_eq!((stats.main, stats.delayed), (0, 0), "{stats:?}");
    assert_eq!(stats.counter("cancelled"), 2);
    for id in [&waiting, &delayed] {
        assert_eq!(s.completion_status(id).await.as_deref(), Some("cancelled"));
        assert!(s.queue.job(QUEUE, id.clone()).await.unwrap().is_none());
    }
    s.queue.resume(QUEUE).await.unwrap();
}

/// Returns the id of the job that ended cancelled while running.
async fn cancel_running(s: &Scenario) -> JobId {
    let keys = QueueKeys::new(QUEUE);
    // Running: the handler sees the request at its next heartbeat, stops with
    // an error, and the job ends cancelled: never retried, not dead-lettered.
    let running = s
        .enqueue(Task {
            sleep_ms: 60_000,
            cooperative_cancel: true,
            ..s.task()
        })
        .await;
    wait_until(T, "the long job starts", || async {
        s.started().await.contains_key(running.as_str())
    })
    .await;
    assert_eq!(
        s.queue.cancel(QUEUE, running.clone()).await.unwrap(),
        CancelOutcome::Requested { first: true }
    );
    let again = s.queue.cancel(QUEUE, running.clone()).await.unwrap();
    assert!(
        matches!(
            again,
            CancelOutcome::Requested { first: false } | CancelOutcome::AlreadyFinished { .. }
        ),
        "{again:?}"
    );
    wait_until(T, "the running job ends cancelled", || async {
        s.completion_status(&running).await.as_deref() == Some("cancelled")
    })
    .await;
    let mut c = redis_conn(&s.url).await;
    let stopped: bool = c
        .sismember("ledger:cancelled", running.as_str())
        .await
        .unwrap();
    assert!(stopped, "the handler saw ctx.until_cancelled()");
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        s.started().await.get(running.as_str()),
        Some(&1),
        "never retried"
    );
    let stats = s.queue.stats(QUEUE).await.unwrap();
    assert_eq!(
        (stats.processing, stats.delayed, stats.dead),
        (0, 0, 0),
        "{stats:?}"
    );
    assert_eq!(stats.counter("retried"), 0);
    assert_eq!(stats.counter("cancelled"), 3);
    let leases: u64 = c.zcard(&keys.leases).await.unwrap();
    assert_eq!(leases, 0);
    running
}

async fn cancel_finished_dead_and_unknown(s: &Scenario, running: JobId) {
    // Finished, dead and unknown jobs say so.
    let quick = s.enqueue(s.task()).await;
    wait_until(T, "the quick job completes", || async {
        s.completion_status(&quick).await.is_some()
    })
    .await;
    assert_eq!(
        s.queue.cancel(QUEUE, quick).await.unwrap(),
        CancelOutcome::AlreadyFinished {
            status: "done".into()
        }
    );
    assert_eq!(
        s.queue.cancel(QUEUE, running).await.unwrap(),
        CancelOutcome::AlreadyFinished {
            status: "cancelled".into()
        }
    );
    let dead = s
        .enqueue(Task {
            permanent: true,
            ..s.task()
        })
        .await;
    wait_until(T, "the failing job is dead-lettered", || async {
        s.queue.stats(QUEUE).await.unwrap().dead == 1
    })
    .await;
    assert_eq!(
        s.queue.cancel(QUEUE, dead).await.unwrap(),
        CancelOutcome::Dead
    );
    assert_eq!(
        s.queue.cancel(QUEUE, "no-such-job").await.unwrap(),
        CancelOutcome::NotFound
    );
}

/// A paused higher-priority queue is skipped: the lower queue's jobs run
/// (its fetcher's priority check gets `paused` and moves on), the paused
/// queue's jobs wait unclaimed until resume.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_higher_priority_queue_is_skipped() {
    init_tracing();
    let server = RedisServer::start().expect("redis-server starts");
    let url = server.url();
    let queue = Queue::connect(&url).await.unwrap();
    queue.pause("high").await.unwrap();
    let task = |seq| Task {
        ledger: url.clone(),
        seq,
        ..Task::default()
    };
    for seq in 0..3 {
        urgent::enqueue(&queue, task(seq)).await.unwrap();
        routine::enqueue(&queue, task(seq)).await.unwrap();
    }
    let mut cfg = fast_config();
    cfg.concurrency = 1;
    let worker = Worker::builder(&url)
        .register(urgent::handler())
        .register(routine::handler())
        .queue_priority("high", 10)
        .config(cfg)
        .build()
        .await
        .unwrap();
    let stop = worker.shutdown_handle();
    let join = tokio::spawn(worker.run_until(std::future::pending()));
    let ran = || async {
        let order: Vec<String> = redis_conn(&url)
            .await
            .lrange("ledger:prio", 0, -1)
            .await
            .unwrap();
        order
    };
    wait_until(T, "the three low-priority jobs ran", || async {
        ran().await.len() >= 3
    })
    .await;
    tokio::time::sleep(Duration::from_millis(600)).await;
    let order = ran().await;
    assert!(
        order.iter().all(|s| s.starts_with("low")),
        "a paused queue's job ran: {order:?}"
    );
    let high = queue.stats("high").await.unwrap();
    assert_eq!((high.main, high.processing), (3, 0), "{high:?}");
    queue.resume("high").await.unwrap();
    wait_until(T, "the high-priority jobs run after resume", || async {
        ran().await.len() == 6
    })
    .await;
    stop.shutdown();
    join.await.unwrap().unwrap();
}
