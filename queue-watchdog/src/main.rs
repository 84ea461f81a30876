//! `queue-watchdog`: the operator binary.
//!
//! - `run`: the reclaim loop (expired leases back to the queue with jittered
//!   backoff, exhausted ones to the dead-letter list, unleased ids adopted).
//!   Safe to run as several copies at once.
//! - `stats`: queue lengths and lifetime counters.
//! - `dead list` / `dead replay`: inspect and replay dead-lettered jobs.

mod cli;
mod commands;

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
            std::process::ExitCode::from(2)
        }
    }
}
