//! Group commit of concurrent single enqueues (`queue-core/src/enqueue_group.rs`):
//! many producers on one `Queue` share script calls, each caller still gets
//! its own result (a job refused by the script fails only its caller, a
//! duplicate id is reported to its caller), and a redis-server killed in the
//! middle leaves every caller with an error or an `Ok` whose job exists.

use std::collections::HashSet;
use std::time::Duration;

use queue_core::{EnqueueOptions, EnqueueOutcome, Enqueued, JobId, QueueError, QueueKeys};
use queue_tests::{task, TestEnv, BOUND};
use redis::AsyncCommands;
use tokio::task::JoinHandle;

/// Script calls the server ran so far (`INFO commandstats`): `FCALL` of
/// the queue-core library, and any `EVALSHA`.
async fn script_calls(env: &TestEnv) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(&mut env.conn().await)
        .await
        .unwrap();
    ["fcall", "evalsha"]
        .iter()
        .map(|c| queue_testkit::command_stat(&info, c, "calls"))
        .sum()
}

/// What caller `i` sends: every 7th job carries a core field name as an extra
/// field (refused by the script), every 5th uses one of a few shared stable
/// ids (all but one of those are duplicates), the rest get generated ids.
fn opts_of(i: u64) -> EnqueueOptions {
    let opts = EnqueueOptions::new();
    if i % 7 == 3 {
        opts.id(format!("bad-{i}")).extra_field("state", "done")
    } else if i.is_multiple_of(5) {
        opts.id(format!("shared-{}", i % 3))
    } else {
        opts
    }
}

#[tokio::test]
async fn concurrent_producers_share_script_calls_and_each_gets_its_own_result() {
    let env = TestEnv::start().await;
    let keys = QueueKeys::new("tasks");
    // Loads the script and counts from here.
    env.enqueue(env.task(0)).await;
    let before = script_calls(&env).await;
    const N: u64 = 400;
    let calls = (1..=N).map(|i| {
        let queue = env.queue.clone();
        let t = env.task(i);
        async move { (i, queue.enqueue_with::<task::Job>(opts_of(i), &t).await) }
    });
    let results: Vec<(u64, Result<Enqueued, QueueError>)> =
        tokio::time::timeout(BOUND, futures::future::join_all(calls))
            .await
            .expect("every caller answered");
    let scripts = script_calls(&env).await - before;
    assert!(
        scripts < N / 4,
        "{N} concurrent enqueues took {scripts} script calls: not grouped"
    );
    let mut conn = env.conn().await;
    let mut shared_created = HashSet::new();
    for (i, r) in results {
        if i % 7 == 3 {
            let err = r.expect_err("a core field name is refused");
            assert_eq!(err.queue(), Some("tasks"), "{err}");
            assert_eq!(
                err.job_id().map(|j| j.to_string()),
                Some(format!("bad-{i}"))
            );
            assert!(err.to_string().contains("core job field"), "{err}");
            assert!(!err.outcome_unknown(), "{err}");
            let exists: bool = conn.exists(keys.job(&format!("bad-{i}"))).await.unwrap();
            assert!(!exists, "a refused job is not written");
            continue;
        }
        let e = r.unwrap_or_else(|e| panic!("caller {i}: {e}"));
        let seq: Option<String> = conn.hget(keys.job(e.id.as_str()), "state").await.unwrap();
        assert_eq!(
            seq.as_deref(),
            Some("queued"),
            "caller {i}'s job {} exists",
            e.id
        );
        if i.is_multiple_of(5) {
            match e.outcome {
                EnqueueOutcome::Created => assert!(shared_created.insert(e.id.clone()), "{}", e.id),
                EnqueueOutcome::Duplicate { .. } => {}
                other => panic!("caller {i}: {other:?}"),
            }
        } else {
            assert!(e.is_new(), "caller {i}: {:?}", e.outcome);
        }
    }
    assert_eq!(
        shared_created.len(),
        3,
        "each shared id created exactly once"
    );
    let bad = (1..=N).filter(|i| i % 7 == 3).count() as u64;
    let shared = (1..=N)
        .filter(|i| i % 7 != 3 && i.is_multiple_of(5))
        .count() as u64;
    let waiting: u64 = conn.llen(&keys.main).await.unwrap();
    assert_eq!(waiting, 1 + N - bad - shared + 3);
}

#[tokio::test]
async fn a_server_killed_mid_batch_leaves_every_caller_an_error_or_a_written_job() {
    let mut env = TestEnv::start_with(&["--appendonly", "yes", "--appendfsync", "always"]).await;
    let queue = env
        .queue
        .clone()
        .with_retry_window(Duration::from_millis(200));
    env.enqueue(env.task(0)).await;
    let producers: Vec<_> = (0..24u64)
        .map(|p| {
            let queue = queue.clone();
            let t = env.task(p);
            tokio::spawn(async move {
                let mut ok = Vec::new();
                for k in 0.. {
                    let opts = EnqueueOptions::new().id(format!("p{p}-{k}"));
                    match queue.enqueue_with::<task::Job>(opts, &t).await {
                        Ok(e) => ok.push(e),
                        Err(e) => return (ok, e),
                    }
                }
                unreachable!()
            })
        })
        .collect();
    let keys = QueueKeys::new("tasks");
    queue_tests::wait_until(BOUND, "some jobs enqueued", || {
        let queue = env.queue.clone();
        async move { queue.stats("tasks").await.is_ok_and(|s| s.main >= 300) }
    })
    .await;
    env.server.kill();
    let mut oks = Vec::new();
    for p in producers {
        let (ok, err) = tokio::time::timeout(BOUND, p)
            .await
            .expect("every caller answered after the kill")
            .unwrap();
        assert_eq!(err.queue(), Some("tasks"), "{err}");
        assert!(err.job_id().is_some(), "the error names the job: {err}");
        oks.extend(ok);
    }
    env.server.restart().unwrap();
    let mut conn = queue_tests::redis_conn(&env.url).await;
    for e in &oks {
        assert!(e.is_new(), "{:?}", e);
        let exists: bool = conn.exists(keys.job(e.id.as_str())).await.unwrap();
        assert!(
            exists,
            "job {} was confirmed but is missing after the restart",
            e.id
        );
    }
    assert!(oks.len() >= 300, "{} confirmed", oks.len());
}

/// Producers that enqueue again as soon as they are answered (a producer
/// loop) are carried together by the next call: the lane waits one scheduler
/// turn for them. Before, the first of them led a call alone and the rest
/// followed in another, twice the calls (issue #12).
#[tokio::test]
async fn producers_answered_together_enqueue_again_in_one_call() {
    looping_producers_fill_each_call().await;
}

/// The same producers joined in the future a multi-threaded runtime's
/// `block_on` runs (not one of its workers: a `#[tokio::main]` body, the
/// benchmark's producers), where a deferred wake is an immediate one: the
/// turn still waits until every producer has enqueued again. A first stop-45
/// version ended the turn at the next poll of the lane's sender by any
/// caller: two calls per round (16 producers, 30,000 jobs: 3,750 calls
/// instead of 1,875).
#[test]
fn producers_in_block_on_of_a_multi_threaded_runtime_fill_each_call() {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
        .block_on(looping_producers_fill_each_call());
}

/// 16 producers each enqueue 40 jobs one after another, joined in one
/// future; expects about one script call per round.
async fn looping_producers_fill_each_call() {
    let env = TestEnv::start().await;
    env.enqueue(env.task(0)).await;
    const PRODUCERS: u64 = 16;
    const ROUNDS: u64 = 40;
    let before = script_calls(&env).await;
    let producers = (0..PRODUCERS).map(|p| {
        let queue = env.queue.clone();
        let t = env.task(p);
        async move {
            for _ in 0..ROUNDS {
                queue.enqueue::<task::Job>(&t).await.unwrap();
            }
        }
    });
    tokio::time::timeout(BOUND, futures::future::join_all(producers))
        .await
        .expect("every producer done");
    let calls = script_calls(&env).await - before;
    let jobs = PRODUCERS * ROUNDS;
    assert_eq!(env.queue.stats("tasks").await.unwrap().main, jobs + 1);
    // One call per round (each carrying the 16 producers), plus the lead of
    // the first round and a few split rounds; two per round before.
    assert!(
        calls <= ROUNDS * 5 / 4,
        "{jobs} jobs from {PRODUCERS} looping producers took {calls} script calls \
         ({:.1} jobs per call)",
        jobs as f64 / calls as f64
    );
}

/// A lone producer (one enqueue at a time) leads every call itself: when its
/// call returns with nobody waiting, the lane goes at once. Before, each call
/// left a hand-on task behind that yielded, found the lane empty and removed
/// it, and the producer's next enqueue joined that task instead of leading: a
/// task spawn and a wake-up per enqueue (issue #12, about a fifth of a lone
/// producer's CPU).
#[tokio::test]
async fn a_lone_producer_leaves_no_task_behind_its_enqueues() {
    let env = TestEnv::start().await;
    let metrics = tokio::runtime::Handle::current().metrics();
    for i in 0..20 {
        let before = metrics.num_alive_tasks();
        env.queue.enqueue::<task::Job>(&env.task(i)).await.unwrap();
        assert_eq!(
            metrics.num_alive_tasks(),
            before,
            "enqueue {i} left a task behind"
        );
    }
    assert_eq!(env.queue.stats("tasks").await.unwrap().main, 20);
}

/// A leader cancelled by its caller before its call went out (here: dropped
/// after its first poll) leaves its lane to the next turn: the callers that
/// joined it are answered, and the queue takes enqueues afterwards.
#[tokio::test]
async fn a_cancelled_leader_leaves_the_callers_behind_it_answered() {
    use futures::FutureExt;
    let env = TestEnv::start().await;
    env.enqueue(env.task(0)).await;
    // That call returned with nobody waiting, which removed its lane: the
    // next caller leads.
    let first = env.task(1);
    let leader = env.queue.enqueue::<task::Job>(&first);
    // One poll, then dropped: the leader yields its scheduler turn before it
    // sends, so this poll never completes it.
    assert!(
        leader.now_or_never().is_none(),
        "the leader yields before it sends"
    );
    let joined = (2..10).map(|i| {
        let queue = env.queue.clone();
        let t = env.task(i);
        async move { queue.enqueue::<task::Job>(&t).await }
    });
    let results = tokio::time::timeout(BOUND, futures::future::join_all(joined))
        .await
        .expect("the callers behind a cancelled leader are answered");
    for r in results {
        r.expect("enqueued");
    }
    tokio::time::timeout(BOUND, env.queue.enqueue::<task::Job>(&env.task(10)))
        .await
        .expect("the lane is not stuck")
        .expect("enqueued");
    // The cancelled leader's job went with the next turn, like a cancelled
    // waiter's: the first job, the leader's, 8 joined and the last.
    assert_eq!(env.queue.stats("tasks").await.unwrap().main, 11);
}

/// A caller alone in its lane and cancelled in its scheduler turn (polled
/// once, then dropped) leaves its job to the lane, and the lane sends it
/// without waiting for another enqueue: a dropped driver with jobs waiting
/// hands them to a task of its own, which ends when the lane is empty. Run
/// on several threads, where the drop of a lane's last driver handle can
/// meet an enqueue on another thread.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_lone_caller_leaves_its_job_to_the_lane() {
    use futures::FutureExt;
    let env = TestEnv::start().await;
    let keys = QueueKeys::new("tasks");
    let metrics = tokio::runtime::Handle::current().metrics();
    for round in 0..20u64 {
        let tasks = metrics.num_alive_tasks();
        let first = env.task(round);
        assert!(env
            .queue
            .enqueue::<task::Job>(&first)
            .now_or_never()
            .is_none());
        queue_tests::wait_until(BOUND, "the cancelled caller's job is sent", || async {
            env.list(&keys.main).await.len() as u64 == round + 1
        })
        .await;
        no_task_left_behind(tasks).await;
    }
}

/// Sixteen producer tasks on two threads, some of whose enqueues are
/// cancelled at any point (a timeout of a few microseconds: before they are
/// admitted, in their scheduler turn, while their call is in flight): every
/// enqueue that returns `Ok` has its job in main, exactly once; a cancelled
/// one's job is there at most once; nobody waits past the bound, and the
/// lanes leave no task behind. The drivers' drop paths (a lane's last
/// waiting caller gone, its jobs handed on) meet enqueues on the other
/// thread here.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn producers_with_cancelled_enqueues_lose_and_double_nothing() {
    let env = TestEnv::start().await;
    env.enqueue(env.task(0)).await;
    let metrics = tokio::runtime::Handle::current().metrics();
    let tasks = metrics.num_alive_tasks();
    const PRODUCERS: u64 = 16;
    const ROUNDS: u64 = 100;
    let producers: Vec<_> = (0..PRODUCERS)
        .map(|p| {
            let queue = env.queue.clone();
            let t = env.task(p);
            tokio::spawn(async move {
                let (mut ok, mut cancelled) = (Vec::new(), Vec::new());
                for r in 0..ROUNDS {
                    let id = format!("p{p}-r{r}");
                    let enqueue =
                        queue.enqueue_with::<task::Job>(EnqueueOptions::new().id(&id), &t);
                    if (p + r) % 3 == 0 {
                        let bound = Duration::from_micros((p * 37 + r * 11) % 400);
                        match tokio::time::timeout(bound, enqueue).await {
                            Ok(done) => ok.push((id, done.map(|_| ()))),
                            Err(_) => cancelled.push(id),
                        }
                    } else {
                        ok.push((id, enqueue.await.map(|_| ())));
                    }
                }
                (ok, cancelled)
            })
        })
        .collect();
    let (mut ok, mut cancelled) = (HashSet::new(), HashSet::new());
    for p in producers {
        let (o, c) = tokio::time::timeout(BOUND, p)
            .await
            .expect("every producer done")
            .expect("the task ran");
        for (id, r) in o {
            r.unwrap_or_else(|e| panic!("{id}: {e}"));
            ok.insert(id);
        }
        cancelled.extend(c);
    }
    no_task_left_behind(tasks).await;
    let main = env.list(&QueueKeys::new("tasks").main).await;
    let mut seen = HashSet::new();
    for id in &main {
        assert!(seen.insert(id.clone()), "{id} twice in main");
    }
    for id in &ok {
        assert!(seen.contains(id), "{id} answered Ok but not in main");
    }
    for id in seen.iter().filter(|id| id.starts_with('p')) {
        assert!(ok.contains(id) || cancelled.contains(id), "{id} unknown");
    }
    assert!(!cancelled.is_empty() && ok.len() > cancelled.len());
}

/// Waits (within the bound) until the runtime has no more tasks alive than
/// `tasks`, counted before the enqueues under test: they left none behind.
async fn no_task_left_behind(tasks: usize) {
    let metrics = tokio::runtime::Handle::current().metrics();
    queue_tests::wait_until(BOUND, "no task left behind", || async {
        metrics.num_alive_tasks() <= tasks
    })
    .await;
}

/// Eight callers (tasks 2 to 9) on `queue` that join the lane of a leader
/// admitted but not yet sending, each in a task of its own; returned once
/// they wait in the lane.
async fn join_the_lane(
    env: &TestEnv,
    queue: &queue_core::Queue,
) -> Vec<JoinHandle<Result<JobId, QueueError>>> {
    let joined = (2..10)
        .map(|i| {
            let queue = queue.clone();
            let t = env.task(i);
            tokio::spawn(async move { queue.enqueue::<task::Job>(&t).await })
        })
        .collect();
    // The joiners wait in the lane.
    tokio::time::sleep(Duration::from_millis(100)).await;
    joined
}

/// Awaits each of `joined` (within the bound) and expects its enqueue `Ok`.
async fn expect_enqueued(joined: Vec<JoinHandle<Result<JobId, QueueError>>>, who: &str) {
    for j in joined {
        let r = tokio::time::timeout(BOUND, j)
            .await
            .expect("answered")
            .expect("the task ran");
        r.unwrap_or_else(|e| panic!("{who} is enqueued: {e}"));
    }
}

/// A leader cancelled by its caller while the call carrying its joined
/// callers is in flight still leaves them answered, each job once: they
/// drive the call themselves (module doc of `enqueue_group.rs`), so the
/// leader's cancel does not reach it; writes are paused so that it is still
/// in flight when the leader is dropped. Before (stop 36), the leader sent
/// it in its own future and its cancel made each of them "outcome unknown";
/// then (stops 36–44), the call was finished in a task of its own, sent
/// again as a retry.
#[tokio::test]
async fn a_leader_cancelled_mid_call_leaves_its_joined_callers_answered() {
    let env = TestEnv::start().await;
    env.enqueue(env.task(0)).await;
    pause_writes(&env, Some(10_000)).await;
    let first = env.task(1);
    let mut leader = Box::pin(env.queue.enqueue::<task::Job>(&first));
    // First poll: the leader is admitted and yields its scheduler turn.
    assert!(futures::poll!(&mut leader).is_pending());
    let joined = join_the_lane(&env, &env.queue).await;
    // The call carrying the leader's job and the joined ones is held by the
    // pause; the leader, polled again, waits for its reply. Then it is
    // cancelled.
    env.wait_blocked_in("fcall", None).await;
    assert!(futures::poll!(&mut leader).is_pending());
    drop(leader);
    pause_writes(&env, None).await;
    expect_enqueued(joined, "a caller behind a leader cancelled mid-call").await;
    // Every job once: the first, the cancelled leader's and the 8 joined.
    assert_eq!(env.queue.stats("tasks").await.unwrap().main, 10);
}

/// Lets a lane's scheduler turn pass: the runtime runs out of ready tasks
/// (here the test's own sleeps) and wakes the lane's callers; a leader polled
/// after this sends its call.
async fn let_the_turn_pass() {
    tokio::time::sleep(Duration::from_millis(20)).await;
}

/// `CLIENT PAUSE <ms> WRITE` (or `CLIENT UNPAUSE` when `ms` is `None`) on
/// the test's server: write commands, scripts included, wait unanswered.
async fn pause_writes(env: &TestEnv, ms: Option<u64>) {
    let mut cmd = redis::cmd("CLIENT");
    match ms {
        Some(ms) => cmd.arg("PAUSE").arg(ms).arg("WRITE"),
        None => cmd.arg("UNPAUSE"),
    };
    let _: () = cmd.query_async(&mut env.conn().await).await.unwrap();
}

/// A caller with a zero retry window ("send once", docs/IDEMPOTENCY.md §1)
/// alone in its lane and cancelled while its call is in flight: the call is
/// not sent again (a job the call wrote could be claimed and acked before a
/// resend, which would write it a second time; with `completion_retention`
/// zero nothing tells it ran), and no task is left behind. Callers that
/// joined a zero-window caller's call go on driving it when that caller is
/// cancelled (module doc of `enqueue_group.rs`): each gets its own `Ok`, and
/// nothing is sent twice. Before (stop 44), the first caller sent the call
/// in its own future: its cancel sent nothing again and every joined caller
/// got "outcome unknown" for a cancel that was not theirs; before stop 36,
/// the call was always sent again once in a task of its own.
#[tokio::test]
async fn a_zero_retry_window_is_not_resent_after_its_leader_is_cancelled() {
    let env = TestEnv::start().await;
    env.enqueue(env.task(0)).await;
    let queue = env.queue.clone().with_retry_window(Duration::ZERO);
    let keys = QueueKeys::new("tasks");
    let metrics = tokio::runtime::Handle::current().metrics();

    // A lone leader: its call (its own job) is in its own future.
    let before = script_calls(&env).await;
    pause_writes(&env, Some(10_000)).await;
    let first = env.task(1);
    let mut leader = Box::pin(queue.enqueue::<task::Job>(&first));
    assert!(futures::poll!(&mut leader).is_pending());
    let_the_turn_pass().await;
    assert!(futures::poll!(&mut leader).is_pending());
    env.wait_blocked_in("fcall", None).await;
    let tasks = metrics.num_alive_tasks();
    drop(leader);
    assert_eq!(
        metrics.num_alive_tasks(),
        tasks,
        "the cancelled zero-window call was sent again in a task"
    );
    pause_writes(&env, None).await;
    // The call held by the pause ran once, when the pause ended.
    queue_tests::wait_until(BOUND, "the held call ran", || async {
        env.list(&keys.main).await.len() == 2
    })
    .await;
    assert_eq!(script_calls(&env).await - before, 1, "no resend");

    // A leader with callers behind it, cancelled while their call is in
    // flight.
    let before = script_calls(&env).await;
    pause_writes(&env, Some(10_000)).await;
    let mut leader = Box::pin(queue.enqueue::<task::Job>(&first));
    assert!(futures::poll!(&mut leader).is_pending());
    let joined = join_the_lane(&env, &queue).await;
    env.wait_blocked_in("fcall", None).await;
    assert!(futures::poll!(&mut leader).is_pending());
    drop(leader);
    pause_writes(&env, None).await;
    expect_enqueued(joined, "a zero-window caller behind a cancelled leader").await;
    // The first, the lone leader's, this leader's and the 8 joined; one call.
    assert_eq!(env.list(&keys.main).await.len(), 11);
    assert_eq!(script_calls(&env).await - before, 1, "no resend");
}

/// The same cancel, with only the leader's own job sent by a zero retry
/// window (its `Queue` clone) and the joined callers on the default one:
/// the joined callers drive the call on (since stop 45; before, the joined
/// jobs were sent again and the leader's was not), and each job is enqueued
/// once. Before, one zero window in a call took the resend from
/// every caller of it: all got "outcome unknown".
#[tokio::test]
async fn only_the_zero_window_callers_of_a_cancelled_call_are_not_resent() {
    let env = TestEnv::start().await;
    env.enqueue(env.task(0)).await;
    let once = env.queue.clone().with_retry_window(Duration::ZERO);
    pause_writes(&env, Some(10_000)).await;
    let first = env.task(1);
    let mut leader = Box::pin(once.enqueue::<task::Job>(&first));
    assert!(futures::poll!(&mut leader).is_pending());
    let joined = join_the_lane(&env, &env.queue).await;
    assert!(futures::poll!(&mut leader).is_pending());
    env.wait_blocked_in("fcall", None).await;
    drop(leader);
    pause_writes(&env, None).await;
    expect_enqueued(
        joined,
        "a caller with a retry window behind a zero-window leader",
    )
    .await;
    // Every job once: the first, the leader's (its held call ran) and the 8.
    assert_eq!(env.queue.stats("tasks").await.unwrap().main, 10);
}

/// A leader whose task panics for a reason of its own (a sibling `join!` or
/// `select!` branch of a web handler) while its call is in flight still
/// leaves its joined callers answered: they drive the call themselves (since
/// stop 45; from stop 36, it was finished in a task of its own, as for a
/// cancel). Before, the drop during the unwinding saw
/// `thread::panicking()` and dropped their senders: each got "abandoned /
/// outcome unknown" for a panic that was not theirs.
#[tokio::test]
async fn a_leader_whose_task_panics_mid_call_leaves_its_joined_callers_answered() {
    use tokio::sync::oneshot;
    let env = TestEnv::start().await;
    env.enqueue(env.task(0)).await;
    let (admitted_tx, admitted_rx) = oneshot::channel();
    let (joined_tx, joined_rx) = oneshot::channel::<()>();
    let (queue, first) = (env.queue.clone(), env.task(1));
    let leader = tokio::spawn(async move {
        let mut enqueue = Box::pin(queue.enqueue::<task::Job>(&first));
        // Admitted as the lane's leader; it yields its scheduler turn.
        assert!(futures::poll!(&mut enqueue).is_pending());
        let _ = admitted_tx.send(());
        let _ = joined_rx.await;
        // It takes the lane's jobs and sends the call; then its task panics.
        assert!(futures::poll!(&mut enqueue).is_pending());
        panic!("a sibling branch of the leader's task panicked");
    });
    admitted_rx.await.expect("the leader was admitted");
    let joined = join_the_lane(&env, &env.queue).await;
    joined_tx.send(()).unwrap();
    let panicked = tokio::time::timeout(BOUND, leader).await.expect("ended");
    assert!(panicked.is_err_and(|e| e.is_panic()));
    expect_enqueued(joined, "a caller behind a leader whose task panicked").await;
    // Every job once: the first, the panicked leader's and the 8 joined.
    assert_eq!(env.queue.stats("tasks").await.unwrap().main, 10);
}

/// A leader kept alive but not polled after it sent its call (a
/// `tokio::select!` on `&mut fut` whose other branch won, a future stored and
/// forgotten) holds up no other enqueue of its queue: here the same task
/// enqueues again, which would hang for ever if it waited on the leader (a
/// "futurelock"), and eight callers in tasks of their own enqueue after it.
/// The enqueue that joins drives the lane's call in flight itself (its
/// driver is shared by every caller waiting in the lane); dropped
/// afterwards, the leader's job is there once. Before (stops 28–44), the
/// leader sent the lane's calls in its own future: every later enqueue
/// joined the lane and waited for a leader nobody polled.
#[tokio::test]
async fn a_leader_kept_unpolled_mid_call_holds_up_no_other_enqueue() {
    let env = TestEnv::start().await;
    env.enqueue(env.task(0)).await;
    let metrics = tokio::runtime::Handle::current().metrics();
    let tasks = metrics.num_alive_tasks();
    let first = env.task(1);
    let mut leader = Box::pin(env.queue.enqueue::<task::Job>(&first));
    // Admitted, it yields its scheduler turn; then it sends its call (its
    // reply cannot have come back within the poll). Not polled again.
    assert!(futures::poll!(&mut leader).is_pending());
    let_the_turn_pass().await;
    assert!(futures::poll!(&mut leader).is_pending());
    let other = env.task(2);
    tokio::time::timeout(BOUND, env.queue.enqueue::<task::Job>(&other))
        .await
        .expect("an enqueue behind a leader kept unpolled is not held up")
        .expect("enqueued");
    let joined = (3..11)
        .map(|i| {
            let queue = env.queue.clone();
            let t = env.task(i);
            tokio::spawn(async move { queue.enqueue::<task::Job>(&t).await })
        })
        .collect();
    expect_enqueued(joined, "a caller behind a leader kept unpolled").await;
    // Dropped with its reply already given (the joined caller drove the
    // call): nothing is sent again, no task is left.
    drop(leader);
    no_task_left_behind(tasks).await;
    // Every job once: the first, the leader's, the other and the 8.
    assert_eq!(env.queue.stats("tasks").await.unwrap().main, 11);
}

/// A leader kept alive but not polled in its scheduler turn (admitted, its
/// call not gathered yet) holds up no other enqueue of its queue either: the
/// caller that joins it drives the lane, which sends both jobs in one call;
/// the leader, polled again, has its own answer. Here both are in one task:
/// waiting on the leader would hang it for ever. Before, the caller joined
/// the leader's lane and waited for the leader to send the call.
#[tokio::test]
async fn a_leader_kept_unpolled_in_its_turn_holds_up_no_other_enqueue() {
    let env = TestEnv::start().await;
    env.enqueue(env.task(0)).await;
    let first = env.task(1);
    let mut leader = Box::pin(env.queue.enqueue::<task::Job>(&first));
    assert!(futures::poll!(&mut leader).is_pending());
    let other = env.task(2);
    let other = tokio::time::timeout(BOUND, env.queue.enqueue::<task::Job>(&other))
        .await
        .expect("an enqueue behind a leader kept unpolled is not held up")
        .expect("enqueued");
    let led = tokio::time::timeout(BOUND, leader)
        .await
        .expect("the leader is answered")
        .expect("enqueued");
    assert_ne!(led, other);
    let main = env.list(&QueueKeys::new("tasks").main).await;
    assert_eq!(main.len(), 3, "{main:?}");
    for id in [&led, &other] {
        assert!(main.contains(&id.to_string()), "{id} in main: {main:?}");
    }
}

/// A leader on the thread of a multi-threaded runtime's `block_on` (where
/// its scheduler turn has no deferred wake: the wake comes at once, to the
/// leader), polled once and kept unpolled, holds up no enqueue in a task on
/// the runtime's workers: that caller, polling the lane's sender for the
/// first time in the turn, comes back once to end it. Before (the first
/// stop-45 version, found by review), it waited for a second poll that
/// nothing would cause: for ever.
#[test]
fn a_leader_kept_unpolled_in_block_on_holds_up_no_enqueue_in_a_task() {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
        .block_on(async {
            let env = TestEnv::start().await;
            env.enqueue(env.task(0)).await;
            let first = env.task(1);
            let mut leader = Box::pin(env.queue.enqueue::<task::Job>(&first));
            assert!(futures::poll!(&mut leader).is_pending());
            let (queue, t) = (env.queue.clone(), env.task(2));
            let other = tokio::spawn(async move { queue.enqueue::<task::Job>(&t).await });
            tokio::time::timeout(BOUND, other)
                .await
                .expect("an enqueue in a task is not held up by a leader kept unpolled")
                .expect("the task ran")
                .expect("enqueued");
            tokio::time::timeout(BOUND, leader)
                .await
                .expect("the leader is answered")
                .expect("enqueued");
            assert_eq!(env.queue.stats("tasks").await.unwrap().main, 3);
        });
}

/// Producers on plain threads, each looping on `Handle::block_on` of one
/// multi-threaded runtime (sync code calling the queue), and producers in a
/// `FuturesUnordered` inside `block_on` (which polls only the futures woken):
/// every enqueue is answered. Their scheduler turns have no deferred wake;
/// in the first stop-45 version such a turn ended only when a caller that
/// had seen it was polled again, and the caller answered in the turn's first
/// poll stopped polling: the threads hung after one enqueue (review).
#[test]
fn producers_looping_on_block_on_are_all_answered() {
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::Arc;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let env = rt.block_on(TestEnv::start());
    rt.block_on(env.enqueue(env.task(0)));
    const THREADS: u64 = 4;
    const ROUNDS: u64 = 300;
    let done = Arc::new(AtomicU64::new(0));
    let threads: Vec<_> = (0..THREADS)
        .map(|p| {
            let (handle, queue, t) = (rt.handle().clone(), env.queue.clone(), env.task(p));
            let done = done.clone();
            std::thread::spawn(move || {
                for _ in 0..ROUNDS {
                    handle.block_on(queue.enqueue::<task::Job>(&t)).unwrap();
                    done.fetch_add(1, Ordering::SeqCst);
                }
            })
        })
        .collect();
    rt.block_on(queue_tests::wait_until(
        BOUND,
        "every thread's enqueues answered",
        || {
            let n = done.load(Ordering::SeqCst);
            async move { n == THREADS * ROUNDS }
        },
    ));
    for t in threads {
        t.join().unwrap();
    }
    rt.block_on(async {
        let unordered: futures::stream::FuturesUnordered<_> = (0..3u64)
            .map(|p| {
                let (queue, t) = (env.queue.clone(), env.task(p));
                async move {
                    for r in 0..ROUNDS {
                        if p == 0 && r % 10 == 0 {
                            tokio::time::sleep(Duration::from_millis(1)).await;
                        }
                        queue.enqueue::<task::Job>(&t).await.unwrap();
                    }
                }
            })
            .collect();
        tokio::time::timeout(BOUND, futures::StreamExt::collect::<Vec<()>>(unordered))
            .await
            .expect("every producer in the FuturesUnordered answered");
        assert_eq!(
            env.queue.stats("tasks").await.unwrap().main,
            1 + THREADS * ROUNDS + 3 * ROUNDS
        );
    });
}

/// An enqueue polled once in a `block_on` of a current-thread runtime that
/// then returns (a `timeout` or `select!` that ended first, a future kept
/// across calls), then awaited in a second `block_on`: it is answered. Its
/// lane's scheduler turn had deferred its wake into the first call, which
/// tokio drops unwoken when the call returns; before, nothing else could
/// end that turn, and the enqueue (with every later one on the queue that
/// joined it) waited for ever (stop 47 review).
#[test]
fn an_enqueue_polled_across_two_block_on_calls_is_answered() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let env = rt.block_on(TestEnv::start());
    let t = env.task(0);
    let mut first = Box::pin(env.queue.enqueue::<task::Job>(&t));
    rt.block_on(async { assert!(futures::poll!(first.as_mut()).is_pending()) });
    rt.block_on(async {
        tokio::time::timeout(BOUND, first)
            .await
            .expect("answered")
            .expect("enqueued");
        assert_eq!(env.queue.stats("tasks").await.unwrap().main, 1);
    });
}

/// A retry window too long for the clock (`Duration::MAX`: "keep trying")
/// means no deadline. Before, `Instant::now() + window` panicked in every
/// enqueue; with group commit the panic was inside the call in flight, whose
/// drop sent the rest again in a task of its own, which panicked again: an
/// endless chain of panicking tasks, and no caller answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unbounded_retry_window_enqueues_with_or_without_group_commit() {
    let env = TestEnv::start().await;
    for group in [true, false] {
        let queue = env
            .queue
            .clone()
            .with_group_commit(group)
            .with_retry_window(Duration::MAX);
        let t = env.task(u64::from(group));
        let call = tokio::spawn(async move {
            queue
                .enqueue_with::<task::Job>(EnqueueOptions::new(), &t)
                .await
        });
        let enqueued = tokio::time::timeout(BOUND, call)
            .await
            .unwrap_or_else(|_| panic!("group commit {group}: the caller was never answered"))
            .unwrap_or_else(|e| panic!("group commit {group}: the enqueue task failed: {e}"))
            .unwrap_or_else(|e| panic!("group commit {group}: {e}"));
        assert!(
            enqueued.is_new(),
            "group commit {group}: {:?}",
            enqueued.outcome
        );
    }
    assert_eq!(env.queue.stats("tasks").await.unwrap().main, 2);
}

/// A batch of more than 256 jobs goes as several script calls in one
/// pipeline, each call's reply read on its own: when Redis refuses a call
/// after an earlier one was written (here the last job's key holds a string:
/// corrupt data), the error names the refused job, does not claim "not
/// enqueued", and lists the jobs written (with generated ids, the only place
/// their ids are told). Before, the refusal discarded every reply: a
/// `QueueError::Redis` with `outcome_unknown() == false`, naming the batch's
/// first job (which was written), while 256 jobs were in main.
#[tokio::test]
async fn a_batch_refused_after_a_written_call_reports_the_jobs_written() {
    let env = TestEnv::start().await;
    let keys = QueueKeys::new("tasks");
    let refused = "refused-last";
    let mut conn = env.conn().await;
    let _: () = conn.set(keys.job(refused), "corrupt").await.unwrap();
    let tasks: Vec<_> = (0..300).map(|i| env.task(i)).collect();
    let items = tasks.iter().enumerate().map(|(i, t)| match i {
        299 => (EnqueueOptions::new().id(refused), t),
        _ => (EnqueueOptions::new(), t),
    });
    let err = env
        .queue
        .enqueue_batch::<task::Job, _>(items)
        .await
        .unwrap_err();
    assert!(err.to_string().contains(refused), "{err}");
    assert_eq!(err.queue(), Some("tasks"));
    let main = env.stats("tasks").await.main;
    assert!(
        main == 0 || err.outcome_unknown(),
        "{main} jobs written, but the error says none was: {err}"
    );
    let QueueError::PartialBatch { written, total, .. } = &err else {
        panic!("expected a partial batch, got {err}");
    };
    assert_eq!((written.len(), *total), (256, 300));
    assert_eq!(main, 256);
    for e in written {
        assert!(e.is_new(), "{e:?}");
        let exists: bool = conn.exists(keys.job(e.id.as_str())).await.unwrap();
        assert!(exists, "job {} reported written", e.id);
    }
}

/// A batch sent in two windows: in the first, Redis refuses a call (a job
/// key of another type under a caller's id: nothing of that call written);
/// the second fails on the connection (its first call carries an argument
/// over the server's `proto-max-bulk-len`: Redis answers a protocol error
/// and closes the connection before running anything of it). The error is
/// the window's failure, and it carries the earlier refusal, naming the
/// refused job, in `refused` (and in its message). Before, that refusal was
/// only logged at debug level: the caller could not tell the refused call's
/// jobs (not written) from the failed window's (outcome unknown).
#[tokio::test]
async fn a_refusal_in_an_earlier_window_is_reported_with_a_later_windows_failure() {
    let env = TestEnv::start().await;
    let keys = QueueKeys::new("tasks");
    let mut conn = env.conn().await;
    let refused = "refused-in-window-1";
    let _: () = conn.set(keys.job(refused), "corrupt").await.unwrap();
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("proto-max-bulk-len")
        .arg("1mb")
        .query_async(&mut conn)
        .await
        .unwrap();
    // Window 1: calls 0-7 (2,048 jobs), call 1 refused (job 300). Window 2:
    // call 8 led by a 2 MiB payload, then call 9.
    let items: Vec<(EnqueueOptions, Vec<u8>)> = (0..2310)
        .map(|i| match i {
            300 => (EnqueueOptions::new().id(refused), b"\x80".to_vec()),
            2048 => (EnqueueOptions::new(), vec![0x80; 2 << 20]),
            _ => (EnqueueOptions::new(), b"\x80".to_vec()),
        })
        .collect();
    let queue = env.queue.clone().with_retry_window(Duration::ZERO);
    let err = queue
        .enqueue_raw_batch("tasks", "send", 1, 3, items)
        .await
        .unwrap_err();
    let QueueError::PartialBatch {
        written,
        total,
        source,
        refused: earlier,
        ..
    } = &err
    else {
        panic!("expected a partial batch, got {err}");
    };
    assert_eq!((written.len(), *total), (2048 - 256, 2310), "{err}");
    assert!(source.outcome_unknown(), "the failed window: {source}");
    let earlier = earlier
        .as_ref()
        .unwrap_or_else(|| panic!("the refusal of window 1 is reported: {err}"));
    assert!(earlier.to_string().contains(refused), "{earlier}");
    assert!(err.to_string().contains(refused), "{err}");
    assert_eq!(env.stats("tasks").await.main, 2048 - 256);
}

/// Seeds job `id`'s key of queue `tasks` with a hash that has no `state`
/// field (corrupt data, or another writer's), not on any list.
async fn seed_stateless_job(env: &TestEnv, id: &str) {
    let _: () = env
        .conn()
        .await
        .hset(QueueKeys::new("tasks").job(id), "type", "send")
        .await
        .unwrap();
}

/// The enqueue of `opts` (a `send` job) on `queue`.
async fn enqueue_send(
    queue: &queue_core::Queue,
    opts: EnqueueOptions,
) -> Result<Enqueued, QueueError> {
    queue
        .enqueue_raw("tasks", "send", 1, 3, opts, b"\x80")
        .await
}

/// A job key holding a hash without a `state` field (corrupt or foreign
/// data) answers `exists` with an empty state. Its caller gets a duplicate
/// of unknown state (nothing written: the id is taken), and the callers
/// that shared its group-commit call get their own outcomes: their jobs were
/// written. Before, one job's reply that did not decode failed the whole
/// call: all four callers got "unexpected reply … (state) is empty" with
/// `outcome_unknown() == false` ("not enqueued") while `good-1` and both
/// generated ids were in main (a caller retrying with a new generated id
/// ran its job twice).
#[tokio::test]
async fn a_stateless_job_hash_fails_no_other_caller_of_its_call() {
    let env = TestEnv::start().await;
    let keys = QueueKeys::new("tasks");
    seed_stateless_job(&env, "bad").await;
    let q = &env.queue;
    let (bad, good, gen1, gen2) = tokio::time::timeout(BOUND, async {
        tokio::join!(
            enqueue_send(q, EnqueueOptions::new().id("bad")),
            enqueue_send(q, EnqueueOptions::new().id("good-1")),
            enqueue_send(q, EnqueueOptions::new()),
            enqueue_send(q, EnqueueOptions::new()),
        )
    })
    .await
    .expect("every caller answered");
    let main = env.list(&keys.main).await;
    for r in [good, gen1, gen2] {
        let e = r.expect("another caller's job is its own outcome");
        assert_eq!(e.outcome, EnqueueOutcome::Created, "{e:?}");
        assert!(
            main.contains(&e.id.to_string()),
            "{} in main: {main:?}",
            e.id
        );
    }
    let bad = bad.expect("a stateless job hash is a duplicate, not an error");
    assert_eq!(
        bad.outcome,
        EnqueueOutcome::Duplicate {
            state: queue_core::JobState::Unknown(String::new())
        }
    );
    assert_eq!(main.len(), 3, "{main:?}");
    assert!(
        !main.contains(&"bad".to_string()),
        "nothing written for bad"
    );

    // A batch with the same three kinds of job: each job's outcome.
    let items = vec![
        (EnqueueOptions::new().id("good-1"), b"\x80".to_vec()),
        (EnqueueOptions::new().id("bad"), b"\x80".to_vec()),
        (EnqueueOptions::new(), b"\x80".to_vec()),
    ];
    let out = q
        .enqueue_raw_batch("tasks", "send", 1, 3, items)
        .await
        .expect("each job's outcome");
    let outcomes: Vec<_> = out.iter().map(|e| e.outcome.clone()).collect();
    assert_eq!(
        outcomes,
        [
            EnqueueOutcome::Duplicate {
                state: queue_core::JobState::Queued
            },
            EnqueueOutcome::Duplicate {
                state: queue_core::JobState::Unknown(String::new())
            },
            EnqueueOutcome::Created,
        ]
    );
    assert!(env.list(&keys.main).await.contains(&out[2].id.to_string()));
}

/// The environment variable that makes this test binary, re-run as a child
/// process, play `dropped_runtime_child` instead of its test (its value is
/// the server's URL).
const DROPPED_RUNTIME_CHILD: &str = "QUEUE_TEST_GROUP_COMMIT_DROPPED_RUNTIME_URL";

/// A group-commit call still in flight when its tokio runtime is dropped
/// (a process ending, a `#[tokio::main]` returning with enqueues running)
/// leaves its caller "abandoned" and the process running. Before, the
/// call's drop resent its jobs with `spawn` on the runtime being shut down,
/// which drops the new task's future in the same call; that future's drop
/// resent again: endless recursion, "fatal runtime error: stack overflow",
/// the process aborted. Played in a child process (this binary re-run with
/// `DROPPED_RUNTIME_CHILD`), so that the abort fails this test instead of
/// killing every test of the binary.
#[test]
fn a_call_in_flight_when_its_runtime_is_dropped_does_not_abort_the_process() {
    if let Ok(url) = std::env::var(DROPPED_RUNTIME_CHILD) {
        dropped_runtime_child(&url);
        return;
    }
    let server = queue_testkit::RedisServer::start().expect("redis-server starts");
    let exe = std::env::current_exe().expect("test executable path");
    let out = std::process::Command::new(exe)
        .args([
            "--exact",
            "a_call_in_flight_when_its_runtime_is_dropped_does_not_abort_the_process",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(DROPPED_RUNTIME_CHILD, server.url())
        .output()
        .expect("the child runs");
    assert!(
        out.status.success(),
        "the child process ended with {}: {}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The child of the test above: a current-thread runtime, an enqueue whose
/// group-commit call is held by the server (`CLIENT PAUSE … WRITE` from
/// another connection), then the runtime dropped with the call in flight.
fn dropped_runtime_child(url: &str) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let queue = queue_core::Queue::connect(url).await.expect("connect");
        // Loads the library, so the held call is the enqueue itself.
        enqueue_send(&queue, EnqueueOptions::new())
            .await
            .expect("enqueued");
        let _: () = redis::cmd("CLIENT")
            .arg("PAUSE")
            .arg(10_000)
            .arg("WRITE")
            .query_async(&mut queue_tests::redis_conn(url).await)
            .await
            .expect("CLIENT PAUSE");
        drop(tokio::spawn(async move {
            enqueue_send(&queue, EnqueueOptions::new()).await
        }));
        queue_tests::wait_until(BOUND, "the enqueue's call held by the pause", || async {
            !queue_tests::env::blocked_clients_in(url, "fcall")
                .await
                .is_empty()
        })
        .await;
    });
    drop(rt);
}

/// A payload longer than the server takes as one argument
/// (`proto-max-bulk-len`, here 1 MB) is refused before it is sent, with an
/// error naming its queue and job (nothing written), and the enqueues that
/// would have shared its group-commit call are written. Before, the call
/// went out: Redis answered "Protocol error: invalid bulk length" and closed
/// the connection, and every caller of the call failed with it.
#[tokio::test]
async fn a_payload_over_the_servers_argument_limit_fails_only_its_own_caller() {
    let env = TestEnv::start_with(&["--proto-max-bulk-len", "1mb"]).await;
    env.enqueue(env.task(0)).await;
    let queue = env.queue.clone().with_max_arg_len(1 << 20);
    let big = vec![0x80u8; 2 << 20];
    let calls = (0..20).map(|i| {
        let queue = &queue;
        let payload: &[u8] = if i == 7 { &big } else { b"\x80" };
        async move {
            queue
                .enqueue_raw(
                    "tasks",
                    "send",
                    1,
                    3,
                    EnqueueOptions::new().id(format!("job-{i}")),
                    payload,
                )
                .await
        }
    });
    let results = tokio::time::timeout(BOUND, futures::future::join_all(calls))
        .await
        .expect("every caller answered");
    for (i, r) in results.into_iter().enumerate() {
        if i == 7 {
            let err = r.expect_err("a payload over the limit is refused");
            assert!(matches!(err, QueueError::ArgumentTooLarge { .. }), "{err}");
            assert_eq!(err.queue(), Some("tasks"));
            assert_eq!(err.job_id().map(|j| j.as_str()), Some("job-7"));
            assert!(!err.outcome_unknown(), "{err}");
        } else {
            let e = r.unwrap_or_else(|e| panic!("caller {i}: {e}"));
            assert_eq!(e.outcome, EnqueueOutcome::Created, "caller {i}");
        }
    }
    let main = env.list(&QueueKeys::new("tasks").main).await;
    assert_eq!(main.len(), 20, "{main:?}");
    assert!(!main.contains(&"job-7".to_string()));

    // In a batch: refused before any job of it is sent.
    let items = vec![
        (EnqueueOptions::new().id("batch-1"), b"\x80".to_vec()),
        (EnqueueOptions::new().id("batch-2"), big),
    ];
    let err = queue
        .enqueue_raw_batch("tasks", "send", 1, 3, items)
        .await
        .expect_err("a payload over the limit is refused");
    assert_eq!(err.job_id().map(|j| j.as_str()), Some("batch-2"), "{err}");
    assert!(!err.outcome_unknown(), "{err}");
    assert_eq!(env.list(&QueueKeys::new("tasks").main).await.len(), 20);
}
