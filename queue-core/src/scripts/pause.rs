//! `pause.lua`: sets a queue's pause flag (the Redis time of the pause),
//! unless it is already set. Its reply is decoded into [`PauseChange`], which
//! `resume.lua` shares.

use super::reply::Fields;
use super::{lua_script, LuaScript};
use crate::conn::RedisConnection;
use crate::error::Result;
use crate::flow::PauseChange;
use crate::keys::QueueKeys;

pub(crate) static SCRIPT: LuaScript<1> =
    lua_script!("pause.lua", keys = 1, args = 0, prelude(super::DRAIN));

/// Pauses one queue.
pub(crate) struct Pause<'a> {
    pub(crate) keys: &'a QueueKeys,
}

impl Pause<'_> {
    /// Runs the script.
    pub(crate) async fn run(&self, conn: &mut RedisConnection) -> Result<PauseChange> {
        let k = self.keys;
        let reply = SCRIPT.call([k.paused()]).run(conn, &k.queue, None).await?;
        decode(k, "pause reply", &reply)
    }
}

/// `{was paused (1|0), paused since ms (0: was not paused)}`, the reply of
/// `pause.lua` and `resume.lua`.
pub(crate) fn decode(
    k: &QueueKeys,
    what: &'static str,
    reply: &redis::Value,
) -> Result<PauseChange> {
    let f = Fields::new(&k.queue, None, what, reply)?;
    let since = f.int(1, "paused since")?;
    Ok(PauseChange {
        queue: k.queue.clone(),
        was_paused: f.int(0, "was paused")? == 1,
        paused_since_ms: (since > 0).then_some(since),
    })
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use redis::AsyncCommands;

    use super::Pause;
    use crate::keys::QueueKeys;
    use crate::scripts::claim::{Claim, ClaimRow, Skip};
    use crate::scripts::enqueue::Enqueue;
    use crate::scripts::fetch::{Fetch, FetchReply};

    /// A BLMOVE that took an id while the queue was paused (here: an LMOVE,
    /// and a provisional lease from the watchdog meanwhile): the claim puts
    /// it back at the tail of main, unclaimed, lease dropped, no attempt.
    #[tokio::test]
    async fn a_claim_while_paused_puts_the_id_back_unclaimed() {
        let (_server, mut conn) = crate::scripts::test_redis().await;
        let keys = QueueKeys::new("scripts-pause");
        for id in ["first", "second"] {
            Enqueue::test_job(&keys, &id.into(), 3)
                .run(&mut conn)
                .await
                .unwrap();
        }
        let moved: String = conn
            .lmove(
                &keys.main,
                &keys.processing,
                redis::Direction::Right,
                redis::Direction::Left,
            )
            .await
            .unwrap();
        assert_eq!(moved, "first");
        let _: () = conn.zadd(&keys.leases, &moved, 1).await.unwrap();
        let change = Pause { keys: &keys }.run(&mut conn).await.unwrap();
        assert!(!change.was_paused && change.paused_since_ms.is_some());

        let claim = Claim {
            keys: &keys,
            id: moved.as_bytes(),
            lease: Duration::from_secs(30),
            token: "tok",
        };
        assert_eq!(
            claim.run(&mut conn).await.unwrap(),
            ClaimRow::Skipped("first".into(), Skip::Paused)
        );
        let main: Vec<String> = conn.lrange(&keys.main, 0, -1).await.unwrap();
        assert_eq!(main, ["second", "first"], "back at the tail: runs first");
        let processing: u64 = conn.llen(&keys.processing).await.unwrap();
        let leases: u64 = conn.zcard(&keys.leases).await.unwrap();
        assert_eq!((processing, leases), (0, 0));
        let attempts: Option<u32> = conn.hget(keys.job("first"), "attempts").await.unwrap();
        assert_eq!(attempts, Some(0));

        let fetch = Fetch {
            keys: &keys,
            lease: Duration::from_secs(30),
            token_base: "tok",
            count: 5,
            first_try: false,
        };
        assert_eq!(
            fetch.run_or_paused(&mut conn).await.unwrap(),
            FetchReply::Paused
        );
        assert_eq!(conn.llen::<_, u64>(&keys.main).await.unwrap(), 2);
    }
}
