//! `promote.lua`: moves due delayed jobs (retries, scheduled jobs, watchdog
//! returns) to main; a missing hash is dead-lettered, never dropped. An
//! entry whose job is in another state than `delayed`, or whose job
//! completed, is dropped from the set (logged here with job id and queue).

use std::time::Duration;

use tracing::warn;

use super::reply::Fields;
use super::{lua_script, LuaScript};
use crate::conn::RedisConnection;
use crate::error::Result;
use crate::job::JobId;
use crate::keys::QueueKeys;

pub(crate) static SCRIPT: LuaScript<7> =
    lua_script!("promote.lua", keys = 7, args = 3, prelude(super::DRAIN));

/// Promotes at most `limit` due jobs of one queue.
pub(crate) struct Promote<'a> {
    pub(crate) keys: &'a QueueKeys,
    pub(crate) limit: usize,
}

/// What the script did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PromoteReply {
    /// Ids moved to main or dead-lettered.
    pub(crate) promoted: u64,
    /// Entries dropped from the delayed set and left where they are: the
    /// job's id and its state (`queued`, `active`, `dead`, ...), or
    /// `completed` when only its completion record exists.
    pub(crate) dropped: Vec<(JobId, String)>,
    /// How long until the earliest remaining delayed job is due (Redis
    /// clock; zero when one is due already); `None` when the set is empty.
    pub(crate) next_due_in: Option<Duration>,
}

impl PromoteReply {
    /// Entries this call took from the delayed set (moved, dead-lettered or
    /// dropped): fewer than the limit means no more were due.
    pub(crate) fn taken(&self) -> u64 {
        self.promoted + self.dropped.len() as u64
    }
}

impl Promote<'_> {
    /// Runs the script.
    pub(crate) async fn run(&self, conn: &mut RedisConnection) -> Result<PromoteReply> {
        let k = self.keys;
        let reply = SCRIPT
            .call([
                &k.delayed,
                &k.main,
                &k.dead,
                &k.stats,
                &k.guard,
                &k.processing,
                &k.leases,
            ])
            .arg(&k.job_prefix)
            .arg(self.limit)
            .arg(&k.done_prefix)
            .run(conn, &k.queue, None)
            .await?;
        let f = Fields::new(&k.queue, None, "promote reply", &reply)?;
        let promoted = f.u64(0, "count")?;
        let next_due_in = match f.int(1, "wait ms")? {
            -1 => None,
            ms => Some(Duration::from_millis(
                u64::try_from(ms).map_err(|_| f.error(format_args!("negative wait {ms}")))?,
            )),
        };
        let dropped = f.dropped_entries(2)?;
        for (job_id, state) in &dropped {
            warn!(queue = %k.queue, %job_id, %state, "promote: dropped a stale delayed entry (its job is not delayed); the job is left where it is");
        }
        Ok(PromoteReply {
            promoted,
            dropped,
            next_due_in,
        })
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::{Promote, PromoteReply};
    use crate::conn::RedisConnection;
    use crate::keys::QueueKeys;
    use crate::scripts::{test_redis, MAX_MS};

    /// A job hash of `id` (bytes: an id need not be UTF-8) in `state`,
    /// listed in the delayed set at `score`.
    async fn delayed_entry(
        conn: &mut RedisConnection,
        keys: &QueueKeys,
        id: &[u8],
        state: &str,
        score: &str,
    ) {
        let mut job = keys.job_prefix.clone().into_bytes();
        job.extend_from_slice(id);
        let _: () = redis::cmd("HSET")
            .arg(&job)
            .arg("state")
            .arg(state)
            .query_async(conn)
            .await
            .unwrap();
        let _: () = redis::cmd("ZADD")
            .arg(&keys.delayed)
            .arg(score)
            .arg(id)
            .query_async(conn)
            .await
            .unwrap();
    }

    /// One promote call of at most 10 jobs.
    async fn promote(
        conn: &mut RedisConnection,
        keys: &QueueKeys,
    ) -> crate::error::Result<PromoteReply> {
        Promote { keys, limit: 10 }.run(conn).await
    }

    /// Scenario: the earliest delayed job is due at +inf or beyond 2^63 ms
    /// (another producer, a hand edit). It is far away: the script answers
    /// the longest wait a script gives. Before, the infinite wait reached
    /// Rust as the most negative integer and the call failed ("negative
    /// wait"), and with it every watchdog pass of the queue.
    #[tokio::test]
    async fn a_run_at_of_infinity_is_a_far_away_job_not_an_error() {
        let (_server, mut conn) = test_redis().await;
        let keys = QueueKeys::new("far");
        for score in ["+inf", "1e19"] {
            delayed_entry(&mut conn, &keys, b"far", "delayed", score).await;
            let reply = promote(&mut conn, &keys)
                .await
                .unwrap_or_else(|e| panic!("run_at {score}: {e}"));
            assert_eq!(reply.promoted, 0, "{score}");
            assert_eq!(
                reply.next_due_in,
                Some(Duration::from_millis(MAX_MS)),
                "{score}"
            );
        }
    }

    /// Scenario: a stale delayed entry (its job is active, leased) whose id is not
    /// UTF-8 (another producer's bytes). The script drops it and the reply
    /// is read, the id lossily. Before, the dropped list's decode failed
    /// the whole reply after the script had committed: the promoter lost
    /// its next-due time and the watchdog's pass ended with an error.
    #[tokio::test]
    async fn a_dropped_entry_whose_id_is_not_utf8_is_read_lossily() {
        let (_server, mut conn) = test_redis().await;
        let keys = QueueKeys::new("bytes");
        delayed_entry(&mut conn, &keys, b"j\xff", "active", "0").await;
        // Leased, as an active job is (one in no list is dead-lettered).
        let _: () = redis::cmd("ZADD")
            .arg(&keys.leases)
            .arg("9999999999999")
            .arg(b"j\xff")
            .query_async(&mut conn)
            .await
            .unwrap();
        let reply = promote(&mut conn, &keys).await.unwrap();
        assert_eq!(reply.promoted, 0);
        assert_eq!(reply.dropped.len(), 1);
        assert_eq!(reply.dropped[0].0.as_str(), "j\u{fffd}");
    }
}
