//! Leases, heartbeats and the watchdog, with worker processes killed by SIGKILL.

use std::time::Duration;

use queue_core::{Queue, Watchdog};
use queue_testkit::RedisServer;
use queue_tests::{
    fast_config, fast_watchdog, init_tracing, redis_conn, spawn_worker, task, wait_until, Ledger,
    Task, WorkerProcess,
};
use redis::AsyncCommands;

const T: Duration = Duration::from_secs(30);
const WORKER_BIN: &str = env!("CARGO_BIN_EXE_test-worker");

async fn setup() -> (RedisServer, String, Queue) {
    init_tracing();
    let server = RedisServer::start().expect("redis-server starts");
    let url = server.url();
    let queue = Queue::connect(&url).await.expect("connect");
    (server, url, queue)
}

async fn started(url: &str, n: usize) -> bool {
    Ledger::read(url).await.started.len() >= n
}

#[tokio::test]
async fn heartbeat_keeps_a_slow_job_from_being_reclaimed() {
    let (_server, url, queue) = setup().await;
    let id = task::enqueue(
        &queue,
        Task {
            ledger: url.clone(),
            sleep_ms: 1500,
            ..Task::default()
        },
    )
    .await
    .unwrap();
    let mut cfg = fast_config();
    cfg.lease = Duration::from_millis(300);
    cfg.heartbeat = Some(Duration::from_millis(100));
    let (stop, join) = spawn_worker(&url, cfg).await;
    let watchdog = Watchdog::connect(&url, ["tasks"], fast_watchdog())
        .await
        .unwrap();
    let (wd_stop_tx, wd_stop_rx) = tokio::sync::oneshot::channel::<()>();
    let wd = tokio::spawn(async move {
        watchdog
            .run_until(async {
                let _ = wd_stop_rx.await;
            })
            .await
    });

    wait_until(T, "completion", || async {
        queue.stats("tasks").await.unwrap().counter("completed") == 1
    })
    .await;
    let _ = wd_stop_tx.send(());
    let report = wd.await.unwrap();
    stop.shutdown();
    join.await.unwrap().unwrap();
    assert_eq!(report.reclaimed, 0, "a heartbeating job is never reclaimed");
    let ledger = Ledger::read(&url).await;
    assert_eq!(ledger.started.get(id.as_str()), Some(&1));
    assert_eq!(ledger.effects.get(id.as_str()), Some(&1));
}

#[tokio::test]
async fn stale_worker_cannot_ack_after_its_lease_was_reclaimed() {
    let (_server, url, queue) = setup().await;
    let id = task::enqueue(
        &queue,
        Task {
            ledger: url.clone(),
            sleep_ms: 1200,
            ..Task::default()
        },
    )
    .await
    .unwrap();
    let mut cfg = fast_config();
    cfg.lease = Duration::from_millis(600);
    cfg.heartbeat = Some(Duration::from_millis(100));
    let (stop, join) = spawn_worker(&url, cfg).await;
    wait_until(T, "first start", || started(&url, 1)).await;

    // Force the first delivery's lease to expire and let the watchdog reclaim it,
    // as if the worker had stalled. (Retry: a heartbeat may slip in between.)
    let watchdog = Watchdog::connect(&url, ["tasks"], fast_watchdog())
        .await
        .unwrap();
    let mut conn = redis_conn(&url).await;
    wait_until(T, "reclaim of the first delivery", || {
        let (watchdog, mut conn, id) = (&watchdog, conn.clone(), id.clone());
        async move {
            let _: () = conn.zadd("q:{tasks}:leases", id.as_str(), 0).await.unwrap();
            watchdog.run_once().await.unwrap().reclaimed == 1
        }
    })
    .await;
    let job = queue.job("tasks", &id).await.unwrap().unwrap();
    assert_eq!(job.state(), Some("delayed"));
    assert!(job.field("token").is_none(), "the stale token was revoked");

    // The stale delivery finishes (lease lost) and is redelivered; the second
    // delivery acks. Only one completion is recorded, by attempt 2.
    wait_until(T, "completion by the second delivery", || async {
        queue.stats("tasks").await.unwrap().counter("completed") == 1
    })
    .await;
    stop.shutdown();
    join.await.unwrap().unwrap();
    let rec = queue.completion("tasks", &id).await.unwrap().unwrap();
    assert_eq!(rec.get("attempts").map(String::as_str), Some("2"));
    let lost: Vec<String> = conn.smembers("ledger:lease_lost").await.unwrap();
    assert_eq!(
        lost,
        vec![id.to_string()],
        "the first delivery saw ctx.lease_lost()"
    );
    let stats = queue.stats("tasks").await.unwrap();
    assert_eq!(stats.counter("completed"), 1);
    assert_eq!((stats.processing, stats.main, stats.delayed), (0, 0, 0));
}

#[tokio::test]
async fn watchdog_returns_a_sigkilled_workers_job_and_it_completes_once() {
    let (_server, url, queue) = setup().await;
    let id = task::enqueue(
        &queue,
        Task {
            ledger: url.clone(),
            sleep_ms: 60_000,
            sleep_attempts: 1,
            ..Task::default()
        },
    )
    .await
    .unwrap();
    let mut proc = WorkerProcess::start(WORKER_BIN, &url, 2, 800, 5000);
    wait_until(T, "the job starts in the worker process", || {
        started(&url, 1)
    })
    .await;
    proc.kill();
    let s = queue.stats("tasks").await.unwrap();
    assert_eq!(
        s.processing, 1,
        "the dead worker's job is still in processing"
    );

    let watchdog = Watchdog::connect(&url, ["tasks"], fast_watchdog())
        .await
        .unwrap();
    wait_until(T, "reclaim after lease expiry", || async {
        watchdog.run_once().await.unwrap().reclaimed == 1
    })
    .await;
    let (stop, join) = spawn_worker(&url, fast_config()).await;
    wait_until(T, "completion", || async {
        queue.stats("tasks").await.unwrap().counter("completed") == 1
    })
    .await;
    stop.shutdown();
    join.await.unwrap().unwrap();
    let ledger = Ledger::read(&url).await;
    assert_eq!(ledger.started.get(id.as_str()), Some(&2));
    assert_eq!(
        ledger.effects.get(id.as_str()),
        Some(&1),
        "side effect exactly once"
    );
    assert_eq!(queue.stats("tasks").await.unwrap().counter("reclaimed"), 1);
}

#[tokio::test]
async fn id_left_between_blmove_and_claim_is_recovered() {
    let (_server, url, queue) = setup().await;
    let id = task::enqueue(
        &queue,
        Task {
            ledger: url.clone(),
            ..Task::default()
        },
    )
    .await
    .unwrap();
    // A worker did BLMOVE main -> processing and died before its claim.
    let mut conn = redis_conn(&url).await;
    let moved: String = redis::cmd("LMOVE")
        .arg("q:{tasks}:main")
        .arg("q:{tasks}:processing")
        .arg("RIGHT")
        .arg("LEFT")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(moved, id.as_str());

    let watchdog = Watchdog::connect(&url, ["tasks"], fast_watchdog())
        .await
        .unwrap();
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
    wait_until(T, "reclaim after the orphan grace", || async {
        watchdog.run_once().await.unwrap().reclaimed == 1
    })
    .await;
    let job = queue.job("tasks", &id).await.unwrap().unwrap();
    assert_eq!(job.attempts(), 0, "it never ran, so no attempt was used");

    let (stop, join) = spawn_worker(&url, fast_config()).await;
    wait_until(T, "completion", || async {
        queue.stats("tasks").await.unwrap().counter("completed") == 1
    })
    .await;
    stop.shutdown();
    join.await.unwrap().unwrap();
    assert_eq!(Ledger::read(&url).await.effects.get(id.as_str()), Some(&1));
}

#[tokio::test]
async fn concurrent_watchdogs_do_not_duplicate_jobs() {
    let (_server, url, queue) = setup().await;
    const N: u64 = 40;
    for seq in 0..N {
        let t = Task {
            ledger: url.clone(),
            seq,
            sleep_ms: 60_000,
            sleep_attempts: 1,
            ..Task::default()
        };
        task::enqueue(&queue, t).await.unwrap();
    }
    let mut proc = WorkerProcess::start(WORKER_BIN, &url, N as usize, 500, 5000);
    wait_until(T, "all jobs started", || started(&url, N as usize)).await;
    proc.kill();
    tokio::time::sleep(Duration::from_millis(600)).await; // leases expire

    let mut dogs = Vec::new();
    for _ in 0..3 {
        let mut cfg = fast_watchdog();
        cfg.batch = 3; // small batches so the three interleave
        dogs.push(Watchdog::connect(&url, ["tasks"], cfg).await.unwrap());
    }
    let reports = futures::future::join_all(dogs.iter().map(|d| d.run_once())).await;
    let reclaimed: u64 = reports.into_iter().map(|r| r.unwrap().reclaimed).sum();
    assert_eq!(
        reclaimed, N,
        "each expired job reclaimed exactly once across three watchdogs"
    );
    let s = queue.stats("tasks").await.unwrap();
    assert_eq!((s.processing, s.delayed + s.main), (0, N));

    let mut cfg = fast_config();
    cfg.concurrency = 16;
    let (stop, join) = spawn_worker(&url, cfg).await;
    wait_until(T, "all completions", || async {
        queue.stats("tasks").await.unwrap().counter("completed") == N as i64
    })
    .await;
    stop.shutdown();
    join.await.unwrap().unwrap();
    let ledger = Ledger::read(&url).await;
    assert_eq!(ledger.effects.len() as u64, N);
    assert!(
        ledger.duplicates().is_empty(),
        "no side effect twice: {:?}",
        ledger.duplicates()
    );
}
