//! `queue-watchdog`: the operator binary.
//!
//! - `run`: the reclaim loop (expired leases back to the queue with jittered
//!   backoff, exhausted ones to the dead-letter list, unleased ids adopted),
//!   optionally exporting Prometheus metrics. Safe to run as several copies.
//! - `stats`: lengths, oldest waiting age, lost (expired-lease) jobs,
//!   throughput over the last minute, lifetime counters.
//! - `jobs show`: one job's hash, location, lease and history.
//! - `dead list` / `dead replay` / `dead purge`: the dead-letter list.
//! - `check`: the queue invariants, with `--repair`.
//! - `doctor`: the Redis settings that lose queue data, with fixes.
//! - `dashboard` (cargo feature `dashboard`, on by default): the web UI.
//! - `enqueue`: one job from JSON (producers without Rust, scripts).
//! - `relay dead` / `relay retry-dead`: cross-queue batch notices that could
//!   not be applied; moving them back once the cause is repaired.
//! - `outbox …` (cargo feature `outbox`, on by default): the PostgreSQL outbox.
//! - `inbox …` (cargo feature `inbox`, on by default): the PostgreSQL inbox.
//!
//! Every queue read and write goes through `queue_core::admin`; this crate
//! parses arguments and formats results. Its own Redis reads are the
//! doctor's (INFO, CONFIG, TTL scan). See `docs/OPERATIONS.md`.

mod cli;
mod cli_inbox;
mod commands;
#[cfg(feature = "dashboard")]
mod dashboard;
mod doctor;
mod error;
mod format;
mod history_view;
mod metrics_export;
mod queue_gauges;
#[cfg(test)]
mod test_dead;
mod views;

use clap::Parser;

#[tokio::main]
async fn main() -> std::process::ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = cli::Cli::parse();
    match commands::dispatch(cli).await {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e}");
            e.exit_code()
        }
    }
}
