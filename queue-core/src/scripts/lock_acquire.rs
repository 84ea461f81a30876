//! `lock_acquire.lua`: takes a user lock (`SET NX PX`) and bumps its fencing
//! counter (which expires a day after the last acquisition and restarts
//! above any earlier value), in one script. Plain script (no prelude): it touches only the
//! lock's own keys.

use std::time::Duration;

use redis::{RedisResult, Value};

use super::{lua_script, LuaScript};
use crate::conn::RedisConnection;
use crate::keys::LockKeys;

pub(crate) static SCRIPT: LuaScript<2> =
    lua_script!("lock_acquire.lua", keys = 2, args = 3, plain(None));

/// The fencing counter lives at least this long after the last acquisition
/// (and at least the lock's TTL).
pub(crate) const FENCE_TTL: Duration = Duration::from_secs(24 * 3600);

/// One attempt to take a lock.
pub(crate) struct LockAcquire<'a> {
    pub(crate) keys: &'a LockKeys,
    /// The new owner's token.
    pub(crate) token: &'a str,
    pub(crate) ttl: Duration,
}

/// What the attempt did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LockAcquireReply {
    /// Taken, with a fencing number higher than any earlier acquisition.
    Acquired { fencing: u64 },
    /// Another owner holds it.
    Held,
    /// Not taken: the fencing counter is at the largest count Redis keeps
    /// (`i64::MAX`), so no number above the ones handed out is left.
    FencingExhausted,
}

impl LockAcquire<'_> {
    /// Runs the script. Errors stay `redis` errors: lock errors carry the
    /// lock name, not a queue.
    pub(crate) async fn run(&self, conn: &mut RedisConnection) -> RedisResult<LockAcquireReply> {
        let reply = SCRIPT
            .call([&self.keys.lock, &self.keys.fence])
            .arg(self.token)
            .arg(super::ms(self.ttl))
            .arg(super::ms(self.ttl.max(FENCE_TTL)))
            .invoke(conn)
            .await?;
        decode(reply)
    }
}

/// The script's answer: the fencing number as decimal text (a Lua number
/// would round it above 2^53) or, from an older script, an integer; `0`
/// held; `-1` no number left. Anything else is a type error naming the reply.
fn decode(reply: Value) -> RedisResult<LockAcquireReply> {
    // `reply::int` reads an integer sent as either (counts stop at
    // i64::MAX, INCR's largest).
    match super::reply::int(&reply) {
        Some(0) => Ok(LockAcquireReply::Held),
        Some(-1) => Ok(LockAcquireReply::FencingExhausted),
        Some(n) if n > 0 => Ok(LockAcquireReply::Acquired { fencing: n as u64 }),
        _ => Err(redis::RedisError::from((
            redis::ErrorKind::UnexpectedReturnType,
            "lock_acquire: not a fencing number",
            format!("{reply:?}"),
        ))),
    }
}
