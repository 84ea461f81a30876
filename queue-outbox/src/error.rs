//! Typed errors. Every error names the outbox table, the queue and the job id
//! where they are known.

use queue_core::{JobId, QueueError};

/// Errors of [`Outbox`](crate::Outbox), [`Relay`](crate::Relay) and reconciliation.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OutboxError {
    /// PostgreSQL refused a statement, or the connection broke.
    ///
    /// During [`Outbox::enqueue_in_tx`](crate::Outbox::enqueue_in_tx) this means
    /// the caller's transaction failed: roll it back (nothing was published).
    /// During a relay batch it means the batch was not committed: its rows stay
    /// unpublished and the next batch sends them again (a no-op in Redis for
    /// the ones that were already sent).
    #[error("postgres error while {action} on outbox table `{table}`{}: {source}", job_suffix(.queue, .job_id))]
    Postgres {
        /// The outbox table.
        table: String,
        /// What was being done (`"inserting a row"`, `"selecting unpublished rows"`, ...).
        action: &'static str,
        /// The queue concerned, if one row is.
        queue: Option<String>,
        /// The job concerned, if one row is.
        job_id: Option<JobId>,
        /// The driver's error.
        #[source]
        source: tokio_postgres::Error,
    },

    /// Could not connect to PostgreSQL at all.
    #[error("cannot connect to postgres: {source}")]
    Connect {
        /// The driver's error (the connection string is not repeated: it may hold a password).
        #[source]
        source: tokio_postgres::Error,
    },

    /// A Redis error from `queue-core` (it carries the queue and job id).
    #[error(transparent)]
    Queue(#[from] QueueError),

    /// The job's arguments could not be encoded to MessagePack.
    #[error("cannot encode payload of job type `{job_type}` for queue `{queue}` (job `{job_id}`): {source}")]
    Encode {
        /// Queue name.
        queue: String,
        /// Job type name.
        job_type: String,
        /// Job id.
        job_id: JobId,
        /// The serializer's error.
        #[source]
        source: rmp_serde::encode::Error,
    },

    /// A job id, queue name, job type or number was rejected before anything was written.
    #[error("invalid job {id:?} for queue `{queue}`: {reason}")]
    InvalidJob {
        /// Queue name.
        queue: String,
        /// The job id.
        id: String,
        /// Why it was rejected.
        reason: String,
    },

    /// The outbox table name is not a plain (optionally schema-qualified) identifier.
    #[error("invalid outbox table name {name:?}: {reason}")]
    InvalidTableName {
        /// The rejected name.
        name: String,
        /// Why it was rejected.
        reason: &'static str,
    },

    /// A row of the outbox table could not be read (a column has an unexpected
    /// type or value). The relay marks such rows rejected instead of failing.
    #[error("invalid row {row_id} of outbox table `{table}`{}: {reason}", job_suffix(.queue, .job_id))]
    InvalidRow {
        /// The outbox table.
        table: String,
        /// The row's `id` column.
        row_id: i64,
        /// Its queue, if it could be read.
        queue: Option<String>,
        /// Its job id, if it could be read.
        job_id: Option<JobId>,
        /// What was wrong.
        reason: String,
    },

    /// A relay batch was stopped by its hook (see
    /// [`Relay::publish_batch_with_hook`](crate::Relay::publish_batch_with_hook)):
    /// the transaction was dropped without commit, as in a crash.
    #[error("relay batch interrupted at {step}{}", job_suffix(.queue, .job_id))]
    Interrupted {
        /// Where: `before_enqueue`, `after_enqueue` or `before_commit`.
        step: &'static str,
        /// The row's queue, for the per-row steps.
        queue: Option<String>,
        /// The row's job id, for the per-row steps.
        job_id: Option<JobId>,
    },
}

fn job_suffix(queue: &Option<String>, job_id: &Option<JobId>) -> String {
    match (queue, job_id) {
        (Some(q), Some(id)) => format!(" (queue `{q}`, job `{id}`)"),
        (Some(q), None) => format!(" (queue `{q}`)"),
        (None, Some(id)) => format!(" (job `{id}`)"),
        (None, None) => String::new(),
    }
}

impl OutboxError {
    pub(crate) fn pg(table: &str, action: &'static str, source: tokio_postgres::Error) -> Self {
        OutboxError::Postgres {
            table: table.to_string(),
            action,
            queue: None,
            job_id: None,
            source,
        }
    }

    pub(crate) fn pg_job(
        table: &str,
        action: &'static str,
        queue: &str,
        job_id: &JobId,
        source: tokio_postgres::Error,
    ) -> Self {
        OutboxError::Postgres {
            table: table.to_string(),
            action,
            queue: Some(queue.to_string()),
            job_id: Some(job_id.clone()),
            source,
        }
    }

    /// The queue this error concerns, when it concerns one.
    pub fn queue(&self) -> Option<&str> {
        match self {
            OutboxError::Postgres { queue, .. }
            | OutboxError::InvalidRow { queue, .. }
            | OutboxError::Interrupted { queue, .. } => queue.as_deref(),
            OutboxError::Encode { queue, .. } | OutboxError::InvalidJob { queue, .. } => {
                Some(queue)
            }
            OutboxError::Queue(e) => e.queue(),
            OutboxError::Connect { .. } | OutboxError::InvalidTableName { .. } => None,
        }
    }

    /// The job this error concerns, when it concerns one.
    pub fn job_id(&self) -> Option<&JobId> {
        match self {
            OutboxError::Postgres { job_id, .. }
            | OutboxError::InvalidRow { job_id, .. }
            | OutboxError::Interrupted { job_id, .. } => job_id.as_ref(),
            OutboxError::Encode { job_id, .. } => Some(job_id),
            OutboxError::Queue(e) => e.job_id(),
            _ => None,
        }
    }

    /// True when the PostgreSQL connection this error came from is closed
    /// (a relay built with [`Relay::connect`](crate::Relay::connect) reconnects).
    pub fn is_connection_closed(&self) -> bool {
        match self {
            OutboxError::Postgres { source, .. } | OutboxError::Connect { source } => {
                source.is_closed()
            }
            _ => false,
        }
    }
}

/// Short alias used throughout the crate.
pub type Result<T, E = OutboxError> = std::result::Result<T, E>;
