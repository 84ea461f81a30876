//! `lock_release.lua`: deletes a user lock, only for its owner.

use redis::RedisResult;

use super::{lua_script, LuaScript};
use crate::conn::RedisConnection;

pub(crate) static SCRIPT: LuaScript<1> =
    lua_script!("lock_release.lua", keys = 1, args = 1, plain(super::DRAIN));

/// Releases one lock.
pub(crate) struct LockRelease<'a> {
    /// The lock key (`LockKeys::lock`).
    pub(crate) key: &'a str,
    pub(crate) token: &'a str,
}

impl LockRelease<'_> {
    /// Runs the script: true when released, false when the caller no longer
    /// owned the lock.
    pub(crate) async fn run(&self, conn: &mut RedisConnection) -> RedisResult<bool> {
        let reply = SCRIPT.call([self.key]).arg(self.token).invoke(conn).await?;
        Ok(redis::from_redis_value::<i64>(reply)? == 1)
    }
}
