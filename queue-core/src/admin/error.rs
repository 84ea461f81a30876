//! [`AdminError`]: what an admin call can fail with.

use crate::error::QueueError;

/// Errors of the [`Admin`](super::Admin) API.
///
/// A failure on one queue or job is a [`QueueError`], which names the queue
/// and, when one job is concerned, its id ([`QueueError::queue`],
/// [`QueueError::job_id`]).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AdminError {
    /// Redis failed, refused or timed out on a queue (and job).
    #[error(transparent)]
    Queue(#[from] QueueError),
    /// A server-wide read failed (clock, key scan): no queue is concerned.
    #[error("redis error ({what}): {source}")]
    Server {
        /// What was being read.
        what: &'static str,
        /// The client's error.
        #[source]
        source: redis::RedisError,
    },
    /// Queue discovery scans the keys of one server; on a Redis Cluster the
    /// queues are spread over nodes: name them instead.
    #[error("queue discovery needs a single Redis server; on a Redis Cluster name the queues")]
    DiscoveryNeedsSingleServer,
    /// The invariant check SCANs for job hashes on one server; it does not
    /// run through a Redis Cluster connection.
    #[error("the invariant check needs a single Redis server (or a Sentinel primary), not a Redis Cluster connection")]
    CheckNeedsSingleServer,
}

impl AdminError {
    /// The queue this error concerns, when it concerns one.
    pub fn queue(&self) -> Option<&str> {
        match self {
            AdminError::Queue(e) => e.queue(),
            _ => None,
        }
    }

    /// The job this error concerns, when it concerns one.
    pub fn job_id(&self) -> Option<&crate::JobId> {
        match self {
            AdminError::Queue(e) => e.job_id(),
            _ => None,
        }
    }

    pub(crate) fn server(what: &'static str) -> impl FnOnce(redis::RedisError) -> AdminError {
        move |source| AdminError::Server { what, source }
    }
}

/// Result of an admin call.
pub type Result<T, E = AdminError> = std::result::Result<T, E>;
