//! Replication: WAIT on enqueue, refusing to enqueue through a replica, and
//! following a failover behind a `redis://` name that moves to the new
//! primary.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use queue_core::{
    ConnectionConfig, EnqueueOptions, Queue, QueueError, QueueKeys, RedisConnection, Watchdog,
};
use queue_testkit::proxy::ReplyDropper;
use queue_testkit::RedisServer;
use queue_tests::env::{wait_ledger, worker_on};
use queue_tests::{
    fast_config, fast_watchdog, task, wait_until, Task, TestEnv, WatchdogHandle, WorkerHandle,
    BOUND,
};

fn replica_of(primary: &RedisServer) -> RedisServer {
    let port = primary.port().to_string();
    RedisServer::start_with(&["--replicaof", "127.0.0.1", &port]).expect("replica starts")
}

async fn link_up(replica: &RedisServer) {
    wait_until(BOUND, "replication link up", || async {
        replica
            .command(&["INFO", "replication"])
            .map(|i| i.contains("master_link_status:up"))
            .unwrap_or(false)
    })
    .await;
}

#[tokio::test]
async fn wait_for_replicas_reports_an_unreplicated_write() {
    let env = TestEnv::start().await;
    let queue = &env.queue;
    let t = env.task(0);
    let opts = EnqueueOptions::new()
        .id("needs-replica")
        .wait_for_replicas(1, Duration::from_millis(200));
    let err = task::enqueue_with(queue, opts.clone(), t.clone())
        .await
        .unwrap_err();
    match &err {
        QueueError::NotReplicated {
            acked,
            wanted,
            job_id,
            queue,
            wait_refused,
        } => {
            assert_eq!((*acked, *wanted), (0, 1));
            assert_eq!(wait_refused, &None);
            assert_eq!(job_id.as_str(), "needs-replica");
            assert_eq!(queue, "tasks");
        }
        other => panic!("expected NotReplicated, got {other}"),
    }
    // The write itself landed on the primary, and the message says so.
    assert!(err.to_string().contains("written on the primary"));
    assert_eq!(env.stats("tasks").await.main, 1);

    let replica = replica_of(&env.server);
    link_up(&replica).await;
    let ok = task::enqueue_with(
        queue,
        EnqueueOptions::new().wait_for_replicas(1, Duration::from_secs(2)),
        t,
    )
    .await
    .unwrap();
    assert!(ok.is_new());
    let main = QueueKeys::new("tasks").main;
    wait_until(BOUND, "the replica has both jobs", || async {
        replica
            .command(&["LLEN", &main])
            .map(|r| r.contains(":2"))
            .unwrap_or(false)
    })
    .await;
}

/// A `WAIT` Redis refuses (here an ACL user without `+wait`: `NOPERM`)
/// confirmed no replica: the enqueue is `NotReplicated` with the refusal,
/// never `Ok`. Before, the pipeline's ignored error reply to `WAIT` read as
/// "no count" and skipped the check, so `wait_for_replicas(0, ..)` returned
/// `Ok` (and the outbox relay marked such rows published).
#[tokio::test]
async fn a_refused_wait_is_not_replicated_rather_than_ok() {
    let env = TestEnv::start().await;
    let acl = "ACL SETUSER producer on >secret ~* &* +@all -wait";
    assert!(env.server.command(&[acl]).unwrap().contains("OK"));
    let url = format!("redis://producer:secret@127.0.0.1:{}/", env.server.port());
    let queue = Queue::connect(&url).await.unwrap();
    for (i, wanted) in [0u32, 1].into_iter().enumerate() {
        let opts = EnqueueOptions::new()
            .id(format!("refused-wait-{i}"))
            .wait_for_replicas(wanted, Duration::from_secs(1));
        let err = task::enqueue_with(&queue, opts, env.task(0))
            .await
            .unwrap_err();
        match &err {
            QueueError::NotReplicated {
                acked: 0,
                wanted: w,
                wait_refused: Some(reply),
                ..
            } if *w == wanted => assert!(reply.contains("NOPERM"), "{reply}"),
            other => panic!("wanted {wanted}: expected a refused WAIT, got {other}"),
        }
        assert!(err.to_string().contains("refused WAIT"), "{err}");
        assert!(!err.outcome_unknown());
        // The job itself was written on the primary.
        assert_eq!(env.stats("tasks").await.main, i as u64 + 1);
    }
}

#[tokio::test]
async fn enqueue_through_a_read_only_replica_is_refused_clearly() {
    let env = TestEnv::start().await;
    let replica = replica_of(&env.server);
    link_up(&replica).await;
    let queue = Queue::connect(&replica.url()).await.unwrap();
    let err = task::enqueue(&queue, Task::default()).await.unwrap_err();
    assert!(matches!(err, QueueError::ReadOnlyReplica { .. }), "{err}");
    assert!(err.to_string().contains("read-only replica"), "{err}");
    assert!(err.job_id().is_some());
}

/// Enqueues `t` under the stable id `id` until Redis accepts it (the
/// documented way to use enqueue errors); true when an attempt was refused
/// with `ReadOnlyReplica` on the way.
async fn enqueue_until_accepted(queue: &Queue, id: &str, t: &Task) -> bool {
    let saw_readonly = AtomicBool::new(false);
    wait_until(BOUND, &format!("enqueue of {id} accepted"), || async {
        match task::enqueue_with(queue, EnqueueOptions::new().id(id), t.clone()).await {
            Ok(_) => true,
            Err(e) => {
                if matches!(e, QueueError::ReadOnlyReplica { .. }) {
                    saw_readonly.store(true, Ordering::SeqCst);
                }
                false
            }
        }
    })
    .await;
    saw_readonly.load(Ordering::SeqCst)
}

/// A failover behind a DNS name or a virtual IP (managed Redis): the name
/// moves to the new primary, while the connections already open stay on the
/// demoted one, which answers every write `READONLY`. The proxy stands for
/// the name: it forwards to A, then, after B is promoted and A made B's
/// replica, sends new connections to B. A producer, a worker and a watchdog,
/// connected through it before the failover, must resume against B: the
/// producer's enqueues are accepted, the worker fetches, runs and acks the
/// jobs enqueued after the switch (each once), and the watchdog returns an
/// orphan left on B. Before, a `redis://` connection reconnected only after
/// I/O errors: all three stayed on A for ever (the enqueue below never
/// succeeded).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_moved_failover_endpoint_is_followed_by_producers_workers_and_the_watchdog() {
    let env = TestEnv::start().await.with_separate_ledger();
    let a = &env.server;
    let b = replica_of(a);
    link_up(&b).await;
    let proxy = ReplyDropper::start(a.port()).unwrap();
    let url = proxy.url();
    let producer = Queue::connect(&url).await.unwrap();
    let worker = WorkerHandle::start(worker_on(&url, [task::handler()], fast_config())).await;
    let watchdog = Watchdog::connect(&url, ["tasks"], fast_watchdog())
        .await
        .unwrap();
    let watchdog = WatchdogHandle::spawn(watchdog);
    enqueue_until_accepted(&producer, "before", &env.task(0)).await;
    wait_ledger(&env.ledger_url, "the job before the failover ran", |l| {
        l.effects.get("before") == Some(&1)
    })
    .await;

    // The failover: B promoted, A demoted to B's replica, the name moved.
    assert!(b
        .command(&["REPLICAOF", "NO", "ONE"])
        .unwrap()
        .contains("OK"));
    let b_port = b.port().to_string();
    let demote = a.command(&["REPLICAOF", "127.0.0.1", &b_port]).unwrap();
    assert!(demote.contains("OK"), "{demote}");
    proxy.forward_new_connections_to(b.port());

    let after: Vec<String> = (1..=5).map(|i| format!("after-{i}")).collect();
    let mut refused = false;
    for (i, id) in after.iter().enumerate() {
        refused |= enqueue_until_accepted(&producer, id, &env.task(i as u64 + 1)).await;
    }
    assert!(
        refused,
        "the producer's open connection reached the demoted A first"
    );
    wait_ledger(&env.ledger_url, "the jobs after the failover ran", |l| {
        after.iter().all(|id| l.effects.contains_key(id))
    })
    .await;
    worker.stop().await;

    // The watchdog works on B: an id left in processing without a lease (a
    // worker died between BLMOVE and its claim) is returned and runs.
    enqueue_until_accepted(&producer, "orphan", &env.task(9)).await;
    let keys = QueueKeys::new("tasks");
    let moved = b
        .command(&["LMOVE", &keys.main, &keys.processing, "RIGHT", "LEFT"])
        .unwrap();
    assert!(moved.contains("orphan"), "{moved}");
    let worker = WorkerHandle::start(worker_on(&url, [task::handler()], fast_config())).await;
    wait_ledger(
        &env.ledger_url,
        "the orphan returned by the watchdog ran",
        |l| l.effects.contains_key("orphan"),
    )
    .await;
    worker.stop().await;
    watchdog.stop().await;

    // Nothing lost, nothing run twice.
    let ledger = queue_tests::Ledger::read(&env.ledger_url).await;
    for id in ["before", "orphan"]
        .iter()
        .copied()
        .chain(after.iter().map(String::as_str))
    {
        assert_eq!(ledger.effects.get(id), Some(&1), "{id}: {ledger:?}");
    }
    assert!(ledger.duplicates().is_empty(), "{ledger:?}");
}

/// A connection used from a second runtime that shuts down right after a
/// write was answered `READONLY`: the reconnect that write started was
/// spawned on that runtime and is dropped with it, unfinished. Later
/// `READONLY`s, on the first runtime, must still reconnect (here to the
/// primary the name has moved to). Before, only the end of the reconnect
/// cleared its "running" flag: the cancelled one never ended, and the
/// connection stayed on the replica for ever.
#[test]
fn a_reconnect_cancelled_with_its_runtime_does_not_stop_later_ones() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let primary = RedisServer::start().unwrap();
    let replica = replica_of(&primary);
    rt.block_on(link_up(&replica));
    let name = ReplyDropper::start(replica.port()).unwrap();
    let conn = rt
        .block_on(RedisConnection::connect(
            &name.url(),
            &ConnectionConfig::default(),
        ))
        .unwrap();
    let probe = QueueKeys::new("readonly-probe").main;
    let write = |mut c: RedisConnection| {
        let probe = probe.clone();
        async move {
            redis::cmd("DEL")
                .arg(&probe)
                .query_async::<i64>(&mut c)
                .await
        }
    };

    // The current-thread runtime returns from `block_on` as soon as the
    // write has its reply: the reconnect spawned there never finishes.
    let other = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let err = other.block_on(write(conn.clone())).unwrap_err();
    assert_eq!(err.code(), Some("READONLY"), "{err}");
    drop(other);

    name.forward_new_connections_to(primary.port());
    rt.block_on(wait_until(
        BOUND,
        "a write accepted after the name moved to the primary",
        || async { write(conn.clone()).await.is_ok() },
    ));
}

#[tokio::test]
async fn stats_report_oldest_waiting_age_and_recent_throughput() {
    let env = TestEnv::start().await;
    assert_eq!(env.stats("tasks").await.oldest_waiting_ms, None);
    env.enqueue(env.task(0)).await;
    // The job has waited 300 ms by the Redis clock (instead of a fixed sleep).
    env.wait_stats("tasks", "the job waited 300 ms", |s| {
        s.oldest_waiting_ms.is_some_and(|age| age >= 300)
    })
    .await;
    let s = env.stats("tasks").await;
    let age = s.oldest_waiting_ms.expect("a job waits");
    assert!((300..5000).contains(&age), "age {age}");
    assert_eq!(s.completed_last_minute, 0);
    env.run_until_completed("tasks", 1).await;
    let s = env.stats("tasks").await;
    assert_eq!(s.completed_last_minute, 1);
    assert_eq!(s.oldest_waiting_ms, None);
}

/// `wait_for_replicas(n, 0)` (or less than a millisecond) is clamped to a
/// `WAIT` of at least 1 ms and at most within the connection's response
/// timeout. Before, it sent `WAIT 1 0` (block until a replica answers): with
/// no replica the enqueue ran into the response timeout ("outcome unknown"
/// instead of `NotReplicated`) and every later call on the `Queue`'s shared
/// connection waited behind the blocked `WAIT`.
#[tokio::test]
async fn a_zero_replica_wait_is_bounded_and_leaves_the_connection_usable() {
    let env = TestEnv::start().await;
    let cfg = ConnectionConfig {
        response_timeout: Duration::from_secs(1),
        ..ConnectionConfig::default()
    };
    let queue = Queue::connect_with(&env.url, &cfg)
        .await
        .unwrap()
        .with_retry_window(Duration::ZERO);
    for (i, timeout) in [Duration::ZERO, Duration::from_micros(500), Duration::MAX]
        .into_iter()
        .enumerate()
    {
        let opts = EnqueueOptions::new()
            .id(format!("no-replica-{i}"))
            .wait_for_replicas(1, timeout);
        let err = task::enqueue_with(&queue, opts, env.task(0))
            .await
            .unwrap_err();
        assert!(
            matches!(
                err,
                QueueError::NotReplicated {
                    acked: 0,
                    wanted: 1,
                    ..
                }
            ),
            "timeout {timeout:?}: expected NotReplicated, got {err}"
        );
        let stats = queue.stats("tasks").await;
        assert_eq!(stats.expect("the connection is usable").main, i as u64 + 1);
    }
}

/// A batch sent in several windows (here 5,000 jobs: 256 per call, 8 calls
/// per window) with `wait_for_replicas` runs `WAIT` with every window, and
/// is confirmed only as far as its least replicated window: after a failover
/// between windows, the new connection's `WAIT` knows nothing of a window
/// the old primary lost. Before, only the last window carried a `WAIT`, and
/// the batch could be `Ok` with its first windows gone.
#[tokio::test]
async fn a_batch_in_several_windows_waits_for_replicas_with_each() {
    let env = TestEnv::start().await;
    let replica = replica_of(&env.server);
    link_up(&replica).await;
    let opts = EnqueueOptions::new().wait_for_replicas(1, Duration::from_secs(5));
    let items: Vec<(EnqueueOptions, Vec<u8>)> =
        (0..5_000).map(|_| (opts.clone(), vec![0xc0])).collect();
    let before = env.command_calls("wait").await;
    let written = env
        .queue
        .enqueue_raw_batch("tasks", "t", 1, 3, items)
        .await
        .expect("replicated");
    assert_eq!(written.len(), 5_000);
    let waits = env.command_calls("wait").await - before;
    assert!(waits >= 3, "one WAIT per window of 2,048 jobs: {waits}");
}
