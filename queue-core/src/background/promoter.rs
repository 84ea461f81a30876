//! The promoter: moves due retries and delayed jobs from the delayed set to
//! main (`promote.lua`). A worker runs [`run`] every `promote_interval`; the
//! watchdog calls [`promote_all_due`] at the end of each pass. Each call is
//! one script, so any number of workers and watchdogs can promote at once
//! (DESIGN rule 1, docs/DESIGN.md).

use std::time::Duration;

use tokio::sync::watch;
use tracing::{debug, warn};

use crate::conn::RedisConnection;
use crate::error::Result;
use crate::keys::QueueKeys;
use crate::scripts::promote::Promote;

/// Ids moved per script call.
const BATCH: usize = 1000;

/// One script call: promotes at most [`BATCH`] due jobs of `keys`' queue.
async fn promote(conn: &mut RedisConnection, keys: &QueueKeys) -> Result<u64> {
    let reply = Promote { keys, limit: BATCH }.run(conn).await?;
    Ok(reply.promoted)
}

/// Promotes every due job of the queue, [`BATCH`] per script call.
pub(crate) async fn promote_all_due(conn: &mut RedisConnection, keys: &QueueKeys) -> Result<u64> {
    let mut total = 0;
    loop {
        let n = promote(conn, keys).await?;
        total += n;
        if n < BATCH as u64 {
            return Ok(total);
        }
    }
}

/// Moves due jobs to main for every queue, one script call per queue every
/// `every`, until `stop` turns true. Errors are logged and retried.
pub(crate) async fn run(
    mut conn: RedisConnection,
    queues: Vec<QueueKeys>,
    every: Duration,
    mut stop: watch::Receiver<bool>,
) {
    loop {
        if *stop.borrow() {
            return;
        }
        for keys in &queues {
            match promote(&mut conn, keys).await {
                Ok(n) if n > 0 => {
                    debug!(queue = %keys.queue, promoted = n, "due delayed jobs moved to main")
                }
                Ok(_) => {}
                Err(e) => warn!(queue = %keys.queue, error = %e, "promote failed; will retry"),
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(every) => {}
            _ = stop.changed() => {}
        }
    }
}
