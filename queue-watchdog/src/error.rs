//! The binary's error type and its exit codes.

use std::process::ExitCode;

use queue_core::QueueError;

/// What went wrong running a subcommand.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    /// An error from queue-core (it names the queue and job).
    #[error(transparent)]
    Queue(#[from] QueueError),
    /// An outbox (PostgreSQL) operation failed.
    #[error(transparent)]
    Outbox(#[from] queue_outbox::OutboxError),
    /// A plain Redis command of the watchdog failed.
    #[error("redis error ({context}): {source}")]
    Redis {
        /// What was being done.
        context: String,
        /// The client's error.
        #[source]
        source: redis::RedisError,
    },
    /// Anything else (bad input, a bind failure, ...).
    #[error("{0}")]
    Other(String),
}

impl CliError {
    pub fn redis(context: impl Into<String>) -> impl FnOnce(redis::RedisError) -> CliError {
        let context = context.into();
        move |source| CliError::Redis { context, source }
    }

    /// Exit code: 2 when Redis could not be reached or answered an error.
    pub fn exit_code(&self) -> ExitCode {
        ExitCode::from(2)
    }
}

pub type Result<T> = std::result::Result<T, CliError>;
