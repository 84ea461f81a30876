//! `worker`: runs the `send_welcome` jobs that `web` enqueues.
//!
//! ```text
//! cargo run -p queue-examples --bin worker -- --redis redis://127.0.0.1:6379/ --concurrency 4
//! ```
//!
//! Stops gracefully on SIGTERM or ctrl-c: no new fetches, in-flight jobs get
//! `--grace-ms` to finish, any still running stay leased and the watchdog
//! (`queue-watchdog run --queue emails`) returns them once their lease expires.
//! A worker killed outright (SIGKILL, crash, power loss) loses nothing either:
//! its leases expire and the watchdog returns the jobs. `WELCOME_WORK_MS` sets
//! the simulated work per job (default 300 ms).

use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use queue_core::{Backoff, QueueError, Worker, WorkerConfig};
use queue_examples::send_welcome;
use tracing::{error, info};

/// Worker process of the examples: runs `send_welcome` jobs.
#[derive(Debug, Parser)]
#[command(name = "worker", about)]
struct Args {
    /// Redis URL.
    #[arg(long, env = "REDIS_URL", default_value = "redis://127.0.0.1:6379/")]
    redis: String,
    /// Jobs run at once.
    #[arg(long, default_value_t = 4)]
    concurrency: usize,
    /// Lease per delivery (ms): how soon the watchdog may return the jobs of a
    /// worker that died. The heartbeat renews it every third of it.
    #[arg(long, default_value_t = 30_000)]
    lease_ms: u64,
    /// On shutdown, how long (ms) in-flight jobs may take to finish.
    #[arg(long, default_value_t = 30_000)]
    grace_ms: u64,
    /// Base retry backoff (ms) after a retryable failure; doubles per attempt, jittered.
    #[arg(long, default_value_t = 1_000)]
    backoff_base_ms: u64,
}

#[tokio::main]
async fn main() -> ExitCode {
    queue_examples::init_tracing("info");
    match work(Args::parse()).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            error!("worker failed: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn work(args: Args) -> Result<(), QueueError> {
    let config = WorkerConfig {
        concurrency: args.concurrency,
        lease: Duration::from_millis(args.lease_ms),
        grace: Duration::from_millis(args.grace_ms),
        backoff: Backoff {
            base: Duration::from_millis(args.backoff_base_ms),
            ..Backoff::default()
        },
        ..WorkerConfig::default()
    };
    let worker = Worker::builder(&args.redis)
        .register(send_welcome::handler())
        .config(config)
        .build()
        .await?;
    info!(pid = std::process::id(), "worker ready");
    worker.run().await
}
