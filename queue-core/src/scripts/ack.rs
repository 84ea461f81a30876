//! `ack.lua`: success. Drops the job from processing and leases, writes the
//! completion record and drops the hash, only while the delivery's lease
//! token still matches (DESIGN rule 3).

use std::time::Duration;

use super::reply;
use super::{lua_script, LuaScript};
use crate::conn::RedisConnection;
use crate::error::Result;
use crate::job::JobId;
use crate::keys::QueueKeys;

pub(crate) static SCRIPT: LuaScript<6> =
    lua_script!("ack.lua", keys = 6, args = 5, prelude(super::DRAIN));

/// Acknowledges one delivery.
pub(crate) struct Ack<'a> {
    pub(crate) keys: &'a QueueKeys,
    pub(crate) id: &'a JobId,
    pub(crate) token: &'a str,
    /// How long the completion record is kept (zero: none).
    pub(crate) retention: Duration,
    /// The handler's result reference, stored in the completion record.
    pub(crate) result_ref: Option<&'a str>,
}

/// What the ack did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AckReply {
    Completed,
    /// The token no longer matches: the job was reclaimed.
    LeaseLost,
}

impl Ack<'_> {
    /// Runs the script.
    pub(crate) async fn run(&self, conn: &mut RedisConnection) -> Result<AckReply> {
        let (k, id) = (self.keys, self.id.as_str());
        let reply = SCRIPT
            .call([
                k.processing.clone(),
                k.leases.clone(),
                k.job(id),
                k.done(id),
                k.stats.clone(),
                k.steps(id),
            ])
            .arg(id)
            .arg(self.token)
            .arg(self.retention.as_millis() as u64)
            .arg(self.result_ref.unwrap_or_default())
            .arg(&k.tput_prefix)
            .run(conn, &k.queue, Some(self.id))
            .await?;
        Ok(
            match reply::flag(&k.queue, Some(self.id), "ack reply", &reply)? {
                true => AckReply::Completed,
                false => AckReply::LeaseLost,
            },
        )
    }
}
