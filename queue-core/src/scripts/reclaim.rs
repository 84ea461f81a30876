//! `reclaim.lua`: one batch of a watchdog pass. Returns jobs whose lease
//! expired (jittered backoff) or dead-letters them when attempts are
//! exhausted, and gives a provisional lease to unleased ids in processing
//! (the BLMOVE → claim window, DESIGN rule 4), `orphan_scan` entries a call
//! from a rotating position. A stale processing entry
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

pub(crate) static SCRIPT: LuaScript<8> =
    lua_script!("reclaim.lua", keys = 8, args = 8, prelude(super::DRAIN));

/// What `reclaim.lua` writes over a taken processing entry until its one
/// `LREM` at the end of the call (a control character: no job id has one,
/// PROTOCOL.md section 1). One left in processing (a call that failed
/// half-way) is no job: the reclaim removes it, and the admin readers of
/// processing skip it.
pub(crate) const RECLAIM_MARK: &str = "\0reclaimed";

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
    /// Processing entries checked for a lease per call, from a position
    /// that moves on by this much a call (`QueueKeys::orphan_cursor`).
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
    /// Leftover reclaim marks removed from processing (entries the orphan
    /// scan met) and from the leases (an older reclaim adopted one): no
    /// job's, logged here.
    pub(crate) marks_removed: u64,
    /// The call stopped before an expired entry whose dead-list lookup
    /// needed more whole walks than a call allows (a stale entry of a dead
    /// job): call again for the rest.
    pub(crate) cut: bool,
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
                &k.orphan_cursor(),
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
        // {reclaimed, dead_lettered, adopted, {id, state, ...}, marks removed, cut}
        let f = Fields::new(&k.queue, None, "reclaim reply", &reply)?;
        // Absent from a three-element reply (the script before it answered them).
        let dropped = if f.len() > 3 {
            f.dropped_entries(3)?
        } else {
            Vec::new()
        };
        // Absent from a four-element reply (the script before it removed none).
        let marks_removed = if f.len() > 4 {
            f.u64(4, "marks removed")?
        } else {
            0
        };
        let cut = f.len() > 5 && f.u64(5, "cut")? == 1;
        if marks_removed > 0 {
            warn!(queue = %k.queue, marks_removed, "reclaim: removed leftover reclaim marks (no job) from processing or the leases: a reclaim call failed half-way before");
        }
        for (job_id, state) in &dropped {
            warn!(queue = %k.queue, %job_id, %state, "reclaim: dropped a stale processing entry or lease (the job is not running); the job is left where it is");
        }
        Ok(ReclaimReply {
            reclaimed: f.u64(0, "reclaimed")?,
            dead_lettered: f.u64(1, "dead_lettered")?,
            adopted: f.u64(2, "adopted")?,
            dropped,
            marks_removed,
            cut,
        })
    }
}

#[cfg(test)]
mod tests {

    use super::Reclaim;
    use crate::conn::RedisConnection;
    use crate::keys::QueueKeys;
    use crate::scripts::{monitor_args, script_commands, test_redis};

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

    /// How the script calls went over `list` (of `len` entries before the
    /// call): lookups (`LPOS`), removals (`LREM`, with their count) and the
    /// entries read by `LRANGE`.
    #[derive(Debug, Default)]
    struct ListCalls {
        lookups: usize,
        removal_counts: Vec<i64>,
        read: usize,
    }

    impl ListCalls {
        fn of(calls: &[String], list: &str, len: usize) -> Self {
            let mut seen = ListCalls::default();
            for args in calls.iter().map(|l| monitor_args(l)) {
                if args.get(1).map(String::as_str) != Some(list) {
                    continue;
                }
                let num = |i: usize| args[i].parse::<i64>().unwrap();
                match args[0].as_str() {
                    "LPOS" => seen.lookups += 1,
                    "LREM" => seen.removal_counts.push(num(2)),
                    "LRANGE" => {
                        // Both ends counted from the tail (negative), as the
                        // script reads; the start is clamped to the head.
                        let (start, stop) = (num(2), num(3));
                        assert!(start < 0 && stop < 0, "{args:?}");
                        let first = start.unsigned_abs().min(len as u64);
                        seen.read += (first + 1).saturating_sub(stop.unsigned_abs()) as usize;
                    }
                    _ => {}
                }
            }
            seen
        }

        /// Walks of the whole list the calls cost at most: each lookup and
        /// removal one, the entries read as a share of the list.
        fn walks(&self, len: usize) -> f64 {
            (self.lookups + self.removal_counts.len()) as f64 + self.read as f64 / len as f64
        }
    }

    /// Ids in `processing` (of `len` ids, `running-<n>` from the head), `expired`
    /// among them where `place` puts them, each leased until 1 (long expired)
    /// with an `active` job hash; the running ones leased far ahead.
    async fn long_processing_list(
        conn: &mut RedisConnection,
        keys: &QueueKeys,
        running: usize,
        expired: &[String],
        expired_at_head: usize,
    ) -> Vec<String> {
        let running: Vec<String> = (0..running).map(|n| format!("running-{n}")).collect();
        let (head, tail) = expired.split_at(expired_at_head);
        let listed = head.iter().chain(&running).chain(tail).cloned();
        rpush_ids(conn, &keys.processing, listed).await;
        let mut pipe = redis::pipe();
        for id in expired {
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
        for chunk in running.chunks(10_000) {
            pipe.cmd("ZADD").arg(&keys.leases);
            for id in chunk {
                pipe.arg("9000000000000").arg(id);
            }
            pipe.ignore();
        }
        let _: () = pipe.query_async(conn).await.unwrap();
        running
    }

    /// One reclaim call of batch 100 over `keys`, watched: its reply and
    /// the calls it made to the processing list (of `len` entries).
    async fn watched_reclaim(
        server: &queue_testkit::RedisServer,
        conn: &mut RedisConnection,
        keys: &QueueKeys,
        len: usize,
    ) -> (super::ReclaimReply, ListCalls) {
        let reclaim = Reclaim {
            batch: 100,
            orphan_scan: 1,
            ..Reclaim::for_tests(keys)
        };
        let mut c = conn.clone();
        let mut reply = None;
        let calls = script_commands(&server.url(), conn, async {
            reply = Some(reclaim.run(&mut c).await.unwrap());
        })
        .await;
        let reply = reply.expect("the call answered");
        (reply, ListCalls::of(&calls, &keys.processing, len))
    }

    async fn processing(conn: &mut RedisConnection, keys: &QueueKeys) -> Vec<String> {
        redis::cmd("LRANGE")
            .arg(&keys.processing)
            .arg(0)
            .arg(-1)
            .query_async(conn)
            .await
            .unwrap()
    }

    /// Scenario: a long processing list (20,000 ids) whose 100 expired
    /// deliveries sit at its tail, where the oldest deliveries are. The pass
    /// finds them from the tail: it reads a few hundred entries there and
    /// removes them with one `LREM` from the tail, not a walk of the whole
    /// list (as `MONITOR` shows the script's calls). Before an earlier fix, `LPOS`
    /// scanned from the head: with 200,000 ids and 500 expired, 10^8
    /// comparisons in one script, Redis blocked for seconds. The calls tell
    /// the costs apart deterministically, where a slow-log bound depended on
    /// the machine's speed. Every running id stays, in its order.
    #[tokio::test]
    async fn expired_ids_at_the_tail_of_a_long_processing_list_are_found_from_the_tail() {
        let (server, mut conn) = test_redis().await;
        let keys = QueueKeys::new("long");
        let expired: Vec<String> = (0..100).map(|n| format!("expired-{n}")).collect();
        let running = long_processing_list(&mut conn, &keys, 19_900, &expired, 0).await;

        let (done, list) = watched_reclaim(&server, &mut conn, &keys, 20_000).await;
        assert_eq!(done.reclaimed, 100);
        assert_eq!(list.lookups, 0, "{list:?}");
        assert_eq!(list.removal_counts, [-100], "one LREM, from the tail");
        assert!(
            list.read <= 4 * expired.len(),
            "read {} entries to find {} at the tail",
            list.read,
            expired.len()
        );
        assert_eq!(processing(&mut conn, &keys).await, running);
    }

    /// Scenario: the same list with its 100 expired deliveries at the head,
    /// behind 20,000 running ones (long-running jobs that extend their
    /// leases, and short ones of a worker that died). The pass walks the
    /// list a bounded number of times whatever the batch: it reads it once
    /// from the tail and removes the taken entries with one `LREM`. Before,
    /// each expired id cost one `LPOS` and one `LREM` from the tail over
    /// the whole list: 200 walks here; with 100,000 running and 500 expired,
    /// 1.7 s in one script, and past the 5 s response timeout at ~300,000.
    /// Every running id stays, in its order.
    #[tokio::test]
    async fn expired_ids_at_the_head_of_a_long_processing_list_cost_a_bounded_number_of_walks() {
        let (server, mut conn) = test_redis().await;
        let keys = QueueKeys::new("long");
        let expired: Vec<String> = (0..100).map(|n| format!("expired-{n}")).collect();
        let running = long_processing_list(&mut conn, &keys, 20_000, &expired, 100).await;

        let len = running.len() + expired.len();
        let (done, list) = watched_reclaim(&server, &mut conn, &keys, len).await;
        assert_eq!(done.reclaimed, 100);
        assert!(
            list.walks(len) <= 3.0,
            "the pass walked processing {:.1} times: {list:?}",
            list.walks(len)
        );
        assert_eq!(processing(&mut conn, &keys).await, running);
    }

    /// Scenario: 100 expired deliveries, 95 at the tail of a 20,000-id list
    /// and 5 at its head. The walk finds the 95 in its first chunk; the 5
    /// left are looked up one by one (`LPOS`, cheaper than reading the rest
    /// of the list for so few), and their positions, counted from the head,
    /// mark the right entries: all 100 leave processing, every running id
    /// stays, in its order.
    #[tokio::test]
    async fn expired_ids_at_both_ends_of_a_long_processing_list_are_all_taken() {
        let (server, mut conn) = test_redis().await;
        let keys = QueueKeys::new("ends");
        let expired: Vec<String> = (0..100).map(|n| format!("expired-{n}")).collect();
        let running = long_processing_list(&mut conn, &keys, 20_000, &expired, 5).await;

        let len = running.len() + expired.len();
        let (done, list) = watched_reclaim(&server, &mut conn, &keys, len).await;
        assert_eq!((done.reclaimed, done.dead_lettered), (100, 0));
        assert_eq!(list.lookups, 5, "{list:?}");
        assert_eq!(processing(&mut conn, &keys).await, running);
    }

    /// Scenario: 200 deliveries whose workers extend their leases, and at
    /// the head of processing one id without a lease (its worker died
    /// between BLMOVE and the claim), with an orphan scan of 100. The scan
    /// moves on by 100 entries a call, so the third call reaches the head
    /// and gives the id its provisional lease; the position then goes back
    /// to the tail. Before, every call looked at the oldest 100 entries
    /// only: the orphan waited until 101 of the 200 had finished.
    #[tokio::test]
    async fn an_orphan_behind_more_running_deliveries_than_the_scan_is_adopted() {
        let (_server, mut conn) = test_redis().await;
        let keys = QueueKeys::new("behind");
        let running = long_processing_list(&mut conn, &keys, 200, &[], 0).await;
        let _: () = redis::cmd("LPUSH")
            .arg(&keys.processing)
            .arg("orphan")
            .query_async(&mut conn)
            .await
            .unwrap();
        let reclaim = Reclaim::for_tests(&keys);
        assert_eq!(reclaim.orphan_scan, 100);

        let mut adopted = 0;
        for _ in 0..3 {
            adopted += reclaim.run(&mut conn).await.unwrap().adopted;
        }
        assert_eq!(adopted, 1);
        let lease: Option<f64> = redis::cmd("ZSCORE")
            .arg(&keys.leases)
            .arg("orphan")
            .query_async(&mut conn)
            .await
            .unwrap();
        assert!(lease.is_some(), "the orphan has its provisional lease");
        let mut listed = vec!["orphan".to_string()];
        listed.extend(running);
        assert_eq!(processing(&mut conn, &keys).await, listed);
        let cursor: Option<String> = redis::cmd("GET")
            .arg(keys.orphan_cursor())
            .query_async(&mut conn)
            .await
            .unwrap();
        assert_eq!(cursor, None, "back to the tail after the head");
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

    /// Scenario: two reclaim marks left in processing beside a running
    /// delivery (a call failed half-way between its `LSET`s and its `LREM`:
    /// Redis keeps a script's writes up to an error), and a third adopted by
    /// an older reclaim (a lease on the mark, expired). Reclaim passes
    /// remove the marks and that lease, adopt nothing, dead-letter nothing
    /// and create no job hash; the running delivery stays. Before, the
    /// orphan scan adopted the marks as orphans and the next pass
    /// dead-lettered a junk job `\0reclaimed` ("job hash missing").
    #[tokio::test]
    async fn leftover_reclaim_marks_are_removed_and_never_taken_for_jobs() {
        use super::RECLAIM_MARK;
        let (_server, mut conn) = test_redis().await;
        let keys = QueueKeys::new("marks");
        let running = long_processing_list(&mut conn, &keys, 1, &[], 0).await;
        rpush_ids(
            &mut conn,
            &keys.processing,
            std::iter::repeat_n(RECLAIM_MARK.to_string(), 2),
        )
        .await;
        let _: () = redis::cmd("ZADD")
            .arg(&keys.leases)
            .arg(1)
            .arg(RECLAIM_MARK)
            .query_async(&mut conn)
            .await
            .unwrap();

        let reclaim = Reclaim::for_tests(&keys);
        let (mut adopted, mut dead, mut dropped, mut marks) = (0, 0, 0, 0);
        for _ in 0..3 {
            let done = reclaim.run(&mut conn).await.unwrap();
            adopted += done.adopted;
            dead += done.dead_lettered;
            dropped += done.dropped.len();
            marks += done.marks_removed;
        }
        assert_eq!((adopted, dead, dropped, marks), (0, 0, 0, 3));
        assert_eq!(processing(&mut conn, &keys).await, running);
        let dead_list: Vec<String> = redis::cmd("LRANGE")
            .arg(&keys.dead)
            .arg(0)
            .arg(-1)
            .query_async(&mut conn)
            .await
            .unwrap();
        assert!(dead_list.is_empty(), "{dead_list:?}");
        let hash: i64 = redis::cmd("EXISTS")
            .arg(keys.job(RECLAIM_MARK))
            .query_async(&mut conn)
            .await
            .unwrap();
        assert_eq!(hash, 0, "no job hash for a mark");
        let leased: Vec<String> = redis::cmd("ZRANGE")
            .arg(&keys.leases)
            .arg(0)
            .arg(-1)
            .query_async(&mut conn)
            .await
            .unwrap();
        assert_eq!(leased, running);
    }
}
