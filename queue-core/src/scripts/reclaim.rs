//! `reclaim.lua`: one batch of a watchdog pass. Returns jobs whose lease
//! expired (jittered backoff) or dead-letters them when attempts are
//! exhausted, and gives a provisional lease to unleased ids in processing
//! (the BLMOVE → claim window, DESIGN rule 4). A stale processing entry
//! (of a dead or delayed job, or of a completed one) or a stale lease is
//! dropped and the job left where it is (logged here with job id and queue).

use std::time::Duration;

use tracing::warn;

use super::reply::Fields;
use super::{lua_script, LuaScript};
use crate::backoff::Backoff;
use crate::conn::RedisConnection;
use crate::error::Result;
use crate::job::JobId;
use crate::keys::QueueKeys;

pub(crate) static SCRIPT: LuaScript<7> =
    lua_script!("reclaim.lua", keys = 7, args = 8, prelude(super::DRAIN));

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
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ReclaimReply {
    pub(crate) reclaimed: u64,
    pub(crate) dead_lettered: u64,
    pub(crate) adopted: u64,
    /// Expired entries dropped and their jobs left where they are: the
    /// job's id and its state (`dead`, `delayed`), `completed` (only its
    /// completion record exists) or `lease only (<state>)` (a lease with no
    /// processing entry and no matching active delivery).
    pub(crate) dropped: Vec<(JobId, String)>,
}

impl ReclaimReply {
    /// Expired leases this call handled (returned, dead-lettered or
    /// dropped): fewer than the batch means no more had expired.
    pub(crate) fn taken(&self) -> u64 {
        self.reclaimed + self.dead_lettered + self.dropped.len() as u64
    }
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
            .arg(&k.done_prefix)
            .run(conn, &k.queue, None)
            .await?;
        // {reclaimed, dead_lettered, adopted, {id, state, ...}}
        let f = Fields::new(&k.queue, None, "reclaim reply", &reply)?;
        // Absent from a three-element reply (the script before it answered them).
        let dropped = if f.len() > 3 {
            f.dropped_entries(3)?
        } else {
            Vec::new()
        };
        for (job_id, state) in &dropped {
            warn!(queue = %k.queue, %job_id, %state, "reclaim: dropped a stale processing entry or lease (the job is not running); the job is left where it is");
        }
        Ok(ReclaimReply {
            reclaimed: f.u64(0, "reclaimed")?,
            dead_lettered: f.u64(1, "dead_lettered")?,
            adopted: f.u64(2, "adopted")?,
            dropped,
        })
    }
}

#[cfg(test)]
mod tests {

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

    /// The commands scripts ran (`MONITOR` lines of the `lua` client)
    /// while `run` ran, in order.
    async fn script_commands<F: std::future::Future<Output = ()>>(
        url: &str,
        conn: &mut RedisConnection,
        run: F,
    ) -> Vec<String> {
        use futures::StreamExt;
        let client = redis::Client::open(url).unwrap();
        let monitor = client.get_async_monitor().await.unwrap();
        run.await;
        // Monitored after everything `run` sent: the end of its lines.
        let _: String = redis::cmd("ECHO")
            .arg("end-of-run")
            .query_async(conn)
            .await
            .unwrap();
        let mut lines = monitor.into_on_message::<String>();
        let mut seen = Vec::new();
        loop {
            let next = tokio::time::timeout(std::time::Duration::from_secs(60), lines.next());
            let line = next.await.expect("monitor lines").expect("monitor open");
            if line.contains("\"end-of-run\"") {
                return seen;
            }
            if line.contains(" lua] ") {
                seen.push(line);
            }
        }
    }

    /// Scenario: a long processing list (20,000 ids) whose 100 expired
    /// deliveries sit at its tail, where the oldest deliveries are. The pass
    /// looks each up from the tail (`LPOS … RANK -1`, as `MONITOR` shows
    /// the script's calls): a few hundred comparisons each, not a walk of
    /// the whole list. Before, `LPOS` scanned from the head: with 200,000
    /// ids and 500 expired, 10^8 comparisons in one script, Redis blocked
    /// for seconds. (The lookup's answer is only "in the list or not", so
    /// no outcome tells the directions apart; the calls do, deterministically,
    /// where a slow-log bound depended on the machine's speed.)
    #[tokio::test]
    async fn expired_ids_at_the_tail_of_a_long_processing_list_are_found_from_the_tail() {
        let (server, mut conn) = test_redis().await;
        let keys = QueueKeys::new("long");
        let expired: Vec<String> = (0..100).map(|n| format!("expired-{n}")).collect();
        rpush_ids(
            &mut conn,
            &keys.processing,
            (0..19_900).map(|n| format!("running-{n}")),
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
            batch: 100,
            orphan_scan: 1,
            ..Reclaim::for_tests(&keys)
        };
        let mut c = conn.clone();
        let calls = script_commands(&server.url(), &mut conn, async move {
            let done = reclaim.run(&mut c).await.unwrap();
            assert_eq!(done.reclaimed, 100);
        })
        .await;
        let lookups: Vec<&String> = calls.iter().filter(|l| l.contains("\"LPOS\"")).collect();
        assert_eq!(lookups.len(), expired.len(), "one lookup per expired id");
        let from_head: Vec<&&String> = lookups
            .iter()
            .filter(|l| !l.ends_with("\"RANK\" \"-1\""))
            .collect();
        assert!(
            from_head.is_empty(),
            "{} lookups from the head, e.g. {:?}",
            from_head.len(),
            from_head.first()
        );
    }

    /// An orphan scan of 0 is refused before any write. Before, the pass
    /// moved the expired deliveries first, then `LRANGE processing -0 -1`
    /// raised: every pass failed half-way, so no orphan was ever adopted
    /// (and the watchdog skipped the rest of that queue's pass).
    #[tokio::test]
    async fn a_reclaim_scanning_no_orphans_is_refused_before_any_write() {
        let (_server, mut conn) = test_redis().await;
        let keys = QueueKeys::new("scan0");
        let _: () = redis::pipe()
            .cmd("RPUSH")
            .arg(&keys.processing)
            .arg("expired")
            .ignore()
            .cmd("HSET")
            .arg(keys.job("expired"))
            .arg(&[
                ("state", "active"),
                ("attempts", "1"),
                ("max_attempts", "3"),
            ])
            .ignore()
            .cmd("ZADD")
            .arg(&keys.leases)
            .arg(1)
            .arg("expired")
            .ignore()
            .query_async(&mut conn)
            .await
            .unwrap();

        let err = Reclaim {
            orphan_scan: 0,
            ..Reclaim::for_tests(&keys)
        }
        .run(&mut conn)
        .await
        .unwrap_err();
        assert!(err.to_string().contains("orphan scan"), "{err}");
        let processing: Vec<String> = redis::cmd("LRANGE")
            .arg(&keys.processing)
            .arg(0)
            .arg(-1)
            .query_async(&mut conn)
            .await
            .unwrap();
        assert_eq!(processing, ["expired"], "still in processing");
        let lease: Option<i64> = redis::cmd("ZSCORE")
            .arg(&keys.leases)
            .arg("expired")
            .query_async(&mut conn)
            .await
            .unwrap();
        assert_eq!(lease, Some(1), "still leased");
        let state: Option<String> = redis::cmd("HGET")
            .arg(keys.job("expired"))
            .arg("state")
            .query_async(&mut conn)
            .await
            .unwrap();
        assert_eq!(state.as_deref(), Some("active"));
    }
}
