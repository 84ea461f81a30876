//! The promoter: moves due retries and delayed jobs from the delayed set to
//! main (`promote.lua`). A worker runs [`run`] per queue; the watchdog calls
//! [`promote_all_due`] at the end of each pass. Each call is one script, so
//! any number of workers and watchdogs can promote at once (DESIGN rule 1,
//! docs/DESIGN.md).
//!
//! No polling: `promote.lua` answers how long until the earliest remaining
//! job is due, and the promoter blocks that long (at most `max_sleep`) in
//! `BLPOP` on the queue's wake list (`QueueKeys::wake`). Every script that
//! adds a job sooner than the head of the delayed set (enqueue, fail,
//! reclaim) pushes to that list, which wakes one promoter in any process to
//! recompute its sleep. A lost wake-up (the woken worker dies, a producer
//! that does not declare the wake key) costs at most `max_sleep`.
//!
//! The same loop refreshes the worker's announcement of the payload versions
//! it handles on this queue (`announce.lua`, rolling deploys), at least every
//! quarter of the announcement's lifetime.

use std::time::Duration;

use tokio::sync::watch;
use tracing::{debug, warn};

use crate::conn::RedisConnection;
use crate::error::{QueueError, Result};
use crate::keys::QueueKeys;
use crate::scripts::announce::Announce;
use crate::scripts::promote::{Promote, PromoteReply};

/// Ids moved per script call.
const BATCH: usize = 1000;

/// One script call: promotes at most [`BATCH`] due jobs of `keys`' queue.
async fn promote(conn: &mut RedisConnection, keys: &QueueKeys) -> Result<PromoteReply> {
    Promote { keys, limit: BATCH }.run(conn).await
}

/// Promotes every due job of the queue, [`BATCH`] per script call.
pub(crate) async fn promote_all_due(conn: &mut RedisConnection, keys: &QueueKeys) -> Result<u64> {
    let mut total = 0;
    loop {
        let reply = promote(conn, keys).await?;
        total += reply.promoted;
        if reply.taken() < BATCH as u64 {
            return Ok(total);
        }
    }
}

/// The `type:version` fields a worker announces for one queue (rolling
/// deploys: a newer payload waits while some live worker announces it).
#[derive(Clone)]
pub(crate) struct Announcement {
    /// The queue's versions-hash fields (`type:version`).
    pub(crate) fields: Vec<String>,
    /// How long one announcement lasts.
    pub(crate) ttl: Duration,
}

impl Announcement {
    /// Announces the fields; an error is logged (the next refresh retries).
    async fn refresh(&self, conn: &mut RedisConnection, keys: &QueueKeys) {
        let announce = Announce {
            keys,
            fields: &self.fields,
            ttl: self.ttl,
        };
        if let Err(e) = announce.run(conn).await {
            warn!(queue = %keys.queue, error = %e, "announcing handled versions failed; will retry");
        }
    }
}

/// Blocks on the queue's wake list for `wait` (a wake-up from a writer of
/// the delayed set ends it sooner). `BLPOP` with a timeout of 0 would block
/// forever, so the wait is at least one millisecond.
async fn wait_for_wake(
    blocking: &mut RedisConnection,
    keys: &QueueKeys,
    wait: Duration,
) -> Result<()> {
    let secs = wait.max(Duration::from_millis(1)).as_secs_f64();
    let _woken: Option<(String, String)> = redis::cmd("BLPOP")
        .arg(&keys.wake)
        .arg(format!("{secs:.3}"))
        .query_async(blocking)
        .await
        .map_err(|e| QueueError::redis(&keys.queue, None, e))?;
    Ok(())
}

/// Moves due jobs of one queue to main until `stop` turns true: a script
/// call, then a wait until the next job is due or a wake-up comes, never
/// longer than `max_sleep`. `conn` runs the scripts; `blocking` is this
/// promoter's own connection for `BLPOP` (its response timeout must exceed
/// `max_sleep`). Errors are logged and retried after `max_sleep`.
pub(crate) async fn run(
    mut conn: RedisConnection,
    mut blocking: RedisConnection,
    keys: QueueKeys,
    max_sleep: Duration,
    announce: Announcement,
    mut stop: watch::Receiver<bool>,
) {
    // Refreshed well before it expires, whatever the promoter's sleeps.
    let refresh_every = announce.ttl / 4;
    let max_sleep = max_sleep.min(refresh_every.max(Duration::from_millis(1)));
    let mut announced: Option<tokio::time::Instant> = None;
    loop {
        if super::stop_requested(&stop) {
            return;
        }
        if announced.is_none_or(|at| at.elapsed() >= refresh_every) {
            announce.refresh(&mut conn, &keys).await;
            announced = Some(tokio::time::Instant::now());
        }
        let next_due_in = match promote(&mut conn, &keys).await {
            Ok(reply) => {
                if reply.promoted > 0 {
                    debug!(queue = %keys.queue, promoted = reply.promoted, "due delayed jobs moved to main");
                }
                reply.next_due_in
            }
            Err(e) => {
                warn!(queue = %keys.queue, error = %e, "promote failed; will retry");
                None
            }
        };
        if next_due_in == Some(Duration::ZERO) {
            continue; // more jobs are due than one batch took
        }
        // A zero `max_sleep` still waits the 1 ms floor of `wait_for_wake`.
        let wait = next_due_in.map_or(max_sleep, |d| d.min(max_sleep));
        tokio::select! {
            r = wait_for_wake(&mut blocking, &keys, wait) => {
                if let Err(e) = r {
                    warn!(queue = %keys.queue, error = %e, "promoter wait failed; will retry");
                    tokio::select! {
                        _ = tokio::time::sleep(max_sleep) => {}
                        _ = stop.changed() => {}
                    }
                }
            }
            _ = stop.changed() => {}
        }
    }
}
