//! Rolling deploys on the worker side: a delivery whose payload schema
//! version is newer than this worker's handler, or whose job type has no
//! handler on this worker, is left for a worker that can run it
//! (`defer.lua`: back to the delayed set without using an attempt), and
//! dead-lettered only once no live worker has announced that type and
//! version for [`WorkerConfig::newer_version_wait`]. Also the list of
//! versions this worker announces ([`announced_fields`], refreshed by the
//! promoter tick).
//!
//! [`WorkerConfig::newer_version_wait`]: super::WorkerConfig::newer_version_wait

use std::time::Duration;

use tracing::{error, info, warn};

use super::runner::{left_at_hard_stop, result_call, JobRunner};
use super::{wait_true, Inner};
use crate::error::Result;
use crate::keys::QueueKeys;
use crate::metrics::JobLabels;
use crate::registry::Registration;
use crate::scripts::announce;
use crate::scripts::claim::Delivery;
use crate::scripts::defer::Defer;
use crate::scripts::fail::FailReply;

/// The versions-hash fields this worker announces on each of its queues.
pub(super) fn announced_fields(inner: &Inner) -> Vec<(QueueKeys, Vec<String>)> {
    inner
        .queues
        .iter()
        .map(|q| {
            let mut fields: Vec<String> = inner
                .handlers
                .iter()
                .filter(|((queue, _), _)| *queue == q.keys.queue.as_str())
                .map(|((_, job_type), reg)| announce::field(job_type, reg.version))
                .collect();
            fields.sort();
            (QueueKeys::clone(&q.keys), fields)
        })
        .collect()
}

impl JobRunner {
    /// The job types this worker handles on the delivery's queue, for logs
    /// (`` `a`, `b` ``).
    fn handled_types(&self) -> String {
        let mut known: Vec<_> = self
            .inner
            .handlers
            .keys()
            .filter(|(q, _)| *q == self.keys.queue.as_str())
            .map(|(_, n)| format!("`{n}`"))
            .collect();
        known.sort();
        known.join(", ")
    }

    /// The handler's version when the delivery's payload is newer than it
    /// (the job is then deferred, not dead-lettered).
    pub(super) fn newer_than_handler(reg: &Registration, d: &Delivery) -> Option<u32> {
        (d.version > reg.version).then_some(reg.version)
    }

    /// Gives the delivery back for a worker that knows its type and version
    /// (`known`: this worker's handler version, `None` when it has no
    /// handler for the type), retrying Redis errors until one lease after
    /// the delivery got here (then the watchdog returns it, which uses an
    /// attempt), or until the shutdown's hard stop (left leased likewise).
    /// The first call is always sent, even at the hard stop (`first_call`):
    /// only the retries stop there.
    pub(super) async fn defer(&self, d: &Delivery, labels: &JobLabels, known: Option<u32>) {
        let deadline = tokio::time::Instant::now() + self.inner.config.lease;
        let mut delay = Duration::from_millis(50);
        let mut hard_stop = self.hard_stop.clone();
        let mut first = true;
        loop {
            let call = self.defer_once(d, known);
            let sent = result_call(&mut first, call, &mut hard_stop).await;
            let res = match sent {
                Ok(res) => res,
                Err(maybe) => return left_at_hard_stop(maybe),
            };
            match res {
                Ok(label) => {
                    match label {
                        "deferred" => crate::metrics::deferred(labels),
                        _ => crate::metrics::finished(labels, label, None),
                    }
                    return;
                }
                Err(e) if e.is_lease_lost() => {
                    warn!(error = %e, "defer discarded: lease lost");
                    return;
                }
                Err(e) if tokio::time::Instant::now() + delay < deadline => {
                    warn!(error = %e, retry_in_ms = delay.as_millis() as u64, "could not defer the job; retrying");
                    tokio::select! {
                        biased;
                        () = tokio::time::sleep(delay) => {}
                        () = wait_true(&mut hard_stop) => return left_at_hard_stop(e.outcome_unknown()),
                    }
                    delay = (delay * 2).min(Duration::from_secs(2));
                }
                Err(e) => {
                    error!(error = %e, "could not defer the job before its lease expired; the watchdog will return it");
                    return;
                }
            }
        }
    }

    /// Runs `defer.lua` once; the metrics label on success.
    async fn defer_once(&self, d: &Delivery, known: Option<u32>) -> Result<&'static str> {
        let cfg = &self.inner.config;
        let field = announce::field(&d.job_type, d.version);
        let mut conn = self.inner.conn.clone();
        let reply = Defer {
            keys: &self.keys,
            id: &d.id,
            token: &d.token,
            field: &field,
            delay: cfg.newer_version_delay,
            wait: cfg.newer_version_wait,
            known,
        }
        .run(&mut conn)
        .await?;
        match reply {
            FailReply::Retry { run_at_ms } => {
                match known {
                    Some(known) => info!(
                        job_version = d.version,
                        handler_version = known,
                        run_at_ms,
                        "payload schema version newer than this worker's handler: left for an upgraded worker (attempt not counted)"
                    ),
                    None => info!(
                        job_version = d.version,
                        handled = %self.handled_types(),
                        run_at_ms,
                        "no handler for this job type on this worker: left for a worker that has one (attempt not counted)"
                    ),
                }
                Ok("deferred")
            }
            FailReply::Dead { reason } => {
                error!(job_version = d.version, handler_version = ?known, reason = %reason, "dead-lettered");
                Ok("dead_lettered")
            }
            FailReply::LeaseLost => Err(self.lease_lost(d)),
            FailReply::CancelRequested => {
                self.end_cancelled(
                    d,
                    "cancelled before a worker knowing its schema version ran it",
                )
                .await
            }
        }
    }
}
