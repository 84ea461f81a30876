//! The heartbeat of one running job: extends its lease every
//! `heartbeat_interval` while the token matches (`extend.lua`, DESIGN rule 3),
//! moves the context's local lease deadline forward on each confirmed extend
//! (`lease_clock.rs`), and marks the context lease-lost when an extend finds
//! another token or the deadline passed without a confirmed extend.
//!
//! Beats are timed from send times, like the lease clock: the first one
//! interval after the claim was sent ([`next_beat`] of the claim, waited out
//! by the runner), each next one interval after the previous extend was
//! sent. Timed from the handler's start and from each reply, a beat came
//! after the local deadline when the handler started late or a reply was
//! slow, was never sent, and the job was reclaimed while it still ran.
//!
//! The runner waits out the first interval itself (a timer in its own task)
//! and spawns this task only for a job still running then: most jobs end
//! within one interval, and a task spawned and aborted per job was a wake-up
//! of another runtime thread per job (issue #12, concurrency 1).
//!
//! A delivery whose local deadline passed before its handler started gets
//! one extend first ([`keep_lease_at_late_start`]): confirmed, the lease is
//! held again and the beats count from that extend; otherwise the handler
//! is not run. Skipping it outright burned the claim's attempt on a job
//! whose Redis lease was usually still this delivery's (with one attempt,
//! the watchdog dead-lettered a job that never ran).

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tracing::{debug, info, warn};

use super::Inner;
use crate::context::CancelFlag;
use crate::error::Result;
use crate::job::{JobContext, JobId};
use crate::keys::QueueKeys;
use crate::lease_clock::LeaseClock;
use crate::scripts::extend::{Extend, ExtendReply};

/// When the beat after a request (the claim, or an extend) sent at
/// `sent_at` is due; `None` beyond what the clock can represent.
pub(super) fn next_beat(sent_at: Instant, every: Duration) -> Option<Instant> {
    sent_at.checked_add(every)
}

/// One extend of a delivery whose local lease deadline passed before its
/// handler started: the heartbeat's call, with the delivery's token. The
/// send time when Redis confirmed it and the clock holds the lease again
/// (the beats then count from it); `None`, logged, when the job was
/// reclaimed, the extend failed or its reply came too late: the handler is
/// not run and the watchdog returns the job.
pub(super) async fn keep_lease_at_late_start(
    inner: &Inner,
    keys: &QueueKeys,
    id: &JobId,
    token: &str,
    ctx: &JobContext,
) -> Option<Instant> {
    let lease = inner.config.lease;
    let extend = Extend {
        keys,
        id,
        token,
        lease,
    };
    let sent_at = Instant::now();
    let (queue, job_id) = (&keys.queue, id);
    match extend.run(&mut inner.conn.clone()).await {
        Ok(ExtendReply::Extended {
            lease_until_ms,
            cancel_requested,
        }) if ctx.inner.lease.regain(sent_at, lease) => {
            info!(%queue, %job_id, lease_until_ms, "lease extended after a late start: running the job");
            note_cancel(&ctx.inner.cancel, cancel_requested);
            Some(sent_at)
        }
        Ok(ExtendReply::Extended { .. }) => {
            warn!(%queue, %job_id, "lease extended after a late start, but the reply came after its own local deadline: not running the job; the watchdog returns it");
            None
        }
        Ok(ExtendReply::LeaseLost) => {
            warn!(%queue, %job_id, "lease lost before the handler started (the job was reclaimed): not running it");
            None
        }
        Err(e) => {
            warn!(%queue, %job_id, error = %e, "lease deadline passed before the handler started and the extend failed: not running it; the watchdog returns the job");
            None
        }
    }
}

/// An operator's cancel request reported by an extend.
fn note_cancel(cancel: &CancelFlag, cancel_requested: bool) {
    if cancel_requested && !cancel.set() {
        info!("cancel requested by an operator");
    }
}

/// Extends the lease now and then every heartbeat interval while the token
/// matches; marks the context lease-lost and stops when it no longer does or
/// when the local deadline passed (Redis unreachable). Started by the runner
/// once one interval has passed since the claim; runs until aborted by the
/// runner, or until `until` (the handler's timeout or execution budget and
/// a lease more): a runner that has not stopped it by then does not answer
/// (its handler blocks the thread), and beats would hold the job for ever.
pub(super) async fn heartbeat_after_first_interval(
    inner: Arc<Inner>,
    keys: Arc<QueueKeys>,
    id: JobId,
    token: String,
    ctx: JobContext,
    until: Option<Instant>,
) {
    if !inner.config.heartbeat_enabled {
        return;
    }
    let conn = inner.conn.clone();
    let extend = Extend {
        keys: &keys,
        id: &id,
        token: &token,
        lease: inner.config.lease,
    };
    let extend = &extend;
    beat(
        &ctx.inner.lease,
        &ctx.inner.cancel,
        inner.config.lease,
        inner.config.heartbeat_interval(),
        until,
        || {
            let mut conn = conn.clone();
            async move { extend.run(&mut conn).await }
        },
    )
    .await;
}

/// The beat loop over `extend` (one `extend.lua` call): the first at once,
/// each next `every` after the previous one was sent, none at or after
/// `until`.
async fn beat<F, Fut>(
    lease: &LeaseClock,
    cancel: &CancelFlag,
    lease_len: Duration,
    every: Duration,
    until: Option<Instant>,
    mut extend: F,
) where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<ExtendReply>>,
{
    loop {
        if lease.is_lost() {
            warn!("lease lost: no extend confirmed before the local lease deadline; another worker may run this job");
            return;
        }
        if until.is_some_and(|t| Instant::now() >= t) {
            warn!("the handler ran a lease past its timeout or execution budget and its runner does not answer (a handler blocking its thread?): no more extends, the watchdog returns the job when its lease ends");
            return;
        }
        let sent_at = Instant::now();
        match extend().await {
            Ok(ExtendReply::LeaseLost) => {
                lease.mark_lost();
                warn!("lease lost: the job was reclaimed; its result will be discarded");
                return;
            }
            Ok(ExtendReply::Extended {
                lease_until_ms,
                cancel_requested,
            }) => {
                lease.confirm(sent_at, lease_len);
                debug!(lease_until_ms, "lease extended");
                note_cancel(cancel, cancel_requested);
            }
            Err(e) => warn!(error = %e, "heartbeat failed; retrying at the next interval"),
        }
        // Due already when the reply took longer than an interval: sent at
        // once, still within the lease of the extend before.
        match next_beat(sent_at, every) {
            Some(at) => tokio::time::sleep_until(at).await,
            None => tokio::time::sleep(every).await,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;

    const LEASE: Duration = Duration::from_secs(1);
    /// The longest heartbeat `build()` accepts for a 1 s lease: under half
    /// of its trusted 900 ms.
    const EVERY: Duration = Duration::from_millis(440);

    /// Runs the runner's first wait and the beat loop over a fake Redis
    /// whose every extend takes `rtt` and succeeds, for `beats` extends.
    /// Returns each extend's send time after the claim, and whether the
    /// local lease was still held when it was sent.
    async fn beat_with_replies_taking(rtt: Duration, beats: usize) -> Vec<(Duration, bool)> {
        let claim = Instant::now();
        let lease = LeaseClock::new(claim, LEASE);
        let cancel = CancelFlag::default();
        let sends = Mutex::new(Vec::new());
        tokio::time::sleep_until(next_beat(claim, EVERY).unwrap()).await;
        let run = beat(&lease, &cancel, LEASE, EVERY, None, || {
            let mut sends = sends.lock().unwrap();
            sends.push((claim.elapsed(), !lease.is_lost()));
            let last = sends.len() >= beats;
            async move {
                tokio::time::sleep(rtt).await;
                Ok(match last {
                    true => ExtendReply::LeaseLost, // ends the loop
                    false => ExtendReply::Extended {
                        lease_until_ms: 0,
                        cancel_requested: false,
                    },
                })
            }
        });
        run.await;
        sends.into_inner().unwrap()
    }

    /// Beats come at claim + k·interval, not an interval after each reply.
    #[tokio::test(start_paused = true)]
    async fn beats_are_timed_from_the_claim_and_each_send() {
        let sends = beat_with_replies_taking(Duration::from_millis(100), 5).await;
        let at: Vec<Duration> = sends.iter().map(|(at, _)| *at).collect();
        let expected: Vec<Duration> = (1..=5).map(|k| EVERY * k).collect();
        assert_eq!(at, expected);
        assert!(sends.iter().all(|(_, held)| *held));
    }

    /// A runner that does not stop its heartbeat by the handler's timeout
    /// (plus a lease: `until`) is not answering (its handler blocks the
    /// thread): the beats stop there, and the lease lapses for the watchdog.
    /// Before, they went on for as long as the process lived, and the job
    /// stayed active for ever (stop 48 review).
    #[tokio::test(start_paused = true)]
    async fn beats_stop_at_until() {
        let claim = Instant::now();
        let lease = LeaseClock::new(claim, LEASE);
        let cancel = CancelFlag::default();
        let sends = Mutex::new(0u32);
        let until = claim + EVERY * 3 + Duration::from_millis(10);
        beat(&lease, &cancel, LEASE, EVERY, Some(until), || {
            *sends.lock().unwrap() += 1;
            async {
                Ok(ExtendReply::Extended {
                    lease_until_ms: 0,
                    cancel_requested: false,
                })
            }
        })
        .await;
        // Sent at claim + 0, 1, 2 and 3 intervals; none after `until`.
        assert_eq!(*sends.lock().unwrap(), 4);
        assert!(Instant::now() >= until && !lease.is_lost());
    }

    /// Replies of 300 ms (each well within the 900 ms the lease is trusted
    /// for): every beat goes out and is confirmed before the deadline of
    /// the one before. Timed from each reply, the second beat went out at
    /// 440 + 300 + 440 ms and its reply came at 1480 ms, after the first
    /// beat's deadline (440 + 900 ms): the lease was lost locally, the
    /// heartbeat stopped and the job was reclaimed while it still ran.
    #[tokio::test(start_paused = true)]
    async fn slow_replies_do_not_push_a_beat_past_the_deadline() {
        let sends = beat_with_replies_taking(Duration::from_millis(300), 6).await;
        assert_eq!(sends.len(), 6, "every beat was sent: {sends:?}");
        assert!(
            sends.iter().all(|(_, held)| *held),
            "a beat found the local lease lost: {sends:?}"
        );
    }
}
