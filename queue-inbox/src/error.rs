//! Typed errors. Every error about one delivery names its job id, queue and
//! inbox key; [`InboxError::into_job_error`] decides retryable or permanent.

use queue_core::{JobError, JobId};

/// Errors of [`Inbox`](crate::Inbox) and [`InboxTx`](crate::InboxTx).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum InboxError {
    /// PostgreSQL refused a statement, or the connection broke. Inside a
    /// handler the transaction is lost: drop it (it rolls back) and let the
    /// job be retried (this maps to a retryable [`JobError`]).
    #[error("postgres error while {action} on inbox table `{table}`{}: {source}", job_suffix(.queue, .job_id, .key))]
    Postgres {
        /// The inbox table.
        table: String,
        /// What was being done (`"claiming the inbox row"`, ...).
        action: &'static str,
        /// The queue concerned, if one delivery is.
        queue: Option<String>,
        /// The job concerned, if one delivery is.
        job_id: Option<JobId>,
        /// The inbox key concerned, if one delivery is.
        key: Option<String>,
        /// The driver's error.
        #[source]
        source: tokio_postgres::Error,
    },

    /// A newer delivery of the same job (a larger fencing token) has already
    /// written this inbox row: this delivery is stale (its lease was lost and
    /// the job runs elsewhere) and must not commit. Permanent for this
    /// delivery; the newer one carries on.
    #[error("inbox row (queue `{queue}`, key `{key}`) of job `{job_id}` was written by a newer delivery (fence {newer}); this delivery's fence {fence} is stale")]
    Fenced {
        /// The job.
        job_id: JobId,
        /// Its queue.
        queue: String,
        /// The inbox key.
        key: String,
        /// This delivery's fencing token.
        fence: u64,
        /// The fencing token stored in the row.
        newer: u64,
    },

    /// [`InboxTx::complete`](crate::InboxTx::complete) found no row claimed by
    /// this delivery: call [`already_done`](crate::InboxTx::already_done) first,
    /// in the same transaction and with the same key. Permanent (a bug in the handler).
    #[error("inbox row (queue `{queue}`, key `{key}`) is not claimed by this delivery of job `{job_id}` (found: {found}); call already_done() first in the same transaction")]
    NotClaimed {
        /// The job.
        job_id: JobId,
        /// Its queue.
        queue: String,
        /// The inbox key.
        key: String,
        /// What was found instead (`no row`, `done by job x`, `running for job x`).
        found: String,
    },

    /// The business key given with [`InboxTx::key`](crate::InboxTx::key) is
    /// empty, longer than 512 bytes or has control characters.
    #[error("invalid inbox key {key:?} for job `{job_id}` on queue `{queue}`: {reason}")]
    InvalidKey {
        /// The job.
        job_id: JobId,
        /// Its queue.
        queue: String,
        /// The rejected key.
        key: String,
        /// Why.
        reason: &'static str,
    },

    /// The inbox row of this delivery (or the uncommitted claim of another)
    /// stayed locked by another transaction for longer than the inbox's lock
    /// timeout ([`Inbox::with_lock_timeout`](crate::Inbox::with_lock_timeout),
    /// 30 s by default): most likely the transaction of a worker that stopped
    /// without dying (its lease expired, its connection still open).
    /// Retryable: the transaction is lost (PostgreSQL aborted it); the next
    /// attempt waits again, and finds the row free once that transaction
    /// ended (committed, rolled back, or killed by the server's
    /// `idle_in_transaction_session_timeout`).
    #[error("inbox row (queue `{queue}`, key `{key}`) of job `{job_id}` stayed locked by another transaction for over {waited:?} (the inbox's lock timeout) while {action}; retry later: {source}")]
    LockTimeout {
        /// What was being done (`"claiming the inbox row"`, ...).
        action: &'static str,
        /// The job.
        job_id: JobId,
        /// Its queue.
        queue: String,
        /// The inbox key.
        key: String,
        /// The bound that ran out.
        waited: std::time::Duration,
        /// The driver's error (SQLSTATE `55P03`, lock_not_available).
        #[source]
        source: tokio_postgres::Error,
    },

    /// The inbox key is held by a job of another type on the same queue: two
    /// handlers chose the same key (`.key(..)`, or a job id of one type used
    /// as the other's key). A key is per queue, not per job type, so this
    /// delivery would take the other type's effect for its own and skip it
    /// (or take over its row). Permanent: give each type its own keys
    /// (`.key(format!("ship_order:{}", id))`), or, when two types are meant
    /// to share a key (one effect, whichever runs first), say so with
    /// [`InboxTx::share_key_across_types`](crate::InboxTx::share_key_across_types).
    #[error("inbox key `{key}` on queue `{queue}` belongs to job type `{}` (job `{}`), not to job `{job_id}` of another type: give each job type its own keys (e.g. prefix them with the type), or call share_key_across_types() where sharing is meant", .owner.job_type.as_deref().unwrap_or("?"), .owner.job_id)]
    KeyCollision {
        /// The job (its type is the handler's own).
        job_id: JobId,
        /// Its queue.
        queue: String,
        /// The inbox key.
        key: String,
        /// The row of the other type's job (`owner.job_type`,
        /// `owner.job_id`, `owner.status`).
        owner: Box<crate::InboxRecord>,
    },

    /// The inbox table name is not a plain (optionally schema-qualified) identifier.
    #[error("invalid inbox table name {name:?}: {reason}")]
    InvalidTableName {
        /// The rejected name.
        name: String,
        /// Why it was rejected.
        reason: &'static str,
    },
}

fn job_suffix(queue: &Option<String>, job_id: &Option<JobId>, key: &Option<String>) -> String {
    let mut parts = Vec::new();
    if let Some(q) = queue {
        parts.push(format!("queue `{q}`"));
    }
    if let Some(id) = job_id {
        parts.push(format!("job `{id}`"));
    }
    if let Some(k) = key {
        parts.push(format!("key `{k}`"));
    }
    if parts.is_empty() {
        String::new()
    } else {
        format!(" ({})", parts.join(", "))
    }
}

impl InboxError {
    pub(crate) fn pg(table: &str, action: &'static str, source: tokio_postgres::Error) -> Self {
        InboxError::Postgres {
            table: table.to_string(),
            action,
            queue: None,
            job_id: None,
            key: None,
            source,
        }
    }

    /// True for errors that retrying the same delivery cannot fix.
    pub fn is_permanent(&self) -> bool {
        !matches!(
            self,
            InboxError::Postgres { .. } | InboxError::LockTimeout { .. }
        )
    }

    /// The handler's error: [`Postgres`](Self::Postgres) and
    /// [`LockTimeout`](Self::LockTimeout) are retryable (the
    /// transaction rolled back; the next attempt starts over), everything else
    /// is permanent. (A bare `?` in a handler goes through `queue-core`'s
    /// blanket `From<E: Error> for JobError`, which makes every error
    /// retryable: harmless for [`Fenced`](Self::Fenced), whose stale delivery
    /// cannot ack or retry anyway, but use this to record the right kind.)
    ///
    /// ```
    /// use queue_inbox::InboxError;
    /// let e = InboxError::Fenced {
    ///     job_id: "invoice-7".into(), queue: "billing".into(), key: "invoice-7".into(),
    ///     fence: 1, newer: 2,
    /// };
    /// assert!(!e.into_job_error().is_retryable());
    /// ```
    pub fn into_job_error(self) -> JobError {
        if self.is_permanent() {
            JobError::permanent(self)
        } else {
            JobError::retryable(self)
        }
    }

    /// The queue this error concerns, when it concerns one.
    pub fn queue(&self) -> Option<&str> {
        match self {
            InboxError::Postgres { queue, .. } => queue.as_deref(),
            InboxError::Fenced { queue, .. }
            | InboxError::NotClaimed { queue, .. }
            | InboxError::InvalidKey { queue, .. }
            | InboxError::LockTimeout { queue, .. }
            | InboxError::KeyCollision { queue, .. } => Some(queue),
            InboxError::InvalidTableName { .. } => None,
        }
    }

    /// The job this error concerns, when it concerns one.
    pub fn job_id(&self) -> Option<&JobId> {
        match self {
            InboxError::Postgres { job_id, .. } => job_id.as_ref(),
            InboxError::Fenced { job_id, .. }
            | InboxError::NotClaimed { job_id, .. }
            | InboxError::InvalidKey { job_id, .. }
            | InboxError::LockTimeout { job_id, .. }
            | InboxError::KeyCollision { job_id, .. } => Some(job_id),
            InboxError::InvalidTableName { .. } => None,
        }
    }
}

/// Short alias used throughout the crate.
pub type Result<T, E = InboxError> = std::result::Result<T, E>;
