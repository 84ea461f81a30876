//! `set_limits.lua`: writes or clears fields of a queue's limits hash
//! (docs/LIMITS.md), validated in the script before any write; a change of a
//! rate key's limits releases the jobs deferred under the old ones.

use super::reply::Fields;
use super::{lua_script, LuaScript};
use crate::conn::RedisConnection;
use crate::error::Result;
use crate::keys::QueueKeys;

pub(crate) static SCRIPT: LuaScript<4> =
    lua_script!("set_limits.lua", keys = 4, args = 2, prelude(super::DRAIN));

/// A change of a queue's limits.
pub(crate) enum SetLimits<'a> {
    /// Sets each field to its value ("": clears it).
    Fields(&'a [(String, String)]),
    /// Drops every limit of the queue.
    ClearAll,
    /// Goes on with the releases of deferred jobs still pending.
    Release,
    /// Releases the deferred jobs of one rate key (`None`: of every key).
    ReleaseDeferred(Option<&'a str>),
}

/// What one call did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SetLimitsReply {
    /// Fields left in the limits hash.
    pub(crate) fields: u64,
    /// Deferred jobs made due now (released).
    pub(crate) released: u64,
    /// Rate keys whose release is not finished (more than one call's share).
    pub(crate) pending: u64,
}

impl SetLimits<'_> {
    /// Runs the script once.
    pub(crate) async fn run(
        &self,
        keys: &QueueKeys,
        conn: &mut RedisConnection,
    ) -> Result<SetLimitsReply> {
        let limits = keys.limits();
        // `guard` (never written): the script reaches keys it does not
        // declare (the release indexes, job hashes); on a migrating slot it
        // is refused with TRYAGAIN instead of stopping half-way
        // (docs/SCALE-OUT.md, "Live resharding").
        let mut call = SCRIPT.call([
            limits.as_str(),
            keys.delayed.as_str(),
            keys.wake.as_str(),
            keys.guard.as_str(),
        ]);
        let mode = match self {
            SetLimits::Fields(_) => "set",
            SetLimits::ClearAll => "clear_all",
            SetLimits::Release => "release",
            SetLimits::ReleaseDeferred(Some(_)) => "release_key",
            SetLimits::ReleaseDeferred(None) => "release_all",
        };
        call = call.arg(mode).arg(&keys.job_prefix);
        match self {
            SetLimits::Fields(fields) => {
                for (name, value) in fields.iter() {
                    call = call.repeated_arg(name).repeated_arg(value);
                }
            }
            SetLimits::ReleaseDeferred(Some(key)) => call = call.repeated_arg(*key),
            _ => {}
        }
        let reply = call.run(conn, &keys.queue, None).await?;
        let f = Fields::new(&keys.queue, None, "set_limits reply", &reply)?;
        Ok(SetLimitsReply {
            fields: f.u64(0, "fields")?,
            released: f.u64(1, "released")?,
            pending: f.u64(2, "pending")?,
        })
    }

    /// Runs the script, then goes on with the releases it left pending
    /// until none is left; the total of jobs released. It ends: a release
    /// only takes jobs deferred before its change, and each call makes jobs
    /// due or finishes a key.
    pub(crate) async fn run_to_end(
        &self,
        keys: &QueueKeys,
        conn: &mut RedisConnection,
    ) -> Result<SetLimitsReply> {
        let mut reply = self.run(keys, conn).await?;
        while reply.pending > 0 {
            let more = SetLimits::Release.run(keys, conn).await?;
            reply.released += more.released;
            reply.pending = more.pending;
        }
        Ok(reply)
    }
}
