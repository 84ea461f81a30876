//! Replication: WAIT on enqueue, and refusing to enqueue through a replica.

use std::time::Duration;

use queue_core::{EnqueueOptions, Queue, QueueError};
use queue_testkit::RedisServer;
use queue_tests::{init_tracing, task, wait_until, Task};

const T: Duration = Duration::from_secs(20);

fn replica_of(primary: &RedisServer) -> RedisServer {
    let port = primary.port().to_string();
    RedisServer::start_with(&["--replicaof", "127.0.0.1", &port]).expect("replica starts")
}

async fn link_up(replica: &RedisServer) {
    wait_until(T, "replication link up", || async {
        replica
            .command(&["INFO", "replication"])
            .map(|i| i.contains("master_link_status:up"))
            .unwrap_or(false)
    })
    .await;
}

#[tokio::test]
async fn wait_for_replicas_reports_an_unreplicated_write() {
    init_tracing();
    let primary = RedisServer::start().unwrap();
    let queue = Queue::connect(&primary.url()).await.unwrap();
    let t = Task {
        ledger: primary.url(),
        ..Task::default()
    };
    let opts = EnqueueOptions::new()
        .id("needs-replica")
        .wait_for_replicas(1, Duration::from_millis(200));
    let err = task::enqueue_with(&queue, opts.clone(), t.clone())
        .await
        .unwrap_err();
    match &err {
        QueueError::NotReplicated {
            acked,
            wanted,
            job_id,
            queue,
        } => {
            assert_eq!((*acked, *wanted), (0, 1));
            assert_eq!(job_id.as_str(), "needs-replica");
            assert_eq!(queue, "tasks");
        }
        other => panic!("expected NotReplicated, got {other}"),
    }
    // The write itself landed on the primary, and the message says so.
    assert!(err.to_string().contains("written on the primary"));
    assert_eq!(queue.stats("tasks").await.unwrap().main, 1);

    let replica = replica_of(&primary);
    link_up(&replica).await;
    let ok = task::enqueue_with(
        &queue,
        EnqueueOptions::new().wait_for_replicas(1, Duration::from_secs(2)),
        t,
    )
    .await
    .unwrap();
    assert!(ok.is_new());
    wait_until(T, "the replica has both jobs", || async {
        replica
            .command(&["LLEN", "q:{tasks}:main"])
            .map(|r| r.contains(":2"))
            .unwrap_or(false)
    })
    .await;
}

#[tokio::test]
async fn enqueue_through_a_read_only_replica_is_refused_clearly() {
    init_tracing();
    let primary = RedisServer::start().unwrap();
    let replica = replica_of(&primary);
    link_up(&replica).await;
    let queue = Queue::connect(&replica.url()).await.unwrap();
    let err = task::enqueue(&queue, Task::default()).await.unwrap_err();
    assert!(matches!(err, QueueError::ReadOnlyReplica { .. }), "{err}");
    assert!(err.to_string().contains("read-only replica"), "{err}");
    assert!(err.job_id().is_some());
}

#[tokio::test]
async fn stats_report_oldest_waiting_age_and_recent_throughput() {
    init_tracing();
    let server = RedisServer::start().unwrap();
    let url = server.url();
    let queue = Queue::connect(&url).await.unwrap();
    assert_eq!(queue.stats("tasks").await.unwrap().oldest_waiting_ms, None);
    task::enqueue(
        &queue,
        Task {
            ledger: url.clone(),
            ..Task::default()
        },
    )
    .await
    .unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let s = queue.stats("tasks").await.unwrap();
    let age = s.oldest_waiting_ms.expect("a job waits");
    assert!((300..5000).contains(&age), "age {age}");
    assert_eq!(s.completed_last_minute, 0);
    let (stop, join) = queue_tests::spawn_worker(&url, queue_tests::fast_config()).await;
    wait_until(T, "completion", || async {
        queue.stats("tasks").await.unwrap().counter("completed") == 1
    })
    .await;
    stop.shutdown();
    join.await.unwrap().unwrap();
    let s = queue.stats("tasks").await.unwrap();
    assert_eq!(s.completed_last_minute, 1);
    assert_eq!(s.oldest_waiting_ms, None);
}
