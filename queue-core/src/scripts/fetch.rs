//! `fetch.lua`: the non-blocking fetch, `LMOVE main processing` and claim of
//! up to `count` jobs in one atomic step (no crash window, DESIGN rule 4).
//! Idempotent for its token base (a receipt kept for half a lease, at least 11 s): a retry
//! whose first reply was lost gets the same deliveries. Its rows are decoded
//! one by one by [`ClaimRow::take_or_unreadable`](super::claim::ClaimRow::take_or_unreadable),
//! so one bad row never throws the batch away.

use std::time::Duration;

use redis::Value;

use super::claim::ClaimRow;
use super::reply;
use super::{lua_script, LuaScript};
use crate::conn::RedisConnection;
use crate::error::{QueueError, Result};
use crate::keys::QueueKeys;

pub(crate) static SCRIPT: LuaScript<11> =
    lua_script!("fetch.lua", keys = 11, args = 8, prelude(super::DRAIN));

/// Moves and claims up to `count` jobs of one queue.
pub(crate) struct Fetch<'a> {
    pub(crate) keys: &'a QueueKeys,
    pub(crate) lease: Duration,
    /// Each claimed job's token is `<token_base>:<n>` (DESIGN rule 3). A
    /// retry with the same base while its receipt lives answers the same rows.
    pub(crate) token_base: &'a str,
    pub(crate) count: usize,
    /// The first try of a fresh `token_base`: no receipt can exist yet, so
    /// the script does not read it (one call less). False for a retry, and
    /// whenever the base may have been used before. Not sent on a connection
    /// where a call may run after its resend, or twice (a cluster or
    /// Sentinel: `may_resend`).
    pub(crate) first_try: bool,
}

impl Fetch<'_> {
    /// Runs the script; the rows in the order the jobs were taken. Only a
    /// reply that is not a list of rows is an error: each row is decoded on
    /// its own.
    /// (none when the queue is paused: see [`run_or_paused`](Self::run_or_paused)).
    #[cfg(any(test, feature = "failpoints"))]
    pub(crate) async fn run(&self, conn: &mut RedisConnection) -> Result<Vec<ClaimRow>> {
        Ok(match self.run_or_paused(conn).await? {
            FetchReply::Rows(rows) => rows,
            FetchReply::Paused | FetchReply::Limited(_) => Vec::new(),
        })
    }

    /// Runs the script; [`FetchReply::Paused`] when the queue is paused.
    /// No worker name is written (see [`run_or_paused_as`](Self::run_or_paused_as)).
    #[cfg(any(test, feature = "failpoints"))]
    pub(crate) async fn run_or_paused(&self, conn: &mut RedisConnection) -> Result<FetchReply> {
        self.run_or_paused_as(conn, "").await
    }

    /// [`run_or_paused`](Self::run_or_paused) by the worker named `worker`:
    /// each claimed job's hash keeps it in its `worker` field ("": none).
    pub(crate) async fn run_or_paused_as(
        &self,
        conn: &mut RedisConnection,
        worker: &str,
    ) -> Result<FetchReply> {
        let k = self.keys;
        let sent_at = tokio::time::Instant::now();
        let reply = self.reply(conn, worker).await?;
        match reply::text(&reply).as_deref() {
            Some("paused") => return Ok(FetchReply::Paused),
            Some(t) if t.starts_with("limited:") => {
                return crate::limits::decode_wait(&k.queue, t).map(FetchReply::Limited)
            }
            _ => {}
        }
        let rows = reply::into_array(reply).map_err(|other| {
            QueueError::protocol(&k.queue, None, format!("fetch reply {other:?}"))
        })?;
        Ok(FetchReply::Rows(
            rows.into_iter()
                .map(|r| ClaimRow::take_or_unreadable(&k.queue, r).sent_at(sent_at))
                .collect(),
        ))
    }

    /// The script's reply as Redis sent it.
    pub(super) async fn reply(&self, conn: &mut RedisConnection, worker: &str) -> Result<Value> {
        let k = self.keys;
        SCRIPT
            .call([
                &k.main,
                &k.processing,
                &k.leases,
                &k.dead,
                &k.stats,
                &k.guard,
                &k.fetch_receipt(self.token_base),
                &k.paused(),
                &k.limits(),
                &k.delayed,
                &k.wake,
            ])
            .arg(&k.job_prefix)
            .arg(&k.done_prefix)
            .arg(super::ms(self.lease))
            .arg(self.token_base)
            .arg(self.count)
            .arg(super::ms(receipt_life(self.lease)).max(1))
            .arg(worker)
            .arg(if self.first_try && !conn.may_resend() {
                "1"
            } else {
                "0"
            })
            .run(conn, &k.queue, None)
            .await
    }
}

/// How long a fetch's receipt lives (half its lease, at least
/// [`RECEIPT_FLOOR`]): a retry with the same token base within it answers
/// the first try's rows. The fetcher's same-token retries end early enough
/// to reach Redis within it (`worker::fetcher::same_token_window`).
pub(crate) fn receipt_life(lease: Duration) -> Duration {
    (lease / 2).max(RECEIPT_FLOOR)
}

/// The shortest receipt life: two default response timeouts (5 s) and a
/// second, so that with the default timeout a fetch whose reply was lost is
/// retried for at least 6 s whatever the lease. Before, half a lease of 10 s
/// or less left no retry at all (`lease / 2 - response_timeout` was 0): the
/// first lost reply stranded every job of the fetch, each spending an
/// attempt unrun (stop 48 review). A receipt that outlives the lease is
/// harmless: a retry's rows are re-read from the jobs, and a job the
/// watchdog returned and another worker claimed answers `busy`
/// (`same_claim` checks the token).
pub(crate) const RECEIPT_FLOOR: Duration = Duration::from_secs(11);

/// What a fetch did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum FetchReply {
    /// The rows, in the order the jobs were taken (none: the queue is empty).
    Rows(Vec<ClaimRow>),
    /// The queue is paused: nothing was moved (docs/FLOW-CONTROL.md).
    Paused,
    /// A queue limit lets no job start for this long: nothing was moved
    /// (docs/LIMITS.md).
    Limited(Duration),
}
