//! Enqueue, fetch, ack, retries, dead-letter and FIFO order against a real redis-server.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use queue_core::{EnqueueOptions, EnqueueOutcome, QueueError, QueueKeys, WorkerConfig};
use queue_tests::handles::WorkerHandle;
use queue_tests::{bill, fast_config, task, wait_until, Task, TestEnv, BOUND};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::Layer;

#[tokio::test]
async fn enqueue_fetch_ack_completes_every_job_once() {
    let env = TestEnv::start().await;
    let ids = env.enqueue_tasks(50, |t| t).await;
    assert_eq!(env.stats("tasks").await.main, 50);
    env.run_until_completed("tasks", 50).await;

    let stats = env.stats("tasks").await;
    assert_eq!(
        (stats.main, stats.processing, stats.delayed, stats.dead),
        (0, 0, 0, 0)
    );
    let ledger = env.ledger().await;
    for id in &ids {
        assert_eq!(
            ledger.effects.get(id.as_str()),
            Some(&1),
            "job {id} ran once"
        );
        // The hash is dropped and a completion record written with the ack.
        assert!(env.queue.job("tasks", id).await.unwrap().is_none());
        let rec = env
            .queue
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
    let env = TestEnv::start().await;
    env.enqueue_tasks(100, |t| t).await;
    let mut cfg = fast_config();
    cfg.concurrency = 1;
    env.run_until_completed_with("tasks", 100, cfg).await;
    assert_eq!(
        env.ledger().await.order,
        (0..100).collect::<Vec<u64>>(),
        "started in enqueue order"
    );
}

#[tokio::test]
async fn stable_id_dedupes_while_queued_and_after_completion() {
    let env = TestEnv::start().await;
    let (queue, t) = (&env.queue, env.task(0));
    let first = task::enqueue_with_id(queue, "invoice-4821-send", t.clone())
        .await
        .unwrap();
    assert_eq!(first.outcome, EnqueueOutcome::Created);
    let again = task::enqueue_with_id(queue, "invoice-4821-send", t.clone())
        .await
        .unwrap();
    assert_eq!(
        again.outcome,
        EnqueueOutcome::Duplicate {
            state: "queued".into()
        }
    );
    assert_eq!(again.id, first.id);
    assert_eq!(env.stats("tasks").await.main, 1);

    env.run_until_completed("tasks", 1).await;
    let after = task::enqueue_with_id(queue, "invoice-4821-send", t)
        .await
        .unwrap();
    assert_eq!(after.outcome, EnqueueOutcome::AlreadyCompleted);
    assert_eq!(env.stats("tasks").await.main, 0);
}

#[tokio::test]
async fn invalid_job_id_is_rejected_before_redis() {
    let env = TestEnv::start().await;
    let err = task::enqueue_with_id(&env.queue, "", env.task(0))
        .await
        .unwrap_err();
    assert!(
        matches!(err, queue_core::QueueError::InvalidJobId { .. }),
        "{err}"
    );
    assert_eq!(err.queue(), Some("tasks"));
}

#[tokio::test]
async fn retry_then_success() {
    let env = TestEnv::start().await;
    let id = env
        .enqueue(Task {
            fail_first: 2,
            ..env.task(0)
        })
        .await;
    env.run_until_completed("tasks", 1).await;
    let stats = env.stats("tasks").await;
    assert_eq!(stats.counter("retried"), 2);
    assert_eq!(stats.dead, 0);
    let ledger = env.ledger().await;
    assert_eq!(ledger.started.get(id.as_str()), Some(&3));
    assert_eq!(ledger.effects.get(id.as_str()), Some(&1));
    assert_eq!(env.completion_attempts("tasks", &id).await, 3);
}

/// Starts a worker, waits for `dead` dead letters on `tasks`, stops it.
async fn run_until_dead(env: &TestEnv, dead: u64) {
    let worker = env.spawn_worker(fast_config()).await;
    env.wait_stats("tasks", "dead-letter", |s| s.dead == dead)
        .await;
    worker.stop().await;
}

#[tokio::test]
async fn retry_exhaustion_dead_letters_with_reason() {
    let env = TestEnv::start().await;
    // max_attempts = 3 on the job; fail on every attempt.
    let id = env
        .enqueue(Task {
            fail_first: 99,
            ..env.task(0)
        })
        .await;
    run_until_dead(&env, 1).await;
    let dead = env.queue.dead_letters("tasks", 0, 10).await.unwrap();
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
    assert_eq!(env.ledger().await.total_effects(), 0);
}

#[tokio::test]
async fn permanent_error_dead_letters_at_once() {
    let env = TestEnv::start().await;
    let id = env
        .enqueue(Task {
            permanent: true,
            ..env.task(0)
        })
        .await;
    run_until_dead(&env, 1).await;
    let job = env.queue.job("tasks", &id).await.unwrap().unwrap();
    assert_eq!(job.attempts(), 1);
    assert_eq!(
        job.field("dead_reason"),
        Some("permanent error: planned permanent failure")
    );
    assert_eq!(env.stats("tasks").await.counter("retried"), 0);
}

#[tokio::test]
async fn bad_payloads_are_dead_lettered_and_the_worker_keeps_going() {
    let env = TestEnv::start().await;
    let queue = &env.queue;
    let raw = |id: &str| EnqueueOptions::new().id(id);
    // Bytes that are not a Task.
    queue
        .enqueue_raw("tasks", "task", 1, 3, raw("corrupt"), &[0xc1, 0xff, 0x00])
        .await
        .unwrap();
    // A well-formed payload under a newer schema version no live worker
    // announces (dead at once: this worker waits zero for one), and one
    // under an older version no handler knows.
    let good = rmp_serde::to_vec_named(&env.task(0)).unwrap();
    queue
        .enqueue_raw("tasks", "task", 7, 3, raw("future-version"), &good)
        .await
        .unwrap();
    queue
        .enqueue_raw("tasks", "task", 0, 3, raw("past-version"), &good)
        .await
        .unwrap();
    // A job type no handler knows (dead once no live worker has announced
    // it for the wait: zero here).
    queue
        .enqueue_raw("tasks", "nope", 1, 3, raw("unknown-type"), &good)
        .await
        .unwrap();
    // And a good job after them.
    let ok = env.enqueue(env.task(0)).await;

    let config = WorkerConfig {
        newer_version_wait: Duration::ZERO,
        ..fast_config()
    };
    let worker = env.spawn_worker(config).await;
    env.wait_stats("tasks", "4 dead + 1 done", |s| {
        s.dead == 4 && s.counter("completed") == 1
    })
    .await;
    worker.stop().await;

    let reason = |id: &'static str| async move {
        queue
            .job("tasks", id)
            .await
            .unwrap()
            .unwrap()
            .field("dead_reason")
            .unwrap()
            .to_string()
    };
    let r = reason("corrupt").await;
    assert!(r.starts_with("payload does not decode as `task`"), "{r}");
    let r = reason("future-version").await;
    assert!(
        r.contains("task:7 is newer than this worker's handler (version 1)")
            && r.contains("no live worker has announced it"),
        "{r}"
    );
    let r = reason("past-version").await;
    assert!(r.contains("unknown schema version 0"), "{r}");
    // The reason says what is missing and what to do about it.
    let r = reason("unknown-type").await;
    for part in [
        "unknown job type `nope` (version 1): no handler for it on the worker that took it",
        "no live worker has announced it",
        "register it on every worker that consumes the queue",
        "then `queue-watchdog dead replay`",
    ] {
        assert!(r.contains(part), "{part:?} missing from: {r}");
    }
    assert_eq!(
        env.stats("tasks").await.counter("retried"),
        0,
        "never retried"
    );
    assert_eq!(env.ledger().await.effects.get(ok.as_str()), Some(&1));
}

#[tokio::test]
async fn dead_letter_replay_runs_the_job_again() {
    let env = TestEnv::start().await;
    let id = env
        .enqueue(Task {
            fail_first: 3,
            ..env.task(0)
        })
        .await;
    let worker = env.spawn_worker(fast_config()).await;
    env.wait_stats("tasks", "dead-letter", |s| s.dead == 1)
        .await;
    // The handler fails on attempts 1..=3. Replaying without resetting the
    // attempt count delivers attempt 4, which succeeds.
    assert!(env.queue.replay_dead("tasks", &id, false).await.unwrap());
    assert!(
        !env.queue.replay_dead("tasks", &id, false).await.unwrap(),
        "second replay is a no-op"
    );
    env.wait_completed("tasks", 1).await;
    worker.stop().await;
    let stats = env.stats("tasks").await;
    assert_eq!(stats.dead, 0);
    assert_eq!(stats.counter("replayed"), 1);
}

#[tokio::test]
async fn delayed_enqueue_runs_after_the_delay() {
    let env = TestEnv::start().await;
    let started = std::time::Instant::now();
    task::enqueue_with(
        &env.queue,
        EnqueueOptions::new().delay(Duration::from_millis(700)),
        env.task(0),
    )
    .await
    .unwrap();
    let s = env.stats("tasks").await;
    assert_eq!((s.main, s.delayed), (0, 1));
    let worker = env.spawn_worker(fast_config()).await;
    env.wait_completed("tasks", 1).await;
    assert!(started.elapsed() >= Duration::from_millis(700));
    worker.stop().await;
}

#[tokio::test]
async fn batch_enqueue_in_one_pipeline_survives_a_function_flush() {
    let env = TestEnv::start().await;
    let queue = &env.queue;
    let batch: Vec<Task> = (0..500).map(|seq| env.task(seq)).collect();
    // Fresh server: the function library is not loaded yet, so this
    // exercises the load-and-resend path.
    let ids = queue.enqueue_many::<task::Job>(&batch).await.unwrap();
    assert_eq!(ids.len(), 500);
    // Gone again (as after a restart without persistence): the pipeline of
    // the next batch finds no function and loads the library once more.
    env.server.command(&["FUNCTION", "FLUSH"]).unwrap();
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
    assert_eq!(env.stats("tasks").await.main, 503);

    let mut cfg = fast_config();
    cfg.concurrency = 16;
    env.run_until_completed_with("tasks", 503, cfg).await;
    assert_eq!(env.ledger().await.order.len(), 503);
}

/// A batch far larger than one round trip can carry within the response
/// timeout is sent in bounded windows (a few script calls each), each
/// within its own timeout and retries: every job is written once and the
/// batch is `Ok`. Before, the whole batch went out as one pipeline under
/// one response timeout: it always timed out, was sent again whole (the
/// retries slower still, with the dedupe reads) and ended in an "outcome
/// unknown" error although every job was written, so a caller that
/// retried `enqueue_many` wrote each job twice.
#[tokio::test]
async fn a_batch_larger_than_one_response_timeout_is_sent_in_windows() {
    let env = TestEnv::start().await;
    let cfg = queue_core::ConnectionConfig {
        response_timeout: Duration::from_millis(300),
        ..Default::default()
    };
    let queue = queue_core::Queue::connect_with(&env.url, &cfg)
        .await
        .unwrap();
    // About four times the batch that first timed out on the old code
    // (some 20,000 jobs in a debug build; 30,000 and more always did).
    const N: u64 = 50_000;
    let batch: Vec<Task> = (0..N).map(|seq| env.task(seq)).collect();
    let ids = queue
        .enqueue_many::<task::Job>(&batch)
        .await
        .expect("a large batch is enqueued");
    assert_eq!(ids.len(), N as usize);
    assert_eq!(env.stats("tasks").await.main, N);
}

/// The acker sends a batch as soon as it is full, and a lone ack when its
/// window ends; it is not woken per ack in between (worker/acker.rs).
///
/// The full batch and the shutdown are shown against a 10 min window: a
/// batch sent only at its window's end, or a shutdown that waited it out,
/// could not pass the waits (60 s at most) and 30 s bound below. The lone
/// ack, a lower bound a loaded machine cannot break, against a 6 s one.
/// (Before, one 6 s window for all three, with bounds of 4 s: ~2 s of slack.)
#[tokio::test]
async fn acks_are_sent_when_a_batch_fills_or_its_window_ends() {
    let env = TestEnv::start().await;
    // The window may be at most a third of the lease.
    let cfg = |ack_window: Duration| WorkerConfig {
        concurrency: 8,
        lease: ack_window * 3 + Duration::from_secs(2),
        ack_batch: 8,
        ack_window,
        ..fast_config()
    };
    let worker = env.spawn_worker(cfg(Duration::from_secs(600))).await;
    for seq in 0..8 {
        env.enqueue(env.task(seq)).await;
    }
    // Sent when full: the window is 10 min.
    env.wait_completed("tasks", 8).await;
    // A lone ack waits (for its window or the shutdown)...
    env.enqueue(env.task(8)).await;
    env.wait_ledger("the ninth job ran", |l| l.effects.len() == 9)
        .await;
    assert_eq!(
        env.stats("tasks").await.counters.get("completed"),
        Some(&8),
        "a lone ack within its window was sent at once"
    );
    // ...and the shutdown does not wait out the window: the last ack is
    // sent at once. The bound is the property (the shutdown does not hang):
    // 30 s for a stop that takes next to nothing, where the old acker
    // waited out the 10 min window.
    tokio::time::timeout(Duration::from_secs(30), worker.stop())
        .await
        .expect("the shutdown waited out the acker's window");
    assert_eq!(env.stats("tasks").await.counters.get("completed"), Some(&9));

    // A lone ack is sent when its window ends, not before.
    let worker = env.spawn_worker(cfg(Duration::from_secs(6))).await;
    let lone = std::time::Instant::now();
    env.enqueue(env.task(9)).await;
    env.wait_completed("tasks", 10).await;
    assert!(
        lone.elapsed() >= Duration::from_secs(5),
        "a lone ack was sent after {:?}, before its 6 s window ended",
        lone.elapsed()
    );
    worker.stop().await;
    assert_eq!(
        env.stats("tasks").await.counters.get("completed"),
        Some(&10)
    );
}

/// A tracing layer (user code the acker runs: it logs "completed" for each
/// ack) that panics on the first "completed" it sees.
struct PanicOnFirstCompleted(Arc<AtomicBool>);

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for PanicOnFirstCompleted {
    fn on_event(&self, event: &tracing::Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
        struct Message(String);
        impl tracing::field::Visit for Message {
            fn record_debug(&mut self, f: &tracing::field::Field, v: &dyn std::fmt::Debug) {
                if f.name() == "message" {
                    self.0 = format!("{v:?}");
                }
            }
        }
        let mut m = Message(String::new());
        event.record(&mut m);
        if m.0 == "completed" && !self.0.swap(true, Ordering::SeqCst) {
            panic!("a tracing layer panicked on `completed`");
        }
    }
}

/// Scenario: a flush of the acker panics (here a tracing layer on its
/// "completed" line, after the ack script ran; the global metrics recorder
/// is user code it runs too). The acker catches it, logs the batch's jobs
/// (acked: the script had answered) and goes on: every later job of the
/// queue is acked once. Before, the acker's task died with the panic, and
/// every later success of the queue was "acker gone: job left leased", run
/// again by the watchdog until dead-lettered "attempts exhausted".
#[tokio::test]
async fn an_acker_whose_flush_panicked_goes_on_acking() {
    let env = TestEnv::start().await;
    let panicked = Arc::new(AtomicBool::new(false));
    // The test's runtime runs every task on this thread: the worker's lines
    // go through this subscriber.
    let subscriber = tracing_subscriber::registry()
        .with(PanicOnFirstCompleted(panicked.clone()))
        .with(
            tracing_subscriber::fmt::layer()
                .with_test_writer()
                .with_filter(tracing_subscriber::filter::LevelFilter::WARN),
        );
    let _default = tracing::subscriber::set_default(subscriber);
    let worker = env.spawn_worker(fast_config()).await;
    env.enqueue(env.task(0)).await;
    // The first ack landed; the line after it panicked.
    env.wait_completed("tasks", 1).await;
    wait_until(BOUND, "the flush panicked", || async {
        panicked.load(Ordering::SeqCst)
    })
    .await;
    let ids = env.enqueue_tasks(10, |t| t).await;
    env.wait_completed("tasks", 11).await;
    worker.stop().await;
    let ledger = env.ledger().await;
    for id in &ids {
        assert_eq!(
            ledger.effects.get(id.as_str()),
            Some(&1),
            "job {id} ran once"
        );
    }
    let stats = env.stats("tasks").await;
    assert_eq!((stats.processing, stats.delayed, stats.dead), (0, 0, 0));
    assert_eq!(stats.counters.get("completed"), Some(&11));
}

/// Queue names are checked at run time by the `#[job]` attribute's rule
/// (`validate_queue_name`), before anything is sent. Before, only the
/// attribute checked them: `enqueue_raw` wrote under `""`, or under a name
/// with a brace, which moves the keys' hash tag (`a}:job:x`'s job `y` is
/// queue `a`'s job `x}:job:y`; on a cluster its keys span slots).
#[tokio::test]
async fn a_queue_name_that_breaks_the_key_layout_is_refused_before_redis() {
    let env = TestEnv::start().await;
    for queue in ["", "}x", "a}:job:x", "a b"] {
        let opts = EnqueueOptions::new().id("y");
        let alone = env
            .queue
            .enqueue_raw(queue, "t", 1, 3, opts.clone(), b"\x80")
            .await
            .unwrap_err();
        let batch = env
            .queue
            .enqueue_raw_batch(queue, "t", 1, 3, vec![(opts, b"\x80".to_vec())])
            .await
            .unwrap_err();
        for err in [alone, batch] {
            assert!(
                matches!(err, QueueError::InvalidQueueName { .. }),
                "{queue:?}: {err}"
            );
            assert_eq!(err.queue(), Some(queue));
        }
    }
    let keys: u64 = redis::cmd("DBSIZE")
        .query_async(&mut env.conn().await)
        .await
        .unwrap();
    assert_eq!(keys, 0, "nothing written");
}

/// A job type of a hand-written `impl Job` on a queue no enqueue accepts.
struct OnSpacedQueue;

impl queue_core::Job for OnSpacedQueue {
    type Args = u32;
    const NAME: &'static str = "on_spaced_queue";
    const QUEUE: &'static str = "emails high";
    fn run(
        _: queue_core::JobContext,
        _: u32,
    ) -> queue_core::BoxFuture<'static, Result<(), queue_core::JobError>> {
        Box::pin(async { Ok(()) })
    }
}

/// A worker is refused at build when a queue it consumes (`queues`) or a
/// job type it registers (`Job::QUEUE`, where that type's enqueues go) is a
/// name every enqueue refuses; so is a `queue_priority` / `queue_concurrency`
/// name (before, refused only as "not consumed", not as a bad name). Before,
/// a hand-written `QUEUE = "emails high"`
/// (or `queues(["{t}x"])`) built a worker consuming a queue no enqueue
/// could reach.
#[tokio::test]
async fn a_worker_on_a_queue_name_enqueues_refuse_is_refused_at_build() {
    let env = TestEnv::start().await;
    let registered = queue_tests::env::worker_on(
        &env.url,
        [queue_core::Registration::of::<OnSpacedQueue>()],
        fast_config(),
    );
    let consumed = env.worker("tasks", fast_config()).queues(["tasks", "{t}x"]);
    let prioritised = env
        .worker("tasks", fast_config())
        .queue_priority("tasks ", 1);
    let limited = env
        .worker("tasks", fast_config())
        .queue_concurrency("{tasks}", 1);
    for (builder, queue) in [
        (registered, "emails high"),
        (consumed, "{t}x"),
        (prioritised, "tasks "),
        (limited, "{tasks}"),
    ] {
        let err = builder.build().await.unwrap_err();
        assert!(
            matches!(&err, QueueError::InvalidQueueName { .. }),
            "{queue}: {err}"
        );
        assert_eq!(err.queue(), Some(queue));
    }
}

/// A worker is refused at build when `queues(..)` lists a queue no job type
/// registered on it is on: handlers are found by `(queue, type)`, so every
/// job it took from there was dead-lettered at once as an unknown type (the
/// reason listing no handled type). A registered type whose queue is left
/// out of `queues(..)` still builds (other workers may consume that queue);
/// it is only logged.
#[tokio::test]
async fn a_worker_consuming_a_queue_it_has_no_job_type_for_is_refused_at_build() {
    let env = TestEnv::start().await;
    let err = env
        .worker("tasks", fast_config())
        .queues(["tasks", "reports"])
        .build()
        .await
        .unwrap_err();
    assert!(matches!(&err, QueueError::Config(_)), "{err}");
    let msg = err.to_string();
    assert!(
        msg.contains("queue `reports` is in queues(..) but no job type registered"),
        "{msg}"
    );
    let off_queue = env.worker("tasks", fast_config()).register(bill::handler());
    off_queue
        .queues(["tasks"])
        .build()
        .await
        .expect("a registered type whose queue is not consumed is only logged");
}

/// `enqueue_raw` stores `opts.max_attempts` over the `max_attempts`
/// argument (the job type's limit), with group commit on or off, as a batch
/// and every typed enqueue do. Before, a single `enqueue_raw` ignored it
/// (except with `wait_for_replicas`, which goes the batch way).
#[tokio::test]
async fn enqueue_raw_stores_the_max_attempts_of_its_options() {
    let env = TestEnv::start().await;
    for group in [true, false] {
        let queue = env.queue.clone().with_group_commit(group);
        let id = format!("attempts-{group}");
        let opts = EnqueueOptions::new().id(id.as_str()).max_attempts(7);
        queue
            .enqueue_raw("tasks", "task", 1, 3, opts, b"\x80")
            .await
            .unwrap();
        let job = env.queue.job("tasks", id.as_str()).await.unwrap().unwrap();
        assert_eq!(job.field("max_attempts"), Some("7"), "group commit {group}");
    }
}

/// A worker whose `run_until` future the caller drops (a `select!` or a
/// `timeout` around it, no shutdown handle) stops: no fetcher, promoter or
/// cron scheduler runs on, and none reads the closed stop channel as "not
/// yet" (which would loop without pause). Before, its loops ran on detached
/// (the signal task kept the stop channel open): ~60 `FCALL` and `TIME`
/// calls a second here, with no way left to stop them. Counts calls, not
/// time: two readings a second apart.
#[tokio::test]
async fn a_dropped_worker_stops_and_leaves_no_loop_running() {
    let env = TestEnv::start().await;
    queue_tests::TICK_LEDGER.get_or_init(|| env.url.clone());
    let worker = env
        .worker("tasks", fast_config())
        .register(queue_tests::tick::handler())
        .build()
        .await
        .unwrap();
    let ran = tokio::time::timeout(
        Duration::from_millis(300),
        worker.run_until(std::future::pending()),
    )
    .await;
    assert!(ran.is_err(), "dropped while running");
    let calls = || async { env.command_calls("fcall").await + env.command_calls("time").await };
    let before = calls().await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let delta = calls().await - before;
    assert!(delta <= 10, "{delta} script and TIME calls in a second");
}

/// Settings that passed validation and then panicked while the worker ran
/// are refused at build: an `ack_window` beyond the clock killed the acker
/// (every later success "acker gone: job left leased", reclaimed and run
/// again until dead-lettered), a window near the lease let the lease expire
/// before the ack; a `block_timeout` or `promote_interval` beyond the clock
/// overflowed at start; a concurrency above what a semaphore holds
/// panicked, one above `u32::MAX` was truncated at shutdown; a huge
/// `ack_batch` aborted the process reserving its room.
#[tokio::test]
async fn settings_that_panicked_at_run_time_are_refused_at_build() {
    let env = TestEnv::start().await;
    let lease = fast_config().lease;
    let day = Duration::from_secs(24 * 3600);
    let with = |f: &dyn Fn(&mut WorkerConfig)| {
        let mut cfg = fast_config();
        f(&mut cfg);
        cfg
    };
    let refused = [
        (with(&|c| c.ack_window = Duration::MAX), "ack_window"),
        (
            with(&|c| c.ack_window = lease / 3 + Duration::from_millis(1)),
            "ack_window",
        ),
        (with(&|c| c.block_timeout = Duration::MAX), "block_timeout"),
        (
            with(&|c| c.block_timeout = day + Duration::from_secs(1)),
            "block_timeout",
        ),
        (
            with(&|c| c.promote_interval = Duration::MAX),
            "promote_interval",
        ),
        (with(&|c| c.concurrency = usize::MAX), "concurrency"),
        (
            with(&|c| c.concurrency = u32::MAX as usize + 1),
            "concurrency",
        ),
        (with(&|c| c.ack_batch = usize::MAX), "ack_batch"),
        (with(&|c| c.ack_batch = 10_001), "ack_batch"),
    ];
    for (cfg, what) in refused {
        let err = env.worker("tasks", cfg).build().await.unwrap_err();
        assert!(
            matches!(&err, QueueError::Config(m) if m.contains(what)),
            "{what}: {err}"
        );
    }
    let err = env
        .worker("tasks", fast_config())
        .queue_concurrency("tasks", usize::MAX)
        .build()
        .await
        .unwrap_err();
    assert!(matches!(&err, QueueError::Config(m) if m.contains("concurrency limit")));
}

/// An extra field the scripts read as a count (`expires_at`,
/// `expires_after`) whose value is none is refused at enqueue, naming the
/// field, queue and job, single and batched: nothing is written. Before, it
/// was stored, and the job was dead-lettered "corrupt field" at its first
/// claim.
#[tokio::test]
async fn a_deadline_field_that_is_no_count_is_refused_at_enqueue() {
    let env = TestEnv::start().await;
    for (i, (name, value)) in [("expires_at", "tomorrow"), ("expires_after", "-1")]
        .into_iter()
        .enumerate()
    {
        let id = format!("bad-deadline-{i}");
        let opts = || {
            EnqueueOptions::new()
                .id(id.as_str())
                .extra_field(name, value)
        };
        let single = env
            .queue
            .enqueue_raw("tasks", "task", 1, 3, opts(), b"\x80")
            .await
            .unwrap_err();
        let batch = env
            .queue
            .enqueue_raw_batch("tasks", "task", 1, 3, vec![(opts(), b"\x80".to_vec())])
            .await
            .unwrap_err();
        for err in [single, batch] {
            assert!(
                matches!(&err, QueueError::InvalidExtraField { name: n, .. } if n == name),
                "{err}"
            );
            assert_eq!(err.queue(), Some("tasks"));
            assert_eq!(err.job_id().map(|j| j.as_str()), Some(id.as_str()));
        }
        assert!(env.queue.job("tasks", id.as_str()).await.unwrap().is_none());
    }
}

/// A hand-written `Job` with a zero `TIMEOUT`.
struct ZeroTimeout;

impl queue_core::Job for ZeroTimeout {
    type Args = u32;
    const NAME: &'static str = "zero_timeout";
    const QUEUE: &'static str = "tasks";
    const TIMEOUT: Option<Duration> = Some(Duration::ZERO);
    fn run(
        _: queue_core::JobContext,
        _: u32,
    ) -> queue_core::BoxFuture<'static, Result<(), queue_core::JobError>> {
        Box::pin(async { Ok(()) })
    }
}

/// A hand-written `Job` with a zero `DEADLINE`.
struct ZeroDeadline;

impl queue_core::Job for ZeroDeadline {
    type Args = u32;
    const NAME: &'static str = "zero_deadline";
    const QUEUE: &'static str = "tasks";
    const DEADLINE: Option<Duration> = Some(Duration::ZERO);
    fn run(
        _: queue_core::JobContext,
        _: u32,
    ) -> queue_core::BoxFuture<'static, Result<(), queue_core::JobError>> {
        Box::pin(async { Ok(()) })
    }
}

/// A hand-written `Job` whose `TIMEOUT` or `DEADLINE` is zero, and a
/// `Backoff` whose base is above its max or whose max is beyond 30 days,
/// are refused at build, naming the type and queue (or the backoff). Before,
/// they built: every attempt failed "timed out after 0ns", every job was
/// dead-lettered "deadline exceeded", and a max near `u64` milliseconds
/// parked a retried job decades away (`#[job]` and `timeout_for` already
/// refused a zero).
#[tokio::test]
async fn zero_job_limits_and_an_unbounded_backoff_are_refused_at_build() {
    let env = TestEnv::start().await;
    for (reg, name, what) in [
        (
            queue_core::Registration::of::<ZeroTimeout>(),
            "zero_timeout",
            "TIMEOUT",
        ),
        (
            queue_core::Registration::of::<ZeroDeadline>(),
            "zero_deadline",
            "DEADLINE",
        ),
    ] {
        let err = env
            .worker("tasks", fast_config())
            .register(reg)
            .build()
            .await
            .unwrap_err();
        let QueueError::Config(msg) = &err else {
            panic!("{name}: {err}");
        };
        for needle in [format!("`{name}`"), "queue `tasks`".into(), what.into()] {
            assert!(msg.contains(&needle), "{needle:?} not in {msg:?}");
        }
    }
    let backoff = |base: Duration, max: Duration| WorkerConfig {
        backoff: queue_core::Backoff { base, max },
        ..fast_config()
    };
    let day = Duration::from_secs(24 * 3600);
    for cfg in [
        backoff(Duration::from_secs(2), Duration::from_secs(1)),
        backoff(Duration::from_secs(1), Duration::from_millis(u64::MAX)),
        backoff(Duration::from_secs(1), day * 30 + Duration::from_millis(1)),
    ] {
        let b = cfg.backoff;
        let err = env.worker("tasks", cfg).build().await.unwrap_err();
        assert!(
            matches!(&err, QueueError::Config(m) if m.contains("backoff")),
            "{b:?}: {err}"
        );
    }
    env.worker("tasks", backoff(Duration::ZERO, day * 30))
        .build()
        .await
        .expect("a zero base and a 30-day max are fine");
}

/// At the largest accepted values (an ack window of a third of the lease,
/// 10,000 acks per call, concurrency `u32::MAX`) a job runs once, is acked
/// before its lease runs out, and the worker stops.
#[tokio::test]
async fn a_job_is_acked_at_the_largest_accepted_ack_window() {
    let env = TestEnv::start().await;
    let cfg = WorkerConfig {
        ack_window: fast_config().lease / 3,
        ack_batch: 10_000,
        concurrency: u32::MAX as usize,
        ..fast_config()
    };
    let id = env.enqueue(env.task(0)).await;
    let worker = env.spawn_worker(cfg).await;
    let watchdog = env.spawn_watchdog("tasks").await;
    env.wait_completed("tasks", 1).await;
    let report = watchdog.stop().await;
    worker.stop().await;
    assert_eq!(env.completion_attempts("tasks", &id).await, 1);
    assert_eq!(report.reclaimed, 0);
}

/// A producer in another language may store any non-negative integer as
/// max attempts (docs/PROTOCOL.md, section 3): a job enqueued through the
/// documented script with "4294967296" (one above `u32::MAX`) runs and
/// completes once. Before, the worker could not read its claim row
/// ("claim row unreadable: field 5 (max_attempts)") and dead-lettered it
/// at its first delivery, unrun.
#[tokio::test]
async fn a_job_stored_with_max_attempts_above_u32_runs_to_completion() {
    let env = TestEnv::start().await;
    let keys = QueueKeys::new("tasks");
    let id = "foreign-huge-max";
    let script = redis::Script::new(&format!(
        "{}\n{}",
        include_str!("../../queue-core/src/scripts/prelude.lua"),
        include_str!("../../queue-core/src/scripts/enqueue.lua")
    ));
    let payload = rmp_serde::to_vec_named(&env.task(0)).expect("payload");
    let reply: Vec<redis::Value> = script
        .key(&keys.main)
        .key(keys.job(id))
        .key(keys.done(id))
        .key(&keys.delayed)
        .key(&keys.stats)
        .key(keys.once(id))
        .arg(id)
        .arg("task")
        .arg(1)
        .arg(payload)
        .arg("4294967296")
        .arg(0)
        .arg(0)
        .arg(0)
        .invoke_async(&mut env.conn().await)
        .await
        .expect("enqueue");
    assert_eq!(reply[0], redis::Value::BulkString(b"new".to_vec()));

    let worker = env.spawn_worker(fast_config()).await;
    env.wait_stats("tasks", "the job completed or dead-lettered", |s| {
        s.counter("completed") + s.counter("dead") >= 1
    })
    .await;
    worker.stop().await;
    let stats = env.stats("tasks").await;
    assert_eq!(stats.dead, 0, "not dead-lettered");
    assert_eq!(env.completion_attempts("tasks", id).await, 1);
    assert_eq!(env.ledger().await.effects.get(id), Some(&1), "ran once");
}

/// Scenario: one worker with a single slot (`concurrency(1)`) serves two
/// queues; `billing` is empty, `tasks` has a backlog. Before, the idle
/// queue's fetcher held the only slot while it blocked in `BLMOVE`, so the
/// busy queue ran one job per block timeout (40 jobs: about 80 s with a 2 s
/// block timeout). The blocking wait now holds no slot. Then bills arrive
/// while the slot runs tasks: a job the wait hands over with no free slot
/// goes back to the head of its queue unclaimed and runs once a slot is
/// free; every job runs once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_queue_does_not_starve_a_busy_one_at_concurrency_one() {
    let env = TestEnv::start().await;
    let config = WorkerConfig {
        concurrency: 1,
        block_timeout: Duration::from_secs(2),
        ..fast_config()
    };
    let worker = WorkerHandle::start(env.worker("tasks", config).register(bill::handler())).await;
    let tasks = env.enqueue_tasks(40, |t| t).await;
    // Far below the 80 s the old fetcher took, far above a loaded machine's
    // few seconds.
    tokio::time::timeout(Duration::from_secs(30), env.wait_completed("tasks", 40))
        .await
        .expect("40 tasks done while the other queue idles");

    let mut bills = Vec::new();
    for cents in 1..=5 {
        bills.push(env.enqueue_bill(env.bill(cents)).await);
        env.enqueue(env.task(100 + cents)).await;
    }
    env.wait_completed("billing", 5).await;
    env.wait_completed("tasks", 45).await;
    worker.stop().await;
    let ledger = env.ledger().await;
    for id in &tasks {
        assert_eq!(ledger.effects.get(id.as_str()), Some(&1), "{id} ran once");
    }
    let receipts = env.ledger_hash::<i64>("ledger:receipts").await;
    for id in &bills {
        assert_eq!(receipts.get(id.as_str()), Some(&1), "bill {id} ran once");
    }
}
