//! Reliability regressions of issue #11 at the worker and watchdog level,
//! against a real redis-server: a fetch whose reply was lost still runs its
//! job (once, without burning an attempt); one unreadable job does not stall
//! its batch, and one taken by a blocked fetch (`BLMOVE` + `claim.lua`) is
//! dead-lettered with its reason (or ends cancelled when a cancel was
//! requested); one broken queue does not stop the watchdog for the others; a
//! worker that cannot make every blocking connection leaves nothing running.

use std::time::Duration;

use queue_core::{
    BoxFuture, EnqueueOptions, Job, JobContext, JobError, Queue, QueueKeys, Registration, Watchdog,
    Worker,
};
use queue_tests::env::BOUND;
use queue_tests::panicking_layer::PanickingLayer;
use queue_tests::{
    fast_config, fast_watchdog, redis_and_queue, redis_conn, routine, spawn_worker, task, urgent,
    wait_until, Ledger, Task, TestEnv,
};
use redis::AsyncCommands;

const T: Duration = Duration::from_secs(30);

fn a_task(url: &str) -> Task {
    Task {
        ledger: url.to_string(),
        ..Task::default()
    }
}

/// Runs a watchdog of `queue` in the background until the returned sender
/// fires.
fn start_watchdog(url: &str, queue: &'static str) -> tokio::sync::oneshot::Sender<()> {
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let url = url.to_string();
    tokio::spawn(async move {
        let watchdog = Watchdog::connect(&url, [queue], fast_watchdog())
            .await
            .unwrap();
        watchdog
            .run_until(async {
                let _ = rx.await;
            })
            .await
    });
    tx
}

async fn counter(queue: &Queue, name: &str) -> i64 {
    queue.stats("tasks").await.unwrap().counter(name)
}

/// Item 1: the worker's fetch script runs while its client has already given
/// up (writes paused longer than the response timeout). The retry with the
/// same token gets the same delivery: the job runs once and, with
/// `max_attempts = 1`, is not dead-lettered at lease expiry.
#[tokio::test]
async fn a_fetch_whose_reply_was_lost_still_runs_its_job_once() {
    let (_server, url, queue) = redis_and_queue().await;
    let mut cfg = fast_config();
    cfg.lease = Duration::from_secs(6);
    cfg.connection.response_timeout = Duration::from_millis(250);
    let (stop, join) = spawn_worker(&url, cfg).await;
    let watchdog = start_watchdog(&url, "tasks");
    // A first job loads the function library (a lost FCALL of a function
    // not loaded yet would only get "Function not found", and never run).
    task::enqueue(&queue, a_task(&url)).await.unwrap();
    wait_until(T, "warm-up job", || async {
        counter(&queue, "completed").await == 1
    })
    .await;

    let _: () = redis::cmd("CLIENT")
        .arg(&["PAUSE", "1000", "WRITE"][..])
        .query_async(&mut redis_conn(&url).await)
        .await
        .unwrap();
    // Paused too: it runs first when the pause ends, then the worker's fetch.
    let job = task::enqueue_with(&queue, EnqueueOptions::new().max_attempts(1), a_task(&url))
        .await
        .unwrap();
    wait_until(T, "the job completes or dies", || async {
        counter(&queue, "completed").await == 2 || counter(&queue, "dead").await > 0
    })
    .await;
    let _ = watchdog.send(());
    stop.shutdown();
    join.await.unwrap().unwrap();
    assert_eq!(counter(&queue, "dead").await, 0, "not dead-lettered");
    let ledger = Ledger::read(&url).await;
    assert_eq!(ledger.started.get(job.id.as_str()), Some(&1), "ran once");
    assert_eq!(ledger.effects.get(job.id.as_str()), Some(&1));
}

/// A fetch whose reply is lost for longer than a third of the lease (Redis
/// writes paused 5 s, lease 12 s): the retries with the same token ended
/// after a third of the lease (4 s) while the fetch's receipt lived half of
/// one, so the job the first try claimed when the pause ended was never
/// run and, with `max_attempts = 1`, was dead-lettered at its lease's
/// expiry. They now go on while the receipt lives (less a margin): the job
/// runs once and is not dead-lettered.
#[tokio::test]
async fn a_fetch_whose_reply_is_lost_for_longer_than_a_third_of_the_lease_still_runs_its_jobs_once()
{
    a_lost_fetch_reply_runs_its_job_once(
        Duration::from_secs(12),
        Duration::from_millis(250),
        Duration::from_secs(5),
    )
    .await;
}

/// The same with a short lease (2 s) and a response timeout of half of it
/// (1 s): the fetch's receipt lived half a lease, less the timeout left no
/// retry at all, and the first reply lost stranded the job (dead-lettered
/// unrun with one attempt). The receipt now lives at least 11 s (stop 48
/// review).
#[tokio::test]
async fn a_fetch_whose_reply_is_lost_under_a_short_lease_is_retried() {
    a_lost_fetch_reply_runs_its_job_once(
        Duration::from_secs(2),
        Duration::from_secs(1),
        Duration::from_millis(1500),
    )
    .await;
}

/// Scenario: with one slot busy, Redis writes are paused for `pause` (longer
/// than `response_timeout`) while the worker's next fetch is sent; the job
/// of one attempt it claims when the pause ends runs once and is not
/// dead-lettered.
async fn a_lost_fetch_reply_runs_its_job_once(
    lease: Duration,
    response_timeout: Duration,
    pause: Duration,
) {
    let env = TestEnv::start().await.with_separate_ledger();
    let mut cfg = fast_config();
    cfg.concurrency = 1;
    cfg.lease = lease;
    cfg.connection.response_timeout = response_timeout;
    let worker = env.spawn_worker(cfg).await;
    let _watchdog = env.spawn_watchdog("tasks").await;
    // The one slot is busy until this job ends: the next fetch is sent
    // then, after the pause began (and the library is loaded).
    let first = env
        .enqueue(Task {
            sleep_ms: 300,
            ..env.task(0)
        })
        .await;
    env.wait_ledger("the first job started", |l| {
        l.started.contains_key(first.as_str())
    })
    .await;
    let job = task::enqueue_with(
        &env.queue,
        EnqueueOptions::new().max_attempts(1),
        env.task(1),
    )
    .await
    .unwrap();
    let _: () = redis::cmd("CLIENT")
        .arg(&["PAUSE", &pause.as_millis().to_string(), "WRITE"][..])
        .query_async(&mut redis_conn(&env.url).await)
        .await
        .unwrap();
    wait_until(T, "the job completes or dies", || async {
        counter(&env.queue, "completed").await == 2 || counter(&env.queue, "dead").await > 0
    })
    .await;
    worker.stop().await;
    assert_eq!(counter(&env.queue, "dead").await, 0, "not dead-lettered");
    let ledger = env.ledger().await;
    assert_eq!(ledger.started.get(job.id.as_str()), Some(&1), "ran once");
    assert_eq!(ledger.effects.get(job.id.as_str()), Some(&1));
}

/// Item 3: a job whose `type` is not UTF-8 is dead-lettered alone, with a
/// reason naming the field; the other jobs of the same fetch run.
#[tokio::test]
async fn one_unreadable_job_is_dead_lettered_and_the_rest_of_its_batch_runs() {
    let (_server, url, queue) = redis_and_queue().await;
    let mut ids = Vec::new();
    for _ in 0..3 {
        ids.push(task::enqueue(&queue, a_task(&url)).await.unwrap());
    }
    let keys = QueueKeys::new("tasks");
    let _: () = redis_conn(&url)
        .await
        .hset(keys.job(ids[1].as_str()), "type", b"\xff\xfe".as_slice())
        .await
        .unwrap();
    let (stop, join) = spawn_worker(&url, fast_config()).await;
    wait_until(T, "two jobs complete and one dies", || async {
        counter(&queue, "completed").await == 2 && counter(&queue, "dead").await == 1
    })
    .await;
    stop.shutdown();
    join.await.unwrap().unwrap();
    let dead = queue.job("tasks", &ids[1]).await.unwrap().expect("kept");
    assert_eq!(dead.state(), Some("dead"));
    let reason = dead.field("dead_reason").unwrap_or_default();
    assert!(
        reason.contains("type"),
        "the reason names the field: {reason}"
    );
    let ledger = Ledger::read(&url).await;
    for good in [&ids[0], &ids[2]] {
        assert_eq!(ledger.effects.get(good.as_str()), Some(&1));
    }
}

/// Hands an idle worker (blocked in `BLMOVE`, so the job goes through
/// `claim.lua`) job `id` with `extra` fields and a claim row that does not
/// decode: a schema version that is not a number, as a producer in another
/// language may write. Waits until `queue`'s statistics satisfy `done`.
async fn unreadable_through_blocked_fetch(
    env: &TestEnv,
    id: &str,
    extra: &[(&str, &str)],
    done: impl Fn(&queue_core::QueueStats) -> bool,
) {
    let worker = env.spawn_worker(fast_config()).await;
    env.wait_blocked_client(None).await;
    let mut fields = vec![
        ("id", id),
        ("state", "queued"),
        ("type", "task"),
        ("v", "x"),
        ("attempts", "0"),
        ("max_attempts", "5"),
    ];
    fields.extend_from_slice(extra);
    env.seed_job("tasks", id, &fields).await;
    env.wait_stats("tasks", "the unreadable job ended", done)
        .await;
    worker.stop().await;
}

/// An unreadable job taken by a blocked fetch is dead-lettered at once with
/// the reason, after one attempt: before, the claim's decoding error was
/// only logged, the job stayed leased and each watchdog return burned
/// another attempt until "attempts exhausted" (DESIGN rule 9). No watchdog
/// runs here.
#[tokio::test]
async fn an_unreadable_job_taken_by_a_blocked_fetch_is_dead_lettered_with_its_reason() {
    let env = TestEnv::start().await;
    unreadable_through_blocked_fetch(&env, "odd-1", &[], |s| s.counter("dead") == 1).await;
    let dead = env
        .queue
        .job("tasks", "odd-1")
        .await
        .unwrap()
        .expect("kept");
    assert_eq!(dead.state(), Some("dead"));
    let reason = dead.field("dead_reason").unwrap_or_default();
    assert!(
        reason.contains("schema version"),
        "the reason names the field: {reason}"
    );
    assert_eq!(
        dead.field("attempts"),
        Some("1"),
        "one attempt, not all five"
    );
}

/// An unreadable job an operator asked to cancel ends cancelled: `fail.lua`
/// answers `cancel_requested` and writes nothing, so the worker ends it
/// with `finish_cancel.lua` (before, that answer counted as done and the
/// job stayed leased).
#[tokio::test]
async fn an_unreadable_job_with_a_cancel_request_ends_cancelled() {
    let env = TestEnv::start().await;
    let extra = [("cancel_requested", "1")];
    unreadable_through_blocked_fetch(&env, "odd-2", &extra, |s| s.counter("cancelled") == 1).await;
    let s = env.stats("tasks").await;
    assert_eq!((s.processing, s.counter("dead")), (0, 0));
    let rec = env.queue.completion("tasks", "odd-2").await.unwrap();
    let status = rec.as_ref().and_then(|r| r.get("status").cloned());
    assert_eq!(status.as_deref(), Some("cancelled"));
}

/// A `task` job of `tasks` whose delivery's lease expired, as a worker that
/// died mid-job leaves it (main is left empty).
async fn expired_delivery(url: &str, queue: &Queue, c: &mut redis::aio::MultiplexedConnection) {
    let id = task::enqueue(queue, a_task(url)).await.unwrap();
    let k = QueueKeys::new("tasks");
    let _: () = c.lpop(&k.main, None).await.unwrap();
    let _: () = c.lpush(&k.processing, id.as_str()).await.unwrap();
    let _: () = c
        .hset_multiple(
            k.job(id.as_str()),
            &[("state", "active"), ("attempts", "1")],
        )
        .await
        .unwrap();
    let _: () = c.zadd(&k.leases, id.as_str(), 1).await.unwrap();
}

/// Item 4: a queue whose pass fails (its leases key has the wrong type) is
/// counted and logged; the queue after it still gets its pass.
#[tokio::test]
async fn one_failing_queue_does_not_stop_the_watchdog_for_the_others() {
    let (_server, url, queue) = redis_and_queue().await;
    let mut c = redis_conn(&url).await;
    let _: () = c
        .set(QueueKeys::new("broken").leases, "not a zset")
        .await
        .unwrap();
    // An expired delivery on `tasks`, the queue after the broken one.
    expired_delivery(&url, &queue, &mut c).await;

    let watchdog = Watchdog::connect(&url, ["broken", "tasks"], fast_watchdog())
        .await
        .unwrap();
    let report = watchdog.run_once().await.unwrap();
    assert_eq!(report.failed_queue_passes, 1);
    assert_eq!(report.reclaimed, 1, "the second queue got its pass");
}

/// A queue whose reclaim succeeds and whose promote then fails (its main
/// list holds another type): the pass is counted failed, and the delivery it
/// returned is still in the report (and the metrics and the log). Before,
/// the failing step returned early and the whole queue's report was dropped:
/// `reclaimed` read 0 for a job the script had moved.
#[tokio::test]
async fn a_failing_step_after_the_reclaim_keeps_its_count() {
    let (_server, url, queue) = redis_and_queue().await;
    let mut c = redis_conn(&url).await;
    expired_delivery(&url, &queue, &mut c).await;
    let _: () = c
        .set(QueueKeys::new("tasks").main, "not a list")
        .await
        .unwrap();

    let watchdog = Watchdog::connect(&url, ["tasks"], fast_watchdog())
        .await
        .unwrap();
    let report = watchdog.run_once().await.unwrap();
    assert_eq!(report.failed_queue_passes, 1, "the promote failed");
    assert_eq!(report.reclaimed, 1, "{report:?}");
    let counted: i64 = c
        .hget(QueueKeys::new("tasks").stats, "reclaimed")
        .await
        .unwrap();
    assert_eq!(counted, 1, "the script did return it");
}

/// Item 9: when the blocking connection of the second queue cannot be made,
/// `run_until` fails and no fetcher of the first queue is left running.
#[tokio::test]
async fn a_worker_that_cannot_connect_every_fetcher_leaves_none_running() {
    let (_server, url, queue) = redis_and_queue().await;
    let worker = Worker::builder(&url)
        .register(urgent::handler())
        .register(routine::handler())
        .config(fast_config())
        .build()
        .await
        .unwrap();
    let mut admin = redis_conn(&url).await;
    let info: String = redis::cmd("INFO")
        .arg("clients")
        .query_async(&mut admin)
        .await
        .unwrap();
    let clients: u64 = info
        .lines()
        .find_map(|l| l.strip_prefix("connected_clients:"))
        .and_then(|n| n.trim().parse().ok())
        .expect("connected_clients");
    // Room for exactly one more connection: the first fetcher's.
    let _: () = redis::cmd("CONFIG")
        .arg(&["SET", "maxclients", &(clients + 1).to_string()][..])
        .query_async(&mut admin)
        .await
        .unwrap();
    let result = worker.run_until(std::future::pending()).await;
    assert!(result.is_err(), "the second blocking connection fails");
    let _: () = redis::cmd("CONFIG")
        .arg(&["SET", "maxclients", "10000"][..])
        .query_async(&mut admin)
        .await
        .unwrap();
    urgent::enqueue(&queue, a_task(&url)).await.unwrap();
    routine::enqueue(&queue, a_task(&url)).await.unwrap();
    // Nothing may take them: give a detached fetcher ample time to.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    for q in ["high", "low"] {
        let waiting: u64 = admin.llen(QueueKeys::new(q).main).await.unwrap();
        assert_eq!(waiting, 1, "queue {q}: no fetcher is running");
    }
}

/// A hand-written `Job` whose `run` panics before it returns its future.
struct PanicsBeforeItsFuture;
impl Job for PanicsBeforeItsFuture {
    type Args = ();
    const NAME: &'static str = "panics_before_its_future";
    const QUEUE: &'static str = "early_panics";
    const MAX_ATTEMPTS: u32 = 3;
    fn run(_ctx: JobContext, _args: ()) -> BoxFuture<'static, Result<(), JobError>> {
        panic!("no future today")
    }
}

/// A panic in a hand-written `Job::run` (or in the payload's decode), before
/// the handler's future exists, is the handler's panic: a retry with the
/// reason recorded, then dead-lettered. It used to unwind the runner outside
/// its `catch_unwind`: the job stayed active and leased with no reason, and
/// every delivery repeated that (here, with no watchdog, for ever).
#[tokio::test]
async fn a_job_whose_run_panics_before_its_future_records_the_panic() {
    let env = TestEnv::start().await;
    let id = env
        .queue
        .enqueue::<PanicsBeforeItsFuture>(&())
        .await
        .unwrap();
    let worker = env
        .spawn_worker_for(Registration::of::<PanicsBeforeItsFuture>(), fast_config())
        .await;
    let queue = PanicsBeforeItsFuture::QUEUE;
    wait_until(
        BOUND,
        "the panic recorded as the job's last error",
        || async {
            let job = env.queue.job(queue, &id).await.unwrap();
            job.and_then(|j| j.field("last_error").map(str::to_owned))
                .is_some_and(|e| e.contains("panicked: no future today"))
        },
    )
    .await;
    env.wait_stats(queue, "dead-lettered after 3 attempts", |s| s.dead == 1)
        .await;
    worker.stop().await;
}

/// A job type whose deadline is "for ever".
struct ForEver;
impl Job for ForEver {
    type Args = ();
    const NAME: &'static str = "for_ever";
    const QUEUE: &'static str = "for_ever";
    const DEADLINE: Option<Duration> = Some(Duration::MAX);
    fn run(_ctx: JobContext, _args: ()) -> BoxFuture<'static, Result<(), JobError>> {
        Box::pin(async { Ok(()) })
    }
}

/// `DEADLINE = Some(Duration::MAX)` is no budget to enforce: the job runs
/// and completes. Its budget (claim time + the deadline) overflowed the
/// clock and panicked every delivery of the type, leaving it leased.
#[tokio::test]
async fn a_deadline_of_for_ever_runs_the_job() {
    let env = TestEnv::start().await;
    let id = env.queue.enqueue::<ForEver>(&()).await.unwrap();
    let worker = env
        .spawn_worker_for(Registration::of::<ForEver>(), fast_config())
        .await;
    env.wait_completed(ForEver::QUEUE, 1).await;
    worker.stop().await;
    assert_eq!(env.completion_attempts(ForEver::QUEUE, &id).await, 1);
}

/// Panics when dropped: a guard that must be committed, or a blocking client
/// dropped in async code.
struct PanicsWhenDropped;
impl Drop for PanicsWhenDropped {
    fn drop(&mut self) {
        panic!("dropped without being committed");
    }
}

/// A handler that outlives its timeout holding a [`PanicsWhenDropped`].
struct TimesOutAndPanicsWhenDropped;
impl Job for TimesOutAndPanicsWhenDropped {
    type Args = ();
    const NAME: &'static str = "times_out_and_panics_when_dropped";
    const QUEUE: &'static str = "drop_panics";
    const MAX_ATTEMPTS: u32 = 2;
    const TIMEOUT: Option<Duration> = Some(Duration::from_millis(1500));
    fn run(_ctx: JobContext, _args: ()) -> BoxFuture<'static, Result<(), JobError>> {
        Box::pin(async {
            let _guard = PanicsWhenDropped;
            tokio::time::sleep(Duration::from_secs(600)).await;
            Ok(())
        })
    }
}

/// A handler whose future panics when dropped at its timeout, after its
/// heartbeat started (lease 2 s, first beat at ~0.67 s, timeout 1.5 s): the
/// timeout is recorded as a retry, then the job is dead-lettered after its 2
/// attempts. Before, the drop's panic unwound the runner and dropped the
/// heartbeat's handle, which detaches the task: it went on extending the
/// lease of a job nothing ran any more, and the job stayed active for ever
/// (the watchdog never saw its lease expire).
#[tokio::test]
async fn a_handler_that_panics_when_dropped_at_its_timeout_is_retried_not_kept_leased() {
    let env = TestEnv::start().await;
    let id = env
        .queue
        .enqueue::<TimesOutAndPanicsWhenDropped>(&())
        .await
        .unwrap();
    let worker = env
        .spawn_worker_for(
            Registration::of::<TimesOutAndPanicsWhenDropped>(),
            fast_config(),
        )
        .await;
    let queue = TimesOutAndPanicsWhenDropped::QUEUE;
    env.wait_stats(queue, "dead-lettered after 2 timed-out attempts", |s| {
        s.dead == 1
    })
    .await;
    let job = env.queue.job(queue, &id).await.unwrap().expect("dead job");
    let reason = job.field("last_error").unwrap_or_default().to_string();
    assert!(reason.contains("timed out"), "{reason}");
    worker.stop().await;
}

/// Runs of [`TracedRuns`].
static TRACED_RUNS: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

/// A job that counts its runs, in a queue of its own.
struct TracedRuns;
impl Job for TracedRuns {
    type Args = ();
    const NAME: &'static str = "traced_runs";
    const QUEUE: &'static str = "traced";
    fn run(_ctx: JobContext, _args: ()) -> BoxFuture<'static, Result<(), JobError>> {
        TRACED_RUNS.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Box::pin(async { Ok(()) })
    }
}

/// Runs of [`OneShotTraced`].
static ONE_SHOT_RUNS: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

/// A job with one attempt that counts its runs, in a queue of its own.
struct OneShotTraced;
impl Job for OneShotTraced {
    type Args = ();
    const NAME: &'static str = "one_shot_traced";
    const QUEUE: &'static str = "one_shot_traced";
    const MAX_ATTEMPTS: u32 = 1;
    fn run(_ctx: JobContext, _args: ()) -> BoxFuture<'static, Result<(), JobError>> {
        ONE_SHOT_RUNS.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Box::pin(async { Ok(()) })
    }
}

/// A panic in the fetcher's task (here a tracing layer of the user's, at
/// the event the fetcher logs for a listed id whose job hash is gone) does
/// not end the queue's fetching: the fetcher starts again, and the jobs of
/// the fetch it was dispatching, left leased, are returned by the watchdog
/// and run. Before, the fetcher's task ended with the panic and the worker
/// went on without it: the queue was never served again by that worker
/// (stop 47).
#[tokio::test]
async fn a_fetcher_that_panics_is_started_again() {
    let _tracing = PanickingLayer::at_first_info_event_of("queue_core::worker::fetcher").install();
    let env = TestEnv::start().await;
    let keys = QueueKeys::new(TracedRuns::QUEUE);
    let mut c = redis_conn(&env.url).await;
    let _: () = c.lpush(&keys.main, "ghost").await.unwrap();
    for _ in 0..2 {
        env.queue.enqueue::<TracedRuns>(&()).await.unwrap();
    }
    let stop_watchdog = start_watchdog(&env.url, TracedRuns::QUEUE);
    let worker = env
        .spawn_worker_for(Registration::of::<TracedRuns>(), fast_config())
        .await;
    wait_until(BOUND, "both jobs run once the fetcher is back", || async {
        TRACED_RUNS.load(std::sync::atomic::Ordering::SeqCst) == 2
    })
    .await;
    env.queue.enqueue::<TracedRuns>(&()).await.unwrap();
    wait_until(BOUND, "a job enqueued after is run", || async {
        TRACED_RUNS.load(std::sync::atomic::Ordering::SeqCst) == 3
    })
    .await;
    env.wait_stats(TracedRuns::QUEUE, "all three acked", |s| {
        (s.main, s.processing) == (0, 0) && s.counters.get("completed") == Some(&3)
    })
    .await;
    worker.stop().await;
    let _ = stop_watchdog.send(());
}

/// A tracing layer of the user's that panics at every job span costs the
/// jobs their spans, not their runs: each job of one attempt runs once and
/// none is dead-lettered. With the panic unwinding the fetcher instead (the
/// first stop-47 fix: restarted after a pause), every fetch stranded its
/// jobs leased, and the watchdog dead-lettered them unrun (skeptic review).
#[tokio::test]
async fn a_tracing_layer_that_panics_at_every_job_span_burns_no_job() {
    let _tracing = PanickingLayer::at_every_job_span().install();
    ten_jobs_of_one_attempt_all_run::<OneShotTraced>(&ONE_SHOT_RUNS).await;
}

/// Scenario: ten jobs of `J` (one attempt, counting its runs in `runs`),
/// a worker and a watchdog, under the panicking tracing layer the test
/// installed: all ten complete, each ran once, none is dead-lettered.
async fn ten_jobs_of_one_attempt_all_run<J: Job<Args = ()>>(runs: &std::sync::atomic::AtomicU32) {
    let env = TestEnv::start().await;
    for _ in 0..10 {
        env.queue.enqueue::<J>(&()).await.unwrap();
    }
    let stop_watchdog = start_watchdog(&env.url, J::QUEUE);
    let worker = env
        .spawn_worker_for(Registration::of::<J>(), fast_config())
        .await;
    env.wait_stats(J::QUEUE, "all ten acked", |s| {
        s.counters.get("completed") == Some(&10)
    })
    .await;
    let stats = env.queue.stats(J::QUEUE).await.unwrap();
    assert_eq!(stats.dead, 0, "{stats:?}");
    assert_eq!(runs.load(std::sync::atomic::Ordering::SeqCst), 10);
    worker.stop().await;
    let _ = stop_watchdog.send(());
}

/// Runs of [`OneShotStarted`].
static STARTED_RUNS: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

/// A job with one attempt that counts its runs, in a queue of its own (not
/// [`OneShotTraced`]'s: `cargo test` runs this file's tests in one process).
struct OneShotStarted;
impl Job for OneShotStarted {
    type Args = ();
    const NAME: &'static str = "one_shot_started";
    const QUEUE: &'static str = "one_shot_started";
    const MAX_ATTEMPTS: u32 = 1;
    fn run(_ctx: JobContext, _args: ()) -> BoxFuture<'static, Result<(), JobError>> {
        STARTED_RUNS.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Box::pin(async { Ok(()) })
    }
}

/// A tracing layer (or metrics recorder) of the user's that panics at the
/// event a runner logs when a job starts, after its claim and before its
/// handler: the job runs anyway. Before, the runner ended with the panic,
/// the job stayed leased, and the watchdog dead-lettered every job of one
/// attempt without its handler ever running (stop 48 review).
#[tokio::test]
async fn a_tracing_layer_that_panics_when_a_job_starts_burns_no_job() {
    let _tracing =
        PanickingLayer::at_every_event("queue_core::worker::runner", "started").install();
    ten_jobs_of_one_attempt_all_run::<OneShotStarted>(&STARTED_RUNS).await;
}

/// Runs of [`CountsRuns`].
static RUNS: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

/// A job that counts its runs.
struct CountsRuns;
impl Job for CountsRuns {
    type Args = ();
    const NAME: &'static str = "counts_runs";
    const QUEUE: &'static str = "bytes_ids";
    const MAX_ATTEMPTS: u32 = 2;
    fn run(_ctx: JobContext, _args: ()) -> BoxFuture<'static, Result<(), JobError>> {
        RUNS.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Box::pin(async { Ok(()) })
    }
}

/// A job whose id is not UTF-8 (another producer's bytes, which
/// docs/PROTOCOL.md forbids and the script does not check) is never run:
/// the worker could not ack it (every call after the claim names the job by
/// its id's text, which is not its key), so it is left leased and the
/// watchdog dead-letters it when its attempts run out. Before, it ran, its
/// ack answered "lease lost", and it ran again at every delivery: its side
/// effect repeated `max_attempts` times, then it was dead-lettered anyway
/// (stop 46 review).
#[tokio::test]
async fn a_job_whose_id_is_not_utf8_is_never_run() {
    let env = TestEnv::start().await;
    let keys = QueueKeys::new(CountsRuns::QUEUE);
    let id: &[u8] = b"a\xffb";
    let mut jobkey = keys.job_prefix.as_bytes().to_vec();
    jobkey.extend_from_slice(id);
    let mut c = redis_conn(&env.url).await;
    let now: (u64, u64) = redis::cmd("TIME").query_async(&mut c).await.unwrap();
    let enqueued_at = (now.0 * 1000 + now.1 / 1000).to_string();
    let _: () = redis::cmd("HSET")
        .arg(&jobkey)
        .arg(&[&b"id"[..], id])
        .arg(&["type", CountsRuns::NAME, "v", "1", "max_attempts", "2"])
        .arg(&[
            "attempts",
            "0",
            "state",
            "queued",
            "enqueued_at",
            &enqueued_at,
        ])
        .arg("payload")
        .arg(&b"\xc0"[..])
        .query_async(&mut c)
        .await
        .unwrap();
    let _: () = redis::cmd("LPUSH")
        .arg(&keys.main)
        .arg(id)
        .query_async(&mut c)
        .await
        .unwrap();
    let watchdog = start_watchdog(&env.url, CountsRuns::QUEUE);
    let worker = env
        .spawn_worker_for(Registration::of::<CountsRuns>(), fast_config())
        .await;
    env.wait_stats(
        CountsRuns::QUEUE,
        "dead-lettered, its attempts spent",
        |s| s.dead == 1,
    )
    .await;
    assert_eq!(RUNS.load(std::sync::atomic::Ordering::SeqCst), 0);
    worker.stop().await;
    let _ = watchdog.send(());
}
