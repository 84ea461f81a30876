//! `stats.lua`: a consistent, read-only snapshot of one queue's lengths,
//! counters, oldest waiting job, recent completions and jobs waiting in
//! group lists (at most `group_limit` group lists read).

use std::collections::BTreeMap;

use redis::Value;

use super::reply::{array, int, text, Fields};
use super::{lua_script, LuaScript};
use crate::conn::RedisConnection;
use crate::error::Result;
use crate::keys::QueueKeys;

pub(crate) static SCRIPT: LuaScript<7> =
    lua_script!("stats.lua", keys = 7, args = 3, prelude(super::READ_ONLY));

/// Reads the snapshot of one queue.
pub(crate) struct Stats<'a> {
    pub(crate) keys: &'a QueueKeys,
    /// The most group lists the script reads (`LLEN` each): a queue's
    /// groups cost a call each, so the snapshot is O(groups) without it.
    pub(crate) group_limit: u64,
}

/// The snapshot, as the script returns it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct StatsReply {
    pub(crate) main: u64,
    pub(crate) processing: u64,
    pub(crate) delayed: u64,
    pub(crate) dead: u64,
    /// Lifetime counters (`enqueued`, `completed`, ...).
    pub(crate) counters: BTreeMap<String, i64>,
    /// Redis clock.
    pub(crate) now_ms: i64,
    /// Since when the oldest job waiting in main waits: its `ready_at`
    /// (promoted, replayed, repaired), else its `enqueued_at`; 0 if none.
    pub(crate) oldest_ready_ms: i64,
    pub(crate) completed_this_minute: u64,
    pub(crate) completed_previous_minute: u64,
    /// Redis time of the pause; 0 when the queue is not paused.
    pub(crate) paused_since_ms: i64,
    /// Jobs waiting in the groups' lists (those read).
    pub(crate) grouped: u64,
    /// Group keys of another type (corrupt data), left out of `grouped`.
    pub(crate) grouped_unreadable: u64,
    /// The group limit left groups unread: `grouped` is a lower bound.
    pub(crate) grouped_partial: bool,
}

impl Stats<'_> {
    /// Runs the script.
    pub(crate) async fn run(&self, conn: &mut RedisConnection) -> Result<StatsReply> {
        let k = self.keys;
        let reply = SCRIPT
            .call([
                &k.main,
                &k.processing,
                &k.delayed,
                &k.dead,
                &k.stats,
                &k.guard,
                &k.paused(),
            ])
            .arg(&k.job_prefix)
            .arg(&k.tput_prefix)
            .arg(self.group_limit)
            .run(conn, &k.queue, None)
            .await?;
        let f = Fields::new(&k.queue, None, "stats reply", &reply)?;
        let counters = f.field(4, "counters", counters)?;
        Ok(StatsReply {
            main: f.u64(0, "main")?,
            processing: f.u64(1, "processing")?,
            delayed: f.u64(2, "delayed")?,
            dead: f.u64(3, "dead")?,
            counters,
            now_ms: f.int(5, "now")?,
            oldest_ready_ms: f.int(6, "oldest")?,
            completed_this_minute: f.u64(7, "completed this minute")?,
            completed_previous_minute: f.u64(8, "completed previous minute")?,
            paused_since_ms: f.int(9, "paused since")?,
            grouped: f.u64(10, "grouped")?,
            grouped_unreadable: f.u64(11, "unreadable groups")?,
            grouped_partial: f.u64(12, "groups left unread")? != 0,
        })
    }
}

/// The counters of the stats hash (`HGETALL`: field, value, ...), leniently:
/// a field whose value is not an integer (corrupt data: `HSET q:{Q}:stats
/// dead x`) is left out, as a field name that is not UTF-8 is, instead of
/// failing the whole snapshot (and with it `stats`, the dashboard's overview
/// and a watchdog's gauges, for every queue). `check` reports it
/// (`bad_counter`). A reply that is neither an array nor a map is malformed (`None`).
fn counters(reply: &Value) -> Option<BTreeMap<String, i64>> {
    let counter = |field: &Value, value: &Value| Some((text(field)?, int(value)?));
    Some(match reply {
        Value::Map(pairs) => pairs.iter().filter_map(|(f, v)| counter(f, v)).collect(),
        other => array(other)?
            .chunks_exact(2)
            .filter_map(|pair| counter(&pair[0], &pair[1]))
            .collect(),
    })
}

#[cfg(test)]
mod tests {
    use super::Stats;
    use crate::keys::QueueKeys;
    use crate::scripts::enqueue::Enqueue;
    use crate::Queue;

    #[tokio::test]
    async fn the_typed_reply_matches_queue_stats() {
        let (_server, mut conn) = crate::scripts::test_redis().await;
        let keys = QueueKeys::new("scripts-stats");
        for id in ["a", "b"] {
            Enqueue {
                payload: b"x",
                ..Enqueue::test_job(&keys, &id.into(), 1)
            }
            .run(&mut conn)
            .await
            .unwrap();
        }
        let typed = Stats {
            keys: &keys,
            group_limit: crate::admin::STATS_GROUP_LIMIT,
        }
        .run(&mut conn)
        .await
        .unwrap();
        let stats = Queue::from_connection(conn)
            .stats(&keys.queue)
            .await
            .unwrap();
        assert_eq!(typed.main, 2);
        assert_eq!(
            (typed.main, typed.processing, typed.delayed, typed.dead),
            (stats.main, stats.processing, stats.delayed, stats.dead)
        );
        assert_eq!(typed.counters, stats.counters);
        assert_eq!(typed.counters.get("enqueued"), Some(&2));
        assert!(typed.oldest_ready_ms > 0 && typed.now_ms >= typed.oldest_ready_ms);
    }
}
