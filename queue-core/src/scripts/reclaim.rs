//! `reclaim.lua`: one batch of a watchdog pass. Returns jobs whose lease
//! expired (jittered backoff) or dead-letters them when attempts are
//! exhausted, and gives a provisional lease to unleased ids in processing
//! (the BLMOVE → claim window, DESIGN rule 4).

use std::time::Duration;

use super::reply::Fields;
use super::{lua_script, LuaScript};
use crate::backoff::Backoff;
use crate::conn::RedisConnection;
use crate::error::Result;
use crate::keys::QueueKeys;

pub(crate) static SCRIPT: LuaScript<7> =
    lua_script!("reclaim.lua", keys = 7, args = 7, prelude(super::DRAIN));

/// One reclaim batch of one queue.
pub(crate) struct Reclaim<'a> {
    pub(crate) keys: &'a QueueKeys,
    /// Expired leases handled by this call.
    pub(crate) batch: usize,
    /// Provisional lease of an unleased id.
    pub(crate) orphan_grace: Duration,
    /// Backoff before a reclaimed job runs again.
    pub(crate) backoff: &'a Backoff,
    /// Seeds the script's jitter.
    pub(crate) seed: u32,
    /// Oldest processing entries checked for a lease.
    pub(crate) orphan_scan: usize,
}

/// What the batch did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ReclaimReply {
    pub(crate) reclaimed: u64,
    pub(crate) dead_lettered: u64,
    pub(crate) adopted: u64,
}

impl<'a> Reclaim<'a> {
    /// The reclaim the script-level tests run: 100 expired leases a call,
    /// 30 s orphan grace, a short fixed backoff.
    #[cfg(test)]
    pub(crate) fn for_tests(keys: &'a QueueKeys) -> Self {
        static BACKOFF: Backoff = Backoff {
            base: Duration::from_millis(10),
            max: Duration::from_millis(100),
        };
        Reclaim {
            keys,
            batch: 100,
            orphan_grace: Duration::from_secs(30),
            backoff: &BACKOFF,
            seed: 7,
            orphan_scan: 100,
        }
    }
}

impl Reclaim<'_> {
    /// Runs the script.
    pub(crate) async fn run(&self, conn: &mut RedisConnection) -> Result<ReclaimReply> {
        let k = self.keys;
        let reply = SCRIPT
            .call([
                &k.processing,
                &k.leases,
                &k.delayed,
                &k.dead,
                &k.stats,
                &k.guard,
                &k.wake,
            ])
            .arg(&k.job_prefix)
            .arg(self.batch)
            .arg(super::ms(self.orphan_grace))
            .arg(super::ms(self.backoff.base))
            .arg(super::ms(self.backoff.max))
            .arg(self.seed)
            .arg(self.orphan_scan)
            .run(conn, &k.queue, None)
            .await?;
        // {reclaimed, dead_lettered, adopted}
        let f = Fields::new(&k.queue, None, "reclaim reply", &reply)?;
        Ok(ReclaimReply {
            reclaimed: f.u64(0, "reclaimed")?,
            dead_lettered: f.u64(1, "dead_lettered")?,
            adopted: f.u64(2, "adopted")?,
        })
    }
}
