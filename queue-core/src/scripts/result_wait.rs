//! `result_wait.lua`: the check a producer makes before it blocks for a
//! job's outcome (`Queue::wait_result`, docs/RESULTS.md): the completion
//! record, the dead-letter reason, or — atomically with the check — the
//! `notify` flag that makes the finishing script wake it. A callback of a
//! sealed batch not created yet (the queue's pending hash names it) counts
//! the waiter in its batch hash; the fire moves the count to the job.

use std::collections::BTreeMap;

use redis::Value;

use super::reply::{self, Fields};
use super::{lua_script, LuaScript};
use crate::conn::RedisConnection;
use crate::error::Result;
use crate::job::JobId;
use crate::keys::QueueKeys;

pub(crate) static SCRIPT: LuaScript<5> =
    lua_script!("result_wait.lua", keys = 5, args = 3, prelude(None));

/// Checks job `id` and registers a waiter when it has not finished.
pub(crate) struct ResultWait<'a> {
    pub(crate) keys: &'a QueueKeys,
    pub(crate) id: &'a JobId,
    /// This check follows a wake taken from `q:{Q}:notify:<id>`: on an
    /// outcome, the script pushes one wake back for the next waiter (the
    /// finishing script pushes at most 100).
    pub(crate) woken: bool,
    /// The caller's last check answered [`WaitState::Pending`]: it is
    /// counted on the batch hash already (a re-check after a `BLPOP` that
    /// timed out does not count it again), and once the job or its record
    /// exists a pending entry left by a batch no longer sealed is dropped.
    pub(crate) was_pending: bool,
}

/// Where the job stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum WaitState {
    /// The completion record, field → raw value.
    Finished(BTreeMap<String, Vec<u8>>),
    /// Dead-lettered, with its reason (bytes that are not UTF-8 replaced by
    /// U+FFFD: it may quote a corrupt field's raw value).
    Dead(String),
    /// No hash and no record.
    Unknown,
    /// Not finished: this waiter is registered (`notify` on the job hash).
    Waiting,
    /// A callback of a sealed batch not created yet: this waiter is counted
    /// on the batch hash (`notify:<id>`). A batch fired by an older
    /// queue-core version (rolling deploy) creates the job without moving
    /// the count, so the caller re-checks every few seconds.
    Pending,
}

impl ResultWait<'_> {
    /// Runs the script.
    pub(crate) async fn run(&self, conn: &mut RedisConnection) -> Result<WaitState> {
        let (k, id) = (self.keys, self.id.as_str());
        let reply = SCRIPT
            .call([
                k.job(id),
                k.done(id),
                k.notify(id),
                k.pending(),
                k.guard.clone(),
            ])
            .arg(if self.woken { "1" } else { "0" })
            .arg(id)
            .arg(if self.was_pending { "1" } else { "0" })
            .run(conn, &k.queue, Some(self.id))
            .await?;
        let f = Fields::new(&k.queue, Some(self.id), "result_wait reply", &reply)?;
        Ok(match f.tag()?.as_str() {
            "finished" => {
                let items = reply::array(&reply).unwrap_or_default();
                let mut record = BTreeMap::new();
                for pair in items[1..].chunks(2) {
                    let [name, value] = pair else {
                        return Err(f.error("odd number of record fields"));
                    };
                    let name = reply::text(name).ok_or_else(|| f.error("field name"))?;
                    let value: &Value = value;
                    record.insert(name, reply::bytes(value).unwrap_or_default());
                }
                WaitState::Finished(record)
            }
            // The reason quotes what the dead-lettering script found (a
            // corrupt field's raw bytes): read lossily, the producer still
            // gets the dead answer (it was a protocol error).
            "dead" => {
                WaitState::Dead(String::from_utf8_lossy(&f.bytes(1, "dead_reason")?).into_owned())
            }
            "unknown" => WaitState::Unknown,
            "waiting" if f.text(1, "wait state")? == "pending" => WaitState::Pending,
            "waiting" => WaitState::Waiting,
            other => return Err(f.error(format_args!("unknown wait state {other:?}"))),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Scenario: a job was dead-lettered because a field of its hash was
    /// corrupt, and the reason quotes the field's raw bytes (not UTF-8). A
    /// producer waiting for its outcome gets the dead answer, the bytes
    /// that are not UTF-8 replaced. Before, it got a protocol error
    /// ("field 1 (dead_reason) missing or malformed").
    #[tokio::test]
    async fn a_dead_reason_that_is_not_utf8_still_answers_dead() {
        let (_server, mut conn) = super::super::test_redis().await;
        let keys = QueueKeys::new("q");
        let id = JobId::from("j1");
        let reason = b"corrupt field attempts: '\xff\xfe1'";
        redis::cmd("HSET")
            .arg(keys.job(id.as_str()))
            .arg("state")
            .arg("dead")
            .arg("dead_reason")
            .arg(&reason[..])
            .query_async::<()>(&mut conn)
            .await
            .unwrap();
        let state = ResultWait {
            keys: &keys,
            id: &id,
            woken: false,
            was_pending: false,
        }
        .run(&mut conn)
        .await
        .unwrap();
        assert_eq!(
            state,
            WaitState::Dead("corrupt field attempts: '\u{fffd}\u{fffd}1'".into())
        );
    }
}
