//! Redis outages and graceful shutdown.

use std::time::{Duration, Instant};

use queue_core::{Queue, QueueError, QueueKeys};
use queue_tests::{fast_config, task, wait_until, Task, TestEnv, WorkerProcess, BOUND};

const WORKER_BIN: &str = env!("CARGO_BIN_EXE_test-worker");

#[tokio::test]
async fn enqueue_while_redis_is_down_returns_an_error() {
    let mut env = TestEnv::start().await;
    let (queue, url) = (env.queue.clone(), env.url.clone());
    env.enqueue(env.task(0)).await;

    env.server.kill();
    let started = Instant::now();
    let err = task::enqueue(&queue, env.task(0))
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
    env.server.restart().unwrap();
    wait_until(BOUND, "enqueue succeeds after restart", || async {
        task::enqueue(&queue, env.task(0)).await.is_ok()
    })
    .await;
}

#[tokio::test]
async fn graceful_shutdown_finishes_in_flight_jobs_and_loses_nothing() {
    let env = TestEnv::start().await;
    env.enqueue_tasks(10, |t| Task { sleep_ms: 400, ..t }).await;
    let mut cfg = fast_config();
    cfg.concurrency = 2;
    let worker = env.spawn_worker(cfg).await;
    env.wait_ledger("two jobs running", |l| l.started.len() >= 2)
        .await;
    worker.stop().await;

    let ledger = env.ledger().await;
    let s = env.stats("tasks").await;
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
    past_the_grace_period(fast_config().concurrency).await;
}

/// A worker that runs one job at a time runs it in its fetcher's task
/// (worker/fetcher.rs): its shutdown still ends at the grace period.
#[tokio::test]
async fn a_one_at_a_time_worker_also_stops_at_the_grace_period() {
    past_the_grace_period(1).await;
}

/// A job still running when the grace period ends is left leased, and
/// shutdown does not wait for it; the watchdog returns it.
async fn past_the_grace_period(concurrency: usize) {
    let env = TestEnv::start().await;
    // A first run far longer than the bound below: a shutdown that waited
    // for it could not pass.
    let id = env
        .enqueue(Task {
            sleep_ms: 60_000,
            sleep_attempts: 1,
            ..env.task(0)
        })
        .await;
    let mut cfg = fast_config();
    cfg.concurrency = concurrency;
    cfg.grace = Duration::from_millis(200);
    cfg.lease = Duration::from_millis(800);
    let worker = env.spawn_worker(cfg).await;
    env.wait_ledger("job running", |l| l.started.len() == 1)
        .await;
    let t0 = Instant::now();
    worker.stop().await;
    // The bound is the property (the shutdown does not wait for the job):
    // the grace (200 ms) and a block timeout, with 15 s for stalls of a
    // loaded 2-core machine, far under the 60 s job.
    assert!(
        t0.elapsed() < Duration::from_secs(15),
        "shutdown honours the grace period, took {:?}",
        t0.elapsed()
    );
    assert_eq!(env.stats("tasks").await.processing, 1, "left leased");

    env.reclaim("tasks", 1).await;
    env.run_until_completed("tasks", 1).await;
    assert_eq!(env.ledger().await.effects.get(id.as_str()), Some(&1));
}

#[tokio::test]
async fn sigterm_to_a_worker_process_loses_nothing() {
    let env = TestEnv::start().await;
    env.enqueue_tasks(6, |t| Task { sleep_ms: 500, ..t }).await;
    let mut proc = WorkerProcess::start(WORKER_BIN, &env.url, 2, 2000, 5000);
    env.wait_ledger("jobs running", |l| !l.started.is_empty())
        .await;
    proc.signal("TERM");
    let status = proc.child.wait().unwrap();
    assert!(
        status.success(),
        "worker exits cleanly on SIGTERM: {status}"
    );
    assert_eq!(env.stats("tasks").await.processing, 0);
    let ledger = env.ledger().await;
    assert_eq!(
        ledger.started.len(),
        ledger.effects.len(),
        "in-flight jobs finished before exit"
    );

    env.run_until_completed("tasks", 6).await;
    let ledger = env.ledger().await;
    assert_eq!(ledger.effects.len(), 6);
    assert!(ledger.duplicates().is_empty());
}

#[tokio::test]
async fn shutdown_requested_before_run_is_not_lost() {
    let env = TestEnv::start().await;
    let worker = env.worker("tasks", fast_config()).build().await.unwrap();
    worker.shutdown_handle().shutdown();
    tokio::time::timeout(
        Duration::from_secs(10),
        worker.run_until(std::future::pending()),
    )
    .await
    .expect("run returns promptly after an earlier shutdown request")
    .unwrap();
}

/// DESIGN rule 10, stop fetching: a job Redis hands to a fetcher blocked in
/// `BLMOVE` after the shutdown request goes back to the head of main
/// unclaimed (no attempt, no lease) instead of being claimed and then left
/// leased by the stopping worker (grace 0: a hard stop at once), which with
/// `max_attempts = 1` dead-lettered it as "attempts exhausted" unrun. The
/// next worker runs it once.
#[tokio::test]
async fn a_job_handed_over_after_the_shutdown_request_goes_back_unclaimed() {
    let env = TestEnv::start().await;
    let mut cfg = fast_config();
    cfg.grace = Duration::ZERO;
    cfg.block_timeout = Duration::from_secs(2);
    let worker = env.spawn_worker(cfg).await;
    env.wait_blocked_client(None).await;
    worker.shutdown();
    let id = env.enqueue(env.task(0)).await;
    worker.join().await;

    let job = env.queue.job("tasks", &id).await.unwrap().expect("kept");
    assert_eq!(
        (job.state(), job.field("attempts")),
        (Some("queued"), Some("0")),
        "no attempt used"
    );
    assert_eq!(env.lease_of("tasks", id.as_str()).await, None, "no lease");
    let main = env.list(&QueueKeys::new("tasks").main).await;
    assert_eq!(main, vec![id.to_string()], "waiting in main");

    env.run_until_completed("tasks", 1).await;
    assert_eq!(env.ledger().await.started.get(id.as_str()), Some(&1));
}
