//! Idempotency support: stable ids, completion records, steps, locks.

use std::time::Duration;

use queue_core::{Lock, LockOptions, QueueKeys};
use queue_tests::{bill, fast_config, redis_conn, wait_until, Bill, TestEnv, WorkerProcess, BOUND};
use redis::AsyncCommands;

const WORKER_BIN: &str = env!("CARGO_BIN_EXE_test-worker");

/// A billing worker with a 2 s lease.
fn billing_config() -> queue_core::WorkerConfig {
    let mut cfg = fast_config();
    cfg.lease = Duration::from_secs(2);
    cfg
}

#[tokio::test]
async fn a_retried_job_skips_steps_already_done() {
    let env = TestEnv::start().await;
    let queue = &env.queue;
    let id = env
        .enqueue_bill(Bill {
            fail_after_charge: 2,
            ..env.bill(500)
        })
        .await;
    env.run_until_completed_with("billing", 1, billing_config())
        .await;
    let key = format!("billing:{id}:charge");
    assert_eq!(
        env.ledger_hash::<i64>("ledger:charge_calls")
            .await
            .get(&key),
        Some(&1),
        "charge step ran once over 3 attempts"
    );
    assert_eq!(
        env.ledger_hash::<i64>("ledger:charges").await.get(&key),
        Some(&500)
    );
    assert_eq!(
        env.ledger_hash::<i64>("ledger:receipts")
            .await
            .get(id.as_str()),
        Some(&1)
    );
    let rec = queue.completion("billing", &id).await.unwrap().unwrap();
    assert_eq!(rec.get("attempts").map(String::as_str), Some("3"));
    assert!(
        rec.get("result").is_some_and(|r| r.starts_with("ch_")),
        "result reference kept: {rec:?}"
    );
    let ttl: i64 = env
        .conn()
        .await
        .pttl(QueueKeys::new("billing").steps(id.as_str()))
        .await
        .unwrap();
    assert!(ttl > 0, "step results expire with the completion record");
}

/// A dead job's `ctx.step` results live as long as its dead entry: the
/// dead-lettering takes their TTL off (`dead_letter()` in the prelude), so a
/// replay weeks later still finds the completed step and does not run its
/// side effect again; the replay gives them a live job's TTL back. Before,
/// they expired 7 days after the last step while the dead entry lived on
/// (7 days from `dead_at`, or for ever with dead retention 0), and a replay
/// in between charged twice.
#[tokio::test]
async fn a_dead_jobs_step_results_live_as_long_as_the_dead_job() {
    let env = TestEnv::start().await;
    // One attempt: the charge step runs, then the job fails and is dead.
    let opts = queue_core::EnqueueOptions::new().max_attempts(1);
    let b = Bill {
        fail_after_charge: 1,
        ..env.bill(700)
    };
    let id = bill::enqueue_with(&env.queue, opts, b)
        .await
        .expect("enqueue bill")
        .id;
    let worker = env.spawn_billing_worker(billing_config()).await;
    env.wait_stats("billing", "the job is dead-lettered", |s| s.dead == 1)
        .await;
    let steps = QueueKeys::new("billing").steps(id.as_str());
    let mut conn = env.conn().await;
    let charged: Vec<String> = conn.hkeys(&steps).await.unwrap();
    assert_eq!(charged, vec!["charge".to_string()]);
    let ttl: i64 = conn.pttl(&steps).await.unwrap();
    assert_eq!(ttl, -1, "step results of a dead job have no TTL");
    // Replayed: the second attempt passes, with the stored charge.
    assert!(env.queue.replay_dead("billing", &id, false).await.unwrap());
    env.wait_completed("billing", 1).await;
    worker.stop().await;
    let key = format!("billing:{id}:charge");
    assert_eq!(
        env.ledger_hash::<i64>("ledger:charge_calls")
            .await
            .get(&key),
        Some(&1),
        "the charge step ran once, not again on the replay"
    );
    let ttl: i64 = conn.pttl(&steps).await.unwrap();
    assert!(ttl > 0, "step results expire with the completion record");
}

/// A stored step result that no longer decodes (the step's result type
/// changed between versions, here a struct stored by an older `bill` where
/// this one reads a `String`) fails the delivery retryably, naming the job,
/// queue and step and saying to rename the step: during a rolling deploy a
/// worker of the old version may still finish the job. Before, the job was
/// dead-lettered at its first delivery ("does not decode", permanent).
#[tokio::test]
async fn a_step_result_that_no_longer_decodes_is_retried_not_dead_lettered() {
    #[derive(serde::Serialize)]
    struct OldCharge {
        id: String,
        cents: u64,
    }
    let env = TestEnv::start().await;
    let id = env.enqueue_bill(env.bill(500)).await;
    let old = rmp_serde::to_vec_named(&OldCharge {
        id: "ch_old".into(),
        cents: 500,
    })
    .unwrap();
    let steps = QueueKeys::new("billing").steps(id.as_str());
    let _: () = env.conn().await.hset(&steps, "charge", old).await.unwrap();
    // A long backoff keeps the retry in the delayed set while we look.
    let mut config = billing_config();
    config.backoff = queue_core::Backoff {
        base: Duration::from_secs(600),
        max: Duration::from_secs(600),
    };
    let worker = env.spawn_billing_worker(config).await;
    env.wait_stats("billing", "the first delivery ended", |s| {
        s.delayed + s.dead >= 1
    })
    .await;
    worker.stop().await;
    let s = env.stats("billing").await;
    assert_eq!((s.dead, s.delayed), (0, 1), "retried, not dead-lettered");
    let job = env
        .queue
        .job("billing", &id)
        .await
        .unwrap()
        .expect("job kept");
    assert_eq!(job.state(), Some("delayed"));
    assert_eq!(job.attempts(), 1);
    let error = job.field("last_error").unwrap_or_default();
    for needle in [
        id.as_str(),
        "`billing`",
        "step `charge`",
        "rename the step (e.g. `charge_v2`)",
    ] {
        assert!(error.contains(needle), "{needle:?} not in {error:?}");
    }
    assert!(
        env.ledger_hash::<i64>("ledger:charge_calls")
            .await
            .is_empty(),
        "the stored step is not run again"
    );
}

#[tokio::test]
async fn worker_killed_after_the_charge_before_the_ack_does_not_charge_twice() {
    let env = TestEnv::start().await;
    let url = &env.url;
    let id = env
        .enqueue_bill(Bill {
            sleep_after_charge_ms: 60_000,
            ..env.bill(900)
        })
        .await;
    // A worker process charges, then is SIGKILLed before it can ack.
    let mut proc = WorkerProcess::start(WORKER_BIN, url, 2, 500, 5000);
    let key = format!("billing:{id}:charge");
    // The charge step is over once its result is recorded under the job (a
    // kill between the charge and that record would rightly repeat the call).
    let steps = QueueKeys::new("billing").steps(id.as_str());
    wait_until(BOUND, "the charge step is recorded", || async {
        let charged = env
            .ledger_hash::<i64>("ledger:charges")
            .await
            .contains_key(&key);
        let recorded: bool = env.conn().await.hexists(&steps, "charge").await.unwrap();
        charged && recorded
    })
    .await;
    proc.kill();

    env.reclaim("billing", 1).await;
    env.run_until_completed_with("billing", 1, billing_config())
        .await;
    assert_eq!(
        env.ledger_hash::<i64>("ledger:charge_calls")
            .await
            .get(&key),
        Some(&1),
        "the payment API was called once"
    );
    assert_eq!(
        env.ledger_hash::<i64>("ledger:charges").await.get(&key),
        Some(&900)
    );
}

#[tokio::test]
async fn a_redelivered_completed_job_is_acked_without_running() {
    let env = TestEnv::start().await;
    let queue = &env.queue;
    let id = queue_tests::bill::enqueue_with_id(queue, "invoice-1", env.bill(100))
        .await
        .unwrap()
        .id;
    let worker = env.spawn_billing_worker(billing_config()).await;
    env.wait_completed("billing", 1).await;
    // Put the same id back as if delivered again (e.g. restored from an old
    // snapshot or pushed by hand): the completion record stops the second run.
    let fields = [
        ("state", "queued"),
        ("type", "bill"),
        ("v", "1"),
        ("attempts", "1"),
    ];
    env.seed_job("billing", "invoice-1", &fields).await;
    env.wait_stats("billing", "skip", |s| s.counter("skipped_done") == 1)
        .await;
    worker.stop().await;
    let s = queue.stats("billing").await.unwrap();
    assert_eq!((s.main, s.processing, s.counter("completed")), (0, 0, 1));
    assert_eq!(env.ledger_hash::<i64>("ledger:charge_calls").await.len(), 1);
    assert!(queue.job("billing", &id).await.unwrap().is_none());
}

#[tokio::test]
async fn lock_is_exclusive_and_release_needs_the_token() {
    let env = TestEnv::start().await;
    let (url, queue) = (&env.url, &env.queue);
    let a = Lock::acquire(
        queue.connection(),
        "report",
        LockOptions::default()
            .ttl(Duration::from_secs(6))
            .no_renew(),
    )
    .await
    .unwrap()
    .expect("free lock");
    assert!(
        Lock::acquire(queue.connection(), "report", LockOptions::default())
            .await
            .unwrap()
            .is_none()
    );
    // A bounded wait: gives up after the wait, does not block forever (the
    // timeout only catches a hang) nor until the holder's 6 s TTL runs out:
    // it would then get the lock, so `None` proves it gave up before.
    let waited = tokio::time::timeout(
        Duration::from_secs(30),
        Lock::acquire(
            queue.connection(),
            "report",
            LockOptions::default().wait(Duration::from_millis(100)),
        ),
    )
    .await
    .expect("a bounded wait returns")
    .unwrap();
    assert!(waited.is_none(), "it waited until the holder's TTL ran out");
    // ...and gets it once the holder's lease runs out.
    let b = Lock::acquire(
        queue.connection(),
        "report",
        LockOptions::default().wait(Duration::from_secs(30)),
    )
    .await
    .unwrap()
    .expect("acquired after expiry");
    assert!(b.fencing() > a.fencing(), "fencing numbers grow");
    // The stale holder cannot extend or release the new owner's lock.
    assert!(!a.extend(Duration::from_secs(5)).await.unwrap());
    assert!(!a.is_held());
    assert!(!a.release().await.unwrap());
    let owner: String = redis_conn(url).await.get("lock:{report}").await.unwrap();
    assert_eq!(owner, b.token());
    assert!(b.release().await.unwrap());
}

#[tokio::test]
async fn auto_renew_keeps_the_lock_and_stops_when_it_is_lost() {
    let env = TestEnv::start().await;
    let (url, queue) = (&env.url, &env.queue);
    let guard = Lock::acquire(
        queue.connection(),
        "sync",
        LockOptions::default().ttl(Duration::from_secs(1)),
    )
    .await
    .unwrap()
    .unwrap();
    // A renewal every third of the TTL: a stall of up to ~650 ms of a loaded
    // machine does not lose it (with 300 ms, one of ~170 ms did).
    tokio::time::sleep(Duration::from_millis(3500)).await;
    assert!(guard.is_held(), "renewed past three leases");
    assert!(
        Lock::acquire(queue.connection(), "sync", LockOptions::default())
            .await
            .unwrap()
            .is_none()
    );
    // Someone deletes it and another owner takes it: the renew loop notices.
    let _: () = redis_conn(url).await.del("lock:{sync}").await.unwrap();
    let thief = Lock::acquire(queue.connection(), "sync", LockOptions::default())
        .await
        .unwrap()
        .unwrap();
    tokio::time::timeout(Duration::from_secs(5), guard.lost())
        .await
        .expect("loss noticed");
    assert!(!guard.is_held());
    assert!(thief.is_held());
}

#[tokio::test]
async fn lock_renewal_stops_when_redis_is_unreachable() {
    let mut env = TestEnv::start().await;
    let queue = env.queue.clone();
    let guard = Lock::acquire(
        queue.connection(),
        "job",
        LockOptions::default().ttl(Duration::from_millis(400)),
    )
    .await
    .unwrap()
    .unwrap();
    env.server.kill();
    tokio::time::timeout(Duration::from_secs(5), guard.lost())
        .await
        .expect("unhealthy holder gives the lock up");
    assert!(!guard.is_held());
}
