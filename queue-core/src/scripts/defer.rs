//! `defer.lua`: a delivery whose payload schema version is newer than the
//! worker's handler, or whose type has no handler on the worker, is given back without using an attempt (delayed for a
//! short time, lease dropped, only while the token matches), or dead-lettered
//! once no live worker has announced that version for the configured wait
//! (docs/RELIABILITY.md, "Rolling deploys"). The given-back delivery is not
//! a start: its claim's `first_started_at` and rate-limit starts are dropped.

use std::time::Duration;

use super::fail::FailReply;
use super::{lua_script, LuaScript};
use crate::conn::RedisConnection;
use crate::error::Result;
use crate::job::JobId;
use crate::keys::QueueKeys;

pub(crate) static SCRIPT: LuaScript<10> =
    lua_script!("defer.lua", keys = 10, args = 6, prelude(super::DRAIN));

/// Gives back one delivery of a newer payload version.
pub(crate) struct Defer<'a> {
    pub(crate) keys: &'a QueueKeys,
    pub(crate) id: &'a JobId,
    pub(crate) token: &'a str,
    /// The payload's field in the versions hash (`type:version`).
    pub(crate) field: &'a str,
    /// How long the job stays in the delayed set before it is offered again.
    pub(crate) delay: Duration,
    /// How long no live worker may have announced the version before the
    /// job is dead-lettered.
    pub(crate) wait: Duration,
    /// The version this worker's handler knows, `None` when the worker has no
    /// handler for the job's type (for the dead-letter reason).
    pub(crate) known: Option<u32>,
}

impl<'a> Defer<'a> {
    /// For script tests: `d`'s version-2 payload (`t:2`) given back by a
    /// worker whose handler knows version 1, for a minute, waiting at most a
    /// minute for a worker that announces it (override with `..`).
    #[cfg(test)]
    pub(crate) fn test_v2(keys: &'a QueueKeys, d: &'a super::claim::Delivery) -> Self {
        Defer {
            keys,
            id: &d.id,
            token: &d.token,
            field: "t:2",
            delay: Duration::from_secs(60),
            wait: Duration::from_secs(60),
            known: Some(1),
        }
    }

    /// Runs the script. It answers like `fail.lua`: [`FailReply::Retry`]
    /// means back in the delayed set (here with the attempt given back),
    /// and `Dead`, `LeaseLost` and `CancelRequested` mean the same as there.
    pub(crate) async fn run(&self, conn: &mut RedisConnection) -> Result<FailReply> {
        let (k, id) = (self.keys, self.id.as_str());
        let reply = SCRIPT
            .call([
                k.processing.clone(),
                k.leases.clone(),
                k.job(id),
                k.delayed.clone(),
                k.dead.clone(),
                k.stats.clone(),
                k.versions(),
                k.wake.clone(),
                k.limits(),
                k.guard.clone(),
            ])
            .arg(id)
            .arg(self.token)
            .arg(self.field)
            .arg(super::ms(self.delay))
            .arg(super::ms(self.wait))
            // '' when the worker has no handler for the type.
            .arg(self.known.map(|v| v.to_string()).unwrap_or_default())
            .run(conn, &k.queue, Some(self.id))
            .await?;
        crate::workflow::relay::hint_if_marked(&k.queue, &reply, 2);
        FailReply::decode(&k.queue, self.id, &reply)
    }
}
