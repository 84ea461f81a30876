//! The watchdog: returns jobs whose lease expired, dead-letters exhausted
//! ones, adopts unleased ids (BLMOVE→claim crash window), promotes due
//! delayed jobs and trims the dead-letter list (`dead_trim.lua`). Every pass is one script per queue, so any number of
//! watchdogs can run at once without duplicating a job (DESIGN rules 1 and 4,
//! docs/DESIGN.md). Each queue's pass is isolated: one that fails is logged
//! with its queue and counted, and the other queues still get theirs.

use std::future::Future;
use std::time::Duration;

use tracing::{debug, info, warn};

use crate::background::promoter::promote_all_due;
use crate::backoff::Backoff;
use crate::conn::{connect, ConnectionConfig, RedisConnection};
use crate::error::{QueueError, Result};
use crate::keys::QueueKeys;
use crate::scripts::dead_trim::DeadTrim;
use crate::scripts::reclaim::Reclaim;

/// Watchdog settings.
///
/// ```
/// let cfg = queue_core::WatchdogConfig::default();
/// assert_eq!(cfg.interval, std::time::Duration::from_secs(1));
/// ```
#[derive(Debug, Clone)]
pub struct WatchdogConfig {
    /// Time between passes.
    pub interval: Duration,
    /// Expired leases handled per script call (a pass loops until done).
    pub batch: usize,
    /// An id found in processing without a lease is treated as leased for this
    /// long from the moment the watchdog first sees it (DESIGN rule 4).
    pub orphan_grace: Duration,
    /// How many processing entries each reclaim call checks for a lease,
    /// from a position that moves on by as many a call (oldest first, back
    /// to the oldest past the newest: [`QueueKeys::orphan_cursor`]), so every
    /// entry is checked within `len / orphan_scan` calls; at least 1
    /// ([`Watchdog::connect`] refuses 0 with [`QueueError::Config`]).
    pub orphan_scan: usize,
    /// Backoff before a reclaimed job runs again (jittered, by attempts).
    /// `base` at most `max`, `max` at most 30 days ([`Backoff::validate`],
    /// checked by [`Watchdog::connect`] as a worker's is at build).
    pub backoff: Backoff,
    /// Read each queue's depths and ages every pass and publish them as
    /// metrics gauges (`queue_depth`, `queue_oldest_job_age_seconds`).
    pub publish_gauges: bool,
    /// Redis timeouts.
    pub connection: ConnectionConfig,
    /// Each pass deletes the oldest dead letters beyond this many per queue
    /// (with their hashes and step results); 0: no limit. Default 10,000.
    pub dead_max_len: usize,
    /// Each pass deletes dead letters older than this; zero: kept forever.
    /// Default 7 days. At most `batch` dead letters are deleted per script
    /// call; a pass calls again while a call deleted its whole `batch` and
    /// more may be due (like the reclaim and the promotion).
    pub dead_retention: Duration,
}

impl Default for WatchdogConfig {
    fn default() -> Self {
        WatchdogConfig {
            interval: Duration::from_secs(1),
            batch: 500,
            orphan_grace: Duration::from_secs(30),
            orphan_scan: 1000,
            backoff: Backoff {
                base: Duration::from_secs(1),
                max: Duration::from_secs(60),
            },
            publish_gauges: true,
            connection: ConnectionConfig::default(),
            dead_max_len: 10_000,
            dead_retention: Duration::from_secs(7 * 24 * 3600),
        }
    }
}

/// What one pass did, summed over queues.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ReclaimReport {
    /// Expired deliveries returned to the delayed set (they run again after backoff).
    pub reclaimed: u64,
    /// Expired deliveries with no attempts left, moved to the dead-letter list.
    pub dead_lettered: u64,
    /// Unleased ids in processing given a provisional lease.
    pub adopted: u64,
    /// Due delayed jobs moved to main.
    pub promoted: u64,
    /// Queues whose pass failed (Redis unreachable, a queue key of the wrong
    /// type, ...). Each is logged with its queue; the other queues still got
    /// their pass.
    pub failed_queue_passes: u64,
    /// Dead letters deleted by the trim (beyond `dead_max_len` or older
    /// than `dead_retention`).
    pub trimmed: u64,
    /// Cross-queue relay notices applied to their batches (docs/WORKFLOWS.md,
    /// "Relay"): the watchdog relays every watched queue on each pass.
    pub relayed: u64,
    /// Expired leases whose entry the reclaim dropped without returning a
    /// job: a stale processing entry of a job that is not running (`dead`,
    /// `delayed`, or completed: only its record is left) or a lease with no
    /// processing entry and no matching active delivery. The job is left
    /// where it is; each is logged with its id and queue
    /// (`reclaim.lua`). Non-zero means something wrote the queue's lists
    /// by hand or a crash left a stale entry: worth a `check`.
    pub dropped: u64,
}

impl ReclaimReport {
    fn add(&mut self, other: ReclaimReport) {
        self.reclaimed += other.reclaimed;
        self.dead_lettered += other.dead_lettered;
        self.adopted += other.adopted;
        self.promoted += other.promoted;
        self.failed_queue_passes += other.failed_queue_passes;
        self.trimmed += other.trimmed;
        self.relayed += other.relayed;
        self.dropped += other.dropped;
    }

    /// True when the pass changed nothing.
    pub fn is_empty(&self) -> bool {
        *self == ReclaimReport::default()
    }
}

/// Lease reclaimer for a set of queues.
///
/// ```
/// # #[tokio::main] async fn main() -> Result<(), queue_core::QueueError> {
/// # let server = queue_testkit::RedisServer::start().unwrap();
/// # let url = server.url();
/// use queue_core::{Watchdog, WatchdogConfig};
/// let watchdog = Watchdog::connect(&url, ["emails"], WatchdogConfig::default()).await?;
/// let report = watchdog.run_once().await?;
/// assert!(report.is_empty());
/// # Ok(()) }
/// ```
pub struct Watchdog {
    conn: RedisConnection,
    queues: Vec<QueueKeys>,
    config: WatchdogConfig,
}

impl std::fmt::Debug for Watchdog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Watchdog")
            .field(
                "queues",
                &self.queues.iter().map(|k| &k.queue).collect::<Vec<_>>(),
            )
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl Watchdog {
    /// Connects to `url` and watches `queues`. A queue name an enqueue
    /// refuses ([`validate_queue_name`](crate::validate_queue_name), e.g.
    /// `"emails "` or `"{emails}"`) is [`QueueError::InvalidQueueName`]:
    /// it would watch keys no enqueue creates, so the jobs of dead workers
    /// on the intended queue were never returned.
    pub async fn connect<I, S>(url: &str, queues: I, config: WatchdogConfig) -> Result<Self>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let queues: Vec<QueueKeys> = queues
            .into_iter()
            .map(|q| {
                crate::enqueue_options::check_queue_name(q.as_ref())?;
                Ok(QueueKeys::new(q.as_ref()))
            })
            .collect::<Result<_>>()?;
        if queues.is_empty() {
            return Err(QueueError::Config(
                "the watchdog needs at least one queue".into(),
            ));
        }
        if config.batch == 0 {
            return Err(QueueError::Config(
                "watchdog batch must be at least 1".into(),
            ));
        }
        // reclaim.lua refuses a scan of 0 (it would fail every pass of
        // every queue, so no orphan was ever adopted).
        if config.orphan_scan == 0 {
            return Err(QueueError::Config(
                "watchdog orphan_scan must be at least 1".into(),
            ));
        }
        // The worker's check (base at most max, max at most 30 days): a max
        // of decades parked a returned job out of reach.
        config.backoff.validate()?;
        let conn = connect(url, &config.connection).await?;
        Ok(Watchdog {
            conn,
            queues,
            config,
        })
    }

    /// One pass over every queue. A queue whose pass fails is logged with its
    /// name and counted in [`ReclaimReport::failed_queue_passes`]; the other
    /// queues still get their pass, so one broken queue never stalls the rest.
    /// Within a queue's pass the steps (reclaim, promote, dead-letter trim,
    /// relay) run independently: one that fails does not skip the others,
    /// and what the others did is still counted in the report.
    pub async fn run_once(&self) -> Result<ReclaimReport> {
        let mut total = ReclaimReport::default();
        for keys in &self.queues {
            total.add(self.pass(keys).await);
        }
        Ok(total)
    }

    /// One queue's pass; `failed_queue_passes` is 1 when a step failed (each
    /// failure is logged with the queue and the step). A step refused for
    /// the queue's data (a corrupt key) does not stop the others; any other
    /// failure (a timeout, a lost connection, Redis loading or read-only)
    /// would fail every later step the same way, each after its own response
    /// timeout, so the queue's pass ends there.
    async fn pass(&self, keys: &QueueKeys) -> ReclaimReport {
        let mut conn = self.conn.clone();
        let mut report = ReclaimReport::default();
        let mut failed = false;
        let mut go_on = |step: &str, e: QueueError| {
            let data = e.is_data_error();
            if data {
                warn!(queue = %keys.queue, step, error = %e, "watchdog pass of this queue failed at this step; its other steps and the other queues go on");
            } else {
                warn!(queue = %keys.queue, step, error = %e, "watchdog pass of this queue failed at this step; the rest of its pass is skipped (Redis unavailable), the other queues go on");
            }
            failed = true;
            data
        };
        'steps: {
            let reclaimed = self.reclaim_all(&mut conn, keys, &mut report).await;
            // Right after the reclaim: a later step that fails must not lose
            // what it returned (the scripts already moved those jobs).
            crate::metrics::reclaimed(
                &keys.queue,
                report.reclaimed,
                report.dead_lettered,
                report.dropped,
            );
            if let Err(e) = reclaimed {
                if !go_on("reclaim", e) {
                    break 'steps;
                }
            }
            match promote_all_due(&mut conn, keys).await {
                Ok(n) => report.promoted += n,
                Err(e) => {
                    if !go_on("promote", e) {
                        break 'steps;
                    }
                }
            }
            if let Err(e) = self.trim_dead(&mut conn, keys, &mut report).await {
                if !go_on("dead-letter trim", e) {
                    break 'steps;
                }
            }
            // The relay's safety net (a worker relays its own queue's notices
            // at once): a failure is logged, not counted, and the next pass
            // retries.
            match crate::workflow::relay::relay_queue(&mut conn, &keys.queue).await {
                Ok(r) => report.relayed += r.applied,
                Err(e) => {
                    warn!(queue = %keys.queue, error = %e, "relay of this queue's batch notices failed; the next pass retries");
                    if !e.is_data_error() {
                        break 'steps;
                    }
                }
            }
            if self.config.publish_gauges {
                let queue = crate::queue::Queue::from_connection(conn);
                // No group list read: the gauges carry no group figure (GROUPS.md).
                match queue.stats_with_group_limit(&keys.queue, 0).await {
                    Ok(stats) => crate::metrics::depth(&stats),
                    Err(e) => {
                        go_on("stats", e);
                    }
                }
            }
        }
        if !report.is_empty() {
            info!(
                queue = %keys.queue,
                reclaimed = report.reclaimed,
                dead_lettered = report.dead_lettered,
                adopted = report.adopted,
                promoted = report.promoted,
                trimmed = report.trimmed,
                dropped = report.dropped,
                failed,
                "watchdog pass"
            );
        }
        if failed {
            report.failed_queue_passes = 1;
        }
        report
    }

    /// Returns the queue's expired leases, `batch` per script call, adding
    /// each call's counts to `report` as it answers (the counts of the calls
    /// before a failing one are kept).
    async fn reclaim_all(
        &self,
        conn: &mut RedisConnection,
        keys: &QueueKeys,
        report: &mut ReclaimReport,
    ) -> Result<()> {
        loop {
            let batch = Reclaim {
                keys,
                batch: self.config.batch,
                orphan_grace: self.config.orphan_grace,
                backoff: &self.config.backoff,
                seed: rand::random(),
                orphan_scan: self.config.orphan_scan,
            }
            .run(conn)
            .await?;
            report.reclaimed += batch.reclaimed;
            report.dead_lettered += batch.dead_lettered;
            report.adopted += batch.adopted;
            report.dropped += batch.dropped.len() as u64;
            // A call cut short by its bound on dead-list walks (stale
            // entries of dead jobs) goes on at once: the real expired leases
            // behind them are not left for the next pass. Each such call
            // takes at least one entry.
            let more = batch.cut && batch.taken() > 0;
            if batch.taken() < self.config.batch as u64 && !more {
                return Ok(());
            }
        }
    }

    /// Trims the queue's dead-letter list, `batch` ids per script call,
    /// until a call takes fewer off the list (nothing more is due: deleted,
    /// or stale entries unlisted, which are not counted) or the list is back
    /// at `dead_max_len` with no retention to apply; the number of dead
    /// letters deleted, added to `report` as each call answers (the counts
    /// of the calls before a failing one are kept). Before, one call per
    /// pass: a dead-letter storm of 3,000 over a cap of 1,000 left 2,500
    /// after the pass, and the cap held only after several passes.
    async fn trim_dead(
        &self,
        conn: &mut RedisConnection,
        keys: &QueueKeys,
        report: &mut ReclaimReport,
    ) -> Result<()> {
        let cfg = &self.config;
        if cfg.dead_max_len == 0 && cfg.dead_retention.is_zero() {
            return Ok(());
        }
        loop {
            let reply = DeadTrim {
                keys,
                max_len: cfg.dead_max_len,
                retention: cfg.dead_retention,
                limit: cfg.batch,
            }
            .run(conn)
            .await?;
            report.trimmed += reply.trimmed;
            if reply.taken() > 0 {
                debug!(queue = %keys.queue, trimmed = reply.trimmed, unlisted = reply.unlisted,
                    remaining = reply.remaining, "dead letters trimmed");
            }
            let capped = cfg.dead_max_len > 0 && reply.remaining <= cfg.dead_max_len as u64;
            if reply.taken() < cfg.batch as u64 || (capped && cfg.dead_retention.is_zero()) {
                return Ok(());
            }
        }
    }

    /// Runs passes every `interval` until `stop` completes, also in the
    /// middle of a pass: the pass in flight is abandoned between two scripts
    /// (each is atomic), so a stop does not wait out a response timeout per
    /// queue when Redis hangs. Redis errors are logged and the next pass
    /// retries; a summary is logged every minute.
    pub async fn run_until(&self, stop: impl Future<Output = ()>) -> ReclaimReport {
        tokio::pin!(stop);
        let mut total = ReclaimReport::default();
        let mut since_summary = ReclaimReport::default();
        let mut last_summary = tokio::time::Instant::now();
        let mut passes = 0u64;
        info!(
            queues = ?self.queues.iter().map(|k| &k.queue).collect::<Vec<_>>(),
            interval_ms = self.config.interval.as_millis() as u64,
            "watchdog started"
        );
        loop {
            // Raced against the stop: against a Redis that hangs, each queue's
            // pass waits out the response timeout, so waiting for the whole
            // pass made a stop take that long per queue. Dropping the pass in
            // flight is safe: each script is atomic, and what it did not
            // finish the next watchdog's pass does.
            let pass = tokio::select! {
                pass = self.run_once() => pass,
                _ = &mut stop => {
                    info!("watchdog stopping: the pass in flight is abandoned");
                    break;
                }
            };
            match pass {
                Ok(report) => {
                    passes += 1;
                    total.add(report);
                    since_summary.add(report);
                    if report.is_empty() {
                        debug!("watchdog pass: nothing to do");
                    }
                    if report.failed_queue_passes > 0 {
                        warn!(
                            failed_queue_passes = report.failed_queue_passes,
                            "watchdog pass: some queues failed; retrying next interval"
                        );
                    }
                }
                Err(e) => warn!(error = %e, "watchdog pass failed; retrying next interval"),
            }
            if last_summary.elapsed() >= Duration::from_secs(60) {
                info!(
                    passes,
                    reclaimed = since_summary.reclaimed,
                    dead_lettered = since_summary.dead_lettered,
                    adopted = since_summary.adopted,
                    promoted = since_summary.promoted,
                    failed_queue_passes = since_summary.failed_queue_passes,
                    trimmed = since_summary.trimmed,
                    dropped = since_summary.dropped,
                    "watchdog summary (last minute)"
                );
                since_summary = ReclaimReport::default();
                last_summary = tokio::time::Instant::now();
            }
            tokio::select! {
                _ = tokio::time::sleep(self.config.interval) => {}
                _ = &mut stop => break,
            }
        }
        info!(
            passes,
            reclaimed = total.reclaimed,
            dead_lettered = total.dead_lettered,
            adopted = total.adopted,
            promoted = total.promoted,
            dropped = total.dropped,
            "watchdog stopped"
        );
        total
    }
}
