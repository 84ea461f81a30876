//! Idempotency support: stable ids, completion records, steps, locks.

use std::collections::HashMap;
use std::time::Duration;

use queue_core::{Lock, LockOptions, Queue, Watchdog, Worker};
use queue_testkit::RedisServer;
use queue_tests::{
    bill, fast_config, fast_watchdog, init_tracing, redis_conn, wait_until, Bill, WorkerProcess,
};
use redis::AsyncCommands;

const T: Duration = Duration::from_secs(30);
const WORKER_BIN: &str = env!("CARGO_BIN_EXE_test-worker");

async fn setup() -> (RedisServer, String, Queue) {
    init_tracing();
    let server = RedisServer::start().expect("redis-server starts");
    let url = server.url();
    let queue = Queue::connect(&url).await.expect("connect");
    (server, url, queue)
}

async fn billing_worker(
    url: &str,
    lease: Duration,
) -> (
    queue_core::ShutdownHandle,
    tokio::task::JoinHandle<queue_core::Result<()>>,
) {
    let mut cfg = fast_config();
    cfg.lease = lease;
    let worker = Worker::builder(url)
        .register(bill::handler())
        .config(cfg)
        .build()
        .await
        .unwrap();
    let h = worker.shutdown_handle();
    (h, tokio::spawn(worker.run_until(std::future::pending())))
}

async fn hash(url: &str, key: &str) -> HashMap<String, i64> {
    redis_conn(url).await.hgetall(key).await.unwrap()
}

#[tokio::test]
async fn a_retried_job_skips_steps_already_done() {
    let (_server, url, queue) = setup().await;
    let id = bill::enqueue(
        &queue,
        Bill {
            ledger: url.clone(),
            cents: 500,
            fail_after_charge: 2,
            ..Bill::default()
        },
    )
    .await
    .unwrap();
    let (stop, join) = billing_worker(&url, Duration::from_secs(2)).await;
    wait_until(T, "completion", || async {
        queue.stats("billing").await.unwrap().counter("completed") == 1
    })
    .await;
    stop.shutdown();
    join.await.unwrap().unwrap();
    let key = format!("billing:{id}:charge");
    assert_eq!(
        hash(&url, "ledger:charge_calls").await.get(&key),
        Some(&1),
        "charge step ran once over 3 attempts"
    );
    assert_eq!(hash(&url, "ledger:charges").await.get(&key), Some(&500));
    assert_eq!(
        hash(&url, "ledger:receipts").await.get(id.as_str()),
        Some(&1)
    );
    let rec = queue.completion("billing", &id).await.unwrap().unwrap();
    assert_eq!(rec.get("attempts").map(String::as_str), Some("3"));
    assert!(
        rec.get("result").is_some_and(|r| r.starts_with("ch_")),
        "result reference kept: {rec:?}"
    );
    let ttl: i64 = redis_conn(&url)
        .await
        .pttl(format!("q:{{billing}}:steps:{id}"))
        .await
        .unwrap();
    assert!(ttl > 0, "step results expire with the completion record");
}

#[tokio::test]
async fn worker_killed_after_the_charge_before_the_ack_does_not_charge_twice() {
    let (_server, url, queue) = setup().await;
    let id = bill::enqueue(
        &queue,
        Bill {
            ledger: url.clone(),
            cents: 900,
            sleep_after_charge_ms: 60_000,
            ..Bill::default()
        },
    )
    .await
    .unwrap();
    // A worker process charges, then is SIGKILLed before it can ack.
    let mut proc = WorkerProcess::start(WORKER_BIN, &url, 2, 500, 5000);
    let key = format!("billing:{id}:charge");
    wait_until(T, "the charge happened", || async {
        hash(&url, "ledger:charges").await.contains_key(&key)
    })
    .await;
    proc.kill();

    let watchdog = Watchdog::connect(&url, ["billing"], fast_watchdog())
        .await
        .unwrap();
    wait_until(T, "reclaim", || async {
        watchdog.run_once().await.unwrap().reclaimed >= 1
    })
    .await;
    let (stop, join) = billing_worker(&url, Duration::from_secs(2)).await;
    wait_until(T, "completion", || async {
        queue.stats("billing").await.unwrap().counter("completed") == 1
    })
    .await;
    stop.shutdown();
    join.await.unwrap().unwrap();
    assert_eq!(
        hash(&url, "ledger:charge_calls").await.get(&key),
        Some(&1),
        "the payment API was called once"
    );
    assert_eq!(hash(&url, "ledger:charges").await.get(&key), Some(&900));
}

#[tokio::test]
async fn a_redelivered_completed_job_is_acked_without_running() {
    let (_server, url, queue) = setup().await;
    let id = bill::enqueue_with_id(
        &queue,
        "invoice-1",
        Bill {
            ledger: url.clone(),
            cents: 100,
            ..Bill::default()
        },
    )
    .await
    .unwrap()
    .id;
    let (stop, join) = billing_worker(&url, Duration::from_secs(2)).await;
    wait_until(T, "completion", || async {
        queue.stats("billing").await.unwrap().counter("completed") == 1
    })
    .await;
    // Put the same id back as if delivered again (e.g. restored from an old
    // snapshot or pushed by hand): the completion record stops the second run.
    let mut c = redis_conn(&url).await;
    let _: () = c
        .hset_multiple(
            "q:{billing}:job:invoice-1",
            &[
                ("state", "queued"),
                ("type", "bill"),
                ("v", "1"),
                ("attempts", "1"),
            ],
        )
        .await
        .unwrap();
    let _: () = c.lpush("q:{billing}:main", "invoice-1").await.unwrap();
    wait_until(T, "skip", || async {
        queue
            .stats("billing")
            .await
            .unwrap()
            .counter("skipped_done")
            == 1
    })
    .await;
    stop.shutdown();
    join.await.unwrap().unwrap();
    let s = queue.stats("billing").await.unwrap();
    assert_eq!((s.main, s.processing, s.counter("completed")), (0, 0, 1));
    assert_eq!(hash(&url, "ledger:charge_calls").await.len(), 1);
    assert!(queue.job("billing", &id).await.unwrap().is_none());
}

#[tokio::test]
async fn lock_is_exclusive_and_release_needs_the_token() {
    let (_server, url, queue) = setup().await;
    let a = Lock::acquire(
        queue.connection(),
        "report",
        LockOptions::default()
            .ttl(Duration::from_millis(300))
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
    // A bounded wait: gives up after the wait, does not block forever...
    let t0 = std::time::Instant::now();
    let waited = Lock::acquire(
        queue.connection(),
        "report",
        LockOptions::default().wait(Duration::from_millis(100)),
    )
    .await
    .unwrap();
    assert!(waited.is_none());
    assert!(t0.elapsed() < Duration::from_millis(250));
    // ...and gets it once the holder's lease runs out.
    let b = Lock::acquire(
        queue.connection(),
        "report",
        LockOptions::default().wait(Duration::from_secs(2)),
    )
    .await
    .unwrap()
    .expect("acquired after expiry");
    assert!(b.fencing() > a.fencing(), "fencing numbers grow");
    // The stale holder cannot extend or release the new owner's lock.
    assert!(!a.extend(Duration::from_secs(5)).await.unwrap());
    assert!(!a.is_held());
    assert!(!a.release().await.unwrap());
    let owner: String = redis_conn(&url).await.get("lock:{report}").await.unwrap();
    assert_eq!(owner, b.token());
    assert!(b.release().await.unwrap());
}

#[tokio::test]
async fn auto_renew_keeps_the_lock_and_stops_when_it_is_lost() {
    let (_server, url, queue) = setup().await;
    let guard = Lock::acquire(
        queue.connection(),
        "sync",
        LockOptions::default().ttl(Duration::from_millis(300)),
    )
    .await
    .unwrap()
    .unwrap();
    tokio::time::sleep(Duration::from_millis(1000)).await;
    assert!(guard.is_held(), "renewed past three leases");
    assert!(
        Lock::acquire(queue.connection(), "sync", LockOptions::default())
            .await
            .unwrap()
            .is_none()
    );
    // Someone deletes it and another owner takes it: the renew loop notices.
    let _: () = redis_conn(&url).await.del("lock:{sync}").await.unwrap();
    let thief = Lock::acquire(queue.connection(), "sync", LockOptions::default())
        .await
        .unwrap()
        .unwrap();
    tokio::time::timeout(Duration::from_secs(2), guard.lost())
        .await
        .expect("loss noticed");
    assert!(!guard.is_held());
    assert!(thief.is_held());
}

#[tokio::test]
async fn lock_renewal_stops_when_redis_is_unreachable() {
    init_tracing();
    let mut server = RedisServer::start().unwrap();
    let queue = Queue::connect(&server.url()).await.unwrap();
    let guard = Lock::acquire(
        queue.connection(),
        "job",
        LockOptions::default().ttl(Duration::from_millis(400)),
    )
    .await
    .unwrap()
    .unwrap();
    server.kill();
    tokio::time::timeout(Duration::from_secs(5), guard.lost())
        .await
        .expect("unhealthy holder gives the lock up");
    assert!(!guard.is_held());
}
