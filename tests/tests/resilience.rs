//! Redis outages and graceful shutdown.

use std::time::{Duration, Instant};

use queue_core::{Queue, QueueError, Watchdog};
use queue_testkit::RedisServer;
use queue_tests::{
    fast_config, fast_watchdog, init_tracing, spawn_worker, task, wait_until, Ledger, Task,
    WorkerProcess,
};

const T: Duration = Duration::from_secs(30);
const WORKER_BIN: &str = env!("CARGO_BIN_EXE_test-worker");

#[tokio::test]
async fn enqueue_while_redis_is_down_returns_an_error() {
    init_tracing();
    let mut server = RedisServer::start().unwrap();
    let url = server.url();
    let queue = Queue::connect(&url).await.unwrap();
    task::enqueue(
        &queue,
        Task {
            ledger: url.clone(),
            ..Task::default()
        },
    )
    .await
    .unwrap();

    server.kill();
    let started = Instant::now();
    let err = task::enqueue(
        &queue,
        Task {
            ledger: url.clone(),
            ..Task::default()
        },
    )
    .await
    .expect_err("enqueue must fail while Redis is down");
    assert!(matches!(err, QueueError::Redis { .. }), "{err}");
    assert_eq!(err.queue(), Some("tasks"));
    assert!(err.job_id().is_some(), "the error names the job id");
    assert!(
        started.elapsed() < Duration::from_secs(15),
        "fails promptly, took {:?}",
        started.elapsed()
    );

    // Connecting anew while down fails too.
    assert!(matches!(
        Queue::connect(&url).await.unwrap_err(),
        QueueError::Connect { .. }
    ));

    // After a restart the same handle works again (it reconnects).
    server.restart().unwrap();
    wait_until(T, "enqueue succeeds after restart", || async {
        task::enqueue(
            &queue,
            Task {
                ledger: url.clone(),
                ..Task::default()
            },
        )
        .await
        .is_ok()
    })
    .await;
}

#[tokio::test]
async fn graceful_shutdown_finishes_in_flight_jobs_and_loses_nothing() {
    init_tracing();
    let server = RedisServer::start().unwrap();
    let url = server.url();
    let queue = Queue::connect(&url).await.unwrap();
    for seq in 0..10 {
        task::enqueue(
            &queue,
            Task {
                ledger: url.clone(),
                seq,
                sleep_ms: 400,
                ..Task::default()
            },
        )
        .await
        .unwrap();
    }
    let mut cfg = fast_config();
    cfg.concurrency = 2;
    let (stop, join) = spawn_worker(&url, cfg).await;
    wait_until(T, "two jobs running", || async {
        Ledger::read(&url).await.started.len() >= 2
    })
    .await;
    stop.shutdown();
    join.await.unwrap().unwrap();

    let ledger = Ledger::read(&url).await;
    let s = queue.stats("tasks").await.unwrap();
    assert_eq!(s.processing, 0, "nothing left in flight");
    assert_eq!(
        ledger.started.len(),
        ledger.effects.len(),
        "every started job finished"
    );
    assert_eq!(
        s.main as i64 + s.counter("completed"),
        10,
        "the rest wait in main"
    );
}

#[tokio::test]
async fn jobs_running_past_the_grace_period_stay_leased_and_are_returned() {
    init_tracing();
    let server = RedisServer::start().unwrap();
    let url = server.url();
    let queue = Queue::connect(&url).await.unwrap();
    let id = task::enqueue(
        &queue,
        Task {
            ledger: url.clone(),
            sleep_ms: 5_000,
            sleep_attempts: 1,
            ..Task::default()
        },
    )
    .await
    .unwrap();
    let mut cfg = fast_config();
    cfg.grace = Duration::from_millis(200);
    cfg.lease = Duration::from_millis(800);
    let (stop, join) = spawn_worker(&url, cfg).await;
    wait_until(T, "job running", || async {
        Ledger::read(&url).await.started.len() == 1
    })
    .await;
    let t0 = Instant::now();
    stop.shutdown();
    join.await.unwrap().unwrap();
    assert!(
        t0.elapsed() < Duration::from_secs(3),
        "shutdown honours the grace period"
    );
    assert_eq!(
        queue.stats("tasks").await.unwrap().processing,
        1,
        "left leased"
    );

    let watchdog = Watchdog::connect(&url, ["tasks"], fast_watchdog())
        .await
        .unwrap();
    wait_until(T, "reclaim", || async {
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
    assert_eq!(Ledger::read(&url).await.effects.get(id.as_str()), Some(&1));
}

#[tokio::test]
async fn sigterm_to_a_worker_process_loses_nothing() {
    init_tracing();
    let server = RedisServer::start().unwrap();
    let url = server.url();
    let queue = Queue::connect(&url).await.unwrap();
    for seq in 0..6 {
        task::enqueue(
            &queue,
            Task {
                ledger: url.clone(),
                seq,
                sleep_ms: 500,
                ..Task::default()
            },
        )
        .await
        .unwrap();
    }
    let mut proc = WorkerProcess::start(WORKER_BIN, &url, 2, 2000, 5000);
    wait_until(T, "jobs running", || async {
        !Ledger::read(&url).await.started.is_empty()
    })
    .await;
    proc.signal("TERM");
    let status = proc.child.wait().unwrap();
    assert!(
        status.success(),
        "worker exits cleanly on SIGTERM: {status}"
    );
    let s = queue.stats("tasks").await.unwrap();
    assert_eq!(s.processing, 0);
    let ledger = Ledger::read(&url).await;
    assert_eq!(
        ledger.started.len(),
        ledger.effects.len(),
        "in-flight jobs finished before exit"
    );

    let (stop, join) = spawn_worker(&url, fast_config()).await;
    wait_until(T, "all six done", || async {
        queue.stats("tasks").await.unwrap().counter("completed") == 6
    })
    .await;
    stop.shutdown();
    join.await.unwrap().unwrap();
    let ledger = Ledger::read(&url).await;
    assert_eq!(ledger.effects.len(), 6);
    assert!(ledger.duplicates().is_empty());
}

#[tokio::test]
async fn shutdown_requested_before_run_is_not_lost() {
    init_tracing();
    let server = RedisServer::start().unwrap();
    let worker = queue_core::Worker::builder(&server.url())
        .register(task::handler())
        .config(fast_config())
        .build()
        .await
        .unwrap();
    worker.shutdown_handle().shutdown();
    tokio::time::timeout(
        Duration::from_secs(10),
        worker.run_until(std::future::pending()),
    )
    .await
    .expect("run returns promptly after an earlier shutdown request")
    .unwrap();
}
