//! Batches and flows (issue #14, docs/WORKFLOWS.md) against a real
//! redis-server: callbacks fire exactly once with the batch's counts; dead,
//! cancelled and replayed members are accounted for; a member adds members;
//! a flow's parent reads its children's results, or is dead-lettered when a
//! child under the fail-parent policy failed; nested flows; callbacks on
//! another queue are refused; and several worker processes, two of them
//! killed mid-batch, still fire every callback exactly once.
//!
//! The cross-queue relay (members and children on other queues than their
//! batch, docs/WORKFLOWS.md "Relay"): a cross-queue batch and flow (parent on
//! `orders`, children on `emails` and `billing`), a worker killed between the
//! relay's two steps (failpoint `relay_after_apply`) counting once, a replay
//! across queues and a stale notice applied again, a corrupt batch key (the
//! notice is kept in the dead-notice list, the others go through), and
//! worker processes SIGKILLed while relaying.

use queue_core::{Batch, ChildPolicy, Flow, JobSpec, QueueError, QueueKeys, WaitError};
use queue_tests::workflow_jobs::{
    wf_bill, wf_callback, wf_email, wf_member, wf_order_close, wf_typed_child, wf_typed_parent,
    WfCallback, WfMember, BILLING, EMAILS, ORDERS, WF_QUEUE, WF_QUEUES,
};
use queue_tests::{
    fast_config, fast_watchdog, wait_until, TestEnv, WatchdogHandle, WorkerHandle, WorkerProcess,
    BOUND,
};
use redis::AsyncCommands;
use std::collections::HashMap;
use std::time::Duration;

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

/// Asserts that nothing was written under any queue's keys (`what`: the
/// refused workflow).
async fn assert_nothing_written(env: &TestEnv, what: &str) {
    let keys: Vec<String> = env.conn().await.keys("q:*").await.unwrap();
    assert!(keys.is_empty(), "{what} wrote {keys:?}");
}

async fn spawn_wf_worker(env: &TestEnv) -> WorkerHandle {
    let builder = queue_tests::workflow_jobs::all()
        .into_iter()
        .fold(queue_core::Worker::builder(&env.url), |b, r| b.register(r))
        .config(fast_config());
    WorkerHandle::start(builder).await
}

/// Three workflow `test-worker` processes (4 slots each), of which the first
/// two are SIGKILLed in turn, each after `progress` more member effects.
/// The survivor is returned with the killed ones (dropped by the caller).
async fn three_workers_two_killed(env: &TestEnv, progress: usize) -> Vec<WorkerProcess> {
    let mut procs: Vec<WorkerProcess> = (0..3)
        .map(|_| wf_worker_process(env, 4, 1000, 2000))
        .collect();
    for victim in procs.iter_mut().take(2) {
        let before = ledger_map(env, "ledger:wf:effects").await.len();
        wait_until(BOUND, "progress before the kill", || async {
            ledger_map(env, "ledger:wf:effects").await.len() > before + progress
        })
        .await;
        victim.kill();
    }
    procs
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

/// A child whose `#[job]` fn returns `Ok(7u32)` (stored with `set_output`:
/// `0xc1` + MessagePack, no UTF-8) reaches its parent's
/// `child_results::<u32>()`, next to a child that used `set_child_result`;
/// the returned value wins over a `set_child_result` of the same run. And
/// `batches show` reads the typed result. Before, `child_results` failed on
/// every call (the results hash was read as UTF-8 text and only `mp:` was
/// decoded) and the parent was dead-lettered.
#[tokio::test]
async fn a_flow_parent_reads_a_childs_returned_typed_value() {
    let env = TestEnv::start().await;
    let parent = WfCallback {
        ledger: env.ledger_url.clone(),
    };
    Flow::new(
        JobSpec::new::<wf_typed_parent::Job>(&parent)
            .unwrap()
            .id("typed-1"),
    )
    .child(
        JobSpec::new::<wf_typed_child::Job>(&7u32)
            .unwrap()
            .id("seven"),
    )
    .child(member(&env, "plain"))
    .enqueue(&env.queue)
    .await
    .unwrap();
    let worker = spawn_wf_worker(&env).await;
    wait_until(BOUND, "the parent recorded its children", || async {
        ledger_map(&env, "ledger:wf:typed")
            .await
            .contains_key("typed-1")
    })
    .await;
    worker.stop().await;
    let typed = ledger_map(&env, "ledger:wf:typed").await;
    assert_eq!(typed["typed-1"], "plain=Ok(Some(5)),seven=Ok(Some(7))");
    let admin = queue_core::admin::Admin::new(env.queue.clone());
    let detail = admin
        .batch_detail(WF_QUEUE, "typed-1")
        .await
        .unwrap()
        .unwrap();
    let outcomes: Vec<(String, String)> = detail
        .members
        .iter()
        .map(|m| (m.id.clone(), m.outcome.clone()))
        .collect();
    assert_eq!(
        outcomes,
        [("plain", "succeeded"), ("seven", "succeeded")].map(|(a, b)| (a.into(), b.into()))
    );
}

/// Member ids from business keys: `photo-1` ran on its own (its completion
/// record is kept) and `photo-3` waits on its own; a batch naming either is
/// refused before its seal, naming the id. Before, the enqueue answered
/// `AlreadyCompleted` / `Duplicate` and wrote nothing, so no job carried
/// the batch: it was sealed (Ok) and never fired. The batch's own members
/// enqueued again (waiting, then completed) are still accepted.
#[tokio::test]
async fn a_member_id_taken_outside_the_batch_is_refused() {
    let env = TestEnv::start().await;
    let plain = WfMember {
        ledger: env.ledger_url.clone(),
        ..WfMember::default()
    };
    let album = |id: &str, members: &[&str]| {
        members.iter().fold(
            Batch::new(&env.queue)
                .id(id)
                .on_complete(callback(&env, &format!("{id}-done"))),
            |b, m| b.add(member(&env, m)),
        )
    };
    let refused = |e: QueueError, id: &str, member: &str| {
        assert!(
            matches!(&e, QueueError::Workflow { batch, detail, .. }
                if batch == id && detail.contains(&format!("`{member}`"))),
            "{e}"
        );
    };
    env.queue
        .enqueue_with_id::<wf_member::Job>("photo-1", &plain)
        .await
        .unwrap();
    let worker = spawn_wf_worker(&env).await;
    env.wait_completed(WF_QUEUE, 1).await;
    worker.stop().await;
    let e = album("album-1", &["photo-1", "photo-2"]).enqueue().await;
    refused(e.unwrap_err(), "album-1", "photo-1");
    env.queue
        .enqueue_with_id::<wf_member::Job>("photo-3", &plain)
        .await
        .unwrap();
    let e = album("album-2", &["photo-3", "photo-4"]).enqueue().await;
    refused(e.unwrap_err(), "album-2", "photo-3");
    // A retried enqueue of the batch's own members: waiting, then completed.
    album("album-3", &["photo-5", "photo-6"])
        .enqueue()
        .await
        .unwrap();
    album("album-3", &["photo-5", "photo-6"])
        .enqueue()
        .await
        .unwrap();
    let worker = spawn_wf_worker(&env).await;
    let fired = wait_callbacks(&env, 1).await;
    worker.stop().await;
    assert_eq!(fired.get("album-3-done").map(String::as_str), Some("1"));
    album("album-3", &["photo-5", "photo-6"])
        .enqueue()
        .await
        .unwrap();
}

/// `ctx.batch_add` of an id that a job outside the batch already took (here
/// `g-9-more`, completed on its own): refused *before* the id is registered
/// and for good, so the adding member is dead-lettered at its first attempt
/// and the sealed batch still fires (one member, failed). Before, the id was
/// registered first (`total` 2, a member no job carries) and the error was
/// retryable: the adder retried until dead and the batch never fired.
#[tokio::test]
async fn batch_add_of_an_id_taken_outside_the_batch_is_refused_before_it_counts() {
    let env = TestEnv::start().await;
    let plain = WfMember {
        ledger: env.ledger_url.clone(),
        ..WfMember::default()
    };
    env.queue
        .enqueue_with_id::<wf_member::Job>("g-9-more", &plain)
        .await
        .unwrap();
    let worker = spawn_wf_worker(&env).await;
    env.wait_completed(WF_QUEUE, 1).await;
    Batch::new(&env.queue)
        .id("adds")
        .on_complete(callback(&env, "adds-done"))
        .add(member_with(&env, "g-9", |m| m.add_more = true))
        .enqueue()
        .await
        .unwrap();
    let fired = wait_callbacks(&env, 1).await;
    worker.stop().await;
    assert!(fired.contains_key("adds-done"), "{fired:?}");
    let adder = env.queue.job(WF_QUEUE, "g-9").await.unwrap().expect("dead");
    assert_eq!(adder.field("state"), Some("dead"));
    assert_eq!(adder.field("attempts"), Some("1"), "refused for good");
    assert!(
        adder
            .field("dead_reason")
            .is_some_and(|r| r.contains("outside this batch")),
        "{:?}",
        adder.field("dead_reason")
    );
}

/// `ctx.batch_add` of a member its enqueue refuses: the adder's id is 510
/// bytes, so the id it derives (`<id>-more`) is 515, past
/// `JobId::MAX_LEN`. Checked as `Batch::enqueue` checks its members, before
/// the id is registered, and refused for good: `total` stays 1, the adder is
/// dead-lettered at its first attempt and the batch fires (one member,
/// dead). Before, the id was registered first (`total` 2), its enqueue was
/// refused after that as a retryable error, the adder retried until dead
/// and the batch never fired.
#[tokio::test]
async fn batch_add_of_a_member_its_enqueue_refuses_is_refused_before_it_counts() {
    let env = TestEnv::start().await;
    let adder = "a".repeat(510);
    Batch::new(&env.queue)
        .id("adds-long")
        .on_complete(callback(&env, "adds-long-done"))
        .add(member_with(&env, &adder, |m| m.add_more = true))
        .enqueue()
        .await
        .unwrap();
    let worker = spawn_wf_worker(&env).await;
    let fired = wait_callbacks(&env, 1).await;
    worker.stop().await;
    assert!(fired.contains_key("adds-long-done"), "{fired:?}");
    let summary = ledger_map(&env, "ledger:wf:summary").await;
    assert_eq!(summary["adds-long-done"], "1/0/1/0", "total stays 1");
    let b = env
        .queue
        .batch(WF_QUEUE, "adds-long")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        (b.state.as_str(), b.total, b.dead),
        ("fired", 1, 1),
        "{b:?}"
    );
    let job = env
        .queue
        .job(WF_QUEUE, adder.as_str())
        .await
        .unwrap()
        .expect("dead");
    assert_eq!(job.field("state"), Some("dead"));
    assert_eq!(job.field("attempts"), Some("1"), "refused for good");
    assert!(
        job.field("dead_reason")
            .is_some_and(|r| r.contains("longer than 512 bytes")),
        "{:?}",
        job.field("dead_reason")
    );
}

/// `ctx.batch_add` from a member whose batch is gone (deleted, or its keys
/// expired) or fired already is refused for good (`JobError::permanent`,
/// naming the batch): the adder is dead-lettered at its first attempt and
/// nothing is added. Before, `BatchAddReply::Missing` / `Fired` became a
/// retryable error: the adder ran again until its attempts ran out.
#[tokio::test]
async fn batch_add_to_a_batch_gone_or_fired_is_refused_for_good() {
    let env = TestEnv::start().await;
    let keys = QueueKeys::new(WF_QUEUE);
    for (batch, adder) in [("adds-gone", "gone-a"), ("adds-fired", "fired-a")] {
        Batch::new(&env.queue)
            .id(batch)
            .on_complete(callback(&env, &format!("{batch}-done")))
            .add(member_with(&env, adder, |m| m.add_more = true))
            .enqueue()
            .await
            .unwrap();
    }
    let mut c = env.conn().await;
    let _: () = c.del(keys.batch("adds-gone")).await.unwrap();
    let _: () = c
        .hset(keys.batch("adds-fired"), "state", "fired")
        .await
        .unwrap();
    let worker = spawn_wf_worker(&env).await;
    for (batch, adder, why) in [
        ("adds-gone", "gone-a", "no such batch"),
        ("adds-fired", "fired-a", "already fired"),
    ] {
        wait_until(BOUND, "the adder dead-lettered", || async {
            env.queue
                .job(WF_QUEUE, adder)
                .await
                .unwrap()
                .is_some_and(|j| j.field("state") == Some("dead"))
        })
        .await;
        let job = env.queue.job(WF_QUEUE, adder).await.unwrap().unwrap();
        assert_eq!(
            job.field("attempts"),
            Some("1"),
            "{adder}: refused for good"
        );
        let reason = job.field("dead_reason").unwrap_or_default();
        assert!(
            reason.contains(&format!("batch `{batch}`")) && reason.contains(why),
            "{adder}: {reason}"
        );
        let more = env
            .queue
            .job(WF_QUEUE, format!("{adder}-more").as_str())
            .await
            .unwrap();
        assert!(more.is_none(), "{adder}: nothing added");
    }
    worker.stop().await;
}

/// A batch id or a flow parent's id (its batch id; a nested flow's too)
/// with a control character is refused before any write: a job's `batch`
/// field holds batch keys one per line, so `album\n7` would be split there
/// and counted in batches that do not exist. Before, it was accepted.
#[tokio::test]
async fn a_batch_id_with_a_control_character_is_refused_before_any_write() {
    let env = TestEnv::start().await;
    let bad = |e: QueueError, id: &str| {
        assert!(
            matches!(&e, QueueError::Workflow { batch, detail, .. }
                if batch == id && detail.contains("control characters")),
            "{e}"
        );
    };
    let e = Batch::new(&env.queue)
        .id("album\n7")
        .on_complete(callback(&env, "album-done"))
        .add(member(&env, "photo-1"))
        .enqueue()
        .await;
    bad(e.unwrap_err(), "album\n7");
    let e = Flow::new(callback(&env, "close\n7"))
        .child(member(&env, "invoice-7"))
        .enqueue(&env.queue)
        .await;
    bad(e.unwrap_err(), "close\n7");
    let e = Flow::new(callback(&env, "close-8"))
        .child(member(&env, "invoice-8"))
        .child_flow(Flow::new(callback(&env, "ship\t8")).child(member(&env, "label-8")))
        .enqueue(&env.queue)
        .await;
    bad(e.unwrap_err(), "ship\t8");
    assert_nothing_written(&env, "a refused batch").await;
}

/// A workflow whose member, child, step or home queue its enqueue would
/// refuse (a member with two `group` fields, a queue name with a space or a
/// brace) is refused before any write. Before, the members' enqueue refused
/// it after the batch was opened and its members registered: the batch
/// stayed open and never fired; a home queue with no callback was never
/// checked at all.
#[tokio::test]
async fn a_workflow_with_a_refused_member_is_refused_before_any_write() {
    use queue_core::{Dag, DagError, EnqueueOptions};
    let env = TestEnv::start().await;
    let twice = EnqueueOptions {
        extra_fields: vec![("group".into(), "a".into()), ("group".into(), "b".into())],
        ..EnqueueOptions::new()
    };
    let e = Batch::new(&env.queue)
        .id("album-9")
        .on_complete(callback(&env, "album-done"))
        .add(member(&env, "photo-1"))
        .add(member(&env, "photo-2").options(twice))
        .enqueue()
        .await
        .unwrap_err();
    assert!(
        matches!(&e, QueueError::InvalidExtraField { name, job_id: Some(id), .. }
            if name == "group" && id.as_str() == "photo-2"),
        "{e}"
    );
    assert_nothing_written(&env, "a batch with a member of two groups").await;
    let spaced = JobSpec::raw("emails high", "t", 1, 1, vec![]).id("mail-1");
    let e = Batch::new(&env.queue)
        .id("album-10")
        .add(member(&env, "photo-3"))
        .add(spaced.clone())
        .enqueue()
        .await
        .unwrap_err();
    assert!(matches!(&e, QueueError::InvalidQueueName { queue, .. } if queue == "emails high"));
    assert_nothing_written(&env, "a batch with a member on `emails high`").await;
    let e = Batch::new(&env.queue)
        .id("album-11")
        .home("{t}x")
        .add(member(&env, "photo-4"))
        .enqueue()
        .await
        .unwrap_err();
    assert!(matches!(&e, QueueError::InvalidQueueName { queue, .. } if queue == "{t}x"));
    assert_nothing_written(&env, "a batch with home `{t}x`").await;
    let e = Flow::new(callback(&env, "close-9"))
        .child(member(&env, "invoice-9"))
        .child(spaced.clone())
        .enqueue(&env.queue)
        .await
        .unwrap_err();
    assert!(matches!(&e, QueueError::InvalidQueueName { .. }), "{e}");
    assert_nothing_written(&env, "a flow with a child on `emails high`").await;
    let e = Dag::new("ship-9")
        .step("pack", member(&env, "pack"))
        .step("mail", spaced)
        .after(["pack"])
        .enqueue(&env.queue)
        .await
        .unwrap_err();
    assert!(
        matches!(&e, DagError::Queue { step, source, .. }
            if step == "mail" && matches!(**source, QueueError::InvalidQueueName { .. })),
        "{e}"
    );
    assert_nothing_written(&env, "a dag with a step on `emails high`").await;
}

/// A batch's callbacks must be on its own queue (the member that finishes
/// the batch creates them in the same script): another queue is refused
/// before any write. Members may be on any queue (the relay).
#[tokio::test]
async fn a_callback_on_another_queue_is_refused() {
    let env = TestEnv::start().await;
    let stranger = JobSpec::raw("emails", "t", 1, 1, vec![]);
    let err = Batch::new(&env.queue)
        .id("mixed-slots")
        .home(WF_QUEUE)
        .on_complete(stranger)
        .add(member(&env, "x"))
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
    let procs = three_workers_two_killed(&env, 40).await;
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

/// Members dead-lettered at their claim are counted like any dead member,
/// so the batch fires: one whose start deadline passed before a worker
/// took it, one with a corrupt count. Before, only fail, defer and the
/// watchdog counted their dead-letters, and such a batch waited for ever.
#[tokio::test]
async fn members_dead_lettered_at_their_claim_are_counted() {
    let env = TestEnv::start().await;
    let expiring = queue_core::EnqueueOptions::new().expires_in(Duration::from_millis(1));
    Batch::new(&env.queue)
        .id("claimed-dead")
        .on_complete(callback(&env, "claimed-dead-done"))
        .add(member(&env, "c-expired").options(expiring))
        .add(member(&env, "c-corrupt"))
        .enqueue()
        .await
        .unwrap();
    // Before any worker runs: the deadline passes, and a count is corrupted.
    let job = QueueKeys::new(WF_QUEUE).job("c-corrupt");
    let _: () = env.conn().await.hset(job, "attempts", "x").await.unwrap();
    tokio::time::sleep(Duration::from_millis(20)).await;
    let worker = spawn_wf_worker(&env).await;
    wait_callbacks(&env, 1).await;
    worker.stop().await;
    let summary = ledger_map(&env, "ledger:wf:summary").await;
    assert_eq!(summary["claimed-dead-done"], "2/0/2/0");
}

// ---- the cross-queue relay ----

/// A member on `queue` (`emails`, `billing` or `wf`).
fn member_on(env: &TestEnv, queue: &str, id: &str, shape: impl FnOnce(&mut WfMember)) -> JobSpec {
    let mut m = WfMember {
        ledger: env.ledger_url.clone(),
        ..WfMember::default()
    };
    shape(&mut m);
    let spec = match queue {
        EMAILS => JobSpec::new::<wf_email::Job>(&m),
        BILLING => JobSpec::new::<wf_bill::Job>(&m),
        _ => JobSpec::new::<wf_member::Job>(&m),
    };
    spec.unwrap().id(id)
}

/// A callback / parent on `orders`.
fn order_callback(env: &TestEnv, id: &str) -> JobSpec {
    let cb = WfCallback {
        ledger: env.ledger_url.clone(),
    };
    JobSpec::new::<wf_order_close::Job>(&cb).unwrap().id(id)
}

/// Runs a `test-worker` process (1 job at a time) that aborts at its first
/// relay, between applying the notices and removing them
/// (failpoint `relay_after_apply`), and waits for it to die.
async fn run_until_relay_crash(env: &TestEnv) {
    let mut proc = WorkerProcess::start_with_env(
        WORKER_BIN,
        &env.url,
        1,
        1000,
        1000,
        Some("relay_after_apply"),
        &[(queue_tests::workflow_jobs::ENV, "1")],
    );
    proc.wait_exit(BOUND).await;
}

/// A watchdog loop on every workflow queue.
async fn spawn_wf_watchdog(env: &TestEnv) -> WatchdogHandle {
    let dog = queue_core::Watchdog::connect(&env.url, WF_QUEUES, fast_watchdog())
        .await
        .unwrap();
    WatchdogHandle::spawn(dog)
}

async fn relay_len(env: &TestEnv, queue: &str) -> usize {
    env.list(&QueueKeys::new(queue).relay()).await.len()
}

/// A batch homed on `orders` whose members are on `emails`, `billing` and
/// `wf` (three other hash tags): each member's ack writes a notice on its
/// own queue, the worker relays it, the callbacks fire once with every
/// member counted once, and nothing is left in the relay lists.
#[tokio::test]
async fn a_cross_queue_batch_fires_once_with_every_member_counted() {
    let env = TestEnv::start().await;
    let mut batch = Batch::new(&env.queue)
        .id("xb")
        .on_success(order_callback(&env, "xb-success"))
        .on_complete(order_callback(&env, "xb-complete"));
    for i in 0..9 {
        let q = [EMAILS, BILLING, WF_QUEUE][i % 3];
        batch = batch.add(member_on(&env, q, &format!("xb-{i}"), |_| {}));
    }
    let created = batch.enqueue().await.unwrap();
    assert_eq!(created.queue, ORDERS);
    let worker = spawn_wf_worker(&env).await;
    let fired = wait_callbacks(&env, 2).await;
    worker.stop().await;
    let summary = ledger_map(&env, "ledger:wf:summary").await;
    assert_eq!(summary["xb-success"], "9/9/0/0");
    assert_eq!(summary["xb-complete"], "9/9/0/0");
    assert!(fired.values().all(|n| n == "1"), "{fired:?}");
    for q in [EMAILS, BILLING, WF_QUEUE] {
        assert_eq!(relay_len(&env, q).await, 0, "{q}: notices left");
        assert_eq!(env.stats(q).await.counter("relayed"), 3, "{q}");
    }
}

/// A flow whose parent is on `orders` and whose children are on `emails`
/// and `billing`: the parent runs once, after both, and reads both typed
/// results; a nested flow on `billing` whose parent is a child of the outer
/// flow on `orders`, and a dead child under `Continue`, are relayed too.
#[tokio::test]
async fn a_cross_queue_flow_runs_the_parent_with_its_childrens_results() {
    let env = TestEnv::start().await;
    let inner = Flow::new(member_on(&env, BILLING, "xf-inner", |_| {})).child(member_on(
        &env,
        EMAILS,
        "xf-inner-a",
        |_| {},
    ));
    Flow::new(order_callback(&env, "xf-close"))
        .child(member_on(&env, EMAILS, "xf-email", |_| {}))
        .child(member_on(&env, BILLING, "xf-charge", |_| {}))
        .child_with(
            ChildPolicy::Continue,
            member_on(&env, EMAILS, "xf-bad", |m| m.fail = true),
        )
        .child_flow(inner)
        .enqueue(&env.queue)
        .await
        .unwrap();
    let worker = spawn_wf_worker(&env).await;
    let fired = wait_callbacks(&env, 1).await;
    worker.stop().await;
    assert_eq!(fired["xf-close"], "1");
    let children = ledger_map(&env, "ledger:wf:children").await;
    assert_eq!(
        children["xf-close"], "3,1",
        "email, charge, inner ok; bad recorded"
    );
    let summary = ledger_map(&env, "ledger:wf:summary").await;
    assert_eq!(summary["xf-close"], "4/3/1/0");
    let effects = ledger_map(&env, "ledger:wf:effects").await;
    assert_eq!(
        effects["xf-inner"], "1",
        "the nested parent ran once, after its child"
    );
}

/// The relay's worker is killed (failpoint `relay_after_apply`) after the
/// notice was applied to the batch (which fired) and before it was removed
/// from the member's queue: the notice is still there. The next worker's
/// start-up relay (no watchdog runs, no other job comes) applies it again,
/// which counts nothing twice, and removes it.
#[tokio::test]
async fn a_crash_between_apply_and_remove_counts_once() {
    let env = TestEnv::start().await;
    Batch::new(&env.queue)
        .id("crash")
        .on_complete(order_callback(&env, "crash-done"))
        .add(member_on(&env, EMAILS, "crash-a", |_| {}))
        .enqueue()
        .await
        .unwrap();
    // Paused: the killed worker cannot take the callback (it would stay
    // leased, and no watchdog runs here).
    env.queue.pause(ORDERS).await.unwrap();
    run_until_relay_crash(&env).await;
    env.queue.resume(ORDERS).await.unwrap();
    let b = env.queue.batch(ORDERS, "crash").await.unwrap().unwrap();
    assert_eq!(
        (b.succeeded, b.state.as_str()),
        (1, "fired"),
        "applied before the crash"
    );
    assert_eq!(
        relay_len(&env, EMAILS).await,
        1,
        "not removed before the crash"
    );
    let worker = spawn_wf_worker(&env).await;
    wait_callbacks(&env, 1).await;
    wait_until(BOUND, "relay list drained at start-up", || async {
        relay_len(&env, EMAILS).await == 0
    })
    .await;
    worker.stop().await;
    let b = env.queue.batch(ORDERS, "crash").await.unwrap().unwrap();
    assert_eq!((b.total, b.succeeded), (1, 1), "counted once: {b:?}");
    assert_eq!(env.stats(EMAILS).await.counter("relayed"), 1);
    let fired = ledger_map(&env, "ledger:wf:callbacks").await;
    assert_eq!(fired["crash-done"], "1");
}

/// Replay across queues: a dead member on `emails` of a batch on `orders`
/// is replayed before the batch fired; the replay's notice (unfinished)
/// follows the death's notice (finished) in order, and the replay call
/// relays both before it returns (the death's found already applied). A
/// stale copy of the death's notice applied again afterwards (a relayer
/// that read the list before the replay) changes nothing: the batch waits
/// for the member's next outcome, then fires once.
#[tokio::test]
async fn a_replay_across_queues_is_relayed_in_order_and_a_stale_notice_changes_nothing() {
    let env = TestEnv::start().await;
    Batch::new(&env.queue)
        .id("rp")
        .on_complete(order_callback(&env, "rp-done"))
        .add(member_on(&env, EMAILS, "rp-dead", |m| m.fail = true))
        .add(member_on(&env, BILLING, "rp-later", |_| {}))
        .enqueue()
        .await
        .unwrap();
    env.queue.pause(BILLING).await.unwrap();
    // The death is applied, then the worker dies before removing the notice.
    run_until_relay_crash(&env).await;
    let relay_key = QueueKeys::new(EMAILS).relay();
    let death = env.list(&relay_key).await;
    assert_eq!(death.len(), 1, "the death's notice, applied, not removed");
    let batch = || async { env.queue.batch(ORDERS, "rp").await.unwrap().unwrap() };
    assert_eq!(batch().await.dead, 1);
    env.queue.pause(EMAILS).await.unwrap();
    assert!(env
        .queue
        .replay_dead(EMAILS, "rp-dead", true)
        .await
        .unwrap());
    // Relayed by the replay call: both notices removed, nothing left to do.
    assert_eq!(relay_len(&env, EMAILS).await, 0);
    assert_eq!(env.stats(EMAILS).await.counter("relayed"), 2);
    let r = env.queue.relay(EMAILS).await.unwrap();
    assert_eq!((r.applied, r.already, r.dead), (0, 0, 0), "{r:?}");
    let after = batch().await;
    assert_eq!(
        (after.state.as_str(), after.dead),
        ("sealed", 0),
        "{after:?}"
    );
    // A stale relayer applies the death's notice again: nothing changes.
    let mut c = env.conn().await;
    let _: () = c.rpush(&relay_key, &death[0]).await.unwrap();
    let r = env.queue.relay(EMAILS).await.unwrap();
    assert_eq!((r.applied, r.already), (0, 1), "{r:?}");
    let after = batch().await;
    assert_eq!(
        (after.state.as_str(), after.dead),
        ("sealed", 0),
        "{after:?}"
    );
    env.queue.resume(EMAILS).await.unwrap();
    env.queue.resume(BILLING).await.unwrap();
    let worker = spawn_wf_worker(&env).await;
    wait_callbacks(&env, 1).await;
    worker.stop().await;
    let summary = ledger_map(&env, "ledger:wf:summary").await;
    assert_eq!(
        summary["rp-done"], "2/1/1/0",
        "dead again after the replay, counted once"
    );
}

/// A notice whose batch key is corrupt (another type) cannot be applied: it
/// is moved to the member queue's dead-notice list (with batch and member,
/// counted in stats as `relay_dead`), and the notices after it, for a
/// healthy batch, still go through.
#[tokio::test]
async fn a_notice_for_a_corrupt_batch_is_kept_visible_and_blocks_nothing() {
    let env = TestEnv::start().await;
    Batch::new(&env.queue)
        .id("broken")
        .on_complete(order_callback(&env, "broken-done"))
        .add(member_on(&env, EMAILS, "broken-a", |_| {}))
        .enqueue()
        .await
        .unwrap();
    let broken = QueueKeys::new(ORDERS).batch("broken");
    let mut c = env.conn().await;
    let _: () = c.del(&broken).await.unwrap();
    let _: () = c.set(&broken, "not a hash").await.unwrap();
    Batch::new(&env.queue)
        .id("healthy")
        .on_complete(order_callback(&env, "healthy-done"))
        .add(member_on(&env, EMAILS, "healthy-a", |_| {}))
        .enqueue()
        .await
        .unwrap();
    let worker = spawn_wf_worker(&env).await;
    wait_callbacks(&env, 1).await;
    wait_until(BOUND, "the broken notice set aside", || async {
        env.stats(EMAILS).await.counter("relay_dead") == 1
    })
    .await;
    worker.stop().await;
    assert_eq!(relay_len(&env, EMAILS).await, 0);
    let dead = env.queue.relay_dead(EMAILS).await.unwrap();
    assert_eq!(dead.len(), 1, "{dead:?}");
    assert_eq!(
        (dead[0].batch.as_str(), dead[0].member.as_str()),
        (broken.as_str(), "broken-a")
    );
    assert!(dead[0].reason.contains("another type"), "{dead:?}");
    let fired = ledger_map(&env, "ledger:wf:callbacks").await;
    assert_eq!(fired.get("healthy-done").map(String::as_str), Some("1"));
    let admin = queue_core::admin::Admin::connect(&env.url).await.unwrap();
    let check = admin.check(EMAILS, false).await.unwrap();
    assert_eq!(check.relay_dead_notices, 1, "{check:?}");
    assert!(!check.is_clean());
}

/// A notice set aside because its batch's count was corrupt is applied
/// once the count is repaired: `Queue::relay_retry_dead` moves it back to
/// the relay list without its reason line, and the next relay run counts
/// the member and fires the batch (the callback waits in `orders`' main).
/// Before, nothing moved a dead notice back, and one pushed back by hand
/// (with its reason line) was set aside again as unreadable: the batch
/// never fired.
#[tokio::test]
async fn a_notice_set_aside_for_a_corrupt_count_applies_once_the_count_is_repaired() {
    let env = TestEnv::start().await;
    Batch::new(&env.queue)
        .id("repaired")
        .on_complete(order_callback(&env, "repaired-done"))
        .add(member_on(&env, EMAILS, "repaired-a", |_| {}))
        .enqueue()
        .await
        .unwrap();
    let batch_key = QueueKeys::new(ORDERS).batch("repaired");
    let mut c = env.conn().await;
    let _: () = c.hset(&batch_key, "succeeded", "x").await.unwrap();
    let worker = spawn_wf_worker(&env).await;
    wait_until(BOUND, "the notice set aside", || async {
        env.queue.relay_dead(EMAILS).await.unwrap().len() == 1
    })
    .await;
    worker.stop().await;
    assert!(env.queue.relay_dead(EMAILS).await.unwrap()[0]
        .reason
        .contains("corrupt"));
    assert_eq!(
        env.queue.relay(EMAILS).await.unwrap(),
        queue_core::RelayReport::default(),
        "nothing to relay until it is moved back"
    );
    let _: () = c.hset(&batch_key, "succeeded", 0).await.unwrap();
    let moved = env.queue.relay_retry_dead(EMAILS).await.unwrap();
    assert_eq!(
        (moved.moved, moved.kept, moved.left),
        (1, 0, 0),
        "{moved:?}"
    );
    assert!(env.queue.relay_dead(EMAILS).await.unwrap().is_empty());
    let r = env.queue.relay(EMAILS).await.unwrap();
    assert_eq!((r.applied, r.already, r.dead), (1, 0, 0), "{r:?}");
    let b = env.queue.batch(ORDERS, "repaired").await.unwrap().unwrap();
    assert_eq!(
        (b.state.as_str(), b.total, b.succeeded),
        ("fired", 1, 1),
        "{b:?}"
    );
    let main = env.list(&QueueKeys::new(ORDERS).main).await;
    assert_eq!(main, ["repaired-done"], "the callback, once");
    assert_eq!(relay_len(&env, EMAILS).await, 0);
}

/// Three worker processes run 20 cross-queue batches (members on `emails`
/// and `billing`, callbacks on `orders`); two are SIGKILLed mid-run, while
/// acking and relaying. The watchdog on every queue returns their jobs and
/// relays what they left. Every callback fires exactly once with all 10
/// members counted once.
#[tokio::test]
async fn killed_workers_lose_no_cross_queue_notice() {
    let env = TestEnv::start().await;
    const BATCHES: usize = 20;
    for b in 0..BATCHES {
        let mut batch = Batch::new(&env.queue)
            .id(format!("xk{b}"))
            .on_complete(order_callback(&env, &format!("xk{b}-done")));
        for i in 0..10 {
            let q = if i % 2 == 0 { EMAILS } else { BILLING };
            batch = batch.add(member_on(&env, q, &format!("xk{b}-{i}"), |m| {
                m.sleep_ms = 20
            }));
        }
        batch.enqueue().await.unwrap();
    }
    let _watchdog = spawn_wf_watchdog(&env).await;
    let procs = three_workers_two_killed(&env, 30).await;
    wait_callbacks(&env, BATCHES).await;
    let summary = ledger_map(&env, "ledger:wf:summary").await;
    for b in 0..BATCHES {
        assert_eq!(summary[&format!("xk{b}-done")], "10/10/0/0", "batch xk{b}");
    }
    // Exactly one callback job per batch (a callback handler killed mid-run
    // runs again, like any job: its run count is not the measure).
    let enqueued: u64 = env
        .conn()
        .await
        .hget(QueueKeys::new(ORDERS).stats, "enqueued")
        .await
        .unwrap();
    assert_eq!(enqueued, BATCHES as u64, "one callback each");
    wait_until(BOUND, "relay lists drained", || async {
        relay_len(&env, EMAILS).await + relay_len(&env, BILLING).await == 0
    })
    .await;
    drop(procs);
}

/// The field of `batch`'s hash (on [`WF_QUEUE`]) counting the producers
/// waiting for its callback `id` before it exists (docs/RESULTS.md).
async fn pending_waiters(env: &TestEnv, batch: &str, id: &str) -> Option<String> {
    let keys = QueueKeys::new(WF_QUEUE);
    let mut c = env.conn().await;
    c.hget(keys.batch(batch), format!("notify:{id}"))
        .await
        .unwrap()
}

async fn pending_len(env: &TestEnv) -> usize {
    let mut c = env.conn().await;
    c.hlen(QueueKeys::new(WF_QUEUE).pending()).await.unwrap()
}

/// A producer enqueues a flow and at once waits for its parent, before any
/// child ran: the parent job does not exist yet (only its spec, in the
/// flow's batch hash), so `result_wait.lua` finds the id in the queue's
/// pending hash and counts the waiter on the batch; the fire moves the
/// count to the parent job it creates (seen on the job while the queue is
/// paused), whose ack wakes the producer with the parent's typed value. The
/// pending entry is gone after the fire. Before, the wait answered
/// `NotFound` at once. The wait's own timeout is longer than the bound: a
/// lost wake-up fails the test instead of ending in a re-check.
#[tokio::test]
async fn waiting_on_a_flow_parent_before_it_exists_returns_its_result() {
    let env = TestEnv::start().await;
    let parent = JobSpec::new::<wf_typed_child::Job>(&42u32)
        .unwrap()
        .id("answer-1");
    Flow::new(parent)
        .child(member_with(&env, "answer-a", |m| m.sleep_ms = 1000))
        .enqueue(&env.queue)
        .await
        .unwrap();
    let waiter = {
        let queue = env.queue.clone();
        tokio::spawn(async move {
            tokio::time::timeout(
                BOUND,
                queue.wait_result::<wf_typed_child::Job>("answer-1", 3 * BOUND),
            )
            .await
        })
    };
    wait_until(
        BOUND,
        "the wait registered on the pending parent",
        || async {
            waiter.is_finished()
                || pending_waiters(&env, "answer-1", "answer-1")
                    .await
                    .is_some()
        },
    )
    .await;
    assert!(
        !waiter.is_finished(),
        "the wait answered before the parent existed: {:?}",
        waiter.await
    );
    assert!(env.queue.job(WF_QUEUE, "answer-1").await.unwrap().is_none());
    assert_eq!(pending_len(&env).await, 1);
    let worker = spawn_wf_worker(&env).await;
    let keys = QueueKeys::new(WF_QUEUE);
    wait_until(BOUND, "the child is running", || async {
        let state: Option<String> = env
            .conn()
            .await
            .hget(keys.job("answer-a"), "state")
            .await
            .unwrap();
        state.as_deref() == Some("active")
    })
    .await;
    // Paused, the worker finishes the child (which creates the parent) but
    // does not fetch the parent: the waiter's count is on the new job.
    env.queue.pause(WF_QUEUE).await.unwrap();
    wait_until(BOUND, "the parent was created", || async {
        env.queue.job(WF_QUEUE, "answer-1").await.unwrap().is_some()
    })
    .await;
    let notify: Option<String> = env
        .conn()
        .await
        .hget(keys.job("answer-1"), "notify")
        .await
        .unwrap();
    assert_eq!(notify.as_deref(), Some("1"), "the fire moved the waiter");
    assert_eq!(pending_waiters(&env, "answer-1", "answer-1").await, None);
    env.queue.resume(WF_QUEUE).await.unwrap();
    let value = waiter
        .await
        .unwrap()
        .expect("the waiter was not woken within BOUND");
    worker.stop().await;
    assert_eq!(value.unwrap(), 42);
    assert_eq!(pending_len(&env).await, 0, "the fire drops the entry");
}

/// Rolling deploy: a producer of this version waits for a flow's parent
/// before it exists (counted on the batch hash), and a worker of an older
/// version fires the batch: it creates the parent without moving the count
/// and wakes nobody (imitated by hand: the batch marked fired, its count
/// dropped, the parent enqueued under its id with no `notify`). The waiter,
/// re-checking every few seconds while pending, finds the parent, waits for
/// it, and gets its record well before its own long timeout; the stale
/// pending entry is dropped by that re-check.
#[tokio::test]
async fn a_parent_created_by_an_older_version_still_reaches_its_waiter() {
    let env = TestEnv::start().await;
    let parent = JobSpec::new::<wf_typed_child::Job>(&7u32)
        .unwrap()
        .id("old-1");
    Flow::new(parent)
        .child(member(&env, "old-a"))
        .enqueue(&env.queue)
        .await
        .unwrap();
    let waiter = {
        let queue = env.queue.clone();
        tokio::spawn(async move {
            tokio::time::timeout(
                BOUND,
                queue.wait_completion(WF_QUEUE, &"old-1".into(), 3 * BOUND),
            )
            .await
        })
    };
    wait_until(
        BOUND,
        "the wait registered on the pending parent",
        || async { pending_waiters(&env, "old-1", "old-1").await.is_some() },
    )
    .await;
    // The old version's fire.
    let keys = QueueKeys::new(WF_QUEUE);
    let mut c = env.conn().await;
    let _: () = c.hset(keys.batch("old-1"), "state", "fired").await.unwrap();
    let _: () = c.hdel(keys.batch("old-1"), "notify:old-1").await.unwrap();
    let reg = wf_typed_child::handler();
    env.queue
        .enqueue_raw(
            WF_QUEUE,
            reg.name(),
            reg.version(),
            1,
            queue_core::EnqueueOptions::default().id("old-1"),
            &rmp_serde::to_vec_named(&7u32).unwrap(),
        )
        .await
        .unwrap();
    let worker = spawn_wf_worker(&env).await;
    let record = waiter
        .await
        .unwrap()
        .expect("the waiter was not woken within BOUND (wait timeout 3 * BOUND)")
        .unwrap();
    worker.stop().await;
    assert_eq!(record.get("status").map(Vec::as_slice), Some(&b"done"[..]));
    assert_eq!(pending_len(&env).await, 0, "the stale entry is dropped");
}

/// The same callback id in two sealed batches: the first seal keeps the
/// pending entry, so a producer waiting for the id is counted on the first
/// batch, whose fire creates the job and wakes it; the second batch's seal
/// neither overwrote the entry nor does a fire of the other batch delete it.
#[tokio::test]
async fn a_callback_id_shared_by_two_batches_reaches_its_waiter() {
    let env = TestEnv::start().await;
    for (batch, m) in [("twin-1", "twin-a"), ("twin-2", "twin-b")] {
        Batch::new(&env.queue)
            .id(batch)
            .on_complete(callback(&env, "twin-cb"))
            .add(member(&env, m))
            .enqueue()
            .await
            .unwrap();
    }
    let keys = QueueKeys::new(WF_QUEUE);
    let named: Option<String> = env
        .conn()
        .await
        .hget(keys.pending(), "twin-cb")
        .await
        .unwrap();
    assert_eq!(named, Some(keys.batch("twin-1")), "the first seal keeps it");
    let waiter = {
        let queue = env.queue.clone();
        tokio::spawn(async move {
            tokio::time::timeout(
                BOUND,
                queue.wait_completion(WF_QUEUE, &"twin-cb".into(), 3 * BOUND),
            )
            .await
        })
    };
    wait_until(BOUND, "the wait registered on the first batch", || async {
        pending_waiters(&env, "twin-1", "twin-cb").await.is_some()
    })
    .await;
    // twin-2's member is cancelled: only twin-1 creates the callback.
    env.queue.cancel(WF_QUEUE, "twin-b").await.unwrap();
    let worker = spawn_wf_worker(&env).await;
    let record = waiter
        .await
        .unwrap()
        .expect("the waiter was not woken within BOUND (wait timeout 3 * BOUND)")
        .unwrap();
    worker.stop().await;
    assert_eq!(record.get("status").map(Vec::as_slice), Some(&b"done"[..]));
}

/// Waiting for a callback that does not come answers within bounds: a flow
/// whose child never runs (no worker) answers `Timeout` with the given
/// timeout; a batch's success callback that is never created (its member
/// was cancelled) answers `NotFound`, woken by the fire, which creates the
/// complete callback with its own waiter count; once every batch fired,
/// nothing is left pending.
#[tokio::test]
async fn waiting_for_a_callback_that_never_comes_answers_in_bounded_time() {
    let env = TestEnv::start().await;
    Flow::new(callback(&env, "stuck"))
        .child(member(&env, "stuck-a"))
        .enqueue(&env.queue)
        .await
        .unwrap();
    let short = Duration::from_millis(300);
    let e = env
        .queue
        .wait_completion(WF_QUEUE, &"stuck".into(), short)
        .await
        .unwrap_err();
    assert!(
        matches!(e, WaitError::Timeout { waited, .. } if waited == short),
        "{e:?}"
    );

    Batch::new(&env.queue)
        .id("half")
        .on_success(callback(&env, "half-ok"))
        .on_complete(callback(&env, "half-done"))
        .add(member(&env, "half-a"))
        .enqueue()
        .await
        .unwrap();
    // Long timeouts awaited within BOUND: a lost wake-up fails the test.
    let wait = |id: &'static str| {
        let queue = env.queue.clone();
        tokio::spawn(async move {
            tokio::time::timeout(
                BOUND,
                queue.wait_completion(WF_QUEUE, &id.into(), 3 * BOUND),
            )
            .await
            .expect("not woken within BOUND (wait timeout 3 * BOUND)")
        })
    };
    let (never, done) = (wait("half-ok"), wait("half-done"));
    wait_until(BOUND, "both waits registered on the batch", || async {
        pending_waiters(&env, "half", "half-ok").await.is_some()
            && pending_waiters(&env, "half", "half-done").await.is_some()
    })
    .await;
    env.queue.cancel(WF_QUEUE, "half-a").await.unwrap();
    let e = never.await.unwrap().unwrap_err();
    assert!(matches!(e, WaitError::NotFound { .. }), "{e:?}");
    let worker = spawn_wf_worker(&env).await;
    let record = done.await.unwrap().unwrap();
    assert_eq!(record.get("status").map(Vec::as_slice), Some(&b"done"[..]));
    assert_eq!(pending_waiters(&env, "half", "half-ok").await, None);
    // The worker also runs `stuck-a`: once `stuck` fired, nothing is pending.
    wait_until(BOUND, "nothing pending once every batch fired", || async {
        pending_len(&env).await == 0
    })
    .await;
    worker.stop().await;
}
