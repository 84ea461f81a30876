//! Helpers shared by the producer and observability tests.

use std::time::Duration;

use queue_core::{Queue, QueueStats, Worker};

/// Runs `worker` until the stats of `queue_name` satisfy `done`, checked
/// every 50 ms for at most 30 s (the caller's assertions say what was missing).
pub async fn run_worker_until(
    worker: Worker,
    queue: Queue,
    queue_name: &'static str,
    done: impl Fn(&QueueStats) -> bool + Send + Sync + 'static,
) {
    worker
        .run_until(async move {
            for _ in 0..600 {
                if done(&queue.stats(queue_name).await.unwrap()) {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
        .await
        .unwrap();
}
