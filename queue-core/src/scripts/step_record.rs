//! `step_record.lua`: stores one `ctx.step` result, fenced by the delivery's
//! lease token and always with a TTL, so a stale worker can neither write
//! under a newer delivery nor recreate the results of a finished job.

use std::time::Duration;

use super::reply;
use super::{lua_script, LuaScript};
use crate::conn::RedisConnection;
use crate::error::Result;
use crate::job::JobId;
use crate::keys::QueueKeys;

pub(crate) static SCRIPT: LuaScript<2> =
    lua_script!("step_record.lua", keys = 2, args = 4, prelude(None));

/// How long step results live while their job has not finished (the ack
/// then sets the completion retention; dead-letter trimming deletes them).
pub(crate) const STEP_TTL: Duration = Duration::from_secs(7 * 24 * 3600);

/// Records step `name` of one delivery.
pub(crate) struct StepRecord<'a> {
    pub(crate) keys: &'a QueueKeys,
    pub(crate) id: &'a JobId,
    /// The delivery's lease token.
    pub(crate) token: &'a str,
    pub(crate) name: &'a str,
    /// The MessagePack result.
    pub(crate) value: &'a [u8],
    pub(crate) ttl: Duration,
}

/// What the script did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum StepReply {
    /// Stored, with the TTL.
    Stored,
    /// The job is not active under this token: nothing written.
    LeaseLost,
}

impl StepRecord<'_> {
    /// Runs the script.
    pub(crate) async fn run(&self, conn: &mut RedisConnection) -> Result<StepReply> {
        let (k, id) = (self.keys, self.id.as_str());
        let reply = SCRIPT
            .call([k.job(id), k.steps(id)])
            .arg(self.token)
            .arg(self.name)
            .arg(self.value)
            .arg(super::ms(self.ttl).max(1))
            .run(conn, &k.queue, Some(self.id))
            .await?;
        match reply::integer(&k.queue, Some(self.id), "step_record reply", &reply)? {
            1 => Ok(StepReply::Stored),
            0 => Ok(StepReply::LeaseLost),
            other => Err(crate::QueueError::protocol(
                &k.queue,
                Some(self.id),
                format!("step_record reply {other}"),
            )),
        }
    }
}
