//! Enqueue, fetch, ack, retries, dead-letter and FIFO order against a real redis-server.

use std::time::Duration;

use queue_core::{EnqueueOptions, EnqueueOutcome, Queue};
use queue_testkit::RedisServer;
use queue_tests::{fast_config, init_tracing, spawn_worker, task, wait_until, Ledger, Task};

const T: Duration = Duration::from_secs(20);

async fn setup() -> (RedisServer, String, Queue) {
    init_tracing();
    let server = RedisServer::start().expect("redis-server starts");
    let url = server.url();
    let queue = Queue::connect(&url).await.expect("connect");
    (server, url, queue)
}

#[tokio::test]
async fn enqueue_fetch_ack_completes_every_job_once() {
    let (_server, url, queue) = setup().await;
    let mut ids = Vec::new();
    for seq in 0..50 {
        let t = Task {
            ledger: url.clone(),
            seq,
            ..Task::default()
        };
        ids.push(task::enqueue(&queue, t).await.expect("enqueue"));
    }
    assert_eq!(queue.stats("tasks").await.unwrap().main, 50);
    let (stop, join) = spawn_worker(&url, fast_config()).await;
    wait_until(T, "50 completions", || async {
        queue.stats("tasks").await.unwrap().counter("completed") == 50
    })
    .await;
    stop.shutdown();
    join.await.unwrap().unwrap();

    let stats = queue.stats("tasks").await.unwrap();
    assert_eq!(
        (stats.main, stats.processing, stats.delayed, stats.dead),
        (0, 0, 0, 0)
    );
    let ledger = Ledger::read(&url).await;
    for id in &ids {
        assert_eq!(
            ledger.effects.get(id.as_str()),
            Some(&1),
            "job {id} ran once"
        );
        // The hash is dropped and a completion record written with the ack.
        assert!(queue.job("tasks", id).await.unwrap().is_none());
        let rec = queue
            .completion("tasks", id)
            .await
            .unwrap()
            .expect("completion record");
        assert_eq!(rec.get("status").map(String::as_str), Some("done"));
        assert_eq!(rec.get("attempts").map(String::as_str), Some("1"));
    }
}

#[tokio::test]
async fn fifo_order_within_a_queue() {
    let (_server, url, queue) = setup().await;
    for seq in 0..100 {
        let t = Task {
            ledger: url.clone(),
            seq,
            ..Task::default()
        };
        task::enqueue(&queue, t).await.unwrap();
    }
    let mut cfg = fast_config();
    cfg.concurrency = 1;
    let (stop, join) = spawn_worker(&url, cfg).await;
    wait_until(T, "100 completions", || async {
        queue.stats("tasks").await.unwrap().counter("completed") == 100
    })
    .await;
    stop.shutdown();
    join.await.unwrap().unwrap();
    let order = Ledger::read(&url).await.order;
    assert_eq!(
        order,
        (0..100).collect::<Vec<u64>>(),
        "started in enqueue order"
    );
}

#[tokio::test]
async fn stable_id_dedupes_while_queued_and_after_completion() {
    let (_server, url, queue) = setup().await;
    let t = Task {
        ledger: url.clone(),
        ..Task::default()
    };
    let first = task::enqueue_with_id(&queue, "invoice-4821-send", t.clone())
        .await
        .unwrap();
    assert_eq!(first.outcome, EnqueueOutcome::Created);
    let again = task::enqueue_with_id(&queue, "invoice-4821-send", t.clone())
        .await
        .unwrap();
    assert_eq!(
        again.outcome,
        EnqueueOutcome::Duplicate {
            state: "queued".into()
        }
    );
    assert_eq!(again.id, first.id);
    assert_eq!(queue.stats("tasks").await.unwrap().main, 1);

    let (stop, join) = spawn_worker(&url, fast_config()).await;
    wait_until(T, "completion", || async {
        queue.stats("tasks").await.unwrap().counter("completed") == 1
    })
    .await;
    stop.shutdown();
    join.await.unwrap().unwrap();
    let after = task::enqueue_with_id(&queue, "invoice-4821-send", t)
        .await
        .unwrap();
    assert_eq!(after.outcome, EnqueueOutcome::AlreadyCompleted);
    assert_eq!(queue.stats("tasks").await.unwrap().main, 0);
}

#[tokio::test]
async fn invalid_job_id_is_rejected_before_redis() {
    let (_server, url, queue) = setup().await;
    let t = Task {
        ledger: url.clone(),
        ..Task::default()
    };
    let err = task::enqueue_with_id(&queue, "", t).await.unwrap_err();
    assert!(
        matches!(err, queue_core::QueueError::InvalidJobId { .. }),
        "{err}"
    );
    assert_eq!(err.queue(), Some("tasks"));
}

#[tokio::test]
async fn retry_then_success() {
    let (_server, url, queue) = setup().await;
    let t = Task {
        ledger: url.clone(),
        fail_first: 2,
        ..Task::default()
    };
    let id = task::enqueue(&queue, t).await.unwrap();
    let (stop, join) = spawn_worker(&url, fast_config()).await;
    wait_until(T, "completion after two retries", || async {
        queue.stats("tasks").await.unwrap().counter("completed") == 1
    })
    .await;
    stop.shutdown();
    join.await.unwrap().unwrap();
    let stats = queue.stats("tasks").await.unwrap();
    assert_eq!(stats.counter("retried"), 2);
    assert_eq!(stats.dead, 0);
    let ledger = Ledger::read(&url).await;
    assert_eq!(ledger.started.get(id.as_str()), Some(&3));
    assert_eq!(ledger.effects.get(id.as_str()), Some(&1));
    let rec = queue.completion("tasks", &id).await.unwrap().unwrap();
    assert_eq!(rec.get("attempts").map(String::as_str), Some("3"));
}

#[tokio::test]
async fn retry_exhaustion_dead_letters_with_reason() {
    let (_server, url, queue) = setup().await;
    // max_attempts = 3 on the job; fail on every attempt.
    let t = Task {
        ledger: url.clone(),
        fail_first: 99,
        ..Task::default()
    };
    let id = task::enqueue(&queue, t).await.unwrap();
    let (stop, join) = spawn_worker(&url, fast_config()).await;
    wait_until(T, "dead-letter", || async {
        queue.stats("tasks").await.unwrap().dead == 1
    })
    .await;
    stop.shutdown();
    join.await.unwrap().unwrap();
    let dead = queue.dead_letters("tasks", 0, 10).await.unwrap();
    assert_eq!(dead.len(), 1);
    let job = &dead[0];
    assert_eq!(job.id, id);
    assert_eq!(job.state(), Some("dead"));
    assert_eq!(job.attempts(), 3);
    let reason = job.field("dead_reason").unwrap();
    assert!(
        reason.starts_with("attempts exhausted (3 of 3)"),
        "{reason}"
    );
    assert!(reason.contains("planned failure on attempt 3"), "{reason}");
    for f in [
        "enqueued_at",
        "delivered_at",
        "failed_at",
        "dead_at",
        "last_error",
    ] {
        assert!(job.field(f).is_some(), "field {f} kept");
    }
    assert_eq!(Ledger::read(&url).await.total_effects(), 0);
}

#[tokio::test]
async fn permanent_error_dead_letters_at_once() {
    let (_server, url, queue) = setup().await;
    let t = Task {
        ledger: url.clone(),
        permanent: true,
        ..Task::default()
    };
    let id = task::enqueue(&queue, t).await.unwrap();
    let (stop, join) = spawn_worker(&url, fast_config()).await;
    wait_until(T, "dead-letter", || async {
        queue.stats("tasks").await.unwrap().dead == 1
    })
    .await;
    stop.shutdown();
    join.await.unwrap().unwrap();
    let job = queue.job("tasks", &id).await.unwrap().unwrap();
    assert_eq!(job.attempts(), 1);
    assert_eq!(
        job.field("dead_reason"),
        Some("permanent error: planned permanent failure")
    );
    assert_eq!(queue.stats("tasks").await.unwrap().counter("retried"), 0);
}

#[tokio::test]
async fn bad_payloads_are_dead_lettered_and_the_worker_keeps_going() {
    let (_server, url, queue) = setup().await;
    let raw = |id: &str| EnqueueOptions::new().id(id);
    // Bytes that are not a Task.
    queue
        .enqueue_raw("tasks", "task", 1, 3, raw("corrupt"), &[0xc1, 0xff, 0x00])
        .await
        .unwrap();
    // A well-formed payload under a schema version no handler knows.
    let good = rmp_serde::to_vec_named(&Task {
        ledger: url.clone(),
        ..Task::default()
    })
    .unwrap();
    queue
        .enqueue_raw("tasks", "task", 7, 3, raw("future-version"), &good)
        .await
        .unwrap();
    // A job type no handler knows.
    queue
        .enqueue_raw("tasks", "nope", 1, 3, raw("unknown-type"), &good)
        .await
        .unwrap();
    // And a good job after them.
    let ok = task::enqueue(
        &queue,
        Task {
            ledger: url.clone(),
            ..Task::default()
        },
    )
    .await
    .unwrap();

    let (stop, join) = spawn_worker(&url, fast_config()).await;
    wait_until(T, "3 dead + 1 done", || async {
        let s = queue.stats("tasks").await.unwrap();
        s.dead == 3 && s.counter("completed") == 1
    })
    .await;
    stop.shutdown();
    join.await.unwrap().unwrap();

    let reason = |id: &'static str| {
        let queue = queue.clone();
        async move {
            queue
                .job("tasks", id)
                .await
                .unwrap()
                .unwrap()
                .field("dead_reason")
                .unwrap()
                .to_string()
        }
    };
    let r = reason("corrupt").await;
    assert!(r.starts_with("payload does not decode as `task`"), "{r}");
    let r = reason("future-version").await;
    assert!(r.contains("unknown schema version 7"), "{r}");
    let r = reason("unknown-type").await;
    assert!(r.contains("unknown job type `nope`"), "{r}");
    assert_eq!(
        queue.stats("tasks").await.unwrap().counter("retried"),
        0,
        "never retried"
    );
    assert_eq!(Ledger::read(&url).await.effects.get(ok.as_str()), Some(&1));
}

#[tokio::test]
async fn dead_letter_replay_runs_the_job_again() {
    let (_server, url, queue) = setup().await;
    let id = task::enqueue(
        &queue,
        Task {
            ledger: url.clone(),
            fail_first: 3,
            ..Task::default()
        },
    )
    .await
    .unwrap();
    let (stop, join) = spawn_worker(&url, fast_config()).await;
    wait_until(T, "dead-letter", || async {
        queue.stats("tasks").await.unwrap().dead == 1
    })
    .await;
    // The handler fails on attempts 1..=3. Replaying without resetting the
    // attempt count delivers attempt 4, which succeeds.
    assert!(queue.replay_dead("tasks", &id, false).await.unwrap());
    assert!(
        !queue.replay_dead("tasks", &id, false).await.unwrap(),
        "second replay is a no-op"
    );
    wait_until(T, "completion after replay", || async {
        queue.stats("tasks").await.unwrap().counter("completed") == 1
    })
    .await;
    stop.shutdown();
    join.await.unwrap().unwrap();
    let stats = queue.stats("tasks").await.unwrap();
    assert_eq!(stats.dead, 0);
    assert_eq!(stats.counter("replayed"), 1);
}

#[tokio::test]
async fn delayed_enqueue_runs_after_the_delay() {
    let (_server, url, queue) = setup().await;
    let started = std::time::Instant::now();
    let t = Task {
        ledger: url.clone(),
        ..Task::default()
    };
    task::enqueue_with(
        &queue,
        EnqueueOptions::new().delay(Duration::from_millis(700)),
        t,
    )
    .await
    .unwrap();
    let s = queue.stats("tasks").await.unwrap();
    assert_eq!((s.main, s.delayed), (0, 1));
    let (stop, join) = spawn_worker(&url, fast_config()).await;
    wait_until(T, "completion", || async {
        queue.stats("tasks").await.unwrap().counter("completed") == 1
    })
    .await;
    assert!(started.elapsed() >= Duration::from_millis(700));
    stop.shutdown();
    join.await.unwrap().unwrap();
}

#[tokio::test]
async fn batch_enqueue_in_one_pipeline_survives_a_script_flush() {
    let (server, url, queue) = setup().await;
    let batch: Vec<Task> = (0..500)
        .map(|seq| Task {
            ledger: url.clone(),
            seq,
            ..Task::default()
        })
        .collect();
    // Fresh server: the script is not loaded yet, so this exercises the NOSCRIPT path.
    let ids = queue.enqueue_many::<task::Job>(&batch).await.unwrap();
    assert_eq!(ids.len(), 500);
    server.command(&["SCRIPT", "FLUSH"]).unwrap();
    let stable: Vec<(EnqueueOptions, &Task)> = batch
        .iter()
        .take(3)
        .enumerate()
        .map(|(i, t)| (EnqueueOptions::new().id(format!("b-{i}")), t))
        .collect();
    let out = queue
        .enqueue_batch::<task::Job, _>(stable.clone())
        .await
        .unwrap();
    assert!(out.iter().all(|e| e.is_new()));
    let again = queue.enqueue_batch::<task::Job, _>(stable).await.unwrap();
    assert!(
        again.iter().all(|e| !e.is_new()),
        "stable ids dedupe in batches too"
    );
    assert_eq!(queue.stats("tasks").await.unwrap().main, 503);

    let mut cfg = fast_config();
    cfg.concurrency = 16;
    let (stop, join) = spawn_worker(&url, cfg).await;
    wait_until(T, "503 completions", || async {
        queue.stats("tasks").await.unwrap().counter("completed") == 503
    })
    .await;
    stop.shutdown();
    join.await.unwrap().unwrap();
    let order = Ledger::read(&url).await.order;
    assert_eq!(order.len(), 503);
}
