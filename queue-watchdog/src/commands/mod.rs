//! What each subcommand does: one file per subcommand, each fetching through
//! `queue_core::admin` (or the doctor) and formatting the result.

pub(crate) mod batches;
mod check;
mod dead;
mod doctor;
mod enqueue;
mod events;
mod flow;
#[cfg(feature = "inbox")]
mod inbox;
mod jobs;
mod limits;
#[cfg(feature = "outbox")]
mod outbox;
mod relay;
mod run;
mod stats;

pub use flow::describe as describe_cancel;

use std::process::ExitCode;

pub use enqueue::{parse_delay, parse_run_at};

use crate::cli::{BatchesCommand, Cli, Command, JobsCommand, QueueCommand, RelayCommand};
use crate::error::{CliError, Result};

pub async fn dispatch(cli: Cli) -> Result<ExitCode> {
    match cli.command {
        Command::Run(args) => run::run(&cli.redis, args).await,
        Command::Stats(args) => stats::stats(&cli.redis, args).await,
        Command::Jobs(JobsCommand::Show {
            id,
            selection,
            json,
        }) => jobs::show(&cli.redis, &id, &selection.queues, json).await,
        Command::Jobs(JobsCommand::Cancel {
            id,
            selection,
            json,
        }) => flow::cancel(&cli.redis, &id, &selection.queues, json).await,
        Command::Queue(QueueCommand::Pause(args)) => flow::pause(&cli.redis, args, true).await,
        Command::Queue(QueueCommand::Resume(args)) => flow::pause(&cli.redis, args, false).await,
        Command::Queue(QueueCommand::Limit(args)) => limits::limit(&cli.redis, args).await,
        Command::Queue(QueueCommand::Events(args)) => events::switch(&cli.redis, args).await,
        Command::Events(args) => events::events(&cli.redis, args).await,
        Command::Dead(cmd) => dead::dead(&cli.redis, cmd).await,
        Command::Check(args) => check::check(&cli.redis, args).await,
        Command::Doctor(args) => doctor::doctor(&cli.redis, args).await,
        Command::Dashboard(args) => dashboard(&cli.redis, args).await,
        Command::Outbox(cmd) => outbox(&cli.redis, cmd).await,
        Command::Enqueue(args) => enqueue::enqueue(&cli.redis, args).await,
        Command::Inbox(cmd) => inbox_cmd(cmd).await,
        Command::Batches(BatchesCommand::Show { id, queue, json }) => {
            batches::show(&cli.redis, &queue, &id, json).await
        }
        Command::Batches(BatchesCommand::List {
            queue,
            offset,
            limit,
            json,
        }) => batches::list(&cli.redis, &queue, offset, limit, json).await,
        Command::Relay(RelayCommand::Dead { queue, json }) => {
            relay::dead(&cli.redis, &queue, json).await
        }
        Command::Relay(RelayCommand::RetryDead { queue, json }) => {
            relay::retry_dead(&cli.redis, &queue, json).await
        }
    }
}

#[cfg(feature = "dashboard")]
async fn dashboard(url: &str, args: crate::cli::DashboardArgs) -> Result<ExitCode> {
    crate::dashboard::serve(url, args).await?;
    Ok(ExitCode::SUCCESS)
}

#[cfg(not(feature = "dashboard"))]
async fn dashboard(_: &str, _: crate::cli::DashboardArgs) -> Result<ExitCode> {
    Err(CliError::not_compiled_in("dashboard", "dashboard"))
}

#[cfg(feature = "outbox")]
async fn outbox(url: &str, cmd: crate::cli::OutboxCommand) -> Result<ExitCode> {
    outbox::dispatch(url, cmd).await
}

#[cfg(not(feature = "outbox"))]
async fn outbox(_: &str, _: crate::cli::OutboxCommand) -> Result<ExitCode> {
    Err(CliError::not_compiled_in("outbox", "outbox"))
}

#[cfg(feature = "inbox")]
async fn inbox_cmd(cmd: crate::cli_inbox::InboxCommand) -> Result<ExitCode> {
    inbox::dispatch(cmd).await
}

#[cfg(not(feature = "inbox"))]
async fn inbox_cmd(_: crate::cli_inbox::InboxCommand) -> Result<ExitCode> {
    Err(CliError::not_compiled_in("inbox", "inbox"))
}

/// JSON text of a value, for `--json` output.
fn to_json<T: serde::Serialize>(v: &T) -> Result<String> {
    serde_json::to_string(v).map_err(|e| CliError::Other(e.to_string()))
}

/// Completes on SIGTERM or ctrl-c (SIGINT). The handlers are installed by
/// this call, not when the future is first polled: a signal that comes
/// before (during a connect or the first watchdog pass) is kept and ends
/// the future at its first poll, instead of killing the process (the
/// default action) or being waited on for a whole pass.
pub fn termination() -> impl std::future::Future<Output = ()> + Send + 'static {
    use tokio::signal::unix::{signal, SignalKind};
    let term = signal(SignalKind::terminate());
    let int = signal(SignalKind::interrupt());
    async move {
        match (term, int) {
            (Ok(mut term), Ok(mut int)) => {
                tokio::select! {
                    _ = term.recv() => {}
                    _ = int.recv() => {}
                }
            }
            (Ok(mut one), Err(_)) | (Err(_), Ok(mut one)) => {
                one.recv().await;
            }
            (Err(e), Err(_)) => {
                // The default actions still end the process.
                tracing::warn!(error = %e, "cannot listen for SIGTERM or ctrl-c; no graceful stop");
                std::future::pending::<()>().await
            }
        }
    }
}
