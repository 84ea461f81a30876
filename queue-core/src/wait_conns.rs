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
//! Pooled connections age: one idle for longer than [`MAX_IDLE`] (a
//! server-side `timeout`, a proxy or load balancer may have closed it in
//! the meantime) or older than [`MAX_AGE`] (kept for ever through a
//! failover, it could still point at the old primary, or a node that left)
//! is dropped instead of handed out, and a new one connects.
//!
//! [`Queue::wait_completion`]: crate::Queue::wait_completion

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::conn::{ConnectionConfig, RedisConnection};
use crate::error::QueueError;
use crate::job::JobId;

/// At most this many idle blocking connections are kept per `Queue` (and
/// its clones); more waiters at once open their own and drop them after.
const IDLE_MAX: usize = 16;

/// A pooled connection idle for longer than this is dropped, not handed out:
/// below the common idle timeouts of proxies and load balancers (60 s and
/// more) and of a server's `timeout` setting.
pub(crate) const MAX_IDLE: Duration = Duration::from_secs(30);

/// A connection older than this is not given back to the pool (nor handed
/// out from it): bounds how long one lives on after a failover or a
/// topology change that left it working but on the wrong node.
pub(crate) const MAX_AGE: Duration = Duration::from_secs(10 * 60);

/// An idle connection and its times.
struct Idle {
    conn: RedisConnection,
    /// When it connected.
    born: Instant,
    /// When it went back to the pool.
    since: Instant,
}

/// The idle blocking connections of one `Queue` (and its clones).
pub(crate) struct WaitConnections {
    url: String,
    /// The queue's settings, its response timeout widened to the longest
    /// block (a wait bounds each `BLPOP` itself: [`Self::blpop_bound`]).
    cfg: ConnectionConfig,
    response_timeout: Duration,
    /// [`MAX_IDLE`] and [`MAX_AGE`] (other values in tests).
    max_idle: Duration,
    max_age: Duration,
    idle: Mutex<Vec<Idle>>,
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
            max_idle: MAX_IDLE,
            max_age: MAX_AGE,
            idle: Mutex::new(Vec::new()),
        }
    }

    /// Other bounds than [`MAX_IDLE`] and [`MAX_AGE`] (tests).
    #[cfg(test)]
    fn with_bounds(mut self, max_idle: Duration, max_age: Duration) -> Self {
        self.max_idle = max_idle;
        self.max_age = max_age;
        self
    }

    /// Whether a connection born at `born`, idle since `since`, may still
    /// serve a wait.
    fn fresh(&self, born: Instant, since: Instant) -> bool {
        born.elapsed() < self.max_age && since.elapsed() < self.max_idle
    }

    /// The most recently returned idle connection still fresh; those past
    /// their bounds are dropped (after the pool's lock is released).
    fn pop_fresh(&self) -> Option<(RedisConnection, Instant)> {
        let mut stale = Vec::new();
        let found = {
            let mut idle = self.lock();
            loop {
                match idle.pop() {
                    None => break None,
                    Some(c) if self.fresh(c.born, c.since) => break Some((c.conn, c.born)),
                    Some(c) => stale.push(c),
                }
            }
        };
        if !stale.is_empty() {
            tracing::debug!(
                dropped = stale.len(),
                "result waits: dropped pooled connections past their idle time or age"
            );
        }
        found
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
        let (conn, born) = match self.pop_fresh() {
            Some(idle) => idle,
            None => {
                let born = Instant::now();
                let conn = RedisConnection::connect(&self.url, &self.cfg)
                    .await
                    .map_err(|e| match e {
                        QueueError::Connect { source, .. } => {
                            QueueError::redis(queue, Some(id), source)
                        }
                        other => other,
                    })?;
                (conn, born)
            }
        };
        Ok(Taken {
            pool: self,
            conn: Some(conn),
            born,
            answered: true,
        })
    }

    /// Drops every idle connection: after one broke (a failover, a server
    /// that killed its clients), the others most likely did too, and a wait
    /// would find each broken in turn.
    pub(crate) fn clear(&self) {
        self.lock().clear();
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Idle>> {
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
    /// When the connection connected (it ages: [`MAX_AGE`]).
    born: Instant,
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
            let now = Instant::now();
            if !self.pool.fresh(self.born, now) {
                return; // too old to serve another wait: dropped
            }
            let mut idle = self.pool.lock();
            if idle.len() < IDLE_MAX {
                idle.push(Idle {
                    conn,
                    born: self.born,
                    since: now,
                });
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

    async fn client_id(conn: &mut RedisConnection) -> i64 {
        redis::cmd("CLIENT")
            .arg("ID")
            .query_async(conn)
            .await
            .expect("CLIENT ID")
    }

    /// Takes a connection as a wait does, runs one answered command on it
    /// and gives it back; its client id.
    async fn one_wait(pool: &WaitConnections) -> i64 {
        let mut taken = pool.take("q", &JobId::from("j")).await.expect("take");
        let id = client_id(taken.for_blpop()).await;
        taken.answered();
        id
    }

    /// A pooled connection that sat idle past `MAX_IDLE`, or lived past
    /// `MAX_AGE`, is dropped and a new one connects; a fresh one is reused
    /// (the pool's point). Before, an idle connection was handed out however
    /// long it had sat (through a server's `timeout`, a proxy's idle cut, a
    /// failover), and the wait found it broken.
    #[tokio::test]
    async fn a_pooled_connection_past_its_idle_time_or_age_is_not_handed_out() {
        let server = queue_testkit::RedisServer::start().expect("redis-server starts");
        // Bounds of seconds, not MAX_IDLE and MAX_AGE: the times below are
        // set back by a bound, and `Instant` cannot go before the machine's
        // boot (a CI machine up for less than MAX_AGE).
        let (max_idle, max_age) = (Duration::from_secs(10), Duration::from_secs(20));
        let pool =
            WaitConnections::new(&server.url(), &ConnectionConfig::default(), Duration::ZERO)
                .with_bounds(max_idle, max_age);
        let first = one_wait(&pool).await;
        assert_eq!(
            one_wait(&pool).await,
            first,
            "a fresh idle connection is reused"
        );

        // It sat idle for longer than its bound.
        pool.lock()[0].since = Instant::now()
            .checked_sub(max_idle + Duration::from_secs(1))
            .expect("the machine is up for longer than the idle bound");
        let second = one_wait(&pool).await;
        assert_ne!(
            second, first,
            "an idle-too-long connection is not handed out"
        );
        assert_eq!(pool.lock().len(), 1, "the stale one left the pool");

        // It connected longer than its bound ago (though used just now).
        pool.lock()[0].born = Instant::now()
            .checked_sub(max_age + Duration::from_secs(1))
            .expect("the machine is up for longer than the age bound");
        let third = one_wait(&pool).await;
        assert_ne!(third, second, "a too-old connection is not handed out");

        // Taken while fresh, too old by the time it is given back: not kept.
        let aged =
            WaitConnections::new(&server.url(), &ConnectionConfig::default(), Duration::ZERO)
                .with_bounds(MAX_IDLE, Duration::ZERO);
        one_wait(&aged).await;
        assert_eq!(
            aged.lock().len(),
            0,
            "a connection past its age is not pooled"
        );
    }

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
