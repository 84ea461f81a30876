//! `pause.lua`: sets a queue's pause flag (the Redis time of the pause),
//! unless it is already set. Its reply is decoded into [`PauseChange`], which
//! `resume.lua` shares.

use super::reply::Fields;
use super::{lua_script, LuaScript};
use crate::conn::RedisConnection;
use crate::error::Result;
use crate::flow::PauseChange;
use crate::keys::QueueKeys;

pub(crate) static SCRIPT: LuaScript<1> =
    lua_script!("pause.lua", keys = 1, args = 0, prelude(super::DRAIN));

/// Pauses one queue.
pub(crate) struct Pause<'a> {
    pub(crate) keys: &'a QueueKeys,
}

impl Pause<'_> {
    /// Runs the script.
    pub(crate) async fn run(&self, conn: &mut RedisConnection) -> Result<PauseChange> {
        let k = self.keys;
        let reply = SCRIPT.call([k.paused()]).run(conn, &k.queue, None).await?;
        decode(k, "pause reply", &reply)
    }
}

/// `{was paused (1|0), paused since ms (0: was not paused)}`, the reply of
/// `pause.lua` and `resume.lua`.
pub(crate) fn decode(
    k: &QueueKeys,
    what: &'static str,
    reply: &redis::Value,
) -> Result<PauseChange> {
    let f = Fields::new(&k.queue, None, what, reply)?;
    let since = f.int(1, "paused since")?;
    Ok(PauseChange {
        queue: k.queue.clone(),
        was_paused: f.int(0, "was paused")? == 1,
        paused_since_ms: (since > 0).then_some(since),
    })
}
