//! The [`QueueKeys`] of the queues a [`Queue`](crate::Queue) enqueues to,
//! built once per queue name and shared by its clones.
//!
//! Building a queue's keys formats every key name of the queue (14
//! `format!`s, about 10k instructions). The producer paid that on every
//! enqueue call: about a fifth of a lone producer's instructions per job
//! (issue #12, `callgrind` of `queue-bench enqueue --producers 1`). Bounded:
//! a `Queue` that enqueues to more than [`MAX_QUEUES`] queue names (names
//! made per tenant, say) starts the cache over instead of growing it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use crate::keys::QueueKeys;

/// Queue names kept at most; the cache is emptied when a new name would
/// pass this.
pub(crate) const MAX_QUEUES: usize = 1024;

/// Queue name → its keys.
#[derive(Default)]
pub(crate) struct KeysCache {
    map: Mutex<HashMap<String, Arc<QueueKeys>>>,
}

impl KeysCache {
    /// The keys of `queue`, built on its first use.
    pub(crate) fn get(&self, queue: &str) -> Arc<QueueKeys> {
        let mut map = self.map.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(keys) = map.get(queue) {
            return keys.clone();
        }
        if map.len() >= MAX_QUEUES {
            map.clear();
        }
        let keys = Arc::new(QueueKeys::new(queue));
        map.insert(queue.to_string(), keys.clone());
        keys
    }
}

#[cfg(test)]
mod tests {
    use super::{KeysCache, MAX_QUEUES};
    use std::sync::Arc;

    #[test]
    fn a_queue_gets_the_same_keys_each_time_and_the_cache_stays_bounded() {
        let cache = KeysCache::default();
        let first = cache.get("emails");
        assert_eq!(first.main, "q:{emails}:main");
        assert!(Arc::ptr_eq(&first, &cache.get("emails")), "built once");
        for i in 0..3 * MAX_QUEUES {
            let keys = cache.get(&format!("tenant-{i}"));
            assert_eq!(keys.queue, format!("tenant-{i}"));
        }
        let len = cache.map.lock().unwrap().len();
        assert!(len <= MAX_QUEUES, "{len} queue names kept");
        assert_eq!(
            cache.get("emails").main,
            "q:{emails}:main",
            "rebuilt after a start over"
        );
    }
}
