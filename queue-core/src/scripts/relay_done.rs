//! `relay_done.lua`: the cross-queue relay's second step, on the members'
//! queue: removes the notices that were applied, and moves those that could
//! not be applied to the dead-notice list (kept visible, with the reason).

use super::reply::Fields;
use super::{lua_script, LuaScript};
use crate::conn::RedisConnection;
use crate::error::Result;
use crate::keys::QueueKeys;

pub(crate) static SCRIPT: LuaScript<3> =
    lua_script!("relay_done.lua", keys = 3, args = 0, prelude(super::DRAIN));

/// The reason that drops a notice instead of setting it aside: its batch
/// is gone (expired or deleted), as a member on the batch's own queue whose
/// batch is gone is skipped.
pub(crate) const DROPPED: &str = "-";

/// Ends notices of one queue's relay list.
pub(crate) struct RelayDone<'a> {
    /// The members' queue (the relay list's).
    pub(crate) keys: &'a QueueKeys,
    /// (notice, `None` when applied, [`DROPPED`] when its batch is gone, or
    /// the reason it cannot be applied).
    pub(crate) notices: &'a [(Vec<u8>, Option<String>)],
}

/// How many notices this call removed, and how many of those it moved to
/// the dead-notice list (a notice another relayer already removed counts in
/// neither); how many it left in the relay list because the dead-notice
/// list holds another type (corrupt data); how many it dropped (their
/// batch is gone).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct RelayDoneReply {
    pub(crate) removed: u64,
    pub(crate) dead: u64,
    pub(crate) kept: u64,
    pub(crate) dropped: u64,
}

impl RelayDone<'_> {
    pub(crate) async fn run(&self, conn: &mut RedisConnection) -> Result<RelayDoneReply> {
        let k = self.keys;
        let mut call = SCRIPT.call([k.relay(), k.relay_dead(), k.stats.clone()]);
        for (notice, reason) in self.notices {
            call = call
                .repeated_arg(notice)
                .repeated_arg(reason.as_deref().unwrap_or_default());
        }
        let reply = call.run(conn, &k.queue, None).await?;
        let f = Fields::new(&k.queue, None, "relay_done reply", &reply)?;
        Ok(RelayDoneReply {
            removed: f.u64(0, "removed")?,
            dead: f.u64(1, "dead")?,
            kept: f.u64(2, "kept")?,
            dropped: f.u64(3, "dropped")?,
        })
    }
}
