//! `dead_trim.lua`: keeps the dead-letter list bounded. Each watchdog pass
//! trims it from the oldest end beyond a maximum length or a retention,
//! deleting the trimmed jobs' hashes and step results, a bounded number of
//! ids per pass. Stale entries (a job whose hash says another state) are
//! taken off the list without a deletion: counted apart
//! ([`DeadTrimReply::unlisted`]), not as dead letters deleted.

use std::time::Duration;

use super::reply::Fields;
use super::{lua_script, LuaScript};
use crate::conn::RedisConnection;
use crate::error::{QueueError, Result};
use crate::keys::QueueKeys;

pub(crate) static SCRIPT: LuaScript<7> =
    lua_script!("dead_trim.lua", keys = 7, args = 5, prelude(super::DRAIN));

/// One trim call on one queue.
pub(crate) struct DeadTrim<'a> {
    pub(crate) keys: &'a QueueKeys,
    /// Longest dead list kept; 0: no limit.
    pub(crate) max_len: usize,
    /// Dead letters older than this are deleted; zero: kept forever.
    pub(crate) retention: Duration,
    /// Entries taken off the list at most by this call (deleted or
    /// unlisted).
    pub(crate) limit: usize,
}

/// What the script did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct DeadTrimReply {
    /// Dead letters deleted (with their hashes and step results).
    pub(crate) trimmed: u64,
    /// Length of the dead list afterwards.
    pub(crate) remaining: u64,
    /// Other entries taken off the list, nothing deleted: stale ones (the
    /// job's hash says another state: left or put where it says, or
    /// dead-lettered again at the head) and those whose job key holds
    /// another type (left for `check`).
    pub(crate) unlisted: u64,
}

impl DeadTrimReply {
    /// Entries the call took off the list: `limit` of them means more may
    /// be due.
    pub(crate) fn taken(&self) -> u64 {
        self.trimmed + self.unlisted
    }
}

impl DeadTrim<'_> {
    /// Runs the script.
    pub(crate) async fn run(&self, conn: &mut RedisConnection) -> Result<DeadTrimReply> {
        let k = self.keys;
        let reply = SCRIPT
            .call([
                &k.dead,
                &k.stats,
                &k.guard,
                &k.main,
                &k.processing,
                &k.leases,
                &k.delayed,
            ])
            .arg(&k.job_prefix)
            .arg(&k.steps_prefix)
            .arg(self.max_len)
            .arg(super::ms(self.retention))
            .arg(self.limit)
            .run(conn, &k.queue, None)
            .await?;
        let f = Fields::new(&k.queue, None, "dead_trim reply", &reply)?;
        let count = |i, name| {
            let n = f.int(i, name)?;
            u64::try_from(n).map_err(|_| {
                QueueError::protocol(&k.queue, None, format!("dead_trim reply: {name} {n}"))
            })
        };
        Ok(DeadTrimReply {
            trimmed: count(0, "trimmed")?,
            remaining: count(1, "remaining")?,
            unlisted: count(2, "unlisted")?,
        })
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use redis::Value;

    use super::{DeadTrim, DeadTrimReply};
    use crate::keys::QueueKeys;
    use crate::scripts::raw_cmd;

    /// An expired dead letter (`old`) and, behind it, a stale entry (`waits`:
    /// its hash says `queued` and it waits in main, a hand edit or an older
    /// bug) are trimmed by age. One dead letter is deleted: the reply, and
    /// the stats counter the watchdog reports, say 1 trimmed; the stale
    /// entry is only unlisted (its job keeps waiting), counted apart. Before,
    /// every entry taken off the list counted as trimmed: 2 dead letters
    /// "deleted" for one.
    #[tokio::test]
    async fn only_deleted_dead_letters_count_as_trimmed() {
        let (_server, mut conn) = crate::scripts::test_redis().await;
        let keys = QueueKeys::new("scripts-dead-trim");
        for (id, state) in [("waits", "queued"), ("old", "dead")] {
            let job = keys.job(id);
            raw_cmd(
                &mut conn,
                &["HSET", &job, "id", id, "state", state, "dead_at", "1"],
            )
            .await;
            raw_cmd(&mut conn, &["LPUSH", &keys.dead, id]).await;
        }
        raw_cmd(&mut conn, &["LPUSH", &keys.main, "waits"]).await;
        tokio::time::sleep(Duration::from_millis(5)).await;
        let reply = DeadTrim {
            keys: &keys,
            max_len: 0,
            retention: Duration::from_millis(1),
            limit: 10,
        }
        .run(&mut conn)
        .await
        .unwrap();
        assert_eq!(
            reply,
            DeadTrimReply {
                trimmed: 1,
                remaining: 0,
                unlisted: 1,
            }
        );
        let trimmed = raw_cmd(&mut conn, &["HGET", &keys.stats, "trimmed"]).await;
        assert_eq!(trimmed, Value::BulkString(b"1".to_vec()));
        assert_eq!(
            raw_cmd(&mut conn, &["EXISTS", &keys.job("old")]).await,
            Value::Int(0),
            "the dead letter is deleted"
        );
        assert_eq!(
            raw_cmd(&mut conn, &["LRANGE", &keys.main, "0", "-1"]).await,
            Value::Array(vec![Value::BulkString(b"waits".to_vec())]),
            "the stale entry's job keeps waiting"
        );
    }
}
