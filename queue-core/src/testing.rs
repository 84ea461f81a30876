//! The state-transition scripts, callable one by one by tests (cargo feature
//! `failpoints` only; hidden, not a public API): the model-based test
//! (`tests/tests/model.rs`) drives a real redis-server through exactly the
//! calls a worker and the watchdog make, in any order, including the ones a
//! crash or a lost reply produces (a `LMOVE` with no claim, a retried claim).

use std::time::Duration;

use crate::backoff::Backoff;
use crate::conn::RedisConnection;
use crate::error::Result;
use crate::job::JobId;
use crate::keys::QueueKeys;
use crate::scripts::ack::{Ack, AckItem, AckReply};
use crate::scripts::claim::{Claim, ClaimRow};
use crate::scripts::extend::{Extend, ExtendReply};
use crate::scripts::fail::{Fail, FailKind, FailReply};
use crate::scripts::fetch::Fetch;
use crate::scripts::promote::Promote;
use crate::scripts::reclaim::Reclaim;

/// One row of a fetch or claim.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Claimed {
    /// Claimed: run it under `token`; `attempt` is 1 on the first delivery.
    Claimed {
        /// Job id.
        id: JobId,
        /// Lease token of the delivery.
        token: String,
        /// Attempt number.
        attempt: u32,
    },
    /// A completion record existed: acked without running.
    Done(JobId),
    /// The hash was missing: dead-lettered.
    Missing(JobId),
    /// Another delivery owns the job.
    Busy(JobId),
    /// Not in processing any more (claim only).
    Gone(JobId),
    /// The queue is paused: the id went back to main, unclaimed (claim only).
    Paused(JobId),
    /// The worker was shutting down: the id went back to main, unclaimed
    /// (claim only).
    Stopping(JobId),
    /// A queue limit held it: the id went back to main, unclaimed (claim only).
    Limited(JobId),
    /// Its rate key was over its limit: delayed, unclaimed (docs/LIMITS.md).
    Deferred(JobId),
    /// The job's data was corrupt: dead-lettered with this reason.
    Corrupt(JobId, String),
    /// Not started before its deadline: dead-lettered as expired.
    Expired(JobId),
    /// A row that did not decode (the id, when it could be read).
    Unreadable(Option<JobId>, String),
}

impl From<ClaimRow> for Claimed {
    fn from(row: ClaimRow) -> Self {
        use crate::scripts::claim::Skip;
        match row {
            ClaimRow::Claimed(d) => Claimed::Claimed {
                id: d.id,
                token: d.token,
                attempt: d.attempt,
            },
            ClaimRow::Skipped(id, Skip::Done) => Claimed::Done(id),
            ClaimRow::Skipped(id, Skip::Missing) => Claimed::Missing(id),
            ClaimRow::Skipped(id, Skip::Busy) => Claimed::Busy(id),
            ClaimRow::Skipped(id, Skip::Gone) => Claimed::Gone(id),
            ClaimRow::Skipped(id, Skip::Paused) => Claimed::Paused(id),
            // NoSlot is the fetcher's name for the same hand-back (never a script's).
            ClaimRow::Skipped(id, Skip::Stopping | Skip::NoSlot) => Claimed::Stopping(id),
            ClaimRow::Skipped(id, Skip::Limited(_)) => Claimed::Limited(id),
            ClaimRow::Skipped(id, Skip::Deferred) => Claimed::Deferred(id),
            ClaimRow::Skipped(id, Skip::Expired) => Claimed::Expired(id),
            ClaimRow::Corrupt(id, reason) => Claimed::Corrupt(id, reason),
            ClaimRow::Unreadable(u) => Claimed::Unreadable(u.id, u.detail),
        }
    }
}

/// What a failed attempt did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Failed {
    /// Back in the delayed set.
    Retry,
    /// Dead-lettered with this reason.
    Dead(String),
    /// The token did not match.
    LeaseLost,
    /// An operator asked to cancel the job: nothing written (the worker ends
    /// it with `finish_cancel.lua`).
    CancelRequested,
}

/// `fetch.lua`: LMOVE and claim up to `count` jobs.
pub async fn fetch(
    conn: &mut RedisConnection,
    queue: &str,
    lease: Duration,
    token_base: &str,
    count: usize,
) -> Result<Vec<Claimed>> {
    fetch_as(conn, queue, lease, token_base, count, false).await
}

/// [`fetch`] as a worker sends the first try of a freshly drawn token base
/// (the script may skip reading the receipt where the connection allows it).
pub async fn fetch_first_try(
    conn: &mut RedisConnection,
    queue: &str,
    lease: Duration,
    token_base: &str,
    count: usize,
) -> Result<Vec<Claimed>> {
    fetch_as(conn, queue, lease, token_base, count, true).await
}

async fn fetch_as(
    conn: &mut RedisConnection,
    queue: &str,
    lease: Duration,
    token_base: &str,
    count: usize,
    first_try: bool,
) -> Result<Vec<Claimed>> {
    let keys = QueueKeys::new(queue);
    let rows = Fetch {
        keys: &keys,
        lease,
        token_base,
        count,
        first_try,
    }
    .run(conn)
    .await?;
    Ok(rows.into_iter().map(Claimed::from).collect())
}

/// `claim.lua`: the claim after a BLMOVE.
pub async fn claim(
    conn: &mut RedisConnection,
    queue: &str,
    id: &str,
    lease: Duration,
    token: &str,
) -> Result<Claimed> {
    let keys = QueueKeys::new(queue);
    let row = Claim {
        keys: &keys,
        id: id.as_bytes(),
        lease,
        token,
    }
    .run(conn)
    .await?;
    Ok(row.into())
}

/// What an ack answered for its delivery.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Acked {
    /// Acknowledged by this call.
    Completed,
    /// Already acknowledged by this same token (a retry after a lost reply).
    AlreadyCompleted,
    /// The token did not match.
    LeaseLost,
    /// The job key is not a hash: nothing written.
    Unreadable,
}

/// `ack.lua` for one delivery (no completion-record retention when
/// `retention` is zero).
pub async fn ack(
    conn: &mut RedisConnection,
    queue: &str,
    id: &str,
    token: &str,
    retention: Duration,
) -> Result<Acked> {
    let keys = QueueKeys::new(queue);
    // No claimed fields: the script reads the record's from the job hash.
    let items = [AckItem {
        id: JobId::from(id),
        token: token.to_string(),
        result_ref: None,
        claimed: None,
        far_from_tail: false,
    }];
    let reply = Ack {
        keys: &keys,
        worker: "",
        items: &items,
        retention,
        compact: false,
    }
    .run(conn)
    .await?;
    Ok(match reply.first() {
        Some(AckReply::Completed) => Acked::Completed,
        Some(AckReply::AlreadyCompleted) => Acked::AlreadyCompleted,
        Some(AckReply::Unreadable) => Acked::Unreadable,
        Some(AckReply::LeaseLost) | None => Acked::LeaseLost,
    })
}

/// `fail.lua`: a retryable (`retry`) or permanent failure.
pub async fn fail(
    conn: &mut RedisConnection,
    queue: &str,
    id: &str,
    token: &str,
    retry: bool,
    delay: Duration,
) -> Result<Failed> {
    let keys = QueueKeys::new(queue);
    let id = JobId::from(id);
    let reply = Fail {
        keys: &keys,
        id: &id,
        token,
        kind: if retry {
            FailKind::Retry
        } else {
            FailKind::Permanent
        },
        message: "model failure",
        delay,
        far_from_tail: false,
    }
    .run(conn)
    .await?;
    Ok(match reply {
        FailReply::Retry { .. } => Failed::Retry,
        FailReply::Dead { reason } => Failed::Dead(reason),
        FailReply::LeaseLost => Failed::LeaseLost,
        FailReply::CancelRequested => Failed::CancelRequested,
    })
}

/// `extend.lua`: true when extended, false when the lease was lost.
pub async fn extend(
    conn: &mut RedisConnection,
    queue: &str,
    id: &str,
    token: &str,
    lease: Duration,
) -> Result<bool> {
    let keys = QueueKeys::new(queue);
    let id = JobId::from(id);
    let reply = Extend {
        keys: &keys,
        id: &id,
        token,
        lease,
    }
    .run(conn)
    .await?;
    Ok(matches!(reply, ExtendReply::Extended { .. }))
}

/// `reclaim.lua`, one batch: `(reclaimed, dead_lettered, adopted)`.
pub async fn reclaim(
    conn: &mut RedisConnection,
    queue: &str,
    orphan_grace: Duration,
    backoff: Backoff,
) -> Result<(u64, u64, u64)> {
    let keys = QueueKeys::new(queue);
    let r = Reclaim {
        keys: &keys,
        batch: 1000,
        orphan_grace,
        backoff: &backoff,
        seed: 7,
        orphan_scan: 1000,
    }
    .run(conn)
    .await?;
    Ok((r.reclaimed, r.dead_lettered, r.adopted))
}

/// `promote.lua`: due delayed jobs to main; the number moved.
pub async fn promote(conn: &mut RedisConnection, queue: &str) -> Result<u64> {
    let keys = QueueKeys::new(queue);
    Ok(Promote {
        keys: &keys,
        limit: 1000,
    }
    .run(conn)
    .await?
    .promoted)
}
