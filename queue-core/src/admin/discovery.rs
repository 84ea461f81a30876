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
    queue_of_raw_key(key.as_bytes())
}

/// [`queue_of_key`] of a key as Redis returns it, bytes: the name between
/// `q:{` and the first `}`, when `}:` follows and the name is UTF-8. A key
/// whose name or rest is not UTF-8 (a job id from a producer in another
/// language: `q:{e}:hist:\xff`) still names its queue; a name that is not
/// UTF-8 names none (no tool can address it).
fn queue_of_raw_key(key: &[u8]) -> Option<&str> {
    let rest = key.strip_prefix(b"q:{")?;
    let end = rest.iter().position(|&b| b == b'}')?;
    if !rest[end..].starts_with(b"}:") {
        return None;
    }
    std::str::from_utf8(&rest[..end]).ok()
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
                // Bytes, not `String`s: one key that is not UTF-8 failed
                // the whole discovery (`stats`, `check`, the dashboard).
                let (next, keys): (u64, Vec<Vec<u8>>) = cmd
                    .query_async(&mut conn.clone())
                    .await
                    .map_err(AdminError::server("SCAN for queue keys"))?;
                found.extend(
                    keys.iter()
                        .filter_map(|k| queue_of_raw_key(k))
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
        assert_eq!(queue_of_raw_key(b"q:{e}:hist:\xff\xfe"), Some("e"));
        assert_eq!(queue_of_raw_key(b"q:{\xff}:main"), None);
    }
}
