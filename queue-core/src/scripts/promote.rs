//! `promote.lua`: moves due delayed jobs (retries, scheduled jobs, watchdog
//! returns) to main; a missing hash is dead-lettered, never dropped.

use super::reply;
use super::{lua_script, LuaScript};
use crate::conn::RedisConnection;
use crate::error::{QueueError, Result};
use crate::keys::QueueKeys;

pub(crate) static SCRIPT: LuaScript<5> =
    lua_script!("promote.lua", keys = 5, args = 2, prelude(super::DRAIN));

/// Promotes at most `limit` due jobs of one queue.
pub(crate) struct Promote<'a> {
    pub(crate) keys: &'a QueueKeys,
    pub(crate) limit: usize,
}

/// What the script did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PromoteReply {
    /// Ids taken from the delayed set (moved to main or dead-lettered).
    pub(crate) promoted: u64,
}

impl Promote<'_> {
    /// Runs the script.
    pub(crate) async fn run(&self, conn: &mut RedisConnection) -> Result<PromoteReply> {
        let k = self.keys;
        let reply = SCRIPT
            .call([&k.delayed, &k.main, &k.dead, &k.stats, &k.guard])
            .arg(&k.job_prefix)
            .arg(self.limit)
            .run(conn, &k.queue, None)
            .await?;
        let n = reply::integer(&k.queue, None, "promote reply", &reply)?;
        let promoted = u64::try_from(n).map_err(|_| {
            QueueError::protocol(&k.queue, None, format!("promote reply: negative count {n}"))
        })?;
        Ok(PromoteReply { promoted })
    }
}
