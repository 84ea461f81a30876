//! The crash and fault harness. See `docs/RELIABILITY.md`.
//!
//! ```text
//! cargo run --release -p queue-tests --bin chaos -- --jobs 10000 --workers 4 --kills 50
//! ```
//!
//! Modes: the orchestrator (default), `worker` (the worker processes the
//! orchestrator starts from its own executable), `aof-window` (measures
//! acknowledged enqueues lost when Redis is SIGKILLed) and `inbox` (database
//! effects through the transactional inbox, with its `inbox-worker`s) and
//! `flow` (batch callbacks exactly once, with its `flow-worker`s).

mod aof;
mod args;
mod check;
mod dog;
mod flow;
mod inbox;
mod inbox_job;
mod job;
mod orchestrator;
mod report;
mod rng;

#[tokio::main]
async fn main() {
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let code = match argv.first().map(String::as_str) {
        Some("worker") => {
            queue_tests::init_tracing();
            job::worker_main(&argv[1..]).await
        }
        Some("inbox-worker") => {
            queue_tests::init_tracing();
            inbox_job::worker_main(&argv[1..]).await
        }
        Some("inbox") => {
            init_stderr_tracing();
            inbox::main(&argv[1..]).await
        }
        Some("flow-worker") => {
            queue_tests::init_tracing();
            flow::worker_main(&argv[1..]).await
        }
        Some("flow") => {
            init_stderr_tracing();
            flow::main(&argv[1..]).await
        }
        Some("aof-window") => {
            init_stderr_tracing();
            aof::main(&argv[1..]).await
        }
        _ => {
            init_stderr_tracing();
            orchestrator::main(&argv).await
        }
    };
    std::process::exit(code);
}

/// Logs of the orchestrator go to stderr (errors only unless RUST_LOG says
/// otherwise), so the report on stdout stays clean.
fn init_stderr_tracing() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("error")),
        )
        .with_writer(std::io::stderr)
        .try_init();
}
