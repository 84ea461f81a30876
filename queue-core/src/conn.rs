//! Connections: a `ConnectionManager` (reconnects by itself) with explicit timeouts.

use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};

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

/// The URL without its password, for error messages and logs.
pub(crate) fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => format!("{}://***@{}", &url[..scheme], &url[at + 1..]),
        _ => url.to_string(),
    }
}

/// Connects with the given timeouts. Fails at once when Redis is unreachable.
pub(crate) async fn connect(url: &str, cfg: &ConnectionConfig) -> Result<ConnectionManager> {
    let client = redis::Client::open(url).map_err(|source| QueueError::Connect {
        url: redact(url),
        source,
    })?;
    let mgr_cfg = ConnectionManagerConfig::new()
        .set_response_timeout(Some(cfg.response_timeout))
        .set_connection_timeout(Some(cfg.connection_timeout))
        .set_number_of_retries(3)
        .set_max_delay(Duration::from_secs(2));
    ConnectionManager::new_with_config(client, mgr_cfg)
        .await
        .map_err(|source| QueueError::Connect {
            url: redact(url),
            source,
        })
}
