//! Connections: one type for a single Redis (a `ConnectionManager`, which
//! reconnects by itself) and a Redis Cluster (redis-rs' cluster client, which
//! follows MOVED/ASK and reconnects to nodes), with explicit timeouts.

use std::time::Duration;

use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClientBuilder;
use redis::cluster_async::ClusterConnection;
use redis::{Cmd, Pipeline, RedisFuture, Value};

use crate::error::{QueueError, Result};

/// Timeouts for talking to Redis.
///
/// ```
/// use std::time::Duration;
/// let cfg = queue_core::ConnectionConfig::default();
/// assert_eq!(cfg.response_timeout, Duration::from_secs(5));
/// ```
#[derive(Debug, Clone)]
pub struct ConnectionConfig {
    /// How long one command may take before it fails with a timeout error.
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

/// A connection to a single Redis or to a Redis Cluster. Cheap to clone
/// (clones share one multiplexed connection).
///
/// The URL picks the kind: `redis://host:port/db` for one server,
/// `redis-cluster://host1:port1,host2:port2` (any reachable nodes) for a cluster.
#[derive(Clone)]
pub struct RedisConnection {
    kind: Kind,
}

#[derive(Clone)]
enum Kind {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
}

impl std::fmt::Debug for RedisConnection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kind = match self.kind {
            Kind::Single(_) => "single",
            Kind::Cluster(_) => "cluster",
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
    pub async fn connect(url: &str, cfg: &ConnectionConfig) -> Result<Self> {
        let err = |source| QueueError::Connect {
            url: redact(url),
            source,
        };
        if let Some(nodes) = url.strip_prefix("redis-cluster://") {
            let nodes: Vec<String> = nodes
                .trim_end_matches('/')
                .split(',')
                .filter(|n| !n.is_empty())
                .map(|n| format!("redis://{n}/"))
                .collect();
            let client = ClusterClientBuilder::new(nodes)
                .connection_timeout(cfg.connection_timeout)
                .response_timeout(cfg.response_timeout)
                .build()
                .map_err(err)?;
            let conn = client.get_async_connection().await.map_err(err)?;
            return Ok(RedisConnection {
                kind: Kind::Cluster(conn),
            });
        }
        let client = redis::Client::open(url).map_err(err)?;
        let mgr_cfg = ConnectionManagerConfig::new()
            .set_response_timeout(Some(cfg.response_timeout))
            .set_connection_timeout(Some(cfg.connection_timeout))
            .set_number_of_retries(3)
            .set_max_delay(Duration::from_secs(2));
        let conn = ConnectionManager::new_with_config(client, mgr_cfg)
            .await
            .map_err(err)?;
        Ok(RedisConnection {
            kind: Kind::Single(conn),
        })
    }

    /// Wraps an existing single-server connection manager.
    pub fn from_manager(conn: ConnectionManager) -> Self {
        RedisConnection {
            kind: Kind::Single(conn),
        }
    }

    /// True for a Redis Cluster connection.
    pub fn is_cluster(&self) -> bool {
        matches!(self.kind, Kind::Cluster(_))
    }
}

impl ConnectionLike for RedisConnection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match &mut self.kind {
            Kind::Single(c) => c.req_packed_command(cmd),
            Kind::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match &mut self.kind {
            Kind::Single(c) => c.req_packed_commands(pipeline, offset, count),
            Kind::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match &self.kind {
            Kind::Single(c) => c.get_db(),
            Kind::Cluster(c) => c.get_db(),
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

/// Connects with the given timeouts. Fails at once when Redis is unreachable.
pub(crate) async fn connect(url: &str, cfg: &ConnectionConfig) -> Result<RedisConnection> {
    RedisConnection::connect(url, cfg).await
}
