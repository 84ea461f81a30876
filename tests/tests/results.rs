//! Deadlines, progress and typed results (docs/RESULTS.md), against real
//! redis-servers: a typed value produced by a `test-worker` process and
//! awaited by this producer without polling; progress on the job while it
//! runs; start deadlines (`expires_in`) of waiting and delayed jobs; the
//! execution deadline (`#[job(deadline = "1s")]`) across attempts.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use queue_core::admin::Admin;
use queue_core::{Backoff, EnqueueOptions, JobId, QueueKeys, WaitError, WorkerConfig};
use queue_tests::results_jobs::{self, budgeted, square, Budgeted, Square, Squared};
use queue_tests::{fast_config, init_tracing, wait_until, TestEnv, WorkerHandle, WorkerProcess};
use redis::AsyncCommands;

const T: Duration = Duration::from_secs(30);
const WORKER_BIN: &str = env!("CARGO_BIN_EXE_test-worker");

/// `n` `test-worker` processes that also run the results jobs.
fn result_workers(url: &str, n: usize) -> Vec<WorkerProcess> {
    (0..n)
        .map(|_| {
            let child = std::process::Command::new(WORKER_BIN)
                .args([url, "2", "2000", "5000"])
                .env(results_jobs::ENV, "1")
                .env_remove("QUEUE_FAILPOINT")
                .stdin(std::process::Stdio::null())
                .spawn()
                .expect("test-worker starts");
            WorkerProcess { child }
        })
        .collect()
}

#[tokio::test]
async fn typed_results_reach_the_producer_from_worker_processes_without_polling() {
    init_tracing();
    let env = TestEnv::start().await;
    let keys = QueueKeys::new(square::QUEUE);
    let mut conn = env.conn().await;
    let _workers = result_workers(&env.url, 2);

    // Waiting before the job even runs: woken by the ack, with progress seen meanwhile.
    let slow = Square {
        n: 7,
        sleep_ms: 800,
        ..Square::default()
    };
    let id = square::enqueue(&env.queue, slow).await.unwrap();
    let waiter = {
        let (queue, id) = (env.queue.clone(), id.clone());
        tokio::spawn(async move { queue.wait_result::<square::Job>(id, T).await })
    };
    let second = {
        let (queue, id) = (env.queue.clone(), id.clone());
        tokio::spawn(async move { queue.wait_result::<square::Job>(id, T).await })
    };
    wait_until(T, "progress 50 on the running job", || async {
        let job = env.queue.job(square::QUEUE, id.clone()).await.unwrap();
        job.is_some_and(|j| {
            j.field("progress") == Some("50") && j.field("progress_message") == Some("half way")
        })
    })
    .await;
    // Only the round trips of this producer's connection: the two waiters
    // each ran result_wait.lua once and then blocked (no polling).
    let got: Squared = waiter.await.unwrap().unwrap();
    assert_eq!((got.n, got.square), (7, 49));
    assert_ne!(got.pid, std::process::id(), "produced by a worker process");
    assert_eq!(second.await.unwrap().unwrap(), got, "every waiter is woken");

    // Already finished: answered at once from the completion record.
    let again = env
        .queue
        .wait_result::<square::Job>(id.clone(), Duration::from_millis(1))
        .await
        .unwrap();
    assert_eq!(again, got);

    // Enqueue and wait in one call.
    let args = Square {
        n: 12,
        ..Square::default()
    };
    // Woken by the completion, not answered at the end of its wait: the
    // wait's own timeout is an hour (a waiter that missed its wake-up would
    // find the result only then), the outer bound of T only catches that.
    // (Before, a 5 s bound with the wait's timeout T.)
    let started = Instant::now();
    let got = tokio::time::timeout(
        T,
        env.queue
            .enqueue_and_wait::<square::Job>(&args, Duration::from_secs(3600)),
    )
    .await
    .expect("woken by the completion, not by the end of its hour")
    .unwrap();
    assert_eq!(got.square, 144);
    eprintln!("enqueue_and_wait round trip: {:?}", started.elapsed());

    // A job nobody waits for leaves no notification key.
    let quiet = square::enqueue(
        &env.queue,
        Square {
            n: 3,
            ..Square::default()
        },
    )
    .await
    .unwrap();
    wait_until(T, "quiet job completed", || async {
        env.queue
            .completion(square::QUEUE, quiet.clone())
            .await
            .unwrap()
            .is_some()
    })
    .await;
    let notify: bool = conn.exists(keys.notify(quiet.as_str())).await.unwrap();
    assert!(!notify, "no notification key without a waiter");

    // Errors are typed: dead-lettered, timeout, unknown, cancelled.
    let failing = Square {
        fail: true,
        ..Square::default()
    };
    let err = env
        .queue
        .enqueue_and_wait::<square::Job>(&failing, T)
        .await
        .unwrap_err();
    assert!(
        matches!(&err, WaitError::Dead { reason, .. } if reason.contains("planned failure")),
        "{err}"
    );
    let long = Square {
        n: 1,
        sleep_ms: 3000,
        ..Square::default()
    };
    let id = square::enqueue(&env.queue, long).await.unwrap();
    let err = env
        .queue
        .wait_result::<square::Job>(id, Duration::from_millis(300))
        .await
        .unwrap_err();
    assert!(matches!(err, WaitError::Timeout { .. }), "{err}");
    let err = env
        .queue
        .wait_result::<square::Job>("never-enqueued", T)
        .await
        .unwrap_err();
    assert!(matches!(err, WaitError::NotFound { .. }), "{err}");
    let delayed = square::enqueue_with(
        &env.queue,
        EnqueueOptions::new().delay(Duration::from_secs(60)),
        Square::default(),
    )
    .await
    .unwrap()
    .id;
    let waiter = {
        let (queue, id) = (env.queue.clone(), delayed.clone());
        tokio::spawn(async move { queue.wait_result::<square::Job>(id, T).await })
    };
    wait_until(T, "the waiter registered", || async {
        let job = env.queue.job(square::QUEUE, delayed.clone()).await.unwrap();
        job.is_some_and(|j| j.field("notify").is_some())
    })
    .await;
    env.queue.cancel(square::QUEUE, delayed).await.unwrap();
    let err = waiter.await.unwrap().unwrap_err();
    assert!(matches!(err, WaitError::Cancelled { .. }), "{err}");
}

#[tokio::test]
async fn expired_jobs_never_run_whether_waiting_or_retried_after_their_deadline() {
    init_tracing();
    let env = TestEnv::start().await;
    // Waiting in main past its deadline (no worker yet); a waiter is woken by the dead-letter.
    let passed = std::time::SystemTime::now() - Duration::from_millis(1);
    let opts = EnqueueOptions::new().id("late").deadline(passed);
    queue_tests::task::enqueue_with(&env.queue, opts, env.task(1))
        .await
        .unwrap();
    let on_time = env.enqueue(env.task(2)).await;
    let waiter = {
        let queue = env.queue.clone();
        tokio::spawn(async move {
            queue
                .wait_completion("tasks", &"late".into(), T)
                .await
                .map(drop)
        })
    };
    wait_until(T, "the waiter registered", || async {
        let job = env.queue.job("tasks", "late").await.unwrap();
        job.is_some_and(|j| j.field("notify").is_some())
    })
    .await;
    let worker = env.spawn_worker(fast_config()).await;
    env.wait_stats("tasks", "one expired, one completed", |s| {
        s.counter("expired") == 1 && s.counter("completed") == 1
    })
    .await;
    let err = waiter.await.unwrap().unwrap_err();
    assert!(err.is_expired(), "{err}");
    let ledger = env.ledger().await;
    assert_eq!(
        ledger.started.get("late"),
        None,
        "an expired job never runs"
    );
    assert_eq!(ledger.started.get(on_time.as_str()), Some(&1));
    let admin = Admin::connect(&env.url).await.unwrap();
    let detail = admin.job_detail("tasks", "late").await.unwrap().unwrap();
    assert_eq!(detail.field("state"), Some("dead"));
    assert!(
        detail.field("dead_reason").unwrap().starts_with("expired"),
        "{detail:?}"
    );
    worker.stop().await;

    // Retried after its deadline: the first attempt fails, the retry is due
    // (backoff 1 s) after the 500 ms deadline and never starts.
    let slow_retry = WorkerConfig {
        backoff: Backoff {
            base: Duration::from_secs(1),
            max: Duration::from_secs(1),
        },
        ..fast_config()
    };
    let worker = env.spawn_worker(slow_retry).await;
    let mut retried = env.task(3);
    retried.fail_first = 1;
    let opts = EnqueueOptions::new()
        .id("retried")
        .expires_in(Duration::from_millis(500));
    queue_tests::task::enqueue_with(&env.queue, opts, retried)
        .await
        .unwrap();
    env.wait_stats("tasks", "the retry expired", |s| s.counter("expired") == 2)
        .await;
    let ledger = env.ledger().await;
    assert_eq!(
        ledger.started.get("retried"),
        Some(&1),
        "the retry never started"
    );
    let job = env.queue.job("tasks", "retried").await.unwrap().unwrap();
    assert!(job.field("dead_reason").unwrap().starts_with("expired"));
    assert_eq!(job.attempts(), 1);
    let stats = env.stats("tasks").await;
    assert_eq!((stats.dead, stats.counter("dead")), (2, 2));
    worker.stop().await;
}

#[tokio::test]
async fn the_execution_deadline_spans_attempts_and_stops_the_handler() {
    init_tracing();
    let env = TestEnv::start().await;
    let config = WorkerConfig {
        backoff: Backoff {
            base: Duration::from_millis(100),
            max: Duration::from_millis(100),
        },
        ..fast_config()
    };
    let worker = WorkerHandle::start(
        queue_core::Worker::builder(&env.url)
            .register(budgeted::handler())
            .config(config),
    )
    .await;
    let enqueue = |id: &'static str, args: Budgeted| {
        let queue = env.queue.clone();
        async move {
            budgeted::enqueue_with_id(&queue, id, args).await.unwrap();
        }
    };
    // One attempt far longer than the budget: stopped after about 1 s. Its
    // handler sleeps an hour: only a stop ends it within the wait below.
    enqueue(
        "stuck",
        Budgeted {
            sleep_ms: 3_600_000,
            fail_first: 0,
        },
    )
    .await;
    // Two attempts of 600 ms: the second is stopped when the 1 s budget runs out.
    enqueue(
        "slow",
        Budgeted {
            sleep_ms: 600,
            fail_first: 1,
        },
    )
    .await;
    // Within the budget across two attempts: completes.
    enqueue(
        "quick",
        Budgeted {
            sleep_ms: 100,
            fail_first: 1,
        },
    )
    .await;
    // Within the wait's 60 s: a handler that was not stopped holds "stuck"
    // for its hour (before, a 5 s bound against a 10 s sleep).
    env.wait_stats(budgeted::QUEUE, "two dead, one completed", |s| {
        s.dead == 2 && s.counter("completed") == 1
    })
    .await;
    for id in ["stuck", "slow"] {
        let job = env.queue.job(budgeted::QUEUE, id).await.unwrap().unwrap();
        let reason = job.field("dead_reason").unwrap();
        assert!(reason.contains("deadline exceeded"), "{id}: {reason}");
    }
    let slow = env
        .queue
        .job(budgeted::QUEUE, "slow")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(slow.attempts(), 2);
    worker.stop().await;
}

/// Compact completion records (`WorkerConfig::compact_records`, the
/// default since stop 48; docs/OPERATIONS.md): a typed result reaches a
/// producer that waits before the job runs (woken by the ack) and one that
/// asks afterwards (read from the string record); `Queue::completion` reads
/// the record; a re-enqueue of the id is refused as completed.
#[tokio::test]
async fn typed_results_reach_the_producer_through_compact_records() {
    typed_results_reach_the_producer_through(true, "string").await;
}

/// The same with hash records (`compact_records: false`, for a deployment
/// that still runs a process older than stop 27).
#[tokio::test]
async fn typed_results_reach_the_producer_through_hash_records() {
    typed_results_reach_the_producer_through(false, "hash").await;
}

async fn typed_results_reach_the_producer_through(compact_records: bool, record_type: &str) {
    init_tracing();
    let env = TestEnv::start().await;
    let keys = QueueKeys::new(square::QUEUE);
    let worker = WorkerHandle::start(
        queue_core::Worker::builder(&env.url)
            .register(square::handler())
            .config(WorkerConfig {
                compact_records,
                ..fast_config()
            }),
    )
    .await;
    let args = Square {
        n: 7,
        sleep_ms: 300,
        ..Square::default()
    };
    let id = square::enqueue(&env.queue, args.clone()).await.unwrap();
    let waiter = {
        let (queue, id) = (env.queue.clone(), id.clone());
        tokio::spawn(async move { queue.wait_result::<square::Job>(id, T).await })
    };
    let got: Squared = waiter.await.unwrap().unwrap();
    assert_eq!((got.n, got.square), (7, 49));
    let again = env
        .queue
        .wait_result::<square::Job>(id.clone(), Duration::from_millis(1))
        .await
        .unwrap();
    assert_eq!(again, got, "answered from the string record");

    let mut conn = env.conn().await;
    let kind: String = redis::cmd("TYPE")
        .arg(keys.done(id.as_str()))
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(kind, record_type, "the record's form");
    let rec = env
        .queue
        .completion(square::QUEUE, id.clone())
        .await
        .unwrap()
        .expect("a completion record");
    assert_eq!(rec.get("status").map(String::as_str), Some("done"));
    assert_eq!(rec.get("attempts").map(String::as_str), Some("1"));
    assert!(
        rec.get("result").is_some_and(|r| r.starts_with("msgpack:")),
        "{rec:?}"
    );
    let dup = square::enqueue_with(&env.queue, EnqueueOptions::new().id(id.clone()), args)
        .await
        .unwrap();
    assert_eq!(dup.outcome, queue_core::EnqueueOutcome::AlreadyCompleted);
    worker.stop().await;
}

/// A start deadline too far to count ("never expires": `expires_in(Duration::MAX)`,
/// `deadline` in the far future) is stored as the largest count a script takes,
/// and the job runs. Before, the number was stored as given (above 2^53 − 1),
/// and the claim dead-lettered the job as "corrupt field expires_after" /
/// "expires_at": it never ran.
#[tokio::test]
async fn a_start_deadline_too_far_to_count_lets_the_job_run() {
    init_tracing();
    let env = TestEnv::start().await;
    let far = std::time::UNIX_EPOCH + Duration::from_secs(u64::MAX / 2);
    for opts in [
        EnqueueOptions::new().expires_in(Duration::MAX),
        EnqueueOptions::new().deadline(far),
    ] {
        queue_tests::task::enqueue_with(&env.queue, opts, env.task(0))
            .await
            .unwrap();
    }
    env.run_until_completed("tasks", 2).await;
    let stats = env.stats("tasks").await;
    assert_eq!((stats.dead, stats.counter("expired")), (0, 0));
}

/// Spawns `n` producers waiting for job `id` of the `tasks` queue (`timeout`
/// each), and waits until the job's `notify` field counts all of them.
async fn registered_waiters(
    env: &TestEnv,
    id: &JobId,
    n: usize,
    timeout: Duration,
) -> Vec<tokio::task::JoinHandle<Result<BTreeMap<String, Vec<u8>>, WaitError>>> {
    let waiters = (0..n)
        .map(|_| {
            let (queue, id) = (env.queue.clone(), id.clone());
            tokio::spawn(async move { queue.wait_completion("tasks", &id, timeout).await })
        })
        .collect();
    let want = n.to_string();
    wait_until(T, &format!("{n} waiters registered"), || async {
        let job = env.queue.job("tasks", id.clone()).await.unwrap();
        job.is_some_and(|j| j.field("notify") == Some(want.as_str()))
    })
    .await;
    waiters
}

/// The outcomes of `waiters`, each within `bound` (an outcome bound far
/// below the waiters' own timeout: a waiter nobody wakes would sit to it).
async fn outcomes<T>(waiters: Vec<tokio::task::JoinHandle<T>>, bound: Duration) -> Vec<T> {
    let mut out = Vec::new();
    for (i, w) in waiters.into_iter().enumerate() {
        let got = tokio::time::timeout(bound, w)
            .await
            .unwrap_or_else(|_| panic!("waiter {i} not woken within {bound:?}"));
        out.push(got.expect("the waiter's task"));
    }
    out
}

/// `Duration::MAX` is "no deadline": before, `Instant::now() + timeout`
/// panicked in every call, and the BLPOP seconds and the blocking
/// connection's response timeout would have overflowed next.
#[tokio::test]
async fn waiting_without_a_deadline_answers_instead_of_panicking() {
    init_tracing();
    let env = TestEnv::start().await;
    let err = env
        .queue
        .wait_completion("tasks", &JobId::from("never-enqueued"), Duration::MAX)
        .await
        .unwrap_err();
    assert!(matches!(err, WaitError::NotFound { .. }), "{err}");

    let id = env.enqueue(env.task(0)).await;
    let waiters = registered_waiters(&env, &id, 1, Duration::MAX).await;
    let worker = env.spawn_worker(fast_config()).await;
    for got in outcomes(waiters, T).await {
        let rec = got.unwrap();
        assert_eq!(rec.get("status").map(Vec::as_slice), Some(&b"done"[..]));
    }
    worker.stop().await;
}

/// More waiters than the finishing script pushes wakes (100): each woken
/// waiter passes its wake on, so all of them return. Before, waiter 101
/// slept until its own timeout.
#[tokio::test]
async fn every_one_of_more_than_a_hundred_waiters_is_woken() {
    init_tracing();
    let env = TestEnv::start().await;
    let keys = QueueKeys::new("tasks");
    let id = env.enqueue(env.task(0)).await;
    let waiters = registered_waiters(&env, &id, 101, T).await;
    let worker = env.spawn_worker(fast_config()).await;
    for got in outcomes(waiters, Duration::from_secs(10)).await {
        let rec = got.unwrap();
        assert_eq!(rec.get("status").map(Vec::as_slice), Some(&b"done"[..]));
    }
    // The relayed wakes stay bounded: at most the 100 the ack pushed.
    let mut conn = env.conn().await;
    let left: usize = conn.llen(keys.notify(id.as_str())).await.unwrap();
    assert!(left <= 100, "{left} wakes left on the notification list");
    worker.stop().await;
}

/// With `completion_retention` zero the ack writes no record, but it still
/// wakes the waiters, who find nothing: NotFound (docs/RESULTS.md). Before,
/// the wake sat inside the record branch and the waiter slept to its timeout.
#[tokio::test]
async fn an_ack_without_a_record_still_wakes_the_waiters() {
    init_tracing();
    let env = TestEnv::start().await;
    let id = env.enqueue(env.task(0)).await;
    let waiters = registered_waiters(&env, &id, 2, T).await;
    let worker = env
        .spawn_worker(WorkerConfig {
            completion_retention: Duration::ZERO,
            ..fast_config()
        })
        .await;
    for got in outcomes(waiters, Duration::from_secs(10)).await {
        let err = got.unwrap_err();
        assert!(matches!(err, WaitError::NotFound { .. }), "{err}");
    }
    env.wait_completed("tasks", 1).await;
    worker.stop().await;
}

/// A wait whose connections the server kills while it blocks (as Sentinel
/// does to the clients of a demoted primary at a failover) checks the job
/// again on a new connection and returns the record once the job is done.
/// Before, the `BLPOP`'s broken connection ended the wait with an error
/// although the job went on and completed.
#[tokio::test]
async fn a_wait_goes_on_after_the_server_kills_its_connections() {
    init_tracing();
    let env = TestEnv::start().await;
    let id = env.enqueue(env.task(0)).await;
    let waiters = registered_waiters(&env, &id, 1, T).await;
    env.wait_blocked_in("blpop", None).await;
    let mut admin = env.conn().await;
    // SKIPME (the default) spares the connection that sends it.
    let killed: u64 = redis::cmd("CLIENT")
        .arg("KILL")
        .arg("TYPE")
        .arg("normal")
        .query_async(&mut admin)
        .await
        .unwrap();
    assert!(killed >= 1, "the waiter's connections were killed");
    let worker = env.spawn_worker(fast_config()).await;
    for got in outcomes(waiters, Duration::from_secs(20)).await {
        let rec = got.unwrap();
        assert_eq!(rec.get("status").map(Vec::as_slice), Some(&b"done"[..]));
    }
    worker.stop().await;
}

/// Waits one after another reuse one blocking connection instead of
/// connecting for each (on Sentinel each connect asks every sentinel and
/// starts a watcher; on Cluster it builds a cluster client).
#[tokio::test]
async fn waits_one_after_another_reuse_one_blocking_connection() {
    init_tracing();
    let env = TestEnv::start().await;
    let id = env.enqueue(env.task(0)).await;
    let mut admin = env.conn().await;
    let received = |info: String| -> u64 {
        info.lines()
            .find_map(|l| l.strip_prefix("total_connections_received:"))
            .and_then(|n| n.trim().parse().ok())
            .expect("INFO stats has total_connections_received")
    };
    let info: String = redis::cmd("INFO")
        .arg("stats")
        .query_async(&mut admin)
        .await
        .unwrap();
    let before = received(info);
    for _ in 0..5 {
        // Nobody runs the job: each wait blocks, then times out.
        let err = env
            .queue
            .wait_completion("tasks", &id, Duration::from_millis(200))
            .await
            .unwrap_err();
        assert!(matches!(err, WaitError::Timeout { .. }), "{err}");
    }
    let info: String = redis::cmd("INFO")
        .arg("stats")
        .query_async(&mut admin)
        .await
        .unwrap();
    let opened = received(info) - before;
    assert_eq!(opened, 1, "five waits opened {opened} connections");
}

/// `enqueue_and_wait` on a `Queue` that cannot wait (made with
/// `Queue::from_connection`: no URL to open the blocking connection) is
/// refused before anything is enqueued. Before, the job was enqueued, then
/// the wait failed with a `Config` error naming no job: a job in main the
/// caller could neither wait for nor find.
#[tokio::test]
async fn enqueue_and_wait_on_a_queue_that_cannot_wait_enqueues_nothing() {
    let env = TestEnv::start().await;
    let queue = queue_core::Queue::from_connection(env.queue.connection());
    let err = queue
        .enqueue_and_wait::<square::Job>(&Square::default(), Duration::from_secs(1))
        .await
        .unwrap_err();
    assert!(
        matches!(err, WaitError::Queue(queue_core::QueueError::Config(_))),
        "{err}"
    );
    assert_eq!(env.stats(square::QUEUE).await.main, 0, "nothing enqueued");
}

/// A wait whose blocking connection cannot be opened after the enqueue (the
/// server refuses new clients) fails with an error naming the job, the only
/// handle on the job it wrote. Before, it was a `Connect` error naming
/// neither queue nor job.
#[tokio::test]
async fn a_wait_that_cannot_connect_after_the_enqueue_names_the_job() {
    let env = TestEnv::start().await;
    let queue = queue_core::Queue::connect(&env.url).await.unwrap();
    // Connects the queue's shared connection before the server is full.
    queue.stats(square::QUEUE).await.unwrap();
    let mut admin = env.conn().await;
    let clients: String = redis::cmd("INFO")
        .arg("clients")
        .query_async(&mut admin)
        .await
        .unwrap();
    let connected = clients
        .lines()
        .find_map(|l| l.strip_prefix("connected_clients:"))
        .and_then(|n| n.trim().parse::<u64>().ok())
        .unwrap();
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("maxclients")
        .arg(connected)
        .query_async(&mut admin)
        .await
        .unwrap();
    let err = queue
        .enqueue_and_wait::<square::Job>(&Square::default(), Duration::from_secs(5))
        .await
        .unwrap_err();
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("maxclients")
        .arg(10_000)
        .query_async(&mut admin)
        .await
        .unwrap();
    let WaitError::Queue(e) = &err else {
        panic!("expected a queue error, got {err}");
    };
    let main = env.list(&QueueKeys::new(square::QUEUE).main).await;
    assert_eq!(main.len(), 1, "the job was enqueued: {main:?}");
    assert_eq!(
        e.job_id().map(|j| j.to_string()),
        Some(main[0].clone()),
        "{err}"
    );
    assert_eq!(e.queue(), Some(square::QUEUE), "{err}");
}

/// A job whose result is `Args` bytes long (`set_result_ref`).
struct SizedResult;

impl queue_core::Job for SizedResult {
    type Args = usize;
    const NAME: &'static str = "sized_result";
    const QUEUE: &'static str = "sized";
    const MAX_ATTEMPTS: u32 = 3;
    fn run(
        ctx: queue_core::JobContext,
        len: usize,
    ) -> queue_core::BoxFuture<'static, Result<(), queue_core::JobError>> {
        Box::pin(async move {
            ctx.set_result_ref("r".repeat(len));
            Ok(())
        })
    }
}

/// Results of several MiB complete their jobs with the result kept, and
/// the small jobs acked beside them complete too: the acker sends at most
/// 64 MiB of results per `ack.lua` call, a larger result in a call of its
/// own. A result above `MAX_RESULT_BYTES` (511 MiB, not reproduced here: the
/// runner's unit test `a_result_over_the_limit_is_dropped_and_the_job_still_completes`)
/// is dropped and its job still completes. Before, a first version of the
/// fix dead-lettered any result above 4 MiB: a job whose work was done was
/// burned, and a replay did the work again.
#[tokio::test]
async fn large_results_complete_with_their_jobs_and_their_batch() {
    const BIG: usize = 5 * 1024 * 1024;
    let env = TestEnv::start().await;
    let mut ids = Vec::new();
    for len in [BIG, 16, BIG, 8] {
        ids.push((len, env.queue.enqueue::<SizedResult>(&len).await.unwrap()));
    }
    let builder = queue_tests::env::worker_on(
        &env.url,
        [queue_core::Registration::of::<SizedResult>()],
        fast_config(),
    );
    let worker = WorkerHandle::start(builder).await;
    env.wait_stats("sized", "four completed", |s| {
        s.counters.get("completed") == Some(&4)
    })
    .await;
    worker.stop().await;
    assert_eq!(env.stats("sized").await.dead, 0);
    for (len, id) in &ids {
        let record = env
            .queue
            .completion("sized", id)
            .await
            .unwrap()
            .unwrap_or_else(|| panic!("{id}: no completion record"));
        let kept = record.get("result").map_or(0, String::len);
        assert!(kept >= *len, "{id}: result of {kept} bytes kept, {len} set");
    }
}
