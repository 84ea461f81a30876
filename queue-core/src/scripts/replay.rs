//! `replay.lua`: returns a dead-lettered job to main (operator action),
//! keeping its previous dead-letter reason; its step results (kept without
//! a TTL while it was dead) get the live job's step TTL back. A member of a
//! batch on another queue gets a relay notice (unfinished), which the reply
//! reports ([`ReplayReply::ReplayedNoticed`]): the caller relays it at once.
//! A bulk replay names the dead-lettering it confirmed (its `dead_at`,
//! [`Replay::run_expecting`]): a job replayed and dead-lettered again since
//! is left alone ([`ReplayReply::Changed`]), as a bulk purge leaves it.

use super::reply;
use super::{lua_script, LuaScript};
use crate::conn::RedisConnection;
use crate::error::Result;
use crate::job::JobId;
use crate::keys::QueueKeys;

pub(crate) static SCRIPT: LuaScript<5> =
    lua_script!("replay.lua", keys = 5, args = 4, prelude(None));

/// Replays one dead-lettered job.
pub(crate) struct Replay<'a> {
    pub(crate) keys: &'a QueueKeys,
    pub(crate) id: &'a JobId,
    /// Restart the attempt count at 0.
    pub(crate) reset_attempts: bool,
}

/// What the script did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ReplayReply {
    /// Back in main.
    Replayed,
    /// Back in main, and a relay notice was written for a batch on another
    /// queue (the job is a member of it): relay the queue now, or the batch
    /// still counts the member as dead until the next relay run
    /// (docs/WORKFLOWS.md, "Relay").
    ReplayedNoticed,
    /// The id is not in the dead-letter list.
    NotDead,
    /// Dead-lettered, but not the dead-lettering expected (another
    /// `dead_at`: replayed and dead-lettered again since it was selected):
    /// nothing changed.
    Changed,
}

impl Replay<'_> {
    /// Runs the script: replays the job whichever dead-lettering it is
    /// (tests; callers go through [`Replay::run_expecting`]).
    #[cfg(test)]
    pub(crate) async fn run(&self, conn: &mut RedisConnection) -> Result<ReplayReply> {
        self.run_expecting(conn, None).await
    }

    /// Runs the script; with `expected_dead_at`, only while the job is
    /// still that dead-lettering ([`ReplayReply::Changed`] otherwise).
    pub(crate) async fn run_expecting(
        &self,
        conn: &mut RedisConnection,
        expected_dead_at: Option<&str>,
    ) -> Result<ReplayReply> {
        let (k, id) = (self.keys, self.id.as_str());
        let reply = SCRIPT
            .call([
                k.dead.clone(),
                k.main.clone(),
                k.job(id),
                k.stats.clone(),
                k.guard.clone(),
            ])
            .arg(id)
            .arg(if self.reset_attempts { "1" } else { "0" })
            // The step results, kept while the job was dead, expire again
            // as a live job's do.
            .arg(super::ms(super::step_record::STEP_TTL))
            .arg(expected_dead_at.unwrap_or(""))
            .run(conn, &k.queue, Some(self.id))
            .await?;
        match reply::integer(&k.queue, Some(self.id), "replay reply", &reply)? {
            1 => Ok(ReplayReply::Replayed),
            2 => Ok(ReplayReply::ReplayedNoticed),
            0 => Ok(ReplayReply::NotDead),
            -1 => Ok(ReplayReply::Changed),
            n => Err(crate::error::QueueError::protocol(
                &k.queue,
                Some(self.id),
                format!("replay reply: expected -1, 0, 1 or 2, got {n}"),
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::{Replay, ReplayReply};
    use crate::keys::QueueKeys;
    use crate::scripts::claim::ClaimRow;
    use crate::scripts::enqueue::{Enqueue, EnqueueReply};
    use crate::scripts::fail::{Fail, FailKind, FailReply};
    use crate::scripts::fetch::Fetch;
    use crate::state::JobState;

    /// Enqueue → fetch → permanent failure → replay, through the wrappers.
    #[tokio::test]
    async fn a_dead_job_is_replayed_once() {
        let (_server, mut conn) = crate::scripts::test_redis().await;
        let keys = QueueKeys::new("scripts-replay");
        let id = "job-1".into();
        let enqueue = Enqueue::test_job(&keys, &id, 3);
        assert!(matches!(
            enqueue.run(&mut conn).await.unwrap(),
            EnqueueReply::Created { .. }
        ));
        assert_eq!(
            enqueue.run(&mut conn).await.unwrap(),
            EnqueueReply::Exists {
                state: JobState::Queued
            }
        );
        let rows = Fetch {
            keys: &keys,
            lease: Duration::from_secs(30),
            token_base: "tok",
            count: 2,
            first_try: false,
        }
        .run(&mut conn)
        .await
        .unwrap();
        let [ClaimRow::Claimed(d)] = rows.as_slice() else {
            panic!("{rows:?}")
        };
        let fail = Fail {
            keys: &keys,
            id: &d.id,
            token: &d.token,
            kind: FailKind::Permanent,
            message: "bad",
            delay: Duration::ZERO,
            far_from_tail: false,
        };
        assert_eq!(
            fail.run(&mut conn).await.unwrap(),
            FailReply::Dead {
                reason: "bad".into()
            }
        );
        // The same fail again (a retry after a lost reply) gets the same
        // answer; a fail under any other token finds no lease.
        assert_eq!(
            fail.run(&mut conn).await.unwrap(),
            FailReply::Dead {
                reason: "bad".into()
            }
        );
        let stale = Fail {
            token: "another-token",
            ..fail
        };
        assert_eq!(stale.run(&mut conn).await.unwrap(), FailReply::LeaseLost);
        let replay = Replay {
            keys: &keys,
            id: &id,
            reset_attempts: true,
        };
        assert_eq!(replay.run(&mut conn).await.unwrap(), ReplayReply::Replayed);
        assert_eq!(replay.run(&mut conn).await.unwrap(), ReplayReply::NotDead);
    }

    /// A replay that names the dead-lettering it confirmed (its `dead_at`)
    /// while the job is another one (replayed and dead-lettered again
    /// since): `Changed`, the job left dead and listed, nothing written.
    /// An empty expectation is none (an older caller's).
    #[tokio::test]
    async fn a_replay_of_another_dead_lettering_than_the_expected_one_changes_nothing() {
        use crate::scripts::raw_cmd;
        use redis::Value;

        let (_server, mut conn) = crate::scripts::test_redis().await;
        let keys = QueueKeys::new("scripts-replay-changed");
        let id = "job-1".into();
        let job = keys.job("job-1");
        raw_cmd(
            &mut conn,
            &[
                "HSET", &job, "id", "job-1", "state", "dead", "dead_at", "200",
            ],
        )
        .await;
        raw_cmd(&mut conn, &["LPUSH", &keys.dead, "job-1"]).await;
        let replay = Replay {
            keys: &keys,
            id: &id,
            reset_attempts: false,
        };
        let before = raw_cmd(&mut conn, &["HGETALL", &job]).await;
        assert_eq!(
            replay.run_expecting(&mut conn, Some("100")).await.unwrap(),
            ReplayReply::Changed
        );
        assert_eq!(raw_cmd(&mut conn, &["HGETALL", &job]).await, before);
        assert_eq!(
            raw_cmd(&mut conn, &["LRANGE", &keys.dead, "0", "-1"]).await,
            Value::Array(vec![Value::BulkString(b"job-1".to_vec())])
        );
        assert_eq!(
            raw_cmd(&mut conn, &["LLEN", &keys.main]).await,
            Value::Int(0)
        );
        assert_eq!(
            replay.run_expecting(&mut conn, Some("")).await.unwrap(),
            ReplayReply::Replayed
        );
    }
}
