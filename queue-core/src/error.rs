//! Typed errors. Every error names the queue where one is concerned (a failed
//! connect names the Redis URL) and, where there is one, the job id. Any failure of an enqueue is an error to the caller, never a log line
//! (DESIGN rule 8, docs/DESIGN.md).

use crate::JobId;

/// Errors returned by [`Queue`](crate::Queue), [`Worker`](crate::Worker) and
/// [`Watchdog`](crate::Watchdog).
///
/// Every variant carries the queue name where one is concerned (a failed
/// connect names the Redis URL; [`Config`](Self::Config) says which setting)
/// and, when one job is concerned, its id, so a log line or an error returned
/// to a web handler says what was affected.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum QueueError {
    /// Redis could not be reached, refused the command, or timed out.
    ///
    /// For an enqueue, [`outcome_unknown`](Self::outcome_unknown) tells
    /// "not enqueued" from "may or may not have been written"; in the latter
    /// case retry with the same stable job id (see [`Queue::enqueue_with_id`](crate::Queue::enqueue_with_id))
    /// to make the retry a no-op if the first write landed.
    #[error("redis error on queue `{queue}`{}: {source}", job_suffix(.job_id))]
    Redis {
        /// Queue name.
        queue: String,
        /// The job concerned, if any.
        job_id: Option<JobId>,
        /// The underlying client error.
        #[source]
        source: redis::RedisError,
    },

    /// Could not connect to Redis at all.
    #[error("cannot connect to redis at `{url}`: {source}")]
    Connect {
        /// The URL that was tried (password removed).
        url: String,
        /// The underlying client error.
        #[source]
        source: redis::RedisError,
    },

    /// The payload could not be serialized to MessagePack.
    #[error("cannot encode payload of job type `{job_type}` on queue `{queue}`{}: {source}", job_suffix(.job_id))]
    Encode {
        /// Queue name.
        queue: String,
        /// Job type name.
        job_type: String,
        /// The job concerned, if any.
        job_id: Option<JobId>,
        /// The serializer's error.
        #[source]
        source: rmp_serde::encode::Error,
    },

    /// The worker's lease on this delivery expired and the job was reclaimed
    /// (possibly already redelivered). The stale worker must not touch it.
    #[error("lease lost for job `{job_id}` on queue `{queue}`: the job was reclaimed by the watchdog and may have been redelivered")]
    LeaseLost {
        /// Queue name.
        queue: String,
        /// Job id.
        job_id: JobId,
    },

    /// Redis answered something this version of the framework does not understand.
    #[error("unexpected reply from redis on queue `{queue}`{}: {detail}", job_suffix(.job_id))]
    Protocol {
        /// Queue name.
        queue: String,
        /// The job concerned, if any.
        job_id: Option<JobId>,
        /// What was wrong with the reply.
        detail: String,
    },

    /// A write (an enqueue, a worker's fetch or ack, a watchdog pass) reached
    /// a read-only replica: a failover demoted the server, or the URL names
    /// a replica. Nothing was written. A `redis://` or Sentinel connection
    /// connects again by itself (docs/OPERATIONS.md, "Failover with a
    /// `redis://` URL"); send the call again. If it persists, point the URL
    /// at the primary (or the Sentinel/Cluster configuration).
    #[error("redis for queue `{queue}`{} is a read-only replica (a failover demoted it, or the URL names a replica): nothing was written; writes need the primary", job_suffix(.job_id))]
    ReadOnlyReplica {
        /// Queue name.
        queue: String,
        /// The job concerned, if any.
        job_id: Option<JobId>,
    },

    /// The job was written on the primary, but fewer replicas than requested
    /// confirmed it within the timeout (see `EnqueueOptions::wait_for_replicas`),
    /// or Redis refused the `WAIT` itself (`wait_refused`: an ACL user without
    /// `+wait` is answered `NOPERM`), so no replica confirmed it.
    /// It may be lost if the primary fails before replicating it.
    #[error("job `{job_id}` on queue `{queue}` was written on the primary but {}", not_replicated(*.acked, *.wanted, .wait_refused))]
    NotReplicated {
        /// Queue name.
        queue: String,
        /// The job (the first of a batch).
        job_id: JobId,
        /// Replicas that confirmed (0 when `WAIT` was refused).
        acked: u32,
        /// Replicas requested.
        wanted: u32,
        /// Redis' error reply to `WAIT` when it refused it (e.g. `NOPERM`
        /// for an ACL user without `+wait`); `None` when `WAIT` answered a
        /// count. A refusal answers every enqueue that asks for replicas the
        /// same way until the server's configuration changes.
        wait_refused: Option<String>,
    },

    /// A job id was rejected before anything was sent to Redis.
    #[error("invalid job id {id:?} for queue `{queue}`: {reason}")]
    InvalidJobId {
        /// Queue name.
        queue: String,
        /// The rejected id.
        id: String,
        /// Why it was rejected.
        reason: &'static str,
    },

    /// A queue name that cannot name a queue's keys, rejected before anything
    /// was sent ([`validate_queue_name`](crate::validate_queue_name): empty,
    /// `{` or `}`, whitespace, control characters).
    #[error("invalid queue name {queue:?}: a queue name {reason}")]
    InvalidQueueName {
        /// The rejected name.
        queue: String,
        /// Why it was rejected.
        reason: &'static str,
    },

    /// An extra job field ([`EnqueueOptions::extra_fields`](crate::EnqueueOptions::extra_fields))
    /// the scripts would refuse, rejected before anything was sent: an empty
    /// name, a name of a core job field ([`CORE_JOB_FIELDS`](crate::CORE_JOB_FIELDS)),
    /// or a name given twice.
    #[error("invalid extra field {name:?} on queue `{queue}`{}: {reason}", job_suffix(.job_id))]
    InvalidExtraField {
        /// Queue name.
        queue: String,
        /// The job (none when validated before an id was chosen).
        job_id: Option<JobId>,
        /// The field name.
        name: String,
        /// Why it was rejected.
        reason: &'static str,
    },

    /// A job argument (its payload, or an extra field's name or value)
    /// longer than the server takes as one argument, refused before
    /// anything was sent: nothing was written. The limit is
    /// [`Queue::with_max_arg_len`](crate::Queue::with_max_arg_len) (default
    /// 512 MiB, Redis' default `proto-max-bulk-len`). Sent anyway, Redis
    /// answers "Protocol error: invalid bulk length" and closes the
    /// connection, failing every other request on it (the enqueues sharing
    /// its group-commit call included).
    #[error("job `{job_id}` on queue `{queue}` not enqueued: its {what} is {len} bytes, more than the {limit} bytes Redis takes as one argument (Queue::with_max_arg_len, proto-max-bulk-len)")]
    ArgumentTooLarge {
        /// Queue name.
        queue: String,
        /// The job.
        job_id: JobId,
        /// What is too long: `payload`, or `extra field <name>`.
        what: String,
        /// Its length in bytes.
        len: usize,
        /// The limit in bytes.
        limit: usize,
    },

    /// A batch sent as several script calls (more than 256 jobs) of which
    /// Redis refused one after others had been written: the jobs in
    /// `written` exist (with generated ids, these are the only place their
    /// ids are told), the others were not written. `source` is the refusal,
    /// naming the refused call's first job; its message names the job the
    /// script refused. [`outcome_unknown`](Self::outcome_unknown) is `true`
    /// (the batch is not "not enqueued").
    ///
    /// Also a batch of which one job's reply did not decode (a reply this
    /// version does not understand): `source` is that job's
    /// [`Protocol`](Self::Protocol) error, naming it (it may or may not be
    /// written), and `written` holds the outcomes of the others.
    ///
    /// Also a batch sent in several windows (more than 2,048 jobs or 4 MiB,
    /// [`Queue::enqueue_raw_batch`](crate::Queue::enqueue_raw_batch)) of
    /// which one failed after earlier ones were written: `source` is that
    /// window's error, naming its first job; when it is "outcome unknown"
    /// the window's jobs not in `written` may or may not have been written;
    /// the windows after it were not sent. When a call of an earlier
    /// window was refused too, `refused` is that refusal (its jobs are not
    /// in `written`: they were not written), and the message names it.
    #[error("batch on queue `{queue}` partly written ({} of {total} jobs): {source}{}",
        written.len(), refused_suffix(.refused))]
    #[non_exhaustive]
    PartialBatch {
        /// Queue name.
        queue: String,
        /// The jobs written, in batch order.
        written: Vec<crate::Enqueued>,
        /// Jobs in the batch.
        total: usize,
        /// Why the rest was not written.
        #[source]
        source: Box<QueueError>,
        /// The first refusal of a call of an earlier window (Redis refused
        /// the call before any write, naming the job it refused), when
        /// `source` is a later window's failure; `None` when there was none
        /// or it is `source` itself. Before, it was only logged: the caller
        /// could not tell those jobs, not written, from the ones the
        /// failed window may have written.
        refused: Option<Box<QueueError>>,
    },

    /// Invalid configuration (e.g. a worker with no registered job).
    #[error("invalid configuration: {0}")]
    Config(String),

    /// A batch or flow could not be built or extended (docs/WORKFLOWS.md):
    /// queues of different cluster slots, a batch that already fired or no
    /// longer exists.
    #[error("batch `{batch}` on queue `{queue}`: {detail}")]
    Workflow {
        /// The queue the batch hash lives on.
        queue: String,
        /// The batch (or flow parent) id.
        batch: String,
        /// What was wrong.
        detail: String,
    },
}

/// The tail of [`QueueError::NotReplicated`]'s message.
fn not_replicated(acked: u32, wanted: u32, wait_refused: &Option<String>) -> String {
    match wait_refused {
        Some(reply) => {
            format!("Redis refused WAIT ({reply}): no replica confirmed it ({wanted} requested)")
        }
        None => format!("only {acked} of {wanted} replicas confirmed it in time"),
    }
}

/// The tail of [`QueueError::PartialBatch`]'s message for its `refused`.
fn refused_suffix(refused: &Option<Box<QueueError>>) -> String {
    match refused {
        Some(e) => format!("; an earlier window's call was refused: {e}"),
        None => String::new(),
    }
}

fn job_suffix(job_id: &Option<JobId>) -> String {
    match job_id {
        Some(id) => format!(" (job `{id}`)"),
        None => String::new(),
    }
}

impl QueueError {
    pub(crate) fn redis(queue: &str, job_id: Option<&JobId>, source: redis::RedisError) -> Self {
        if source.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::ReadOnly) {
            return QueueError::ReadOnlyReplica {
                queue: queue.to_string(),
                job_id: job_id.cloned(),
            };
        }
        QueueError::Redis {
            queue: queue.to_string(),
            job_id: job_id.cloned(),
            source,
        }
    }

    pub(crate) fn protocol(queue: &str, job_id: Option<&JobId>, detail: impl Into<String>) -> Self {
        QueueError::Protocol {
            queue: queue.to_string(),
            job_id: job_id.cloned(),
            detail: detail.into(),
        }
    }

    /// The queue this error concerns, when it concerns one.
    pub fn queue(&self) -> Option<&str> {
        match self {
            QueueError::Redis { queue, .. }
            | QueueError::Encode { queue, .. }
            | QueueError::LeaseLost { queue, .. }
            | QueueError::Protocol { queue, .. }
            | QueueError::InvalidJobId { queue, .. }
            | QueueError::InvalidQueueName { queue, .. }
            | QueueError::InvalidExtraField { queue, .. }
            | QueueError::ArgumentTooLarge { queue, .. }
            | QueueError::PartialBatch { queue, .. }
            | QueueError::ReadOnlyReplica { queue, .. }
            | QueueError::NotReplicated { queue, .. }
            | QueueError::Workflow { queue, .. } => Some(queue),
            QueueError::Connect { .. } | QueueError::Config(_) => None,
        }
    }

    /// The job this error concerns, when it concerns one.
    pub fn job_id(&self) -> Option<&JobId> {
        match self {
            QueueError::Redis { job_id, .. }
            | QueueError::Encode { job_id, .. }
            | QueueError::Protocol { job_id, .. }
            | QueueError::ReadOnlyReplica { job_id, .. }
            | QueueError::InvalidExtraField { job_id, .. } => job_id.as_ref(),
            QueueError::PartialBatch { source, .. } => source.job_id(),
            QueueError::LeaseLost { job_id, .. }
            | QueueError::NotReplicated { job_id, .. }
            | QueueError::ArgumentTooLarge { job_id, .. } => Some(job_id),
            _ => None,
        }
    }

    /// True for the lease-lost outcome of ack/extend/retry.
    pub fn is_lease_lost(&self) -> bool {
        matches!(self, QueueError::LeaseLost { .. })
    }

    /// For an enqueue error: `true` when the job **may or may not** have been
    /// written — a request reached (or may have reached) Redis and its reply
    /// was lost (response timeout, connection reset, broken pipe, closed
    /// connection), or Redis answered something this version does not
    /// understand ([`QueueError::Protocol`]: the script ran, what it wrote
    /// is not known). Enqueue again with the same id to learn the truth.
    /// `false`: the job was **not enqueued** by this call (refused connection,
    /// an error reply such as OOM, a read-only replica, an invalid id or
    /// payload), except [`QueueError::NotReplicated`], which was written on
    /// the primary. [`QueueError::PartialBatch`] is `true`: some of the
    /// batch was written (listed in the error), the rest was not.
    ///
    /// ```
    /// let e = queue_core::QueueError::Config("x".into());
    /// assert!(!e.outcome_unknown());
    /// ```
    pub fn outcome_unknown(&self) -> bool {
        match self {
            QueueError::Redis { source, .. } => outcome_unknown(source),
            QueueError::PartialBatch { .. } | QueueError::Protocol { .. } => true,
            _ => false,
        }
    }

    /// Redis refused this call for its data: an `ERR` reply (a script
    /// refused or failed on what it read) or `WRONGTYPE` (a key of another
    /// type). Sending the same call again fails the same way. Every other
    /// failure is the server's condition or the connection's (out of memory,
    /// busy with a long script, loading, a replica, a primary gone, a
    /// cluster redirect, a timeout) and may pass when sent again later —
    /// among them the `ERR Function not found` of a server that lacks the
    /// function library (the call's load reached another node than its
    /// resend, or the library was flushed in between): the next call loads
    /// it. Before, that `ERR` counted as an error of the data, and the
    /// workflow relay set its notices aside in `relay:dead` for good.
    ///
    /// ```
    /// let e = queue_core::QueueError::Config("x".into());
    /// assert!(!e.is_data_error());
    /// ```
    pub fn is_data_error(&self) -> bool {
        match self {
            QueueError::Redis { source, .. } => {
                matches!(source.code(), Some("ERR" | "WRONGTYPE"))
                    && !crate::scripts::is_unloaded(source)
            }
            _ => false,
        }
    }

    /// A failure of the connection rather than an answer from Redis: worth
    /// sending again once the client has reconnected.
    pub(crate) fn is_connection_failure(&self) -> bool {
        match self {
            QueueError::Redis { source, .. } => matches!(
                source.kind(),
                redis::ErrorKind::Io | redis::ErrorKind::ClusterConnectionNotFound
            ),
            _ => false,
        }
    }
}

/// Whether a call that failed with `e` may have run on the server (its
/// reply lost on a connection that broke after sending): see
/// [`QueueError::outcome_unknown`].
pub(crate) fn outcome_unknown(e: &redis::RedisError) -> bool {
    e.kind() == redis::ErrorKind::Io && !e.is_connection_refusal()
}

/// Short alias used throughout the crate.
pub type Result<T, E = QueueError> = std::result::Result<T, E>;
