//! `progress.lua`: stores `ctx.progress(n, message)` on the job hash, fenced
//! by the delivery's lease token, so a stale delivery cannot overwrite the
//! progress of a newer one (docs/RESULTS.md).

use super::reply;
use super::{lua_script, LuaScript};
use crate::conn::RedisConnection;
use crate::error::{QueueError, Result};
use crate::job::JobId;
use crate::keys::QueueKeys;

pub(crate) static SCRIPT: LuaScript<1> =
    lua_script!("progress.lua", keys = 1, args = 3, prelude(None));

/// Records the progress of one delivery.
pub(crate) struct Progress<'a> {
    pub(crate) keys: &'a QueueKeys,
    pub(crate) id: &'a JobId,
    /// The delivery's lease token.
    pub(crate) token: &'a str,
    /// Progress so far (the handler's unit: percent, items, bytes...).
    pub(crate) done: u64,
    /// A short message (kept up to 1024 bytes, cut at a UTF-8 character
    /// boundary).
    pub(crate) message: &'a str,
}

impl Progress<'_> {
    /// Runs the script: `true` when stored, `false` when the delivery no
    /// longer owns the job (nothing written).
    pub(crate) async fn run(&self, conn: &mut RedisConnection) -> Result<bool> {
        let (k, id) = (self.keys, self.id.as_str());
        let reply = SCRIPT
            .call([k.job(id)])
            .arg(self.token)
            .arg(self.done)
            .arg(self.message)
            .run(conn, &k.queue, Some(self.id))
            .await?;
        match reply::integer(&k.queue, Some(self.id), "progress reply", &reply)? {
            1 => Ok(true),
            0 => Ok(false),
            other => Err(QueueError::protocol(
                &k.queue,
                Some(self.id),
                format!("progress reply {other}"),
            )),
        }
    }
}
