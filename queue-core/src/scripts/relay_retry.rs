//! `relay_retry.lua`: an operator's retry of the cross-queue relay notices
//! that could not be applied: moves them from the members' queue's
//! dead-notice list back to its relay list, without their reason line
//! (`Queue::relay_retry_dead`); a notice without a seq (written while the
//! queue's `relay:seq` was corrupt) gets a fresh one.

use super::reply::Fields;
use super::{lua_script, LuaScript};
use crate::conn::RedisConnection;
use crate::error::Result;
use crate::keys::QueueKeys;

pub(crate) static SCRIPT: LuaScript<3> =
    lua_script!("relay_retry.lua", keys = 3, args = 2, prelude(super::DRAIN));

/// Moves up to `limit` dead notices of one queue back to its relay list,
/// oldest first, leaving the `skip` oldest entries.
pub(crate) struct RelayRetry<'a> {
    /// The members' queue (the relay list's).
    pub(crate) keys: &'a QueueKeys,
    /// Entries examined by this call at most.
    pub(crate) limit: u64,
    /// Entries left at the list's oldest end (kept by an earlier call).
    pub(crate) skip: u64,
}

/// What one call did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct RelayRetryReply {
    /// Notices moved back to the relay list.
    pub(crate) moved: u64,
    /// Entries examined and left in the dead-notice list (no readable
    /// notice, or one without a seq while `relay:seq` is still corrupt).
    pub(crate) kept: u64,
    /// Entries of the dead-notice list not examined yet (newer ones).
    pub(crate) left: u64,
}

impl RelayRetry<'_> {
    pub(crate) async fn run(&self, conn: &mut RedisConnection) -> Result<RelayRetryReply> {
        let k = self.keys;
        let reply = SCRIPT
            .call([k.relay_dead(), k.relay(), k.relay_seq()])
            .arg(self.limit)
            .arg(self.skip)
            .run(conn, &k.queue, None)
            .await?;
        let f = Fields::new(&k.queue, None, "relay_retry reply", &reply)?;
        Ok(RelayRetryReply {
            moved: f.u64(0, "moved")?,
            kept: f.u64(1, "kept")?,
            left: f.u64(2, "left")?,
        })
    }
}
