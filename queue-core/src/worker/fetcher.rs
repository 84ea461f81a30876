//! The fetcher: one task per queue that turns free concurrency permits into
//! running jobs.
//!
//! It waits for a free [`Slot`], first serves queues of higher priority (one
//! job each), takes as many more free slots as `fetch_batch` allows, and
//! moves and claims that many jobs with one script (`fetch.lua`: atomic, one
//! round trip). Only when the queue is empty does it block in `BLMOVE` on its
//! own connection (a blocking command would stall the shared one; BLMOVE
//! cannot run in a script) and claim the id with `claim.lua`; a crash between
//! the two leaves an unleased id the watchdog recovers (DESIGN rule 4,
//! docs/DESIGN.md). The blocking wait holds no slot (the worker's other
//! queues may use them all meanwhile); the job it hands over takes a free
//! one, or goes back to the head of main unclaimed when none is free.
//!
//! Both scripts are idempotent for their token, so a fetch or claim whose
//! reply was lost (timeout, dropped connection, failover) is retried with the
//! same token for as long as the fetch's receipt lives (half a lease, at least 11 s, less the
//! response timeout) and gets the same deliveries; the hard stop ends the retries. Each
//! row is decoded on its own: a row that does not decode is dead-lettered alone.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use futures::stream::{FuturesUnordered, StreamExt};
use futures::FutureExt;
use std::panic::AssertUnwindSafe;

use tokio::sync::{watch, Semaphore};
use tracing::{debug, error, info, info_span, warn, Instrument};

use super::acker::AckSender;
use super::runner::JobRunner;
use super::slots::{Slot, WorkerQueue};
use super::{Inner, WorkerIdentity};
use crate::conn::RedisConnection;
use crate::error::{QueueError, Result};
use crate::job::JobId;
use crate::keys::QueueKeys;
use crate::scripts::claim::{Claim, ClaimRow, Delivery, Skip, Unreadable};
use crate::scripts::fail::{Fail, FailKind, FailReply};
use crate::scripts::fetch::{Fetch, FetchReply};

/// Most `fetch.lua` calls one fetcher keeps in flight while its queue has a
/// backlog: one landing (its jobs starting) while the next is on its way.
const PIPELINE_DEPTH: usize = 2;

/// A pipelined fetch as it lands: its slots, how many jobs it asked for, the reply.
type Landed = (Vec<Slot>, usize, Result<FetchReply>);

/// The pipelined fetches of one fetcher.
type InFlight = FuturesUnordered<Pin<Box<dyn Future<Output = Landed> + Send>>>;

/// First pause before a fetch or claim is retried with the same token.
const FIRST_RETRY_PAUSE: Duration = Duration::from_millis(50);

/// Longest decoding error kept in the dead-letter reason of an unreadable row.
const REASON_CHARS: usize = 300;

/// The span of a job's run, with the producer's trace adopted. A tracing
/// layer of the user's that panics here (it is called when the span opens)
/// costs the job its span, not its run: the job runs without one. Before,
/// the panic unwound the fetcher with the fetch's jobs claimed and not
/// started (each burned an attempt when the watchdog returned it).
fn job_span(queue: &str, delivery: &Delivery, worker: &WorkerIdentity) -> tracing::Span {
    std::panic::catch_unwind(|| {
        let span = info_span!("job", queue = %queue, job_id = %delivery.id, job_type = %delivery.job_type, attempt = delivery.attempt, worker = %worker);
        crate::trace_context::adopt(&span, delivery.traceparent.as_deref());
        span
    })
    .unwrap_or_else(|_| tracing::Span::none())
}

/// Fetches jobs of one queue (and, by priority, of higher ones).
#[derive(Clone)]
pub(super) struct Fetcher {
    pub(super) inner: Arc<Inner>,
    /// Index of this fetcher's queue in `inner.queues`.
    pub(super) me: usize,
    /// This fetcher's own connection, for `BLMOVE`.
    pub(super) blocking: RedisConnection,
    /// The worker-wide concurrency limit.
    pub(super) sem: Arc<Semaphore>,
    pub(super) stop: watch::Receiver<bool>,
    pub(super) hard_stop: watch::Receiver<bool>,
    /// Each queue's acker, by index in `inner.queues`.
    pub(super) ackers: Arc<Vec<AckSender>>,
}

impl Fetcher {
    fn queue(&self) -> &WorkerQueue {
        &self.inner.queues[self.me]
    }

    /// Whether a shutdown was requested (or the worker dropped): no new
    /// fetch may start.
    fn stopping(&self) -> bool {
        crate::background::stop_requested(&self.stop)
    }

    /// Fetches and dispatches until the stop flag turns true. The worker
    /// runs it under `background::supervised`, on a clone of the fetcher
    /// at each start: a panic (a bug, or code of the user's run in this
    /// task) starts it again instead of ending the queue's fetching for
    /// the worker's life; the jobs of the fetch it was dispatching stay
    /// leased until the watchdog returns them. A job's span opens under a
    /// guard of its own ([`job_span`]): a tracing layer that panics there
    /// does not reach this.
    pub(super) async fn run(mut self) {
        let queue = self.queue().keys.queue.clone();
        let mut error_delay = Duration::from_millis(100);
        // The last blocking wait timed out: the queue was empty, so the next
        // fetch goes straight back to BLMOVE (no fetch script that would
        // find nothing): an idle worker makes one call per block timeout.
        let mut idle = false;
        // The last fetch came back full: jobs are likely waiting, so fetches
        // are pipelined (see `run_pipelined`) until one comes back short.
        let mut backlog = false;
        let mut in_flight: InFlight = FuturesUnordered::new();
        loop {
            if self.stopping() {
                break;
            }
            if backlog || !in_flight.is_empty() {
                if !self
                    .run_pipelined(&mut in_flight, &mut backlog, &mut error_delay)
                    .await
                {
                    break;
                }
                continue;
            }
            let Some(first) = self.wait_slot().await else {
                break;
            };
            // Strict priority: while a higher-priority queue has jobs (and room
            // under its own limit), take from it first, one job per check.
            let Some(first) = self.serve_higher_priority(first).await else {
                continue;
            };
            if self.stopping() {
                break; // requested while a slot was awaited
            }
            let mut slots = vec![first];
            self.fill(&mut slots);
            let asked = slots.len();
            let keys = self.queue().keys.clone();
            match self.fetch(&keys, &mut slots, idle).await {
                Ok(FetchReply::Paused) => self.wait_while_paused(slots).await,
                Ok(FetchReply::Limited(wait)) => self.wait_while_limited(slots, wait).await,
                // The blocking wait timed out: BLMOVE again, unless group jobs
                // wait (BLMOVE only watches main; docs/GROUPS.md).
                Ok(FetchReply::Rows(rows)) if rows.is_empty() => {
                    idle = !self.groups_waiting(&keys).await
                }
                Ok(FetchReply::Rows(rows)) => {
                    idle = false;
                    error_delay = Duration::from_millis(100);
                    backlog = asked > 1 && rows.len() == asked && self.may_pipeline();
                    self.run_fetched(rows, &mut slots).await;
                }
                Err(e) => self.pause_after_error(&e, &mut error_delay).await,
            }
        }
        // Stopping: the fetches in flight claimed their jobs already; they
        // run within the grace period like any other.
        while let Some(landed) = in_flight.next().await {
            if let (mut slots, _, Ok(FetchReply::Rows(rows))) = landed {
                self.dispatch(self.me, rows, &mut slots);
            }
        }
        debug!(queue = %queue, "fetcher stopped");
    }

    /// One step of the pipelined mode, entered when a fetch of more than one
    /// job came back full (a backlog; one free slot has nothing to overlap): up to [`PIPELINE_DEPTH`] `fetch.lua` calls in flight, so
    /// the next batch is on its way while the last one runs. A fetch is sent
    /// with the slots free when it is sent and no more (nothing is claimed
    /// ahead of a free slot, so no lease ticks for a job that waits for one),
    /// and, while another is in flight, only once a whole `fetch_batch` of
    /// slots is free: fetches stay full. It ends (`backlog` false) when a
    /// fetch comes back short, paused, limited or failed, and once the last
    /// fetch in flight landed the serial loop (BLMOVE when empty, priority,
    /// pause and limit waits) takes over. False: stop (no fetch is launched
    /// once it is requested).
    async fn run_pipelined(
        &mut self,
        in_flight: &mut InFlight,
        backlog: &mut bool,
        error_delay: &mut Duration,
    ) -> bool {
        let batch = self.queue().fetch_batch;
        let mut slots = Vec::new();
        while *backlog && in_flight.len() < PIPELINE_DEPTH {
            // Checked before each launch: `select!` below may have taken a
            // landed fetch or a slot while the stop request came.
            if self.stopping() {
                return false;
            }
            self.fill(&mut slots);
            if slots.len() >= batch || (in_flight.is_empty() && !slots.is_empty()) {
                self.launch(std::mem::take(&mut slots), in_flight);
                continue;
            }
            if in_flight.is_empty() {
                match self.wait_slot().await {
                    Some(slot) => slots.push(slot),
                    None => return false,
                }
                continue;
            }
            tokio::select! {
                Some(landed) = in_flight.next() => {
                    self.landed(landed, backlog, error_delay).await;
                }
                slot = self.wait_slot() => match slot {
                    Some(slot) => slots.push(slot),
                    None => return false,
                },
            }
        }
        drop(slots); // the pipeline ended, or is full: let them go until needed
        if let Some(landed) = in_flight.next().await {
            self.landed(landed, backlog, error_delay).await;
        }
        true
    }

    /// Sends one `fetch.lua` call for `slots.len()` jobs without waiting for it.
    fn launch(&self, slots: Vec<Slot>, in_flight: &mut InFlight) {
        let inner = self.inner.clone();
        let keys = self.queue().keys.clone();
        let hard_stop = self.hard_stop.clone();
        in_flight.push(Box::pin(async move {
            let asked = slots.len();
            let reply = fetch_ready(&inner, &keys, asked, &hard_stop).await;
            (slots, asked, reply)
        }));
    }

    /// A pipelined fetch came back: dispatch its rows; anything but a full
    /// batch ends the pipeline (the serial loop then sees the pause, limit,
    /// empty queue or error itself).
    async fn landed(
        &mut self,
        (mut slots, asked, reply): Landed,
        backlog: &mut bool,
        error_delay: &mut Duration,
    ) {
        match reply {
            Ok(FetchReply::Rows(rows)) => {
                *backlog &= rows.len() == asked;
                *error_delay = Duration::from_millis(100);
                self.dispatch(self.me, rows, &mut slots);
            }
            Ok(FetchReply::Paused | FetchReply::Limited(_)) => *backlog = false,
            Err(e) => {
                *backlog = false;
                drop(slots);
                self.pause_after_error(&e, error_delay).await;
            }
        }
    }

    /// Whether this queue's fetches may be pipelined: only when no queue of
    /// this worker has a higher priority (strict priority checks those
    /// before every fetch of this one).
    fn may_pipeline(&self) -> bool {
        let mine = self.queue().priority;
        !self.inner.queues.iter().any(|q| q.priority > mine)
    }

    /// Adds free slots to `slots` up to `fetch_batch`, without waiting.
    fn fill(&self, slots: &mut Vec<Slot>) {
        while slots.len() < self.queue().fetch_batch {
            match self.try_slot() {
                Some(s) => slots.push(s),
                None => break,
            }
        }
    }

    /// Claims up to `slots.len()` ready jobs; when there are none (or the
    /// queue was `idle`: the last blocking wait timed out), gives its slots
    /// back and blocks for the next job (a pause is then seen by
    /// `claim.lua`). No rows: the block timed out.
    ///
    /// The blocking wait holds no slot, so the worker's other queues may
    /// use every slot meanwhile: an idle queue whose fetcher held the last
    /// slot for a whole block timeout let a busy queue run one job per block
    /// timeout (concurrency 1, two queues). The job the wait hands over
    /// takes a free slot; with none free it goes back to the head of main
    /// unclaimed ([`Skip::NoSlot`]) and the fetcher fetches it again once it
    /// holds a slot.
    async fn fetch(
        &mut self,
        keys: &QueueKeys,
        slots: &mut Vec<Slot>,
        idle: bool,
    ) -> Result<FetchReply> {
        if !idle {
            match self.fetch_ready(keys, slots.len()).await? {
                FetchReply::Rows(rows) if rows.is_empty() => {}
                ready => return Ok(ready),
            }
        }
        slots.clear();
        Ok(match self.fetch_blocking(slots).await? {
            Some(ClaimRow::Skipped(id, Skip::Paused)) => {
                info!(queue = %keys.queue, job_id = %id, "{}", Skip::Paused.reason());
                FetchReply::Paused
            }
            Some(ClaimRow::Skipped(_, Skip::Limited(ms))) => {
                FetchReply::Limited(Duration::from_millis(ms))
            }
            row => FetchReply::Rows(row.into_iter().collect()),
        })
    }

    /// Waits for this queue's permit (if limited), then a worker-wide one.
    async fn wait_slot(&mut self) -> Option<Slot> {
        let inner = self.inner.clone();
        let queue = tokio::select! {
            p = inner.queues[self.me].queue_permit() => p?,
            _ = self.stop.changed() => return None,
        };
        let global = tokio::select! {
            p = self.sem.clone().acquire_owned() => p.ok()?,
            _ = self.stop.changed() => return None,
        };
        Some(Slot { global, queue })
    }

    fn try_slot(&self) -> Option<Slot> {
        let queue = self.queue().try_queue_permit()?;
        let global = self.sem.clone().try_acquire_owned().ok()?;
        Some(Slot { global, queue })
    }

    /// Tries the queues with a higher priority than this one; returns the
    /// slot back when none had a job for it.
    async fn serve_higher_priority(&self, slot: Slot) -> Option<Slot> {
        let mine = self.queue().priority;
        for (i, q) in self.inner.queues.iter().enumerate() {
            if i == self.me || q.priority <= mine {
                continue;
            }
            let Some(queue_permit) = q.try_queue_permit() else {
                continue;
            };
            match self.fetch_ready(&q.keys, 1).await {
                Ok(FetchReply::Paused | FetchReply::Limited(_)) => continue, // skipped while paused or limited
                Ok(FetchReply::Rows(rows))
                    if rows.iter().any(|r| matches!(r, ClaimRow::Claimed(_))) =>
                {
                    let mut slots = vec![Slot {
                        global: slot.global,
                        queue: queue_permit,
                    }];
                    self.dispatch(i, rows, &mut slots);
                    return None;
                }
                Ok(FetchReply::Rows(rows)) => self.dispatch(i, rows, &mut Vec::new()),
                Err(e) => warn!(queue = %q.keys.queue, error = %e, "priority fetch failed"),
            }
        }
        Some(slot)
    }

    /// Spawns a runner for each claimed row of queue `qi` (index in
    /// `inner.queues`), each holding one slot.
    fn dispatch(&self, qi: usize, rows: Vec<ClaimRow>, slots: &mut Vec<Slot>) {
        let kept = self.dispatch_or_keep(qi, rows, slots, false);
        debug_assert!(kept.is_empty(), "every runner was spawned");
    }

    /// Runs the jobs of a fetch of this fetcher's own queue: in this task
    /// when the worker runs one job at a time (its only slot is taken, so
    /// there is nothing to fetch until the job ends; a task per job cost a
    /// spawn and two thread wake-ups per job, about three context switches
    /// instead of one, docs/BENCHMARKS.md "Stop 26"), else each in a task of
    /// its own. A panic of the runner itself is caught and logged (a
    /// handler's panic is already a failed attempt): the fetcher goes on.
    async fn run_fetched(&self, rows: Vec<ClaimRow>, slots: &mut Vec<Slot>) {
        let inline = self.inner.config.concurrency == 1;
        for job in self.dispatch_or_keep(self.me, rows, slots, inline) {
            if AssertUnwindSafe(job).catch_unwind().await.is_err() {
                error!(queue = %self.queue().keys.queue, "job runner panicked; its job stays leased until the watchdog returns it");
            }
        }
    }

    /// [`dispatch`](Self::dispatch), or, with `keep`, the runners returned
    /// to be awaited by the caller instead of spawned.
    fn dispatch_or_keep(
        &self,
        qi: usize,
        rows: Vec<ClaimRow>,
        slots: &mut Vec<Slot>,
        keep: bool,
    ) -> Vec<Pin<Box<dyn Future<Output = ()> + Send>>> {
        let mut kept: Vec<Pin<Box<dyn Future<Output = ()> + Send>>> = Vec::new();
        let keys = &self.inner.queues[qi].keys;
        let queue = &keys.queue;
        for row in rows {
            match row {
                ClaimRow::Claimed(delivery) => {
                    let Some(slot) = slots.pop() else {
                        error!(queue = %queue, job_id = %delivery.id, "claimed more jobs than permits; leaving it leased");
                        continue;
                    };
                    let runner = JobRunner {
                        inner: self.inner.clone(),
                        keys: keys.clone(),
                        hard_stop: self.hard_stop.clone(),
                        acker: self.ackers[qi].clone(),
                    };
                    let span = job_span(queue, &delivery, &self.inner.identity);
                    let job = async move {
                        runner.run(delivery).await;
                        drop(slot);
                    }
                    .instrument(span);
                    // Boxed either way: the runner's future is ~1.8 KB, and
                    // spawned by value tokio copies it several times (into
                    // the task cell, and its stage again when it ends): ~2.5k
                    // instructions per job against one allocation (issue #12,
                    // worker_cost.py).
                    let job: Pin<Box<dyn Future<Output = ()> + Send>> = Box::pin(job);
                    if keep {
                        kept.push(job);
                    } else {
                        tokio::spawn(job);
                    }
                }
                ClaimRow::Skipped(id, why @ (Skip::Deferred | Skip::NoSlot)) => {
                    debug!(queue = %queue, job_id = %id, "{}", why.reason())
                }
                ClaimRow::Skipped(id, why) => {
                    info!(queue = %queue, job_id = %id, "{}", why.reason())
                }
                ClaimRow::Corrupt(id, reason) => {
                    error!(queue = %queue, job_id = %id, reason = %reason, "corrupt job data: dead-lettered")
                }
                ClaimRow::Unreadable(row) => self.dead_letter_unreadable(keys, row),
            }
        }
        kept
    }

    async fn pause_after_error(&mut self, e: &QueueError, delay: &mut Duration) {
        warn!(queue = %self.queue().keys.queue, error = %e, retry_in_ms = delay.as_millis() as u64, "fetch failed; reconnecting with backoff");
        tokio::select! {
            _ = tokio::time::sleep(*delay) => {}
            _ = self.stop.changed() => {}
        }
        *delay = (*delay * 2).min(Duration::from_secs(5));
    }

    /// LMOVE + claim of up to `count` jobs in one script (see [`fetch_ready`]).
    async fn fetch_ready(&self, keys: &QueueKeys, count: usize) -> Result<FetchReply> {
        fetch_ready(&self.inner, keys, count, &self.hard_stop).await
    }

    /// Whether the queue's fair-queuing ring exists (some group has waiting
    /// jobs): one `EXISTS` per block timeout of an idle fetcher. An error
    /// answers true: the next fetch script finds out.
    async fn groups_waiting(&self, keys: &QueueKeys) -> bool {
        let exists: redis::RedisResult<bool> = redis::cmd("EXISTS")
            .arg(keys.groups())
            .query_async(&mut self.inner.conn.clone())
            .await;
        exists.unwrap_or(true)
    }

    /// BLMOVE on the fetcher's own connection, then the claim script.
    /// `BLMOVE`, then `claim.lua` with a free slot pushed onto `slots`; with
    /// none free the id goes back unclaimed and the row says
    /// [`Skip::NoSlot`].
    async fn fetch_blocking(&mut self, slots: &mut Vec<Slot>) -> Result<Option<ClaimRow>> {
        let k = self.queue().keys.clone();
        let moved: Option<Vec<u8>> = redis::cmd("BLMOVE")
            .arg(&k.main)
            .arg(&k.processing)
            .arg("RIGHT")
            .arg("LEFT")
            .arg(self.inner.config.block_timeout.as_secs_f64())
            .query_async(&mut self.blocking)
            .await
            .map_err(|e| QueueError::redis(&k.queue, None, e))?;
        let Some(id) = moved else { return Ok(None) };
        crate::failpoint::hit("after_blmove");
        // A shutdown requested while BLMOVE waited: stop fetching (DESIGN
        // rule 10). The claim script then puts the id back at the head of
        // main unclaimed, atomically (no attempt, no lease), instead of
        // claiming a job the stopping worker may never run.
        let stopping = self.stopping();
        // No free slot (the worker's other queues took them while this one
        // waited): the id goes back the same way, to be fetched again by this
        // fetcher once it holds a slot.
        let no_slot = match self.try_slot() {
            Some(slot) => {
                slots.push(slot);
                false
            }
            None => true,
        };
        // The window of DESIGN rule 4 is here: until the claim lands, the id
        // sits in processing with no lease. Retry the claim briefly; if it
        // never lands, the watchdog adopts the id and returns it.
        let token = random_token();
        let claim = Claim {
            keys: &k,
            id: &id,
            lease: self.inner.config.lease,
            token: &token,
        };
        let job_id = JobId::from(String::from_utf8_lossy(&id).into_owned());
        let first_sent = tokio::time::Instant::now();
        same_token_retries(
            &self.inner,
            &self.hard_stop,
            &k,
            Some(&job_id),
            "claim",
            || {
                let mut conn = self.inner.conn.clone();
                let claim = &claim;
                let me = &self.inner.identity.name;
                async move { claim.run_as(&mut conn, me, stopping || no_slot).await }
            },
        )
        .await
        .map(|row| match row {
            ClaimRow::Skipped(id, Skip::Stopping) if no_slot && !stopping => {
                ClaimRow::Skipped(id, Skip::NoSlot)
            }
            row => row.sent_at(first_sent),
        })
        .map(Some)
    }

    /// Dead-letters the job of a row that does not decode (its reason names
    /// the field), in a task of its own; the batch's other rows run. Without
    /// a readable id and token the job stays leased: the watchdog returns it.
    fn dead_letter_unreadable(&self, keys: &QueueKeys, row: Unreadable) {
        let (Some(id), Some(token)) = (row.id.clone(), row.token) else {
            error!(queue = %keys.queue, job_id = ?row.id.as_ref().map(JobId::as_str), detail = %row.detail,
                "unreadable claim row without a lease token: left to the watchdog");
            return;
        };
        error!(queue = %keys.queue, job_id = %id, detail = %row.detail, "unreadable claim row: dead-lettering the job");
        let (inner, keys) = (self.inner.clone(), keys.clone());
        let hard_stop = self.hard_stop.clone();
        tokio::spawn(async move {
            // The detail names the field first, then quotes the whole row
            // (payload included): the reason keeps the start.
            let detail: String = row.detail.chars().take(REASON_CHARS).collect();
            let message = format!("claim row unreadable: {detail}");
            let fail = Fail {
                keys: &keys,
                id: &id,
                token: &token,
                kind: FailKind::Permanent,
                message: &message,
                delay: Duration::ZERO,
                far_from_tail: false,
            };
            let ended = match fail.run(&mut inner.conn.clone()).await {
                // An operator asked to cancel it: fail.lua wrote nothing, the
                // job ends cancelled (as a runner's would), not leased.
                Ok(FailReply::CancelRequested) => super::cancel::finish_cancel(
                    &inner, &hard_stop, &keys, &id, &token, &message, false,
                )
                .await
                .map(|_| ()),
                other => other.map(|_| ()),
            };
            if let Err(e) = ended {
                warn!(queue = %keys.queue, job_id = %id, error = %e,
                    "cannot dead-letter an unreadable job; the watchdog returns it when its lease expires");
            }
        });
    }
}

/// LMOVE + claim of up to `count` jobs in one script (nothing: paused),
/// retried with the same token base while Redis fails (see
/// [`same_token_retries`]).
async fn fetch_ready(
    inner: &Inner,
    keys: &QueueKeys,
    count: usize,
    hard_stop: &watch::Receiver<bool>,
) -> Result<FetchReply> {
    let token_base = random_token();
    let mut first_try = true;
    let first_sent = tokio::time::Instant::now();
    let reply = same_token_retries(inner, hard_stop, keys, None, "fetch", || {
        // The base was just drawn: only its first try may skip the receipt.
        let fetch = Fetch {
            keys,
            lease: inner.config.lease,
            token_base: &token_base,
            count,
            first_try: std::mem::replace(&mut first_try, false),
        };
        let mut conn = inner.conn.clone();
        let me = &inner.identity.name;
        async move { fetch.run_or_paused_as(&mut conn, me).await }
    })
    .await?;
    Ok(match reply {
        FetchReply::Rows(rows) => {
            FetchReply::Rows(rows.into_iter().map(|r| r.sent_at(first_sent)).collect())
        }
        other => other,
    })
}

/// Runs `op`, a fetch, claim or cancelled end (`finish_cancel.lua`) with one
/// fixed token, retrying Redis failures (not bad replies) with a doubling
/// pause for as long as the fetch's receipt lives, less a margin
/// ([`same_token_window`]), the last retry at the window's end. These
/// scripts answer a retry with the same token as they answered the first
/// try (claim: the hash holds the token; fetch: its receipt lives half a
/// lease; finish_cancel: the record keeps it), so a first try that ran but
/// whose reply was lost is not claimed twice, not answered `busy` or "lease
/// lost", and its jobs run. A row carries the lease its first try took: the
/// callers stamp it with the first try's send time, where the local lease
/// clock starts (a retry's send time let a worker trust its lease up to the
/// retry window beyond the Redis one); a reply that comes after that local
/// deadline gets the late start's extend before its handler runs
/// (heartbeat.rs). Before, the retries ended after a third of a lease while
/// the receipt lived half of one: a reply lost for 10 to 15 s (30 s lease)
/// cost every job of the fetch its attempt (with one attempt, dead-lettered
/// without running). The hard stop (`hard_stop` true) ends the retries and
/// their pause: the worker leaves what is leased to the watchdog, and a
/// fetch retried on would start jobs after the worker stopped.
pub(super) async fn same_token_retries<T, F, Fut>(
    inner: &Inner,
    hard_stop: &watch::Receiver<bool>,
    keys: &QueueKeys,
    job_id: Option<&JobId>,
    what: &str,
    mut op: F,
) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T>>,
{
    let window = same_token_window(inner.config.lease, inner.config.connection.response_timeout);
    let mut hard_stop = hard_stop.clone();
    let started = tokio::time::Instant::now();
    let mut pause = FIRST_RETRY_PAUSE;
    loop {
        let result = op().await;
        let left = window.saturating_sub(started.elapsed());
        match result {
            Err(e) if is_redis_failure(&e) && !left.is_zero() && !*hard_stop.borrow() => {
                let wait = pause.min(left);
                warn!(queue = %keys.queue, job_id = ?job_id.map(JobId::as_str), error = %e,
                    retry_in_ms = wait.as_millis() as u64, "{what} failed; retrying with the same token");
                tokio::select! {
                    _ = tokio::time::sleep(wait) => {}
                    _ = super::wait_true(&mut hard_stop) => {
                        warn!(queue = %keys.queue, job_id = ?job_id.map(JobId::as_str),
                            "{what}: hard stop, no more retries; what it claimed stays leased for the watchdog");
                        return Err(e);
                    }
                }
                pause *= 2;
            }
            result => return result,
        }
    }
}

/// How long a fetch, claim or cancelled end is retried with its token: the
/// life of the fetch's receipt (half a lease, at least 11 s:
/// `scripts::fetch::receipt_life`) less the response timeout, so that the last retry, sent by the window's
/// end, reaches Redis (or is given up by the client) before the receipt
/// expires: 10 s of a 30 s lease with the default 5 s timeout, 14 s with a
/// 1 s timeout. A retry that ran after the receipt expired would be a new
/// fetch under the same token base: its jobs would get the tokens of the
/// first try's still-leased ones (`<base>:1..n`), and a queue rate limit's
/// start log, keyed by token, would count them once. A first version of
/// this window took at most a tenth of the lease as its margin (12 s of
/// 30 s): a retry sent at 12 s could run up to 17 s, after the receipt.
fn same_token_window(lease: Duration, response_timeout: Duration) -> Duration {
    crate::scripts::fetch::receipt_life(lease).saturating_sub(response_timeout)
}

/// A failure to reach Redis or run the command (worth retrying), as opposed
/// to a reply this version does not understand.
pub(super) fn is_redis_failure(e: &QueueError) -> bool {
    matches!(
        e,
        QueueError::Redis { .. } | QueueError::ReadOnlyReplica { .. }
    )
}

/// A fresh random lease token (UUID v4 text) from the thread-local RNG: no
/// system call per fetch, unlike `Uuid::new_v4`.
fn random_token() -> String {
    uuid::Builder::from_random_bytes(rand::random())
        .into_uuid()
        .to_string()
}

#[cfg(test)]
mod window_tests {
    use super::same_token_window;
    use crate::scripts::fetch::receipt_life;
    use std::time::Duration;

    /// The last same-token retry, sent at the window's end and answered
    /// (or given up) within the response timeout, lands while the receipt
    /// lives, whatever the lease and timeout.
    #[test]
    fn the_last_retry_lands_within_the_receipt() {
        let s = Duration::from_secs;
        for lease in [s(1), s(10), s(12), s(30), s(300)] {
            for rt in [Duration::from_millis(250), s(1), s(5), s(10), s(60)] {
                let w = same_token_window(lease, rt);
                assert!(
                    w + rt <= receipt_life(lease) || w.is_zero(),
                    "{lease:?} {rt:?}: {w:?}"
                );
            }
        }
        assert_eq!(same_token_window(s(30), s(5)), s(10));
        // A short lease still leaves a window with the default timeout:
        // before, none at 10 s or less (stop 48 review).
        assert_eq!(same_token_window(s(10), s(5)), s(6));
        assert_eq!(same_token_window(s(2), s(1)), s(10));
    }
}
