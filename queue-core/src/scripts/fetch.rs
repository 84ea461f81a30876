//! `fetch.lua`: the non-blocking fetch, `LMOVE main processing` and claim of
//! up to `count` jobs in one atomic step (no crash window, DESIGN rule 4).
//! Idempotent for its token base (a receipt kept for half a lease): a retry
//! whose first reply was lost gets the same deliveries. Its rows are decoded
//! one by one by [`ClaimRow::decode_or_unreadable`](super::claim::ClaimRow::decode_or_unreadable),
//! so one bad row never throws the batch away.

use std::time::Duration;

use super::claim::ClaimRow;
use super::reply;
use super::{lua_script, LuaScript};
use crate::conn::RedisConnection;
use crate::error::{QueueError, Result};
use crate::keys::QueueKeys;

pub(crate) static SCRIPT: LuaScript<7> =
    lua_script!("fetch.lua", keys = 7, args = 6, prelude(super::DRAIN));

/// Moves and claims up to `count` jobs of one queue.
pub(crate) struct Fetch<'a> {
    pub(crate) keys: &'a QueueKeys,
    pub(crate) lease: Duration,
    /// Each claimed job's token is `<token_base>:<n>` (DESIGN rule 3). A
    /// retry with the same base within half a lease answers the same rows.
    pub(crate) token_base: &'a str,
    pub(crate) count: usize,
}

impl Fetch<'_> {
    /// Runs the script; the rows in the order the jobs were taken. Only a
    /// reply that is not a list of rows is an error: each row is decoded on
    /// its own.
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
                &k.fetch_receipt(self.token_base),
            ])
            .arg(&k.job_prefix)
            .arg(&k.done_prefix)
            .arg(self.lease.as_millis() as u64)
            .arg(self.token_base)
            .arg(self.count)
            .arg((self.lease.as_millis() as u64 / 2).max(1))
            .run(conn, &k.queue, None)
            .await?;
        let rows = reply::array(&reply).ok_or_else(|| {
            QueueError::protocol(&k.queue, None, format!("fetch reply {reply:?}"))
        })?;
        Ok(rows
            .iter()
            .map(|r| ClaimRow::decode_or_unreadable(&k.queue, r).sent_at(sent_at))
            .collect())
    }
}
