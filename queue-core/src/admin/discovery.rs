//! Queue discovery: queue names found from their keys (`q:{Q}:stats`
//! hashes and `q:{Q}:*` lists), for tools that are not told which queues exist.

use std::collections::BTreeSet;

use super::{Admin, AdminError, Result};

/// The queue a key belongs to: `q:{emails}:main` → `emails`.
///
/// ```
/// use queue_core::admin::queue_of_key;
/// assert_eq!(queue_of_key("q:{emails}:job:42"), Some("emails"));
/// assert_eq!(queue_of_key("lock:{emails}"), None);
/// ```
pub fn queue_of_key(key: &str) -> Option<&str> {
    let rest = key.strip_prefix("q:{")?;
    let end = rest.find('}')?;
    rest[end..].starts_with("}:").then(|| &rest[..end])
}

impl Admin {
    /// Every queue that has keys, sorted: scans the whole keyspace (SCAN, so
    /// without blocking Redis) for `q:{*}:stats` hashes and `q:{*}:*` lists.
    /// On big deployments name the queues instead. Not on a Redis Cluster
    /// ([`AdminError::DiscoveryNeedsSingleServer`]).
    pub async fn discover_queues(&self) -> Result<Vec<String>> {
        let conn = self.queue.connection();
        if conn.is_cluster() {
            return Err(AdminError::DiscoveryNeedsSingleServer);
        }
        let mut found = BTreeSet::new();
        for (pattern, kind) in [("q:{*}:stats", None), ("q:{*}:*", Some("list"))] {
            let mut cursor = 0u64;
            loop {
                let mut cmd = redis::cmd("SCAN");
                cmd.arg(cursor)
                    .arg("MATCH")
                    .arg(pattern)
                    .arg("COUNT")
                    .arg(1000);
                if let Some(kind) = kind {
                    cmd.arg("TYPE").arg(kind);
                }
                let (next, keys): (u64, Vec<String>) = cmd
                    .query_async(&mut conn.clone())
                    .await
                    .map_err(AdminError::server("SCAN for queue keys"))?;
                found.extend(
                    keys.iter()
                        .filter_map(|k| queue_of_key(k))
                        .map(String::from),
                );
                cursor = next;
                if cursor == 0 {
                    break;
                }
            }
        }
        Ok(found.into_iter().collect())
    }

    /// `named` when it is not empty, else every queue found by
    /// [`Admin::discover_queues`].
    pub async fn queues_or_discover(&self, named: &[String]) -> Result<Vec<String>> {
        if !named.is_empty() {
            return Ok(named.to_vec());
        }
        self.discover_queues().await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queue_names_from_keys() {
        assert_eq!(queue_of_key("q:{emails}:main"), Some("emails"));
        assert_eq!(queue_of_key("q:{a:b}:job:1"), Some("a:b"));
        assert_eq!(queue_of_key("lock:{x}"), None);
        assert_eq!(queue_of_key("q:{broken"), None);
    }
}
