//! `extend.lua`: the heartbeat. Pushes the lease forward only while the
//! delivery's token matches (DESIGN rule 3).

use std::time::Duration;

use super::reply::Fields;
use super::{lua_script, LuaScript};
use crate::conn::RedisConnection;
use crate::error::Result;
use crate::job::JobId;
use crate::keys::QueueKeys;

pub(crate) static SCRIPT: LuaScript<3> =
    lua_script!("extend.lua", keys = 3, args = 3, prelude(super::DRAIN));

/// Extends one delivery's lease.
pub(crate) struct Extend<'a> {
    pub(crate) keys: &'a QueueKeys,
    pub(crate) id: &'a JobId,
    pub(crate) token: &'a str,
    pub(crate) lease: Duration,
}

/// What the extend did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ExtendReply {
    /// The lease now ends at `lease_until_ms` (Redis clock);
    /// `cancel_requested`: an operator asked to cancel the job.
    Extended {
        lease_until_ms: i64,
        cancel_requested: bool,
    },
    /// The token no longer matches: the job was reclaimed.
    LeaseLost,
}

impl Extend<'_> {
    /// Runs the script.
    pub(crate) async fn run(&self, conn: &mut RedisConnection) -> Result<ExtendReply> {
        let (k, id) = (self.keys, self.id.as_str());
        let reply = SCRIPT
            .call([k.leases.clone(), k.job(id), k.limits()])
            .arg(id)
            .arg(self.token)
            .arg(super::ms(self.lease))
            .run(conn, &k.queue, Some(self.id))
            .await?;
        let f = Fields::new(&k.queue, Some(self.id), "extend reply", &reply)?;
        Ok(match f.int(0, "lease_until")? {
            0 => ExtendReply::LeaseLost,
            until => ExtendReply::Extended {
                lease_until_ms: until,
                cancel_requested: f.int(1, "cancel requested")? == 1,
            },
        })
    }
}
