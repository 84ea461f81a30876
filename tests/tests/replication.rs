//! Replication: WAIT on enqueue, and refusing to enqueue through a replica.

use std::time::Duration;

use queue_core::{ConnectionConfig, EnqueueOptions, Queue, QueueError, QueueKeys};
use queue_testkit::RedisServer;
use queue_tests::{task, wait_until, Task, TestEnv, BOUND};

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
