//! Command-line interface definition.

use clap::{Args, Parser, Subcommand};

/// Operator tool for queue-core queues: reclaim loop, stats, dead letters.
#[derive(Debug, Parser)]
#[command(name = "queue-watchdog", version, about)]
pub struct Cli {
    /// Redis URL.
    #[arg(long, global = true, env = "REDIS_URL", default_value = "redis://127.0.0.1:6379/")]
    pub redis: String,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the reclaim loop until SIGTERM / ctrl-c.
    Run(RunArgs),
    /// Print queue lengths and lifetime counters.
    Stats(StatsArgs),
    /// Inspect or replay dead-lettered jobs.
    #[command(subcommand)]
    Dead(DeadCommand),
}

#[derive(Debug, Args)]
pub struct RunArgs {
    /// Queue to watch (repeat for several).
    #[arg(long = "queue", short = 'q', required = true)]
    pub queues: Vec<String>,
    /// Milliseconds between passes.
    #[arg(long, default_value_t = 1000)]
    pub interval_ms: u64,
    /// Grace (ms) for ids found in processing without a lease (a worker died
    /// between BLMOVE and claim) before they are returned.
    #[arg(long, default_value_t = 30_000)]
    pub orphan_grace_ms: u64,
    /// Base backoff (ms) before a reclaimed job runs again; doubles per attempt, jittered.
    #[arg(long, default_value_t = 1000)]
    pub backoff_base_ms: u64,
    /// Maximum backoff (ms).
    #[arg(long, default_value_t = 60_000)]
    pub backoff_max_ms: u64,
    /// Expired leases handled per script call.
    #[arg(long, default_value_t = 500)]
    pub batch: usize,
    /// Run a single pass, print its report and exit.
    #[arg(long)]
    pub once: bool,
}

#[derive(Debug, Args)]
pub struct StatsArgs {
    /// Queue (repeat for several).
    #[arg(long = "queue", short = 'q', required = true)]
    pub queues: Vec<String>,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Subcommand)]
pub enum DeadCommand {
    /// List dead-lettered jobs, newest first, with their reason.
    List {
        /// Queue.
        #[arg(long, short = 'q')]
        queue: String,
        /// How many.
        #[arg(long, default_value_t = 50)]
        limit: u64,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Move dead-lettered jobs back to the queue.
    Replay {
        /// Queue.
        #[arg(long, short = 'q')]
        queue: String,
        /// Job ids to replay.
        #[arg(required_unless_present = "all")]
        ids: Vec<String>,
        /// Replay every dead-lettered job of the queue.
        #[arg(long, conflicts_with = "ids")]
        all: bool,
        /// Restart the attempt count at 0.
        #[arg(long)]
        reset_attempts: bool,
        /// Show what would be replayed without changing anything.
        #[arg(long)]
        dry_run: bool,
    },
}
