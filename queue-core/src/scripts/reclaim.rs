//! `reclaim.lua`: one batch of a watchdog pass. Returns jobs whose lease
//! expired (jittered backoff) or dead-letters them when attempts are
//! exhausted, and gives a provisional lease to unleased ids in processing
//! (the BLMOVE → claim window, DESIGN rule 4).

use std::time::Duration;

use super::reply::Fields;
use super::{lua_script, LuaScript};
use crate::backoff::Backoff;
use crate::conn::RedisConnection;
use crate::error::Result;
use crate::keys::QueueKeys;

pub(crate) static SCRIPT: LuaScript<7> =
    lua_script!("reclaim.lua", keys = 7, args = 7, prelude(super::DRAIN));

/// One reclaim batch of one queue.
pub(crate) struct Reclaim<'a> {
    pub(crate) keys: &'a QueueKeys,
    /// Expired leases handled by this call.
    pub(crate) batch: usize,
    /// Provisional lease of an unleased id.
    pub(crate) orphan_grace: Duration,
    /// Backoff before a reclaimed job runs again.
    pub(crate) backoff: &'a Backoff,
    /// Seeds the script's jitter.
    pub(crate) seed: u32,
    /// Oldest processing entries checked for a lease.
    pub(crate) orphan_scan: usize,
}

/// What the batch did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ReclaimReply {
    pub(crate) reclaimed: u64,
    pub(crate) dead_lettered: u64,
    pub(crate) adopted: u64,
}

impl<'a> Reclaim<'a> {
    /// The reclaim the script-level tests run: 100 expired leases a call,
    /// 30 s orphan grace, a short fixed backoff.
    #[cfg(test)]
    pub(crate) fn for_tests(keys: &'a QueueKeys) -> Self {
        static BACKOFF: Backoff = Backoff {
            base: Duration::from_millis(10),
            max: Duration::from_millis(100),
        };
        Reclaim {
            keys,
            batch: 100,
            orphan_grace: Duration::from_secs(30),
            backoff: &BACKOFF,
            seed: 7,
            orphan_scan: 100,
        }
    }
}

impl Reclaim<'_> {
    /// Runs the script.
    pub(crate) async fn run(&self, conn: &mut RedisConnection) -> Result<ReclaimReply> {
        let k = self.keys;
        let reply = SCRIPT
            .call([
                &k.processing,
                &k.leases,
                &k.delayed,
                &k.dead,
                &k.stats,
                &k.guard,
                &k.wake,
            ])
            .arg(&k.job_prefix)
            .arg(self.batch)
            .arg(super::ms(self.orphan_grace))
            .arg(super::ms(self.backoff.base))
            .arg(super::ms(self.backoff.max))
            .arg(self.seed)
            .arg(self.orphan_scan)
            .run(conn, &k.queue, None)
            .await?;
        // {reclaimed, dead_lettered, adopted}
        let f = Fields::new(&k.queue, None, "reclaim reply", &reply)?;
        Ok(ReclaimReply {
            reclaimed: f.u64(0, "reclaimed")?,
            dead_lettered: f.u64(1, "dead_lettered")?,
            adopted: f.u64(2, "adopted")?,
        })
    }
}

#[cfg(test)]
mod tests {
    use redis::Value;

    use super::Reclaim;
    use crate::conn::RedisConnection;
    use crate::keys::QueueKeys;
    use crate::scripts::test_redis;

    /// Ids pushed to the tail of `list`, in pipelines of 10,000.
    async fn rpush_ids(conn: &mut RedisConnection, list: &str, ids: impl Iterator<Item = String>) {
        let ids: Vec<String> = ids.collect();
        for chunk in ids.chunks(10_000) {
            let _: () = redis::cmd("RPUSH")
                .arg(list)
                .arg(chunk)
                .query_async(conn)
                .await
                .unwrap();
        }
    }

    /// The slow-log entries of script calls (`FCALL`) slower than `us`
    /// microseconds, logged while `run` ran: their durations.
    async fn slow_calls<F: std::future::Future<Output = ()>>(
        conn: &mut RedisConnection,
        us: u64,
        run: F,
    ) -> Vec<i64> {
        let mut admin = conn.clone();
        let _: () = redis::cmd("CONFIG")
            .arg("SET")
            .arg("slowlog-log-slower-than")
            .arg(us)
            .query_async(&mut admin)
            .await
            .unwrap();
        let _: () = redis::cmd("SLOWLOG")
            .arg("RESET")
            .query_async(&mut admin)
            .await
            .unwrap();
        run.await;
        let log: Vec<Value> = redis::cmd("SLOWLOG")
            .arg("GET")
            .arg(-1)
            .query_async(&mut admin)
            .await
            .unwrap();
        log.iter()
            .filter_map(|e| match e {
                Value::Array(f) if format!("{:?}", f.get(3)).contains("FCALL") => match f.get(2) {
                    Some(Value::Int(d)) => Some(*d),
                    _ => None,
                },
                _ => None,
            })
            .collect()
    }

    /// Scenario: a long processing list (200,000 ids) whose 500 expired
    /// deliveries sit at its tail, where the oldest deliveries are. The pass
    /// looks each up from the tail: a few hundred comparisons each, not a walk
    /// of the whole list. Before, `LPOS` scanned from the head: 500 × 200,000
    /// comparisons in one script, Redis blocked for about a second.
    #[tokio::test]
    async fn expired_ids_at_the_tail_of_a_long_processing_list_are_found_from_the_tail() {
        let (_server, mut conn) = test_redis().await;
        let keys = QueueKeys::new("long");
        let expired: Vec<String> = (0..500).map(|n| format!("expired-{n}")).collect();
        rpush_ids(
            &mut conn,
            &keys.processing,
            (0..199_500).map(|n| format!("running-{n}")),
        )
        .await;
        rpush_ids(&mut conn, &keys.processing, expired.iter().cloned()).await;
        let mut pipe = redis::pipe();
        for id in &expired {
            pipe.cmd("HSET")
                .arg(keys.job(id))
                .arg(&[
                    ("state", "active"),
                    ("attempts", "1"),
                    ("max_attempts", "3"),
                ])
                .ignore();
            pipe.cmd("ZADD").arg(&keys.leases).arg(1).arg(id).ignore();
        }
        let _: () = pipe.query_async(&mut conn).await.unwrap();

        let reclaim = Reclaim {
            batch: 500,
            orphan_scan: 1,
            ..Reclaim::for_tests(&keys)
        };
        // Measured on a shared 2-core machine: about 35 ms from the tail,
        // 4.4 s from the head. The bound sits far from both.
        let mut c = conn.clone();
        let slow = slow_calls(&mut conn, 500_000, async move {
            let done = reclaim.run(&mut c).await.unwrap();
            assert_eq!(done.reclaimed, 500);
        })
        .await;
        assert_eq!(slow, Vec::<i64>::new(), "µs of a reclaim pass over 0.5 s");
    }
}
