//! `limits_read.lua`: a queue's limits hash and how much of the queue-level
//! limits is in use, read in one step (docs/LIMITS.md).

use super::reply::{self, Fields};
use super::{lua_script, LuaScript};
use crate::conn::RedisConnection;
use crate::error::Result;
use crate::keys::QueueKeys;

pub(crate) static SCRIPT: LuaScript<3> = lua_script!(
    "limits_read.lua",
    keys = 3,
    args = 0,
    prelude(super::READ_ONLY)
);

/// The decoded reply.
pub(crate) struct LimitsReply {
    /// The limits hash, name → value.
    pub(crate) fields: Vec<(String, String)>,
    /// Live leases: jobs running now.
    pub(crate) running: u64,
    /// Starts within the queue's rate window (0 without a queue rate).
    pub(crate) started_in_window: u64,
}

/// Reads one queue's limits.
pub(crate) async fn read(keys: &QueueKeys, conn: &mut RedisConnection) -> Result<LimitsReply> {
    let reply = SCRIPT
        .call([keys.limits(), keys.leases.clone(), keys.guard.clone()])
        .run(conn, &keys.queue, None)
        .await?;
    let f = Fields::new(&keys.queue, None, "limits reply", &reply)?;
    let flat = reply::array(&reply)
        .and_then(|items| items.first().and_then(reply::array))
        .unwrap_or_default();
    let fields = flat
        .chunks(2)
        .filter_map(|pair| Some((reply::text(pair.first()?)?, reply::text(pair.get(1)?)?)))
        .collect();
    Ok(LimitsReply {
        fields,
        running: f.u64(1, "running")?,
        started_in_window: f.u64(2, "started in window")?,
    })
}
