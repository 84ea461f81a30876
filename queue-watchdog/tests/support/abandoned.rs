//! A DAG whose producer "died" before the seal: a corrupt main list makes
//! its root's enqueue fail after its batches were opened, so they stay open
//! (and expire after the open TTL). Shared by the batch CLI and dashboard tests.

use queue_core::{Dag, Queue, QueueKeys};

/// Enqueues `dag` on `queue_name` so that it fails half-way, then mends the
/// main list.
pub async fn abandon_dag(url: &str, queue: &Queue, queue_name: &str, dag: Dag) {
    let main = QueueKeys::new(queue_name).main;
    let mut c = redis::Client::open(url)
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let _: () = redis::cmd("SET")
        .arg(&main)
        .arg("x")
        .query_async(&mut c)
        .await
        .unwrap();
    dag.enqueue(queue).await.unwrap_err();
    let _: () = redis::cmd("DEL")
        .arg(&main)
        .query_async(&mut c)
        .await
        .unwrap();
}
