//! `relay_apply.lua`: the cross-queue relay's first step, on the batches'
//! queue: applies notices written by members on other queues to the
//! batches there, in order, once each (docs/WORKFLOWS.md, "Relay").

use super::reply;
use super::{lua_script, LuaScript};
use crate::conn::RedisConnection;
use crate::error::{QueueError, Result};
use crate::keys::QueueKeys;

pub(crate) static SCRIPT: LuaScript<2> =
    lua_script!("relay_apply.lua", keys = 2, args = 0, prelude(super::DRAIN));

/// Applies notices to batches homed on one queue.
pub(crate) struct RelayApply<'a> {
    /// The batches' queue.
    pub(crate) keys: &'a QueueKeys,
    /// The notices, oldest first, as read from the members' relay list.
    pub(crate) notices: &'a [Vec<u8>],
}

/// What applying one notice did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Applied {
    /// Applied by this call.
    Now,
    /// Applied before (a crash between apply and remove, or another relayer).
    Already,
    /// The batch does not exist (expired, deleted).
    NoBatch,
    /// The batch is corrupt: a key of another type, or a count the notice
    /// changes that is not an integer (the batch's `count_error` names it).
    /// Not counted and not marked applied.
    Corrupt,
    /// The notice is unreadable or names another queue's batch.
    Unreadable,
    /// The notice has no seq (0: its queue's `relay:seq` was corrupt when it
    /// was written). Never taken for "already applied": it is set aside,
    /// and `relay_retry.lua` gives it a seq once `relay:seq` is repaired.
    NoSeq,
}

/// The reply: one outcome per notice, and whether applying wrote notices
/// into the batches' queue's own relay list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RelayApplyReply {
    pub(crate) outcomes: Vec<Applied>,
    pub(crate) noted: bool,
}

impl RelayApply<'_> {
    pub(crate) async fn run(&self, conn: &mut RedisConnection) -> Result<RelayApplyReply> {
        let k = self.keys;
        let mut call = SCRIPT.call([&k.stats, &k.guard]);
        for n in self.notices {
            call = call.repeated_arg(n);
        }
        let reply = call.run(conn, &k.queue, None).await?;
        self.decode(&reply)
    }

    fn decode(&self, reply: &redis::Value) -> Result<RelayApplyReply> {
        let queue = &self.keys.queue;
        let bad = |detail: String| QueueError::protocol(queue, None, detail);
        let codes = reply::array(reply)
            .ok_or_else(|| bad(format!("relay_apply reply is not an array: {reply:?}")))?;
        if codes.len() != self.notices.len() + 1 {
            return Err(bad(format!(
                "relay_apply reply has {} codes for {} notices",
                codes.len(),
                self.notices.len()
            )));
        }
        let mut outcomes = Vec::with_capacity(self.notices.len());
        for code in &codes[..self.notices.len()] {
            outcomes.push(
                match reply::integer(queue, None, "relay_apply reply", code)? {
                    1 => Applied::Now,
                    2 => Applied::Already,
                    0 => Applied::NoBatch,
                    3 => Applied::Corrupt,
                    4 => Applied::Unreadable,
                    5 => Applied::NoSeq,
                    n => return Err(bad(format!("relay_apply reply: unknown code {n}"))),
                },
            );
        }
        let noted =
            reply::integer(queue, None, "relay_apply flag", &codes[self.notices.len()])? == 1;
        Ok(RelayApplyReply { outcomes, noted })
    }
}
