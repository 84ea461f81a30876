//! A worker process for fault tests: runs the `task` and `bill` jobs until SIGTERM.
//!
//! `test-worker <redis-url> <concurrency> <lease-ms> <grace-ms>`

use std::time::Duration;

use queue_core::{Worker, WorkerConfig};

#[tokio::main]
async fn main() {
    queue_tests::init_tracing();
    let args: Vec<String> = std::env::args().collect();
    let arg = |i: usize, default: u64| -> u64 {
        args.get(i).and_then(|s| s.parse().ok()).unwrap_or(default)
    };
    let url = args
        .get(1)
        .cloned()
        .expect("usage: test-worker <redis-url> [concurrency] [lease-ms] [grace-ms]");
    let config = WorkerConfig {
        concurrency: arg(2, 4) as usize,
        lease: Duration::from_millis(arg(3, 1000)),
        grace: Duration::from_millis(arg(4, 5000)),
        block_timeout: Duration::from_millis(200),
        ..WorkerConfig::default()
    };
    let builder = Worker::builder(&url)
        .register(queue_tests::task::handler())
        .register(queue_tests::bill::handler());
    let worker = queue_tests::results_jobs::if_asked()
        .into_iter()
        .chain(queue_tests::workflow_jobs::if_asked())
        .chain(queue_tests::dag_jobs::if_asked())
        .chain(queue_tests::limited::if_asked())
        .fold(builder, |b, reg| b.register(reg))
        .config(config)
        .build()
        .await
        .expect("worker");
    worker.run().await.expect("worker run");
}
