//! The binary's error type and its exit codes.

use std::process::ExitCode;

use queue_core::admin::AdminError;
use queue_core::QueueError;

/// What went wrong running a subcommand.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    /// An error from queue-core (it names the queue and job).
    #[error(transparent)]
    Queue(#[from] QueueError),
    /// An error of queue-core's admin API.
    #[error(transparent)]
    Admin(AdminError),
    /// An outbox (PostgreSQL) operation failed.
    #[cfg(feature = "outbox")]
    #[error(transparent)]
    Outbox(#[from] queue_outbox::OutboxError),
    /// An inbox (PostgreSQL) operation failed.
    #[cfg(feature = "inbox")]
    #[error(transparent)]
    Inbox(#[from] queue_inbox::InboxError),
    /// A plain Redis command of the watchdog failed (the doctor's reads).
    #[error("redis error ({context}): {source}")]
    Redis {
        /// What was being done.
        context: String,
        /// The client's error.
        #[source]
        source: redis::RedisError,
    },
    /// Anything else (bad input, a bind failure, a subcommand not compiled in, ...).
    #[error("{0}")]
    Other(String),
}

impl From<AdminError> for CliError {
    fn from(e: AdminError) -> Self {
        match e {
            AdminError::Queue(e) => CliError::Queue(e),
            AdminError::DiscoveryNeedsSingleServer => CliError::Other(
                "queue discovery needs a single Redis; on a cluster name the queues with --queue"
                    .into(),
            ),
            other => CliError::Admin(other),
        }
    }
}

impl CliError {
    pub fn redis(context: impl Into<String>) -> impl FnOnce(redis::RedisError) -> CliError {
        let context = context.into();
        move |source| CliError::Redis { context, source }
    }

    /// A subcommand whose cargo feature was left out of this build.
    #[cfg_attr(
        all(feature = "dashboard", feature = "outbox", feature = "inbox"),
        allow(dead_code)
    )]
    pub fn not_compiled_in(subcommand: &str, feature: &str) -> CliError {
        CliError::Other(format!(
            "the `{subcommand}` subcommand is not compiled into this queue-watchdog: \
             rebuild it with `cargo build -p queue-watchdog --features {feature}` \
             (it is on by default)"
        ))
    }

    /// Exit code: 2 when Redis could not be reached or answered an error.
    pub fn exit_code(&self) -> ExitCode {
        ExitCode::from(2)
    }
}

pub type Result<T> = std::result::Result<T, CliError>;
