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
//! Redis failures are retried until the earliest lease of the batch would
//! have expired anyway (then the watchdog owns those jobs); a retry after a
//! lost reply is safe: the script answers "already acked" for its own token.
//! On shutdown the channel closes once every runner is done, and the acker
//! flushes what is left before it ends.

use std::sync::atomic::{AtomicIsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, Notify};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tracing::{error, info, warn, Span};

use super::fetcher::is_redis_failure;
use super::Inner;
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
    /// When the lease would have expired anyway: no retry after it.
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

/// Starts the acker of queue `keys`. It ends once every [`AckSender`] is
/// dropped and the last batch is flushed.
pub(super) fn spawn(inner: Arc<Inner>, keys: Arc<QueueKeys>) -> (AckSender, JoinHandle<()>) {
    let batch = inner.config.ack_batch.max(1);
    let room = batch
        .max(inner.config.concurrency)
        .saturating_mul(4)
        .min(tokio::sync::Semaphore::MAX_PERMITS);
    let (tx, rx) = mpsc::channel(room);
    let fill = Arc::new(Notify::new());
    let unflushed = Arc::new(AtomicIsize::new(0));
    let task = tokio::spawn(run(inner, keys, rx, fill.clone(), unflushed.clone()));
    let sender = AckSender {
        tx,
        wake: Arc::new(WakeOnDrop(fill)),
        unflushed,
        batch: batch as isize,
    };
    (sender, task)
}

async fn run(
    inner: Arc<Inner>,
    keys: Arc<QueueKeys>,
    mut rx: mpsc::Receiver<AckRequest>,
    fill: Arc<Notify>,
    unflushed: Arc<AtomicIsize>,
) {
    let max = inner.config.ack_batch.max(1);
    let window = inner.config.ack_window;
    let mut batch = Vec::with_capacity(max);
    loop {
        if rx.recv_many(&mut batch, max).await == 0 {
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
                }
            }
        }
        let sent = batch.len() as isize;
        flush(&inner, &keys, &mut batch).await;
        unflushed.fetch_sub(sent, Ordering::AcqRel);
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

/// One `ack.lua` call for the batch (retried on Redis failures), then the
/// per-job outcome: log line, metrics. Leaves `batch` empty.
async fn flush(inner: &Inner, keys: &QueueKeys, batch: &mut Vec<AckRequest>) {
    let (items, jobs): (Vec<AckItem>, Vec<AckedJob>) =
        batch.drain(..).map(|r| (r.item, r.job)).unzip();
    let deadline = jobs.iter().map(|j| j.deadline).min();
    let mut delay = Duration::from_millis(50);
    let replies = loop {
        let mut conn = inner.conn.clone();
        let res = Ack {
            keys,
            worker: &inner.identity.name,
            items: &items,
            retention: inner.config.completion_retention,
            compact: inner.config.compact_records,
        }
        .run(&mut conn)
        .await;
        match res {
            Ok(replies) => break replies,
            Err(e)
                if is_redis_failure(&e) && deadline.is_some_and(|d| Instant::now() + delay < d) =>
            {
                warn!(queue = %keys.queue, jobs = items.len(), error = %e, retry_in_ms = delay.as_millis() as u64, "could not record the jobs' results; retrying");
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(Duration::from_secs(2));
            }
            Err(e) => {
                for req in jobs {
                    req.span.in_scope(|| error!(error = %e, "could not record the job's result; the watchdog will return it when its lease expires"));
                }
                return;
            }
        }
    };
    for (req, reply) in jobs.into_iter().zip(replies) {
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
    }
}
