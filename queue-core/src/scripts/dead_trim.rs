//! `dead_trim.lua`: keeps the dead-letter list bounded. Each watchdog pass
//! trims it from the oldest end beyond a maximum length or a retention,
//! deleting the trimmed jobs' hashes and step results, a bounded number of
//! ids per pass.

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
    /// Ids trimmed at most by this call.
    pub(crate) limit: usize,
}

/// What the script did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct DeadTrimReply {
    /// Dead letters deleted.
    pub(crate) trimmed: u64,
    /// Length of the dead list afterwards.
    pub(crate) remaining: u64,
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
        })
    }
}
