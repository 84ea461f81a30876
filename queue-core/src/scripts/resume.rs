//! `resume.lua`: drops a queue's pause flag; the reply says whether it was
//! paused and since when.

use super::{lua_script, LuaScript};
use crate::conn::RedisConnection;
use crate::error::Result;
use crate::flow::PauseChange;
use crate::keys::QueueKeys;

pub(crate) static SCRIPT: LuaScript<1> =
    lua_script!("resume.lua", keys = 1, args = 0, prelude(super::DRAIN));

/// Resumes one queue.
pub(crate) struct Resume<'a> {
    pub(crate) keys: &'a QueueKeys,
}

impl Resume<'_> {
    /// Runs the script.
    pub(crate) async fn run(&self, conn: &mut RedisConnection) -> Result<PauseChange> {
        let k = self.keys;
        let reply = SCRIPT.call([k.paused()]).run(conn, &k.queue, None).await?;
        super::pause::decode(k, "resume reply", &reply)
    }
}
