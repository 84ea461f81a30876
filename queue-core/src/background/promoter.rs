//! The promoter: moves due retries and delayed jobs from the delayed set to
//! main (`promote.lua`). A worker runs [`run`] every `promote_interval`; the
//! watchdog calls [`promote_all_due`] at the end of each pass. Each call is
//! one script, so any number of workers and watchdogs can promote at once
//! (DESIGN rule 1, docs/DESIGN.md). The same tick refreshes the worker's
//! announcement of the payload versions it handles (`announce.lua`, rolling
//! deploys).

use std::time::Duration;

use tokio::sync::watch;
use tracing::{debug, warn};

use crate::conn::RedisConnection;
use crate::error::Result;
use crate::keys::QueueKeys;
use crate::scripts::announce::Announce;
use crate::scripts::promote::Promote;

/// The `(job type, version)` fields a worker announces per queue on every
/// tick, each lasting `ttl`.
pub(crate) struct Announcements {
    /// Per queue, its versions-hash fields (`type:version`).
    pub(crate) fields: Vec<(QueueKeys, Vec<String>)>,
    /// How long one announcement lasts.
    pub(crate) ttl: Duration,
}

impl Announcements {
    /// Announces every queue's fields; errors are logged (the next tick retries).
    async fn refresh(&self, conn: &mut RedisConnection) {
        for (keys, fields) in &self.fields {
            let announce = Announce {
                keys,
                fields,
                ttl: self.ttl,
            };
            if let Err(e) = announce.run(conn).await {
                warn!(queue = %keys.queue, error = %e, "announcing handled versions failed; will retry");
            }
        }
    }
}

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
/// `every`, until `stop` turns true, first refreshing `announce`. Errors are
/// logged and retried.
pub(crate) async fn run(
    mut conn: RedisConnection,
    queues: Vec<QueueKeys>,
    every: Duration,
    announce: Announcements,
    mut stop: watch::Receiver<bool>,
) {
    loop {
        if *stop.borrow() {
            return;
        }
        announce.refresh(&mut conn).await;
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
