//! Batches and flows (issue #14, docs/WORKFLOWS.md) against a real
//! redis-server: callbacks fire exactly once with the batch's counts; dead,
//! cancelled and replayed members are accounted for; a member adds members;
//! a flow's parent reads its children's results, or is dead-lettered when a
//! child under the fail-parent policy failed; nested flows; queues of another
//! hash tag are refused; and several worker processes, two of them killed
//! mid-batch, still fire every callback exactly once.

use queue_core::{Batch, ChildPolicy, Flow, JobSpec, QueueError, QueueKeys};
use queue_tests::workflow_jobs::{wf_callback, wf_member, WfCallback, WfMember, WF_QUEUE};
use queue_tests::{fast_config, wait_until, TestEnv, WorkerHandle, WorkerProcess, BOUND};
use redis::AsyncCommands;
use std::collections::HashMap;

const WORKER_BIN: &str = env!("CARGO_BIN_EXE_test-worker");

/// A `test-worker` process that also serves the workflow jobs.
fn wf_worker_process(
    env: &TestEnv,
    concurrency: usize,
    lease_ms: u64,
    grace_ms: u64,
) -> WorkerProcess {
    WorkerProcess::start_with_env(
        WORKER_BIN,
        &env.url,
        concurrency,
        lease_ms,
        grace_ms,
        None,
        &[(queue_tests::workflow_jobs::ENV, "1")],
    )
}

fn member(env: &TestEnv, id: &str) -> JobSpec {
    let m = WfMember {
        ledger: env.ledger_url.clone(),
        ..WfMember::default()
    };
    JobSpec::new::<wf_member::Job>(&m).unwrap().id(id)
}

fn member_with(env: &TestEnv, id: &str, shape: impl FnOnce(&mut WfMember)) -> JobSpec {
    let mut m = WfMember {
        ledger: env.ledger_url.clone(),
        ..WfMember::default()
    };
    shape(&mut m);
    JobSpec::new::<wf_member::Job>(&m).unwrap().id(id)
}

fn callback(env: &TestEnv, id: &str) -> JobSpec {
    let cb = WfCallback {
        ledger: env.ledger_url.clone(),
    };
    JobSpec::new::<wf_callback::Job>(&cb).unwrap().id(id)
}

async fn spawn_wf_worker(env: &TestEnv) -> WorkerHandle {
    let builder = queue_core::Worker::builder(&env.url)
        .register(wf_member::handler())
        .register(wf_callback::handler())
        .config(fast_config());
    WorkerHandle::start(builder).await
}

async fn ledger_map(env: &TestEnv, key: &str) -> HashMap<String, String> {
    let mut c = env.conn().await;
    c.hgetall(key).await.unwrap()
}

async fn wait_callbacks(env: &TestEnv, n: usize) -> HashMap<String, String> {
    wait_until(BOUND, &format!("{n} callbacks"), || async {
        ledger_map(env, "ledger:wf:callbacks").await.len() >= n
    })
    .await;
    ledger_map(env, "ledger:wf:callbacks").await
}

/// Success and complete callbacks: both fire when all succeed; only the
/// complete one (with the dead count) when a member is dead-lettered.
#[tokio::test]
async fn batch_callbacks_fire_once_with_the_counts() {
    let env = TestEnv::start().await;
    let mut ok = Batch::new(&env.queue)
        .id("all-ok")
        .on_success(callback(&env, "ok-success"))
        .on_complete(callback(&env, "ok-complete"));
    let mut bad = Batch::new(&env.queue)
        .id("one-bad")
        .on_success(callback(&env, "bad-success"))
        .on_complete(callback(&env, "bad-complete"));
    for i in 0..10 {
        ok = ok.add(member(&env, &format!("ok-{i}")));
        bad = bad.add(member_with(&env, &format!("bad-{i}"), |m| m.fail = i == 3));
    }
    ok.enqueue().await.unwrap();
    bad.enqueue().await.unwrap();
    let workers = [spawn_wf_worker(&env).await, spawn_wf_worker(&env).await];
    let fired = wait_callbacks(&env, 3).await;
    queue_tests::handles::stop_all(workers.into()).await;
    let summary = ledger_map(&env, "ledger:wf:summary").await;
    assert_eq!(summary["ok-success"], "10/10/0/0");
    assert_eq!(summary["ok-complete"], "10/10/0/0");
    assert_eq!(summary["bad-complete"], "10/9/1/0");
    assert!(
        !fired.contains_key("bad-success"),
        "a dead member: no success callback"
    );
    assert!(
        fired.values().all(|n| n == "1"),
        "each callback once: {fired:?}"
    );
    let b = env.queue.batch(WF_QUEUE, "one-bad").await.unwrap().unwrap();
    assert_eq!((b.state.as_str(), b.dead, b.finished()), ("fired", 1, 10));
}

/// A member adds a member from inside its handler: the batch waits for it.
/// Enqueuing the same batch again (a producer's retry) changes nothing.
#[tokio::test]
async fn a_member_adds_members_before_the_batch_fires() {
    let env = TestEnv::start().await;
    let batch = Batch::new(&env.queue)
        .id("growing")
        .on_complete(callback(&env, "growing-done"))
        .add(member_with(&env, "g-1", |m| m.add_more = true))
        .add(member(&env, "g-2"));
    batch.clone().enqueue().await.unwrap();
    let again = batch.enqueue().await.unwrap();
    assert!(again.members.iter().all(|e| !e.is_new()));
    let worker = spawn_wf_worker(&env).await;
    wait_callbacks(&env, 1).await;
    worker.stop().await;
    let summary = ledger_map(&env, "ledger:wf:summary").await;
    assert_eq!(summary["growing-done"], "3/3/0/0");
    assert_eq!(ledger_map(&env, "ledger:wf:effects").await.len(), 3);
}

/// Cancelled and replayed members: a cancelled waiting member counts as
/// cancelled; a dead member replayed before the batch fired counts again
/// only by its next outcome.
#[tokio::test]
async fn cancelled_and_replayed_members_are_counted_once() {
    let env = TestEnv::start().await;
    Batch::new(&env.queue)
        .id("mixed")
        .on_complete(callback(&env, "mixed-done"))
        .add(member(&env, "m-cancel"))
        .add(member_with(&env, "m-dead", |m| m.fail = true))
        .add(member_with(&env, "m-slow", |m| m.sleep_ms = 2000))
        .enqueue()
        .await
        .unwrap();
    env.queue.cancel(WF_QUEUE, "m-cancel").await.unwrap();
    let worker = spawn_wf_worker(&env).await;
    let batch = || async { env.queue.batch(WF_QUEUE, "mixed").await.unwrap().unwrap() };
    wait_until(BOUND, "m-dead dead-lettered", || async {
        batch().await.dead == 1
    })
    .await;
    // Paused, the replayed member waits in main while m-slow still runs: it
    // counts as unfinished again, then by its next outcome (dead again).
    env.queue.pause(WF_QUEUE).await.unwrap();
    assert!(env
        .queue
        .replay_dead(WF_QUEUE, "m-dead", true)
        .await
        .unwrap());
    let after = batch().await;
    assert_eq!(
        (after.state.as_str(), after.dead),
        ("sealed", 0),
        "{after:?}"
    );
    env.queue.resume(WF_QUEUE).await.unwrap();
    wait_callbacks(&env, 1).await;
    worker.stop().await;
    let summary = ledger_map(&env, "ledger:wf:summary").await;
    assert_eq!(summary["mixed-done"], "3/1/1/1");
}

/// A flow: the parent runs after its children and reads their results; a
/// nested flow's parent is a child of the outer flow; a failed child under
/// `Continue` is reported, one under `FailParent` dead-letters the parent.
#[tokio::test]
async fn flows_run_the_parent_after_the_children() {
    let env = TestEnv::start().await;
    let inner = Flow::new(callback(&env, "inner"))
        .child(member(&env, "inner-a"))
        .child(member(&env, "inner-b"));
    Flow::new(callback(&env, "outer"))
        .child(member(&env, "outer-a"))
        .child_with(
            ChildPolicy::Continue,
            member_with(&env, "outer-bad", |m| m.fail = true),
        )
        .child_flow(inner)
        .enqueue(&env.queue)
        .await
        .unwrap();
    Flow::new(callback(&env, "doomed"))
        .child(member(&env, "doomed-a"))
        .child(member_with(&env, "doomed-bad", |m| m.fail = true))
        .enqueue(&env.queue)
        .await
        .unwrap();
    let worker = spawn_wf_worker(&env).await;
    let fired = wait_callbacks(&env, 2).await;
    let keys = QueueKeys::new(WF_QUEUE);
    wait_until(BOUND, "doomed parent dead-lettered", || async {
        env.list(&keys.dead).await.contains(&"doomed".to_string())
    })
    .await;
    worker.stop().await;
    let children = ledger_map(&env, "ledger:wf:children").await;
    assert_eq!(children["inner"], "2,0");
    assert_eq!(
        children["outer"], "2,1",
        "outer-a, inner ok; outer-bad recorded"
    );
    assert!(!fired.contains_key("doomed"));
    let reason = env
        .ledger_field(&keys.job("doomed"), "dead_reason")
        .await
        .unwrap();
    assert!(reason.contains("doomed-bad"), "{reason}");
}

/// Every queue of a batch must share its hash tag (the ack updates the
/// batch in the same script): another tag is refused before any write.
#[tokio::test]
async fn queues_of_another_hash_tag_are_refused() {
    let env = TestEnv::start().await;
    let stranger = JobSpec::raw("emails", "t", 1, 1, vec![]);
    let err = Batch::new(&env.queue)
        .id("mixed-slots")
        .add(member(&env, "x"))
        .add(stranger)
        .enqueue()
        .await
        .unwrap_err();
    assert!(matches!(err, QueueError::Workflow { .. }), "{err}");
    assert!(env
        .queue
        .batch(WF_QUEUE, "mixed-slots")
        .await
        .unwrap()
        .is_none());
}

/// Three worker processes run 30 batches of 10 slow members; two are
/// SIGKILLed mid-batch (the watchdog returns their jobs, which run again).
/// Every callback fires exactly once, with every member counted once.
#[tokio::test]
async fn killed_workers_fire_every_callback_exactly_once() {
    let env = TestEnv::start().await;
    const BATCHES: usize = 30;
    for b in 0..BATCHES {
        let mut batch = Batch::new(&env.queue)
            .id(format!("k{b}"))
            .on_complete(callback(&env, &format!("k{b}-done")));
        for i in 0..10 {
            batch = batch.add(member_with(&env, &format!("k{b}-{i}"), |m| m.sleep_ms = 30));
        }
        batch.enqueue().await.unwrap();
    }
    let _watchdog = env.spawn_watchdog(WF_QUEUE).await;
    let mut procs: Vec<WorkerProcess> = (0..3)
        .map(|_| wf_worker_process(&env, 4, 1000, 2000))
        .collect();
    for victim in procs.iter_mut().take(2) {
        let before = ledger_map(&env, "ledger:wf:effects").await.len();
        wait_until(BOUND, "progress before the kill", || async {
            ledger_map(&env, "ledger:wf:effects").await.len() > before + 40
        })
        .await;
        victim.kill();
    }
    wait_callbacks(&env, BATCHES).await;
    // Each member counted once although some ran twice (killed mid-run):
    // every callback saw 10 of 10, never an early or double count.
    let summary = ledger_map(&env, "ledger:wf:summary").await;
    for b in 0..BATCHES {
        assert_eq!(summary[&format!("k{b}-done")], "10/10/0/0", "batch k{b}");
    }
    let enqueued: u64 = env
        .conn()
        .await
        .hget(QueueKeys::new(WF_QUEUE).stats, "enqueued")
        .await
        .unwrap();
    assert_eq!(
        enqueued,
        (BATCHES * 11) as u64,
        "members + one callback each"
    );
    drop(procs);
}

/// A member whose worker is SIGKILLed on its last attempt is dead-lettered
/// by the watchdog (`reclaim.lua`): counted dead, and the batch fires.
#[tokio::test]
async fn a_member_dead_lettered_by_the_watchdog_is_counted() {
    let env = TestEnv::start().await;
    let last_try = queue_core::EnqueueOptions::new().max_attempts(1);
    Batch::new(&env.queue)
        .id("reclaimed")
        .on_complete(callback(&env, "reclaimed-done"))
        .add(member_with(&env, "r-slow", |m| m.sleep_ms = 60_000).options(last_try))
        .enqueue()
        .await
        .unwrap();
    let mut proc = wf_worker_process(&env, 1, 500, 1000);
    wait_until(BOUND, "r-slow running", || async {
        env.list(&QueueKeys::new(WF_QUEUE).processing).await.len() == 1
    })
    .await;
    proc.kill();
    let _watchdog = env.spawn_watchdog(WF_QUEUE).await;
    let worker = spawn_wf_worker(&env).await;
    wait_callbacks(&env, 1).await;
    worker.stop().await;
    let summary = ledger_map(&env, "ledger:wf:summary").await;
    assert_eq!(summary["reclaimed-done"], "1/0/1/0");
}
