//! `finish_cancel.lua`: ends a running job that an operator asked to cancel,
//! after its handler returned an error: completion record of status
//! `cancelled`, never retried or dead-lettered, only while the delivery's
//! token matches (DESIGN rule 3).

use std::time::Duration;

use super::reply;
use super::{lua_script, LuaScript};
use crate::conn::RedisConnection;
use crate::error::Result;
use crate::job::JobId;
use crate::keys::QueueKeys;

pub(crate) static SCRIPT: LuaScript<7> = lua_script!(
    "finish_cancel.lua",
    keys = 7,
    args = 5,
    prelude(super::DRAIN)
);

/// Ends one cancelled delivery.
pub(crate) struct FinishCancel<'a> {
    pub(crate) keys: &'a QueueKeys,
    pub(crate) id: &'a JobId,
    pub(crate) token: &'a str,
    /// How long the completion record is kept.
    pub(crate) retention: Duration,
    /// The handler's error, kept on the record (sent cut to
    /// [`MAX_ERROR_BYTES`](super::MAX_ERROR_BYTES)).
    pub(crate) message: &'a str,
    /// Claimed far from the tail of processing
    /// ([`Delivery::far_from_tail`](super::claim::Delivery::far_from_tail)).
    pub(crate) far_from_tail: bool,
}

impl FinishCancel<'_> {
    /// Runs the script: `true` when the job ended cancelled, `false` when the
    /// lease was lost.
    pub(crate) async fn run(&self, conn: &mut RedisConnection) -> Result<bool> {
        let (k, id) = (self.keys, self.id.as_str());
        let reply = SCRIPT
            .call([
                k.processing.clone(),
                k.leases.clone(),
                k.job(id),
                k.done(id),
                k.stats.clone(),
                k.steps(id),
                k.guard.clone(),
            ])
            .arg(id)
            .arg(self.token)
            .arg(super::ms(self.retention).max(1))
            .arg(&*super::cut_error(self.message))
            .arg(super::far_arg(self.far_from_tail))
            .run(conn, &k.queue, Some(self.id))
            .await?;
        reply::flag(&k.queue, Some(self.id), "finish_cancel reply", &reply)
    }
}
