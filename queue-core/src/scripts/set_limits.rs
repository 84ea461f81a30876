//! `set_limits.lua`: writes or clears fields of a queue's limits hash
//! (docs/LIMITS.md), validated in the script before any write.

use super::reply;
use super::{lua_script, LuaScript};
use crate::conn::RedisConnection;
use crate::error::Result;
use crate::keys::QueueKeys;

pub(crate) static SCRIPT: LuaScript<1> =
    lua_script!("set_limits.lua", keys = 1, args = 1, prelude(super::DRAIN));

/// A change of a queue's limits.
pub(crate) enum SetLimits<'a> {
    /// Sets each field to its value ("": clears it).
    Fields(&'a [(String, String)]),
    /// Drops every limit of the queue.
    ClearAll,
}

impl SetLimits<'_> {
    /// Runs the script; the number of limit fields left.
    pub(crate) async fn run(&self, keys: &QueueKeys, conn: &mut RedisConnection) -> Result<u64> {
        let mut call = SCRIPT.call([keys.limits()]);
        match self {
            SetLimits::Fields(fields) => {
                call = call.arg("set");
                for (name, value) in fields.iter() {
                    call = call.repeated_arg(name).repeated_arg(value);
                }
            }
            SetLimits::ClearAll => call = call.arg("clear_all"),
        }
        let reply = call.run(conn, &keys.queue, None).await?;
        Ok(reply::integer(&keys.queue, None, "set_limits reply", &reply)?.max(0) as u64)
    }
}
