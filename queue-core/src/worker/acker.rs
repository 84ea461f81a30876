//! The acker: one task per queue that records successes in batches. A
//! runner whose handler succeeded hands its ack here and frees its
//! concurrency slot at once; the acker sends one `ack.lua` call for up to
//! `ack_batch` acks, when that many wait or `ack_window` after the first
//! (zero: at once, with whatever is already waiting). Within the window the
//! acker is not woken per ack: it sleeps until the window ends, or until the
//! sender whose ack completes a batch wakes it (a task wake-up per job was a
//! hand-off between runtime threads per job at low concurrency; issue #12).
//! Senders count the acks not yet flushed (`unflushed`, after their send, so
//! every counted ack is in the channel or with the acker); the acker takes
//! off what it flushed. The script checks every
//! token of the batch (DESIGN rule 3, docs/DESIGN.md) and answers per job.
//!
//! Redis failures are retried until one lease after the earliest handler of
//! the batch returned (its heartbeat stopped then, so by that time its lease
//! has expired and the watchdog owns the job); a retry after a lost reply is
//! safe: the script answers "already acked" for its own token.
//! On shutdown the channel closes once every runner is done, and the acker
//! flushes what is left before it ends; the worker stops it (`stop`) when
//! the shutdown's time is up (grace + the hard-stop wait, worker/mod.rs):
//! it then stops retrying, and the jobs it had not recorded stay leased for
//! the watchdog, each logged in its span.
//!
//! A panic in a flush (it runs user code: the tracing layers that see
//! "completed", the global metrics recorder) is caught: the batch's jobs are
//! logged with what is known of their ack (recorded, or not: left leased,
//! or maybe) and the acker goes on with the channel's next acks. Before, the
//! acker's task died and every later success of its queue was left leased.

use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicIsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt;
use tokio::sync::{mpsc, watch, Notify};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tracing::{error, info, warn, Span};

use super::fetcher::is_redis_failure;
use super::{panic_message, wait_true, Inner};
use crate::keys::QueueKeys;
use crate::metrics::JobLabels;
use crate::scripts::ack::{Ack, AckItem, AckReply};

/// One finished delivery waiting for its ack.
pub(super) struct AckRequest {
    /// What the ack script is sent (moved into the call, not copied).
    pub(super) item: AckItem,
    /// What the acker does with the reply.
    pub(super) job: AckedJob,
}

/// The acker's side of an [`AckRequest`]: where it logs the outcome and what
/// it counts.
pub(super) struct AckedJob {
    /// The job's metric labels.
    pub(super) labels: JobLabels,
    /// The handler's run time.
    pub(super) elapsed: Duration,
    /// The job's span: the acker logs the outcome inside it.
    pub(super) span: Span,
    /// One lease after the handler returned (its heartbeat stopped then):
    /// the lease has expired by then, no retry after it.
    pub(super) deadline: Instant,
}

/// Where a queue's runners send their acks. Cheap to clone.
#[derive(Clone)]
pub(super) struct AckSender {
    tx: mpsc::Sender<AckRequest>,
    /// Wakes the acker within its window once a batch is complete, and,
    /// dropped with the last sender, to flush and end without waiting out
    /// its window.
    wake: Arc<WakeOnDrop>,
    /// Acks sent and not yet flushed (briefly below zero when the acker
    /// flushed an ack before its sender counted it).
    unflushed: Arc<AtomicIsize>,
    /// `ack_batch`.
    batch: isize,
}

impl AckSender {
    /// Queues an ack when the channel has room, without a future: a pending
    /// send holds the request inside the runner's future, which is copied
    /// several times per job (~1 KB of its ~2.8 KB, issue #12). Gives the
    /// request back when the acker is `capacity` acks behind, for
    /// [`send`](Self::send).
    pub(super) fn try_send(&self, req: AckRequest) -> Option<AckRequest> {
        match self.tx.try_send(req) {
            Ok(()) => self.counted(),
            Err(mpsc::error::TrySendError::Full(req)) => return Some(req),
            Err(mpsc::error::TrySendError::Closed(req)) => gone(&req),
        }
        None
    }

    /// Queues an ack; waits only while the acker is `capacity` acks behind.
    pub(super) async fn send(&self, req: AckRequest) {
        match self.tx.send(req).await {
            Ok(()) => self.counted(),
            Err(mpsc::error::SendError(req)) => gone(&req),
        }
    }

    /// Counted after the send: every ack counted is in the channel or with
    /// the acker, so a wake-up at a full batch finds the whole batch.
    fn counted(&self) {
        if self.unflushed.fetch_add(1, Ordering::AcqRel) + 1 >= self.batch {
            self.wake.0.notify_one();
        }
    }
}

/// A send after the acker ended (it outlives every runner, so only then).
fn gone(req: &AckRequest) {
    req.job
        .span
        .in_scope(|| error!("acker gone: job left leased; the watchdog will return it"));
}

/// Wakes the acker when dropped (with the last [`AckSender`]).
struct WakeOnDrop(Arc<Notify>);

impl Drop for WakeOnDrop {
    fn drop(&mut self) {
        self.0.notify_one();
    }
}

/// A queue's acker task, as the worker's shutdown waits for it.
pub(super) struct Acker {
    /// Its queue, for the shutdown's log lines.
    pub(super) keys: Arc<QueueKeys>,
    pub(super) task: JoinHandle<()>,
    /// Acks sent and not yet flushed.
    unflushed: Arc<AtomicIsize>,
}

impl Acker {
    /// Acks handed to the acker and not flushed yet.
    pub(super) fn pending(&self) -> usize {
        usize::try_from(self.unflushed.load(Ordering::Acquire)).unwrap_or(0)
    }
}

/// Starts the acker of queue `keys`. It ends once every [`AckSender`] is
/// dropped and the last batch is flushed, or once `stop` turns true (the
/// shutdown's time is up: what it has not recorded stays leased).
pub(super) fn spawn(
    inner: Arc<Inner>,
    keys: Arc<QueueKeys>,
    stop: watch::Receiver<bool>,
) -> (AckSender, Acker) {
    let batch = inner.config.ack_batch.max(1);
    let room = batch
        .max(inner.config.concurrency)
        .saturating_mul(4)
        .min(tokio::sync::Semaphore::MAX_PERMITS);
    let (tx, rx) = mpsc::channel(room);
    let fill = Arc::new(Notify::new());
    let unflushed = Arc::new(AtomicIsize::new(0));
    let task = tokio::spawn(run(
        inner,
        keys.clone(),
        rx,
        fill.clone(),
        unflushed.clone(),
        stop,
    ));
    let sender = AckSender {
        tx,
        wake: Arc::new(WakeOnDrop(fill)),
        unflushed: unflushed.clone(),
        batch: batch as isize,
    };
    let acker = Acker {
        keys,
        task,
        unflushed,
    };
    (sender, acker)
}

async fn run(
    inner: Arc<Inner>,
    keys: Arc<QueueKeys>,
    mut rx: mpsc::Receiver<AckRequest>,
    fill: Arc<Notify>,
    unflushed: Arc<AtomicIsize>,
    mut stop: watch::Receiver<bool>,
) {
    let max = inner.config.ack_batch.max(1);
    let window = inner.config.ack_window;
    let mut batch = Vec::with_capacity(max);
    // The batch in flight, split for the call (the items are moved into
    // it, not copied) and kept here, outside the flush, so that a panic in
    // the flush leaves their spans to log with.
    let mut items: Vec<AckItem> = Vec::with_capacity(max);
    let mut jobs: Vec<AckedJob> = Vec::with_capacity(max);
    loop {
        let received = tokio::select! {
            biased;
            n = rx.recv_many(&mut batch, max) => n,
            _ = wait_true(&mut stop) => return leave_queued(&mut rx),
        };
        if received == 0 {
            return; // every sender dropped and nothing left
        }
        // `ack_window` is at most a third of the lease (validated at build);
        // a window beyond the clock, should one get here, flushes at once
        // instead of panicking (a dead acker left every later ack unsent).
        if let Some(until) = Instant::now()
            .checked_add(window)
            .filter(|_| !window.is_zero())
        {
            // Take what is queued; then sleep until the window ends or the
            // sender that completes the batch wakes us, never woken per ack.
            loop {
                let closed = take_queued(&mut rx, &mut batch, max);
                if closed || batch.len() >= max {
                    break;
                }
                tokio::select! {
                    _ = fill.notified() => {}
                    _ = tokio::time::sleep_until(until) => {
                        take_queued(&mut rx, &mut batch, max);
                        break;
                    }
                    // The flush sees the stop and leaves the batch leased.
                    _ = wait_true(&mut stop) => break,
                }
            }
        }
        let sent = batch.len() as isize;
        for req in batch.drain(..) {
            items.push(req.item);
            jobs.push(req.job);
        }
        let mut stopped = false;
        for part in call_parts(&items, ACK_CALL_RESULT_BYTES) {
            if stopped {
                // The stop ended an earlier call of this batch: these were
                // never sent and stay leased.
                leave_batch(&jobs[part], false);
                continue;
            }
            let mut progress = Progress::default();
            let flushed = AssertUnwindSafe(flush(
                &inner,
                &keys,
                &items[part.clone()],
                &jobs[part.clone()],
                &mut stop,
                &mut progress,
            ))
            .catch_unwind()
            .await;
            stopped = match flushed {
                Ok(stopped) => stopped,
                Err(panic) => {
                    flush_panicked(&keys, &jobs[part], &progress, &*panic);
                    false
                }
            };
        }
        items.clear();
        jobs.clear();
        unflushed.fetch_sub(sent, Ordering::AcqRel);
        if stopped {
            return leave_queued(&mut rx);
        }
    }
}

/// The results one `ack.lua` call carries at most (64 MiB), unless a single
/// result is larger: it then goes in a call of its own. Redis refuses a call
/// above its query-buffer limit (1 GB by default): 64 acks of large results
/// in one call failed the ack of every job of the batch, again at each
/// redelivery.
const ACK_CALL_RESULT_BYTES: usize = 64 * 1024 * 1024;

/// The batch's items split, in order, into the ranges one `ack.lua` call
/// each sends: as many items as fit in `max_bytes` of results (at least one
/// per call). A batch of small results is one range.
fn call_parts(items: &[AckItem], max_bytes: usize) -> Vec<std::ops::Range<usize>> {
    let mut parts = Vec::with_capacity(1);
    let (mut start, mut bytes) = (0, 0usize);
    for (i, item) in items.iter().enumerate() {
        let len = item.result_ref.as_ref().map_or(0, Vec::len);
        if i > start && bytes.saturating_add(len) > max_bytes {
            parts.push(start..i);
            (start, bytes) = (i, 0);
        }
        bytes = bytes.saturating_add(len);
    }
    if start < items.len() {
        parts.push(start..items.len());
    }
    parts
}

/// At the shutdown's stop: closes the channel (a runner still sending
/// hears the acker is gone) and logs every ack still queued as left leased.
fn leave_queued(rx: &mut mpsc::Receiver<AckRequest>) {
    rx.close();
    while let Ok(req) = rx.try_recv() {
        req.job.span.in_scope(|| {
            warn!("shutdown: the worker stopped before the job's ack was sent; the job stays leased and the watchdog returns it when its lease expires")
        });
    }
}

/// Moves queued acks into `batch` up to `max`, without waiting. True when
/// every sender is gone and nothing is left: flush now (shutdown).
fn take_queued(
    rx: &mut mpsc::Receiver<AckRequest>,
    batch: &mut Vec<AckRequest>,
    max: usize,
) -> bool {
    while batch.len() < max {
        match rx.try_recv() {
            Ok(req) => batch.push(req),
            Err(mpsc::error::TryRecvError::Empty) => return false,
            Err(mpsc::error::TryRecvError::Disconnected) => return true,
        }
    }
    false
}

/// How far a flush got, read after a panic in it.
#[derive(Default)]
struct Progress {
    /// An `ack.lua` call is on its way (its outcome unknown until it answers).
    in_flight: bool,
    /// A call whose outcome is unknown (a timeout, a lost reply) was made:
    /// the acks may have been recorded.
    maybe_landed: bool,
    /// The script's answer, once it came.
    replies: Option<Vec<AckReply>>,
    /// The jobs whose outcome was logged and counted, from the first.
    reported: usize,
}

/// One `ack.lua` call for the batch (retried on Redis failures until the
/// batch's deadline), then the per-job outcome: log line, metrics. True when
/// the worker's `stop` ended it first (the batch's jobs are logged as left
/// leased): the acker then ends. `progress` tells a caught panic how far it
/// got.
async fn flush(
    inner: &Inner,
    keys: &QueueKeys,
    items: &[AckItem],
    jobs: &[AckedJob],
    stop: &mut watch::Receiver<bool>,
    progress: &mut Progress,
) -> bool {
    let deadline = jobs.iter().map(|j| j.deadline).min();
    let mut delay = Duration::from_millis(50);
    let replies = loop {
        if *stop.borrow() {
            leave_batch(jobs, progress.maybe_landed);
            return true;
        }
        let mut conn = inner.conn.clone();
        let call = Ack {
            keys,
            worker: &inner.identity.name,
            items,
            retention: inner.config.completion_retention,
            compact: inner.config.compact_records,
        };
        progress.in_flight = true;
        let res = tokio::select! {
            biased;
            res = call.run(&mut conn) => res,
            _ = wait_true(stop) => {
                // The call was sent, or may have been: it may land.
                leave_batch(jobs, true);
                return true;
            }
        };
        progress.in_flight = false;
        match res {
            Ok(replies) => break replies,
            Err(e)
                if is_redis_failure(&e) && deadline.is_some_and(|d| Instant::now() + delay < d) =>
            {
                progress.maybe_landed |= e.outcome_unknown();
                warn!(queue = %keys.queue, jobs = items.len(), error = %e, retry_in_ms = delay.as_millis() as u64, "could not record the jobs' results; retrying");
                tokio::select! {
                    biased;
                    _ = tokio::time::sleep(delay) => {}
                    _ = wait_true(stop) => {
                        leave_batch(jobs, progress.maybe_landed);
                        return true;
                    }
                }
                delay = (delay * 2).min(Duration::from_secs(2));
            }
            Err(e) => {
                let maybe = progress.maybe_landed || e.outcome_unknown();
                for req in jobs {
                    if maybe {
                        req.span.in_scope(|| error!(error = %e, "could not confirm the job's result: it may have been recorded; if not, the watchdog returns it when its lease expires"));
                    } else {
                        req.span.in_scope(|| error!(error = %e, "could not record the job's result; the watchdog will return it when its lease expires"));
                    }
                }
                return false;
            }
        }
    };
    let replies = &*progress.replies.insert(replies);
    for (req, reply) in jobs.iter().zip(replies) {
        let _entered = req.span.enter();
        match reply {
            AckReply::Completed | AckReply::AlreadyCompleted => {
                info!("completed");
                crate::metrics::finished(&req.labels, "completed", Some(req.elapsed));
            }
            AckReply::LeaseLost => warn!("result discarded: lease lost"),
            AckReply::Unreadable => {
                error!("result discarded: the job hash is not readable (wrong type); the watchdog will deal with it")
            }
        }
        progress.reported += 1;
    }
    false
}

/// At the shutdown's stop, during a flush: the batch's jobs stay leased
/// (their ack may have landed when `maybe` a call was on its way).
fn leave_batch(jobs: &[AckedJob], maybe: bool) {
    for req in jobs {
        if maybe {
            req.span.in_scope(|| warn!("shutdown: the worker stopped waiting for Redis to record the job's result; it may have been recorded; if not, the job stays leased and the watchdog returns it when its lease expires"));
        } else {
            req.span.in_scope(|| warn!("shutdown: the worker stopped before the job's result was recorded; the job stays leased and the watchdog returns it when its lease expires"));
        }
    }
}

/// A flush panicked: logs, in each job's span, what is known of the jobs
/// whose outcome it had not reported yet. The logging is guarded too (a
/// tracing layer that panicked may panic again); the acker goes on either
/// way.
fn flush_panicked(
    keys: &QueueKeys,
    jobs: &[AckedJob],
    progress: &Progress,
    panic: &(dyn std::any::Any + Send),
) {
    let msg = panic_message(panic);
    let report = || {
        error!(queue = %keys.queue, jobs = jobs.len(), panic = %msg, "the acker panicked while recording a batch of results; it goes on with the next acks");
        let maybe = progress.in_flight || progress.maybe_landed;
        for (i, req) in jobs.iter().enumerate().skip(progress.reported) {
            let known = match progress.replies.as_ref().and_then(|r| r.get(i)) {
                Some(AckReply::Completed | AckReply::AlreadyCompleted) => {
                    "its ack was recorded: the job is complete (its outcome was not logged nor counted)"
                }
                Some(AckReply::LeaseLost) => "the ack answered lease lost: its result was discarded",
                Some(AckReply::Unreadable) => {
                    "the ack answered that the job hash is not readable: its result was discarded"
                }
                None if maybe => {
                    "its ack may have been recorded; if not, the watchdog returns it when its lease expires"
                }
                None => {
                    "its ack was not recorded: the job stays leased and the watchdog returns it when its lease expires"
                }
            };
            req.span.in_scope(
                || error!(panic = %msg, "the acker panicked recording the job's result: {known}"),
            );
        }
    };
    // A second panic (the same layer on these lines) has been printed by
    // the panic hook; nothing more to do with it.
    let _ = std::panic::catch_unwind(AssertUnwindSafe(report));
}

#[cfg(test)]
mod call_parts_tests {
    use super::{call_parts, AckItem};
    use crate::job::JobId;

    fn item(result: usize) -> AckItem {
        AckItem {
            id: JobId::from("j"),
            token: String::new(),
            result_ref: (result > 0).then(|| vec![0; result]),
            claimed: None,
            far_from_tail: false,
        }
    }

    /// Small results go in one call; large ones are split so that a call
    /// carries at most the cap, and a result above the cap goes alone.
    #[test]
    fn a_batch_is_split_by_its_result_bytes() {
        let sizes = |v: &[usize]| v.iter().map(|&n| item(n)).collect::<Vec<_>>();
        assert_eq!(call_parts(&sizes(&[1, 0, 3, 2]), 10), vec![0..4]);
        assert_eq!(
            call_parts(&sizes(&[6, 5, 4, 1, 20, 2]), 10),
            vec![0..1, 1..4, 4..5, 5..6]
        );
        assert_eq!(call_parts(&sizes(&[20]), 10), vec![0..1]);
        assert!(call_parts(&[], 10).is_empty());
    }
}
