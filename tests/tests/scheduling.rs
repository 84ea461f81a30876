//! Scheduled (delayed / run-at) and periodic (cron) jobs, queue priorities
//! and per-queue concurrency limits.

use std::collections::HashMap;
use std::time::{Duration, SystemTime};

use queue_core::{EnqueueOptions, Queue, QueueError, Worker};
use queue_testkit::RedisServer;
use queue_tests::{
    fast_config, init_tracing, redis_conn, routine, task, tick, urgent, wait_until, Task,
    TICK_LEDGER,
};
use redis::AsyncCommands;

const T: Duration = Duration::from_secs(20);

#[tokio::test]
async fn periodic_job_fires_once_per_period_across_workers() {
    init_tracing();
    let server = RedisServer::start().unwrap();
    let url = server.url();
    TICK_LEDGER.set(url.clone()).unwrap();
    let mut workers = Vec::new();
    for _ in 0..3 {
        let w = Worker::builder(&url)
            .register(tick::handler())
            .config(fast_config())
            .build()
            .await
            .unwrap();
        let stop = w.shutdown_handle();
        workers.push((stop, tokio::spawn(w.run_until(std::future::pending()))));
    }
    tokio::time::sleep(Duration::from_millis(3500)).await;
    for (stop, _) in &workers {
        stop.shutdown();
    }
    for (_, join) in workers {
        join.await.unwrap().unwrap();
    }
    let ticks: HashMap<String, u64> = redis_conn(&url)
        .await
        .hgetall("ledger:ticks")
        .await
        .unwrap();
    assert!(ticks.len() >= 2, "fired every second: {ticks:?}");
    for (id, runs) in &ticks {
        assert!(id.starts_with("cron:tick:"), "{id}");
        assert_eq!(*runs, 1, "firing {id} ran {runs} times across 3 workers");
    }
    let queue = Queue::connect(&url).await.unwrap();
    assert_eq!(
        queue.stats("cron").await.unwrap().counter("enqueued") as usize,
        ticks.len()
    );
}

#[tokio::test]
async fn invalid_cron_expression_is_a_build_error() {
    init_tracing();
    let server = RedisServer::start().unwrap();
    let reg = queue_core::Registration::periodic::<tick::Job>("61 * * * * *");
    let err = Worker::builder(&server.url())
        .register(reg)
        .build()
        .await
        .unwrap_err();
    assert!(
        matches!(err, QueueError::Config(ref m) if m.contains("invalid cron expression")),
        "{err}"
    );
}

#[tokio::test]
async fn run_at_schedules_by_the_redis_clock() {
    init_tracing();
    let server = RedisServer::start().unwrap();
    let url = server.url();
    let queue = Queue::connect(&url).await.unwrap();
    let at = SystemTime::now() + Duration::from_millis(800);
    let t = Task {
        ledger: url.clone(),
        ..Task::default()
    };
    let id = task::enqueue_with(&queue, EnqueueOptions::new().run_at(at), t.clone())
        .await
        .unwrap()
        .id;
    let job = queue.job("tasks", &id).await.unwrap().unwrap();
    assert_eq!(job.state(), Some("delayed"));
    let run_at: u64 = job.field("run_at").unwrap().parse().unwrap();
    let want = at
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    assert!(run_at.abs_diff(want) < 50, "run_at {run_at} vs {want}");
    // A time in the past runs now.
    let past = SystemTime::now() - Duration::from_secs(3600);
    task::enqueue_with(&queue, EnqueueOptions::new().run_at(past), t)
        .await
        .unwrap();
    assert_eq!(queue.stats("tasks").await.unwrap().main, 1);
}

#[tokio::test]
async fn higher_priority_queue_is_served_first() {
    init_tracing();
    let server = RedisServer::start().unwrap();
    let url = server.url();
    let queue = Queue::connect(&url).await.unwrap();
    for seq in 0..5 {
        routine::enqueue(
            &queue,
            Task {
                ledger: url.clone(),
                seq,
                ..Task::default()
            },
        )
        .await
        .unwrap();
    }
    for seq in 0..5 {
        urgent::enqueue(
            &queue,
            Task {
                ledger: url.clone(),
                seq,
                ..Task::default()
            },
        )
        .await
        .unwrap();
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
    wait_until(T, "all ten ran", || async {
        redis_conn(&url)
            .await
            .llen::<_, usize>("ledger:prio")
            .await
            .unwrap()
            == 10
    })
    .await;
    stop.shutdown();
    join.await.unwrap().unwrap();
    let order: Vec<String> = redis_conn(&url)
        .await
        .lrange("ledger:prio", 0, -1)
        .await
        .unwrap();
    let first_low = order.iter().position(|s| s.starts_with("low")).unwrap();
    assert_eq!(first_low, 5, "all high-priority jobs first: {order:?}");
}

#[tokio::test]
async fn per_queue_concurrency_limit_holds() {
    init_tracing();
    let server = RedisServer::start().unwrap();
    let url = server.url();
    let queue = Queue::connect(&url).await.unwrap();
    for seq in 0..12 {
        let t = Task {
            ledger: url.clone(),
            seq,
            sleep_ms: 150,
            probe_concurrency: true,
            ..Task::default()
        };
        task::enqueue(&queue, t).await.unwrap();
    }
    let mut cfg = fast_config();
    cfg.concurrency = 8;
    let worker = Worker::builder(&url)
        .register(task::handler())
        .queue_concurrency("tasks", 2)
        .config(cfg)
        .build()
        .await
        .unwrap();
    let stop = worker.shutdown_handle();
    let join = tokio::spawn(worker.run_until(std::future::pending()));
    wait_until(T, "12 done", || async {
        queue.stats("tasks").await.unwrap().counter("completed") == 12
    })
    .await;
    stop.shutdown();
    join.await.unwrap().unwrap();
    let max: u64 = redis_conn(&url)
        .await
        .get("ledger:max_running")
        .await
        .unwrap();
    assert_eq!(
        max, 2,
        "never more than the queue's limit, and the limit was used"
    );
}
