//! `lock_extend.lua`: renews a user lock's TTL, only for its owner.

use std::time::Duration;

use redis::RedisResult;

use super::{lua_script, LuaScript};
use crate::conn::RedisConnection;

pub(crate) static SCRIPT: LuaScript<1> =
    lua_script!("lock_extend.lua", keys = 1, args = 2, plain(super::DRAIN));

/// Renews one lock.
pub(crate) struct LockExtend<'a> {
    /// The lock key (`LockKeys::lock`).
    pub(crate) key: &'a str,
    pub(crate) token: &'a str,
    pub(crate) ttl: Duration,
}

impl LockExtend<'_> {
    /// Runs the script: true when extended, false when the caller no longer
    /// owns the lock.
    pub(crate) async fn run(&self, conn: &mut RedisConnection) -> RedisResult<bool> {
        let reply = SCRIPT
            .call([self.key])
            .arg(self.token)
            .arg(super::ms(self.ttl))
            .invoke(conn)
            .await?;
        Ok(redis::from_redis_value::<i64>(reply)? == 1)
    }
}
