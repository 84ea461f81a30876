//! `group_pause.lua`: pauses or resumes one group of a queue (the group's
//! field in `q:{Q}:gpaused`, docs/GROUPS.md); a resume puts the group back in
//! the ring while it has waiting jobs. The reply is decoded into a
//! [`PauseChange`] like a queue pause's.

use super::{lua_script, LuaScript};
use crate::conn::RedisConnection;
use crate::error::Result;
use crate::flow::PauseChange;
use crate::keys::QueueKeys;

pub(crate) static SCRIPT: LuaScript<3> =
    lua_script!("group_pause.lua", keys = 3, args = 2, prelude(super::DRAIN));

/// Pauses (`pause: true`) or resumes one group.
pub(crate) struct GroupPause<'a> {
    pub(crate) keys: &'a QueueKeys,
    pub(crate) group: &'a str,
    pub(crate) pause: bool,
}

impl GroupPause<'_> {
    /// Runs the script.
    pub(crate) async fn run(&self, conn: &mut RedisConnection) -> Result<PauseChange> {
        let k = self.keys;
        let mode = if self.pause { "pause" } else { "resume" };
        let reply = SCRIPT
            .call([k.groups_paused(), k.groups(), k.group(self.group)])
            .arg(self.group)
            .arg(mode)
            .run(conn, &k.queue, None)
            .await?;
        super::pause::decode(k, "group pause reply", &reply)
    }
}
