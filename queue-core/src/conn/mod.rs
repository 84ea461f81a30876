//! Connections: one type for a single Redis (a `ConnectionManager`, which
//! reconnects by itself after I/O errors, replaced by a new connection to the
//! URL's host after a `READONLY` reply), a Redis Cluster (redis-rs' cluster client, which
//! follows MOVED/ASK, retries TRYAGAIN and reconnects to nodes) and a primary
//! managed by Redis Sentinel (resolved through the sentinels and replaced
//! after a failover), with explicit timeouts.
//!
//! See `docs/SCALE-OUT.md` for how each kind behaves when nodes fail.

mod cluster;
mod health;
mod sentinel;
mod single;

use std::sync::Arc;
use std::time::Duration;

use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster_async::ClusterConnection;
use redis::{Cmd, ErrorKind, Pipeline, RedisError, RedisFuture, Value};

use crate::error::{QueueError, Result};
use crate::scripts::library::{self, LoadGate};
use cluster::connect_cluster;
use sentinel::{SentinelConnection, SentinelTarget};
use single::SingleConnection;

/// Timeouts for talking to Redis.
///
/// # How long a call can block
///
/// | call | upper bound |
/// |---|---|
/// | `Queue::connect*`, `Worker::build`, `Watchdog::connect`, `Admin::connect` | `connection_timeout` (the whole connect, retries included, also against a Redis that accepts TCP but never answers) |
/// | one command or script (stats, admin reads, lock extend) | `response_timeout`, a wait for the client's reconnect (`redis://`) or for the primary's resolution (Sentinel) included |
/// | `Queue::enqueue*` (one job) | `retry_window + response_timeout` (see `Queue::with_retry_window`) |
/// | `Queue::enqueue_many`, `enqueue_batch`, `enqueue_raw_batch` | that per window of at most 2,048 jobs and 4 MiB (each window is one round trip with its own retries), plus each window's `WAIT` timeout when replicas are asked for |
/// | `Lock::acquire` | `wait + 4 × response_timeout` (a call whose reply was lost is sent again, up to 3 times) |
/// | `LockGuard::release` | `4 × response_timeout` (the same lost-reply retries) |
/// | `JobContext::step`, `JobContext::lock` | two commands: `2 × response_timeout` plus the step's own work |
/// | `Worker::run_until` start-up | `connection_timeout` per queue (one blocking connection each) |
/// | `Worker` shutdown after the signal | `block_timeout + response_timeout` (fetchers) + `grace` + 5 s |
/// | `Watchdog::run_once` | per queue and batch, `response_timeout` |
///
/// ```
/// use std::time::Duration;
/// let cfg = queue_core::ConnectionConfig::default();
/// assert_eq!(cfg.response_timeout, Duration::from_secs(5));
/// ```
#[derive(Debug, Clone)]
pub struct ConnectionConfig {
    /// How long one command may take before it fails with a timeout error.
    /// For a cluster this bounds the whole request, including the client's
    /// own retries after MOVED, ASK, TRYAGAIN or a lost node.
    pub response_timeout: Duration,
    /// How long connecting may take.
    pub connection_timeout: Duration,
}

impl Default for ConnectionConfig {
    fn default() -> Self {
        ConnectionConfig {
            response_timeout: Duration::from_secs(5),
            connection_timeout: Duration::from_secs(5),
        }
    }
}

/// A connection to a single Redis, a Redis Cluster or a Sentinel-managed
/// primary. Cheap to clone (clones share one multiplexed connection).
///
/// The URL picks the kind:
///
/// | URL | kind |
/// |---|---|
/// | `redis://[user:pass@]host:port[/db]` | one server (reconnects after I/O errors and after `READONLY`) |
/// | `redis-cluster://[user:pass@]host1:port1,host2:port2` | a Redis Cluster: any reachable nodes as seeds |
/// | `redis-sentinel://[user:pass@]host1:port1[,host2:port2]/<master-name>[/db][?check_interval_ms=500]` | the primary that the sentinels name `<master-name>` |
///
/// For Sentinel, the credentials are those of the data nodes (the sentinels
/// are asked without authentication). The primary is resolved when
/// connecting: every sentinel is asked, the named nodes are tried from the
/// highest configuration epoch down, and a node is used only if `ROLE` says
/// it is a primary (a user that may not run `ROLE`, `NOPERM`, takes the
/// first named node that connects, and a `READONLY` from it makes the
/// connection ask again). After an I/O error, a timeout or a `READONLY`
/// reply (a demoted primary) the connection asks the sentinels again and
/// switches to the new primary. A command refused with `READONLY` did not
/// run, so it is sent once more to the new primary — a pipeline only when
/// its first reply is `READONLY` (nothing of it ran; a later one means the
/// commands before it ran, and the replies are returned as they are); any
/// other error is returned to the caller (the command may or may not have
/// run), and the next command uses the new primary. In the background, every `check_interval_ms` (default
/// 500, 0 = never) a sentinel is asked whether the primary moved — after a
/// controlled failover the old primary keeps accepting writes for seconds —
/// and the connection switches when it did.
///
/// For one server, the client reconnects by itself after an I/O error. A
/// `READONLY` reply (a failover demoted the server while the connection
/// stayed) is returned to the caller as it is — the command did not run,
/// and every caller retries: workers, the watchdog, producers that follow
/// the enqueue error rules — and starts, in the background, a new connection
/// to the URL's host, its name resolved again: behind a DNS name or a
/// virtual IP that the failover moved, the next commands reach the new
/// primary. While the server reached stays a replica, the reconnects are
/// spaced by a wait doubling from 250 ms to 5 s (one at a time per
/// connection); a `READONLY` a minute after the last reconnect starts one
/// at once. A manager wrapped with [`from_manager`](Self::from_manager) is
/// never replaced (its URL is not known).
#[derive(Clone)]
pub struct RedisConnection {
    kind: Kind,
    /// One load of the function library at a time, its outcome shared with
    /// the calls in flight meanwhile (`scripts/library.rs`): shared by every
    /// connection of the process to the same URL (a fresh one for a
    /// connection wrapped with `from_manager` / `from_cluster`).
    library: Arc<LoadGate>,
}

#[derive(Clone)]
enum Kind {
    Single(SingleConnection),
    Cluster(ClusterConnection),
    Sentinel(SentinelConnection),
}

impl std::fmt::Debug for RedisConnection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kind = match self.kind {
            Kind::Single(_) => "single",
            Kind::Cluster(_) => "cluster",
            Kind::Sentinel(_) => "sentinel",
        };
        f.debug_struct("RedisConnection")
            .field("kind", &kind)
            .finish()
    }
}

impl RedisConnection {
    /// Connects to `url` (see the type's docs for the URL forms).
    ///
    /// ```
    /// # #[tokio::main] async fn main() -> Result<(), queue_core::QueueError> {
    /// # let server = queue_testkit::RedisServer::start().unwrap();
    /// let conn = queue_core::RedisConnection::connect(&server.url(), &Default::default()).await?;
    /// assert!(!conn.is_cluster());
    /// # Ok(()) }
    /// ```
    ///
    /// The whole connect, the client's own retries included, is bounded by
    /// `cfg.connection_timeout`: a Redis that accepts the TCP connection but
    /// never answers (paused, overloaded) fails in that time, not a multiple.
    pub async fn connect(url: &str, cfg: &ConnectionConfig) -> Result<Self> {
        match tokio::time::timeout(cfg.connection_timeout, Self::connect_unbounded(url, cfg)).await
        {
            Ok(result) => result,
            Err(_) => Err(QueueError::Connect {
                url: redact(url),
                source: RedisError::from(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    format!(
                        "no answer within the connection timeout ({:?})",
                        cfg.connection_timeout
                    ),
                )),
            }),
        }
    }

    async fn connect_unbounded(url: &str, cfg: &ConnectionConfig) -> Result<Self> {
        let err = |source| QueueError::Connect {
            url: redact(url),
            source,
        };
        if let Some(rest) = url.strip_prefix("redis-cluster://") {
            let conn = connect_cluster(rest, cfg).await.map_err(err)?;
            return Ok(RedisConnection {
                kind: Kind::Cluster(conn),
                library: library::gate_for(&load_target(url)),
            });
        }
        if let Some(rest) = url.strip_prefix("redis-sentinel://") {
            let target = SentinelTarget::parse(rest).map_err(err)?;
            let conn = SentinelConnection::new(target, cfg.clone());
            // Resolve now, so a wrong URL or a missing primary fails at once.
            conn.current().await.map_err(err)?;
            return Ok(RedisConnection {
                kind: Kind::Sentinel(conn),
                library: library::gate_for(&load_target(url)),
            });
        }
        let client = redis::Client::open(url).map_err(err)?;
        let mgr_cfg = ConnectionManagerConfig::new()
            .set_response_timeout(Some(cfg.response_timeout))
            .set_connection_timeout(Some(cfg.connection_timeout))
            .set_number_of_retries(3)
            .set_max_delay(Duration::from_secs(2));
        let conn = SingleConnection::connect(
            client,
            mgr_cfg,
            cfg.connection_timeout,
            cfg.response_timeout,
            redact(url),
        )
        .await
        .map_err(err)?;
        Ok(RedisConnection {
            kind: Kind::Single(conn),
            library: library::gate_for(&load_target(url)),
        })
    }

    /// Wraps an existing single-server connection manager. It reconnects by
    /// itself after I/O errors, but not after a `READONLY` reply (its URL is
    /// not known here): prefer [`connect`](Self::connect) with the URL.
    pub fn from_manager(conn: ConnectionManager) -> Self {
        RedisConnection {
            kind: Kind::Single(SingleConnection::wrap(conn)),
            library: Arc::default(),
        }
    }

    /// Wraps an existing Redis Cluster connection.
    pub fn from_cluster(conn: ClusterConnection) -> Self {
        RedisConnection {
            kind: Kind::Cluster(conn),
            library: Arc::default(),
        }
    }

    /// True for a Redis Cluster connection.
    pub fn is_cluster(&self) -> bool {
        matches!(self.kind, Kind::Cluster(_))
    }

    /// True when a command may run after a later send of it, or run twice
    /// without its caller knowing: the cluster client reconnects and resends
    /// by itself (up to its `retries`); a Sentinel connection drops its
    /// connection to the primary when a reply times out, so a retry goes out
    /// on a new one, where it can overtake the first send (still queued on
    /// the old one: Redis orders nothing between two connections). A script
    /// call must then not skip a read on the promise that this is its first
    /// run (fetch's receipt, the dedupe reads of a generated enqueue id): a
    /// late first send of a generated id's enqueue, after its retry wrote
    /// the job, pushed the id twice and reset its hash (stop 47 review). One
    /// read more per call, on clusters and Sentinel only: a `redis://`
    /// connection keeps its one connection across a timeout (its replies
    /// stay in order) and a dropped one takes its unsent commands with it.
    pub(crate) fn may_resend(&self) -> bool {
        self.is_cluster() || self.is_sentinel()
    }

    /// The library loads' gate of this connection's server(s).
    pub(crate) fn library_gate(&self) -> Arc<LoadGate> {
        self.library.clone()
    }

    /// True for a Sentinel-managed primary (`redis-sentinel://`).
    pub fn is_sentinel(&self) -> bool {
        matches!(self.kind, Kind::Sentinel(_))
    }

    /// For a Sentinel connection, the `host:port` of the primary it currently
    /// talks to (`None` between a failure and the next resolution, and for
    /// the other kinds).
    pub fn sentinel_primary(&self) -> Option<String> {
        match &self.kind {
            Kind::Sentinel(s) => s.read_current().map(|c| c.addr),
            _ => None,
        }
    }
}

fn split_userinfo(rest: &str) -> (Option<&str>, &str) {
    // The userinfo ends at the last '@' before the path.
    let authority_end = rest.find('/').unwrap_or(rest.len());
    match rest[..authority_end].rfind('@') {
        Some(at) => (Some(&rest[..at]), &rest[at + 1..]),
        None => (None, rest),
    }
}

/// The error of a call that got no reply within the response timeout
/// although the connection's own timeout did not fire (it waited for a
/// reconnect, or for the Sentinel primary to be resolved): the error a
/// response timeout gives (an I/O `TimedOut`), so callers read it the same
/// way — the command may have run ([`QueueError::outcome_unknown`]), and
/// an enqueue retries it within its window.
fn no_reply_within(limit: Duration) -> RedisError {
    RedisError::from(std::io::Error::new(
        std::io::ErrorKind::TimedOut,
        format!("no reply within the response timeout ({limit:?}); the command may have run"),
    ))
}

/// `call`, failed with [`no_reply_within`] once `limit` passed (no bound
/// for `None`).
async fn within<T>(
    limit: Option<Duration>,
    call: impl std::future::Future<Output = redis::RedisResult<T>>,
) -> redis::RedisResult<T> {
    match limit {
        Some(limit) => tokio::time::timeout(limit, call)
            .await
            .unwrap_or_else(|_| Err(no_reply_within(limit))),
        None => call.await,
    }
}

fn invalid_url(msg: &'static str) -> RedisError {
    RedisError::from((ErrorKind::InvalidClientConfig, msg))
}

impl ConnectionLike for RedisConnection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match &mut self.kind {
            Kind::Single(c) => Box::pin(c.command(cmd)),
            Kind::Cluster(c) => c.req_packed_command(cmd),
            Kind::Sentinel(c) => Box::pin(c.command(cmd)),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match &mut self.kind {
            Kind::Single(c) => Box::pin(c.commands(pipeline, offset, count)),
            Kind::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
            Kind::Sentinel(c) => Box::pin(c.commands(pipeline, offset, count)),
        }
    }

    fn get_db(&self) -> i64 {
        match &self.kind {
            Kind::Single(c) => c.db(),
            Kind::Cluster(c) => c.get_db(),
            Kind::Sentinel(c) => c.db(),
        }
    }
}

/// The URL without its password, for error messages and logs.
pub(crate) fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            format!("{}://***@{}", &url[..scheme], &url[at + 1..])
        }
        _ => url.to_string(),
    }
}

/// What names a connection's server(s) for the library loads' gate: the URL
/// without its credentials and its query (`redis://h:1/0`,
/// `redis-sentinel://s1:1,s2:2/m`). Two users of one server share it.
fn load_target(url: &str) -> String {
    let (scheme, rest) = url.split_once("://").unwrap_or(("", url));
    let (_, rest) = split_userinfo(rest);
    let rest = rest.split('?').next().unwrap_or_default();
    format!("{scheme}://{rest}")
}

/// Connects with the given timeouts. Fails at once when Redis is unreachable.
pub(crate) async fn connect(url: &str, cfg: &ConnectionConfig) -> Result<RedisConnection> {
    RedisConnection::connect(url, cfg).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn userinfo_is_split_before_the_path() {
        assert_eq!(split_userinfo("u:p@h:1,h:2"), (Some("u:p"), "h:1,h:2"));
        assert_eq!(split_userinfo("h:1/m@x"), (None, "h:1/m@x"));
        assert_eq!(
            redact("redis-sentinel://:pw@h:1/m"),
            "redis-sentinel://***@h:1/m"
        );
        assert_eq!(
            load_target("redis-sentinel://u:pw@s1:1,s2:2/m?check_interval_ms=0"),
            "redis-sentinel://s1:1,s2:2/m"
        );
        assert_eq!(load_target("redis://:pw@h:1/0"), "redis://h:1/0");
    }
}
