//! The blocking connections of result waits ([`Queue::wait_completion`]):
//! a small pool of idle ones, shared by a `Queue`'s clones, so that a wait
//! takes one instead of connecting (on Sentinel: asking every sentinel and
//! starting a watcher; on Cluster: building a cluster client) for every
//! call; and which failures of a wait are worth waiting out (a broken
//! connection, a failover) rather than reported.
//!
//! A connection goes back to the pool only when its last `BLPOP` answered:
//! one dropped mid-`BLPOP` (the caller gave up on the wait) still has that
//! `BLPOP` blocking on the server, and the next wait's would queue behind it.
//!
//! [`Queue::wait_completion`]: crate::Queue::wait_completion

use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::conn::{ConnectionConfig, RedisConnection};
use crate::error::QueueError;
use crate::job::JobId;

/// At most this many idle blocking connections are kept per `Queue` (and
/// its clones); more waiters at once open their own and drop them after.
const IDLE_MAX: usize = 16;

/// The idle blocking connections of one `Queue` (and its clones).
pub(crate) struct WaitConnections {
    url: String,
    /// The queue's settings, its response timeout widened to the longest
    /// block (a wait bounds each `BLPOP` itself: [`Self::blpop_bound`]).
    cfg: ConnectionConfig,
    response_timeout: Duration,
    idle: Mutex<Vec<RedisConnection>>,
}

impl WaitConnections {
    /// The pool for connections to `url` with `cfg`; each answers a `BLPOP`
    /// of up to `longest_block`.
    pub(crate) fn new(url: &str, cfg: &ConnectionConfig, longest_block: Duration) -> Self {
        WaitConnections {
            url: url.to_string(),
            cfg: ConnectionConfig {
                response_timeout: cfg.response_timeout.saturating_add(longest_block),
                ..cfg.clone()
            },
            response_timeout: cfg.response_timeout,
            idle: Mutex::new(Vec::new()),
        }
    }

    /// How long a `BLPOP` of `block` may take before its connection is
    /// taken for broken: the block plus the queue's response timeout.
    pub(crate) fn blpop_bound(&self, block: Duration) -> Duration {
        block.saturating_add(self.response_timeout)
    }

    /// An idle connection, or a new one. A failed connect is a
    /// [`QueueError::Redis`] naming the queue and job `id` (a `Connect`
    /// error names neither).
    pub(crate) async fn take(&self, queue: &str, id: &JobId) -> Result<Taken<'_>, QueueError> {
        let idle = self.lock().pop();
        let conn = match idle {
            Some(conn) => conn,
            None => RedisConnection::connect(&self.url, &self.cfg)
                .await
                .map_err(|e| match e {
                    QueueError::Connect { source, .. } => {
                        QueueError::redis(queue, Some(id), source)
                    }
                    other => other,
                })?,
        };
        Ok(Taken {
            pool: self,
            conn: Some(conn),
            answered: true,
        })
    }

    /// Drops every idle connection: after one broke (a failover, a server
    /// that killed its clients), the others most likely did too, and a wait
    /// would find each broken in turn.
    pub(crate) fn clear(&self) {
        self.lock().clear();
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<RedisConnection>> {
        // A panic while holding this lock cannot leave the Vec half-changed
        // (push, pop and clear are whole): go on with it.
        self.idle.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// A connection taken from the pool for one wait; back into it when
/// dropped, if its last `BLPOP` answered (see the module doc).
pub(crate) struct Taken<'a> {
    pool: &'a WaitConnections,
    conn: Option<RedisConnection>,
    answered: bool,
}

impl Taken<'_> {
    /// The connection, for one `BLPOP`: marked unanswered until
    /// [`answered`](Self::answered).
    pub(crate) fn for_blpop(&mut self) -> &mut RedisConnection {
        self.answered = false;
        self.conn
            .as_mut()
            .expect("a Taken holds its connection until dropped")
    }

    /// The `BLPOP` answered: the connection can serve another wait.
    pub(crate) fn answered(&mut self) {
        self.answered = true;
    }

    /// The connection failed: dropped, not given back.
    pub(crate) fn forget(&mut self) {
        self.conn = None;
    }
}

impl Drop for Taken<'_> {
    fn drop(&mut self) {
        if let (true, Some(conn)) = (self.answered, self.conn.take()) {
            let mut idle = self.pool.lock();
            if idle.len() < IDLE_MAX {
                idle.push(conn);
            }
        }
    }
}

/// Whether a failure of a wait's check or `BLPOP` is worth waiting out:
/// the connection broke or timed out, the node was demoted or unblocked
/// its clients (a failover), or it is loading or without its primary. Each
/// passes once the connection is rebuilt or the failover is over; a data
/// error or a refused configuration does not.
pub(crate) fn worth_waiting_out(e: &QueueError) -> bool {
    match e {
        QueueError::ReadOnlyReplica { .. } => true,
        QueueError::Redis { source, .. } => {
            matches!(
                source.kind(),
                redis::ErrorKind::Io | redis::ErrorKind::ClusterConnectionNotFound
            ) || matches!(
                source.code(),
                Some("UNBLOCKED" | "LOADING" | "MASTERDOWN" | "TRYAGAIN" | "CLUSTERDOWN")
            )
        }
        _ => false,
    }
}

/// Shared, so that a `Queue`'s clones use one pool.
pub(crate) type SharedWaitConnections = Arc<WaitConnections>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_data_error_is_not_waited_out_and_a_broken_connection_is() {
        let io = QueueError::redis(
            "q",
            None,
            redis::RedisError::from(std::io::Error::new(
                std::io::ErrorKind::ConnectionReset,
                "reset",
            )),
        );
        assert!(worth_waiting_out(&io));
        let data = QueueError::redis(
            "q",
            None,
            redis::RedisError::from((
                redis::ErrorKind::Server(redis::ServerErrorKind::ResponseError),
                "bad",
            )),
        );
        assert!(!worth_waiting_out(&data));
        assert!(!worth_waiting_out(&QueueError::Config("x".into())));
    }
}
