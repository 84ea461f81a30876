//! `fetch.lua`: the non-blocking fetch, `LMOVE main processing` and claim of
//! up to `count` jobs in one atomic step (no crash window, DESIGN rule 4).
//! Its rows are decoded by [`ClaimRow::decode`](super::claim::ClaimRow::decode).

use std::time::Duration;

use super::claim::ClaimRow;
use super::reply;
use super::{lua_script, LuaScript};
use crate::conn::RedisConnection;
use crate::error::{QueueError, Result};
use crate::keys::QueueKeys;

pub(crate) static SCRIPT: LuaScript<6> =
    lua_script!("fetch.lua", keys = 6, args = 5, prelude(super::DRAIN));

/// Moves and claims up to `count` jobs of one queue.
pub(crate) struct Fetch<'a> {
    pub(crate) keys: &'a QueueKeys,
    pub(crate) lease: Duration,
    /// Each claimed job's token is `<token_base>:<n>` (DESIGN rule 3).
    pub(crate) token_base: &'a str,
    pub(crate) count: usize,
}

impl Fetch<'_> {
    /// Runs the script; the rows in the order the jobs were taken.
    pub(crate) async fn run(&self, conn: &mut RedisConnection) -> Result<Vec<ClaimRow>> {
        let k = self.keys;
        let sent_at = tokio::time::Instant::now();
        let reply = SCRIPT
            .call([
                &k.main,
                &k.processing,
                &k.leases,
                &k.dead,
                &k.stats,
                &k.guard,
            ])
            .arg(&k.job_prefix)
            .arg(&k.done_prefix)
            .arg(self.lease.as_millis() as u64)
            .arg(self.token_base)
            .arg(self.count)
            .run(conn, &k.queue, None)
            .await?;
        let rows = reply::array(&reply).ok_or_else(|| {
            QueueError::protocol(&k.queue, None, format!("fetch reply {reply:?}"))
        })?;
        rows.iter()
            .map(|r| ClaimRow::decode(&k.queue, r).map(|row| row.sent_at(sent_at)))
            .collect()
    }
}
