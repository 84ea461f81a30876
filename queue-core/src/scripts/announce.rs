//! `announce.lua`: a worker's announcement of the `(job type, schema
//! version)` pairs it handles on one queue, with an expiry, in the queue's
//! versions hash ([`QueueKeys::versions`]). A worker that receives a payload
//! newer than its handler reads it (`defer.lua`) to decide whether to leave
//! the job for an upgraded worker (docs/RELIABILITY.md, "Rolling deploys").
//!
//! [`QueueKeys::versions`]: crate::QueueKeys::versions

use std::time::Duration;

use super::reply;
use super::{lua_script, LuaScript};
use crate::conn::RedisConnection;
use crate::error::Result;
use crate::keys::QueueKeys;

pub(crate) static SCRIPT: LuaScript<1> =
    lua_script!("announce.lua", keys = 1, args = 1, prelude(super::DRAIN));

/// The field of the versions hash for `job_type` at `version`.
pub(crate) fn field(job_type: &str, version: u32) -> String {
    format!("{job_type}:{version}")
}

/// Announces `fields` (see [`field`]) on one queue for `ttl`.
pub(crate) struct Announce<'a> {
    pub(crate) keys: &'a QueueKeys,
    pub(crate) fields: &'a [String],
    pub(crate) ttl: Duration,
}

impl Announce<'_> {
    /// Runs the script; the number of expired fields it removed.
    pub(crate) async fn run(&self, conn: &mut RedisConnection) -> Result<i64> {
        let k = self.keys;
        let mut call = SCRIPT.call([k.versions()]).arg(super::ms(self.ttl));
        for f in self.fields {
            call = call.repeated_arg(f);
        }
        let reply = call.run(conn, &k.queue, None).await?;
        reply::integer(&k.queue, None, "announce reply", &reply)
    }
}
