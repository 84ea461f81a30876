//! Scheduled (delayed / run-at) and periodic (cron) jobs, queue priorities
//! and per-queue concurrency limits.

use std::collections::HashMap;
use std::time::{Duration, SystemTime};

use queue_core::{EnqueueOptions, QueueError, QueueKeys, Worker};
use queue_tests::env::worker_on;
use queue_tests::handles::stop_all;
use queue_tests::panicking_layer::PanickingLayer;
use queue_tests::{
    fast_config, routine, task, tick, urgent, wait_until, Task, TestEnv, Tick, WorkerHandle, BOUND,
    TICK_LEDGER,
};
use redis::AsyncCommands;

#[tokio::test]
async fn periodic_job_fires_once_per_period_across_workers() {
    let env = TestEnv::start().await;
    TICK_LEDGER.set(env.url.clone()).unwrap();
    let mut workers = Vec::new();
    for _ in 0..3 {
        let builder = worker_on(&env.url, [tick::handler()], fast_config());
        workers.push(WorkerHandle::start(builder).await);
    }
    // Three firings (one a second) instead of a fixed 3.5 s sleep.
    let ticks = || async {
        let t: HashMap<String, u64> = env.conn().await.hgetall("ledger:ticks").await.unwrap();
        t
    };
    wait_until(BOUND, "three firings ran", || async {
        ticks().await.len() >= 3
    })
    .await;
    stop_all(workers).await;
    let ticks = ticks().await;
    assert!(ticks.len() >= 2, "fired every second: {ticks:?}");
    for (id, runs) in &ticks {
        assert!(id.starts_with("cron:tick:"), "{id}");
        assert_eq!(*runs, 1, "firing {id} ran {runs} times across 3 workers");
    }
    assert_eq!(
        env.stats("cron").await.counter("enqueued") as usize,
        ticks.len()
    );
}

/// The firing ids [`restarted_tick`] ran (this test's own job and queue:
/// the shared `tick` records into a ledger another test of this binary
/// sets).
static RESTARTED_TICKS: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());

/// A periodic job firing every second, recording its runs.
#[queue_core::job(queue = "cron_restart", cron = "*/1 * * * * *")]
async fn restarted_tick(ctx: queue_core::JobContext, _t: Tick) -> Result<(), queue_core::JobError> {
    RESTARTED_TICKS
        .lock()
        .unwrap()
        .push(ctx.job_id().to_string());
    Ok(())
}

/// A panic in the periodic-job scheduler's task (here a tracing layer of
/// the user's, at the event that logs the first firing) does not end the
/// firings: the scheduler starts again, and the next firings are enqueued
/// once each. Before, its task ended with the panic and the worker went on
/// without it: no firing ever again from that worker (stop 47 review).
#[tokio::test]
async fn a_scheduler_that_panics_is_started_again() {
    let _tracing =
        PanickingLayer::at_first_info_event_of("queue_core::background::scheduler").install();
    let env = TestEnv::start().await;
    let worker = WorkerHandle::start(worker_on(
        &env.url,
        [restarted_tick::handler()],
        fast_config(),
    ))
    .await;
    let runs = || RESTARTED_TICKS.lock().unwrap().clone();
    wait_until(BOUND, "three firings ran across the restart", || async {
        runs().len() >= 3
    })
    .await;
    stop_all(vec![worker]).await;
    let mut ran = runs();
    let all = ran.len();
    ran.sort();
    ran.dedup();
    assert_eq!(ran.len(), all, "a firing ran twice: {:?}", runs());
    assert_eq!(env.stats("cron_restart").await.dead, 0);
}

#[tokio::test]
async fn invalid_cron_expression_is_a_build_error() {
    let env = TestEnv::start().await;
    let reg = queue_core::Registration::periodic::<tick::Job>("61 * * * * *");
    let err = Worker::builder(&env.url)
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
    let env = TestEnv::start().await;
    let queue = &env.queue;
    let at = SystemTime::now() + Duration::from_millis(800);
    let t = env.task(0);
    let id = task::enqueue_with(queue, EnqueueOptions::new().run_at(at), t.clone())
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
    task::enqueue_with(queue, EnqueueOptions::new().run_at(past), t)
        .await
        .unwrap();
    assert_eq!(env.stats("tasks").await.main, 1);
}

#[tokio::test]
async fn higher_priority_queue_is_served_first() {
    let env = TestEnv::start().await;
    for seq in 0..5 {
        routine::enqueue(&env.queue, env.task(seq)).await.unwrap();
    }
    for seq in 0..5 {
        urgent::enqueue(&env.queue, env.task(seq)).await.unwrap();
    }
    let mut cfg = fast_config();
    cfg.concurrency = 1;
    let builder = worker_on(&env.url, [urgent::handler(), routine::handler()], cfg)
        .queue_priority("high", 10);
    let worker = WorkerHandle::start(builder).await;
    wait_until(BOUND, "all ten ran", || async {
        env.conn()
            .await
            .llen::<_, usize>("ledger:prio")
            .await
            .unwrap()
            == 10
    })
    .await;
    worker.stop().await;
    let order = env.list("ledger:prio").await;
    let first_low = order.iter().position(|s| s.starts_with("low")).unwrap();
    assert_eq!(first_low, 5, "all high-priority jobs first: {order:?}");
}

#[tokio::test]
async fn per_queue_concurrency_limit_holds() {
    let env = TestEnv::start().await;
    env.enqueue_tasks(12, |t| Task {
        sleep_ms: 150,
        probe_concurrency: true,
        ..t
    })
    .await;
    let mut cfg = fast_config();
    cfg.concurrency = 8;
    let builder = env.worker("tasks", cfg).queue_concurrency("tasks", 2);
    let worker = WorkerHandle::start(builder).await;
    env.wait_completed("tasks", 12).await;
    worker.stop().await;
    let max: u64 = env.conn().await.get("ledger:max_running").await.unwrap();
    assert_eq!(
        max, 2,
        "never more than the queue's limit, and the limit was used"
    );
}

// ---- the promoter sleeps until the next due job, woken by new ones ------

/// The promoter's longest sleep in these scenarios: far beyond their bound,
/// so a job promoted in time was promoted because something woke it.
const NO_POLL: Duration = Duration::from_secs(600);

/// How long a woken promoter may take under load (well below [`NO_POLL`]).
const WOKEN_BOUND: Duration = Duration::from_secs(30);

/// A worker whose promoter never wakes on its own within a test.
async fn idle_promoter_worker(env: &TestEnv) -> WorkerHandle {
    let worker = env
        .spawn_worker(queue_core::WorkerConfig {
            promote_interval: NO_POLL,
            ..fast_config()
        })
        .await;
    // One job through main: the worker runs, its promoter's first pass
    // (an empty delayed set) is behind it.
    env.enqueue(env.task(0)).await;
    env.wait_completed("tasks", 1).await;
    worker
}

/// Waits (at most [`WOKEN_BOUND`]) for `n` completions on `tasks`.
async fn wait_completed_soon(env: &TestEnv, n: i64, what: &str) {
    wait_until(WOKEN_BOUND, what, || async {
        env.stats("tasks").await.counter("completed") >= n
    })
    .await;
}

/// Enqueues `t` due in `delay`, through the test's own `Queue` (a client
/// other than the worker's).
async fn enqueue_delayed(env: &TestEnv, delay: Duration, t: Task) {
    task::enqueue_with(&env.queue, EnqueueOptions::new().delay(delay), t)
        .await
        .expect("delayed enqueue");
}

#[tokio::test]
async fn a_delayed_job_from_another_client_wakes_the_sleeping_promoter() {
    let env = TestEnv::start().await;
    let worker = idle_promoter_worker(&env).await;
    enqueue_delayed(&env, Duration::from_millis(300), env.task(1)).await;
    wait_completed_soon(&env, 2, "the delayed job ran once due").await;
    worker.stop().await;
}

#[tokio::test]
async fn a_retry_wakes_the_sleeping_promoter() {
    let env = TestEnv::start().await;
    let worker = idle_promoter_worker(&env).await;
    let id = env
        .enqueue(Task {
            fail_first: 1,
            ..env.task(1)
        })
        .await;
    wait_completed_soon(&env, 2, "the retried job ran again once due").await;
    assert_eq!(env.completion_attempts("tasks", id).await, 2);
    worker.stop().await;
}

#[tokio::test]
async fn a_sooner_delayed_job_shortens_the_promoters_sleep() {
    let env = TestEnv::start().await;
    let worker = idle_promoter_worker(&env).await;
    enqueue_delayed(&env, Duration::from_secs(3600), env.task(1)).await;
    // The promoter now sleeps toward the hour-away head; a sooner job wakes it.
    enqueue_delayed(&env, Duration::from_millis(300), env.task(2)).await;
    wait_completed_soon(&env, 2, "the sooner job ran once due").await;
    assert_eq!(
        env.stats("tasks").await.delayed,
        1,
        "the later job still waits"
    );
    worker.stop().await;
}

/// The Redis clock, in seconds.
async fn redis_secs(env: &TestEnv) -> f64 {
    let (s, us): (u64, u64) = redis::cmd("TIME")
        .query_async(&mut env.conn().await)
        .await
        .unwrap();
    s as f64 + us as f64 / 1e6
}

/// Scenario: a worker starts while every enqueue of its cron job fails
/// (here: the queue's main list is a key of another type), and the
/// enqueues work again a few firings later. Every firing of the gap is
/// enqueued (ids are `cron:<job>:<unix seconds>`), not only the latest: the
/// scheduler's start-up is its first Redis clock read, not its first
/// successful enqueue. Before, each failing tick tried only its latest
/// firing, and the others were lost.
#[tokio::test]
async fn cron_firings_missed_while_enqueues_failed_at_start_up_are_all_enqueued() {
    let env = TestEnv::start().await;
    // Nothing runs: the firings stay in main, where the test finds them.
    env.queue.pause("cron").await.unwrap();
    let main = QueueKeys::new("cron").main;
    let _: () = env.conn().await.set(&main, "not a list").await.unwrap();
    let worker = WorkerHandle::start(worker_on(&env.url, [tick::handler()], fast_config())).await;
    let started = redis_secs(&env).await;
    wait_until(BOUND, "five seconds of firings refused", || async {
        redis_secs(&env).await >= started + 5.5
    })
    .await;
    let _: () = env.conn().await.del(&main).await.unwrap();
    let repaired = redis_secs(&env).await;
    // Firings after the worker's first clock read (allowing it 2 s after
    // `started`, for a loaded machine) up to the repair: at least three.
    let gap: Vec<String> = (started as u64 + 3..=repaired as u64)
        .map(|s| format!("cron:tick:{s}"))
        .collect();
    assert!(gap.len() >= 3, "{gap:?}");
    let missing = || async {
        let mut missing = Vec::new();
        for id in &gap {
            if env.queue.job("cron", id.as_str()).await.unwrap().is_none() {
                missing.push(id.clone());
            }
        }
        missing
    };
    wait_until(
        Duration::from_secs(15),
        "every firing of the gap enqueued",
        || async { missing().await.is_empty() },
    )
    .await;
    worker.stop().await;
}

/// A daily schedule firing at the UTC second `at` (unix seconds).
fn daily_at(at: i64) -> &'static str {
    let (s, m, h) = (at % 60, at / 60 % 60, at / 3600 % 24);
    Box::leak(format!("{s} {m} {h} * * *").into_boxed_str())
}

/// Scenario: every worker was down across a daily job's firing (here 5
/// minutes ago; its record in the cron hash is the day before's firing). The
/// first worker to start enqueues that firing late, once, and records it; a
/// worker started after it enqueues nothing more. Before, start-up looked
/// only 60 s back: the day's firing was skipped without a word.
#[tokio::test]
async fn a_firing_missed_while_every_worker_was_down_runs_when_one_starts() {
    let env = TestEnv::start().await;
    // Nothing runs: the firing stays in main, where the test finds it.
    env.queue.pause("cron").await.unwrap();
    let missed = redis_secs(&env).await as i64 - 300;
    let expr = daily_at(missed);
    let keys = QueueKeys::new("cron");
    let record = |secs: i64| format!("{secs} {expr}");
    let _: () = env
        .conn()
        .await
        .hset(keys.cron(), "tick", record(missed - 86_400))
        .await
        .unwrap();
    let start = || {
        let reg = queue_core::Registration::periodic::<tick::Job>(expr);
        WorkerHandle::start(worker_on(&env.url, [reg], fast_config()))
    };
    let worker = start().await;
    let id = format!("cron:tick:{missed}");
    wait_until(BOUND, "the missed firing enqueued", || async {
        env.queue.job("cron", id.as_str()).await.unwrap().is_some()
    })
    .await;
    let marked = || async {
        let v: Option<String> = env.conn().await.hget(keys.cron(), "tick").await.unwrap();
        v
    };
    wait_until(BOUND, "the firing recorded", || async {
        marked().await == Some(record(missed))
    })
    .await;
    worker.stop().await;
    // Its once-marker refuses the id until the next day's firing has left
    // the catch-up window (a scheduler starting from a record left behind
    // finds it due until then), not 10 minutes.
    let mut conn = env.conn().await;
    let once_ms: i64 = conn.pttl(keys.once(&id)).await.unwrap();
    assert!(once_ms > 23 * 3_600_000, "once-marker for {once_ms} ms");
    // A restart goes on from the record: the firing is not due again, even
    // with its job and once-marker gone (run, and the marker lost).
    let _: () = conn
        .del(&[keys.job(&id), keys.once(&id), keys.main.clone()])
        .await
        .unwrap();
    let again = start().await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    again.stop().await;
    assert!(
        env.queue.job("cron", id.as_str()).await.unwrap().is_none(),
        "enqueued again"
    );
    assert_eq!(env.stats("cron").await.counter("enqueued"), 1);
    assert_eq!(marked().await, Some(record(missed)));
}

/// A firing enqueued while its record cannot be written (here the cron hash
/// is a string) is recorded once the hash can be written again, without
/// waiting for the next firing (tomorrow's, here). Before, the failed mark
/// was only logged: a restart would have enqueued the firing again (stop 48
/// review).
#[tokio::test]
async fn a_firing_whose_record_failed_is_recorded_on_a_later_tick() {
    let env = TestEnv::start().await;
    env.queue.pause("cron").await.unwrap();
    let keys = QueueKeys::new("cron");
    let _: () = env
        .conn()
        .await
        .set(keys.cron(), "not a hash")
        .await
        .unwrap();
    let fired = redis_secs(&env).await as i64 - 5;
    let expr = daily_at(fired);
    let reg = queue_core::Registration::periodic::<tick::Job>(expr);
    let worker = WorkerHandle::start(worker_on(&env.url, [reg], fast_config())).await;
    let id = format!("cron:tick:{fired}");
    wait_until(BOUND, "the firing enqueued", || async {
        env.queue.job("cron", id.as_str()).await.unwrap().is_some()
    })
    .await;
    let _: () = env.conn().await.del(keys.cron()).await.unwrap();
    wait_until(BOUND, "the firing recorded", || async {
        let v: Option<String> = env.conn().await.hget(keys.cron(), "tick").await.unwrap();
        v == Some(format!("{fired} {expr}"))
    })
    .await;
    worker.stop().await;
}

/// A cron hash of another type (corrupt data) costs only its records: the
/// scheduler starts without them and fires what is due, instead of retrying
/// its start-up for ever.
#[tokio::test]
async fn a_cron_hash_of_another_type_does_not_stop_the_firings() {
    let env = TestEnv::start().await;
    env.queue.pause("cron").await.unwrap();
    let _: () = env
        .conn()
        .await
        .set(QueueKeys::new("cron").cron(), "not a hash")
        .await
        .unwrap();
    let worker = WorkerHandle::start(worker_on(&env.url, [tick::handler()], fast_config())).await;
    wait_until(BOUND, "a firing enqueued", || async {
        env.stats("cron").await.main > 0
    })
    .await;
    worker.stop().await;
}
