//! Group commit of concurrent single enqueues on one [`Queue`](crate::Queue)
//! (its clones share it, as they share the multiplexed connection).
//!
//! The enqueues of one queue that overlap wait in the queue's lane, and the
//! lane's calls go out one at a time: each `enqueue_many.lua` call carries
//! everything waiting when it leaves (at most
//! [`MAX_JOBS_PER_CALL`](crate::scripts::enqueue_many::MAX_JOBS_PER_CALL)).
//! The lane's sender is one future, its *driver*, shared by every caller
//! waiting in the lane: each caller awaits its own reply and, meanwhile,
//! polls the driver, so the lane moves while any of its callers is polled
//! and no caller depends on another being polled. A caller that finds
//! another one inside the driver (on another thread) comes back until its
//! own poll gets inside: `Shared` wakes only the callers registered when the
//! driver wakes it ([`Driver::poll_for`]). The driver lets the
//! scheduler run once (`yield_now`, no timer) before it takes the waiting
//! jobs, sends them, answers each caller, and goes on with whoever joined
//! meanwhile; a call that returns with nobody waiting removes the lane at
//! once. No task is spawned: a lone producer sends each enqueue in its own
//! future (issue #12: a hand-on task per call cost it a spawn and a wake-up
//! per enqueue). A job waits at most for the call ahead of it and one
//! scheduler turn. A full lane (4 calls' worth) sends the newcomer alone.
//! A turn's deferred wake comes when the runtime thread that started it
//! parks or yields: a task that blocks that thread (blocking code in async
//! code) holds up the lane's callers on the other threads until it returns.
//!
//! The scheduler turn is what keeps the calls full under load: the callers a
//! call just answered, when they enqueue again at once (a producer loop, a
//! burst of requests), join the next call. Before, the first of them led a
//! call alone and the rest followed in another: 16 looping producers took
//! twice the calls, 8.6 jobs per call instead of 10.5–13.9 (issue #12).
//!
//! Every caller gets its own result: `Ok` only from the script's reply for its
//! own job (DESIGN rule 8); a job refused by validation is sent again alone,
//! so only its caller gets the script's error; a job's reply that does not
//! decode fails only that job's caller (the others keep the outcomes the
//! call gave them: their jobs were written); a failed call fails each of its
//! callers with the error naming that caller's job. Retries follow
//! `Queue::retry_window` (the shortest of the call's callers), with each
//! job's own enqueue token, and never skip the dedupe reads.
//!
//! A caller that stops waiting (cancelled, or its task panics) leaves its
//! job in the lane: the lane's next call carries it, as before. When every
//! caller of a lane has stopped waiting, the driver is dropped: a call in
//! flight then is finished once in a task of its own (`InFlight`, unless a
//! caller's retry window is zero), and jobs still waiting are handed to a
//! new driver in a task of its own (`DriverEnd`).
//!
//! Before (stops 28–44), the first caller of a lane sent its calls inside
//! its own future and the others waited for it: an enqueue future kept alive
//! without being polled while its task awaited another enqueue on the same
//! queue (`tokio::select!` on `&mut fut`) held up every enqueue that joined
//! it, for ever in one task (a "futurelock"); a stop-44 change that sent
//! joined calls from a task of their own removed that but lost the batching
//! (16 looping producers: 12–14 jobs per call instead of 16), and was not
//! kept.

use std::collections::HashMap;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::Poll;
use std::time::Duration;

use futures::future::{BoxFuture, Shared, WeakShared};
use futures::FutureExt;
use tokio::sync::oneshot;
use tracing::{debug, error};

use crate::conn::RedisConnection;
use crate::error::{QueueError, Result};
use crate::job::JobId;
use crate::keys::QueueKeys;
use crate::queue::{script_job, with_retries, EnqueueOptions};
use crate::scripts::enqueue::EnqueueReply;
use crate::scripts::enqueue_many::{self, ManyJob, ManyReply, Mode, MAX_JOBS_PER_CALL};

/// One enqueue, ready to send (validated id, encoded payload, own token).
pub(crate) struct PendingJob {
    pub(crate) id: JobId,
    pub(crate) job_type: String,
    pub(crate) schema_version: u32,
    pub(crate) max_attempts: u32,
    pub(crate) opts: EnqueueOptions,
    pub(crate) payload: Vec<u8>,
    /// Unique per enqueue call, kept across its retries.
    pub(crate) token: String,
    /// The id was generated for this call (it cannot exist yet).
    pub(crate) generated: bool,
    /// The caller's `Queue::retry_window`.
    pub(crate) retry_window: Duration,
}

/// A caller waiting for the next call of its lane.
struct Waiter {
    job: PendingJob,
    tx: oneshot::Sender<Result<EnqueueReply>>,
}

/// A lane's sender ([`drive`]), shared by the callers waiting in the lane,
/// with the scheduler turns it waits ([`Turns`]).
#[derive(Clone)]
struct Driver {
    future: Shared<BoxFuture<'static, ()>>,
    turns: Arc<Turns>,
}

/// The scheduler turns of one driver: turn `n` has passed once `passed`
/// reaches `n` ([`SchedulerTurn`]).
#[derive(Default)]
struct Turns {
    /// The number of the turn the driver waits on (or last waited on).
    started: AtomicU64,
    /// The highest turn known to have passed.
    passed: AtomicU64,
    /// The last turn whose deferred wake came at once (no scheduler on the
    /// thread that started it): its pollers' second polls end it.
    immediate: AtomicU64,
}

thread_local! {
    /// Set when a driver is polled on this thread ([`Inside`]): tells
    /// [`Driver::poll_for`] whether its poll reached the driver.
    static INSIDE: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// A driver's future, marking the thread [`INSIDE`] at each poll.
struct Inside(BoxFuture<'static, ()>);

impl Future for Inside {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> Poll<()> {
        INSIDE.with(|inside| inside.set(true));
        self.0.as_mut().poll(cx)
    }
}

impl Driver {
    /// Polls the driver for a poller that last saw it wait on turn `seen`:
    /// in a turn without a deferred wake (see [`SchedulerTurn`]), a poller
    /// polled again within it was woken and run again since, so the turn
    /// has passed.
    fn poll_for(&mut self, seen: &mut Option<u64>, cx: &mut std::task::Context<'_>) -> Poll<()> {
        let turns = &self.turns;
        let turn = turns.started.load(Ordering::Acquire);
        if *seen == Some(turn) && turns.immediate.load(Ordering::Acquire) == turn {
            turns.pass(turn);
        }
        let outer = INSIDE.with(|inside| inside.replace(false));
        let polled = Pin::new(&mut self.future).poll(cx);
        let reached = INSIDE.with(|inside| inside.replace(outer));
        if polled.is_pending() {
            let now = turns.started.load(Ordering::Acquire);
            // Another poller was inside the driver (on another thread):
            // `Shared` answered `Pending` without polling it, and wakes only
            // the pollers registered when the driver wakes it. The driver
            // may have woken them (a reply, a turn's wake) before this one
            // was registered, or not have seen the turn this visit passed;
            // if the poller inside then leaves (answered, or cancelled), no
            // wake is left to come: come back until a visit gets inside
            // (futures-rs issue 2706; stop 47: threads looping on
            // `Handle::block_on` hung, 1 CI run in ~180 on a loaded machine).
            // A turn without a deferred wake, seen here for the first time
            // and not passed: its one wake may have gone to another poller
            // (one kept unpolled, say), and nothing else is bound to poll
            // this one again: come back once, to end it.
            if !reached
                || (*seen != Some(now)
                    && turns.immediate.load(Ordering::Acquire) == now
                    && turns.passed.load(Ordering::Acquire) < now)
            {
                cx.waker().wake_by_ref();
            }
            *seen = Some(now);
        }
        polled
    }

    /// Polls the driver to its end (a task a dropped driver hands its lane
    /// to).
    async fn run(mut self) {
        let mut seen = None;
        std::future::poll_fn(move |cx| self.poll_for(&mut seen, cx)).await
    }
}

impl Turns {
    fn pass(&self, turn: u64) {
        self.passed.fetch_max(turn, Ordering::AcqRel);
    }
}

/// The enqueues of one queue waiting for the lane's next call. A lane exists
/// while its driver has work (its presence is the "in flight" flag).
#[derive(Default)]
struct Lane {
    waiting: Vec<Waiter>,
    /// The lane's driver, held by its waiting callers only: when all of them
    /// have stopped waiting it is dropped and this no longer upgrades.
    driver: Option<(WeakShared<BoxFuture<'static, ()>>, Arc<Turns>)>,
    /// Which driver `driver` is (see [`DriverEnd`]).
    generation: u64,
}

/// The lanes of one `Queue` and its clones, one per queue name.
#[derive(Default)]
pub(crate) struct GroupCommit {
    lanes: Mutex<HashMap<String, Lane>>,
    /// Numbers the drivers, so that a dropped one touches only its own lane.
    generations: AtomicU64,
}

/// Waiters beyond this many (per queue) send alone: bounded memory.
const MAX_WAITING: usize = 4 * MAX_JOBS_PER_CALL;

/// What [`GroupCommit::admit`] decided for a call.
enum Admit {
    /// Waits in the lane: await the reply while driving the lane.
    Wait(oneshot::Receiver<Result<EnqueueReply>>, Driver),
    /// The lane is full: send alone, outside the group (boxed: the rare
    /// case keeps the common one small).
    Alone(Box<PendingJob>),
}

impl GroupCommit {
    fn lanes(&self) -> MutexGuard<'_, HashMap<String, Lane>> {
        self.lanes.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Enqueues `job` through the lane of `queue` (or, the lane full, alone)
    /// and answers the job's own reply.
    pub(crate) async fn enqueue(
        self: &Arc<Self>,
        conn: &RedisConnection,
        keys: Arc<QueueKeys>,
        job: PendingJob,
    ) -> Result<EnqueueReply> {
        let id = job.id.clone();
        match self.admit(conn, &keys, job) {
            Admit::Wait(rx, driver) => reply_driving(rx, driver)
                .await
                .unwrap_or_else(|_| Err(abandoned(&keys.queue, &id))),
            Admit::Alone(job) => send_alone(conn, &keys, &job).await,
        }
    }

    /// Puts `job` in the lane of its queue and hands back the lane's driver,
    /// starting one when the lane has none (a new lane, or one whose callers
    /// all stopped waiting: its jobs go with this caller's call). A full lane
    /// with a driver sends `job` alone.
    fn admit(
        self: &Arc<Self>,
        conn: &RedisConnection,
        keys: &Arc<QueueKeys>,
        job: PendingJob,
    ) -> Admit {
        let mut lanes = self.lanes();
        let lane = match lanes.get_mut(&keys.queue) {
            Some(lane) => lane,
            None => lanes.entry(keys.queue.clone()).or_default(),
        };
        let live = lane.driver.as_ref().and_then(|(future, turns)| {
            Some(Driver {
                future: future.upgrade()?,
                turns: turns.clone(),
            })
        });
        if live.is_some() && lane.waiting.len() >= MAX_WAITING {
            // The lock first: were this the driver's last handle, its drop
            // would take the lock.
            drop(lanes);
            drop(live);
            return Admit::Alone(Box::new(job));
        }
        let (tx, rx) = oneshot::channel();
        lane.waiting.push(Waiter { job, tx });
        let driver = live.unwrap_or_else(|| DriverEnd::start(self, conn, keys, lane, false));
        Admit::Wait(rx, driver)
    }

    /// Takes the next call's worth of the lane's jobs; an empty lane is
    /// removed instead (`None`), in one hold of the lock, so that no caller
    /// can join it in between.
    fn take(&self, queue: &str) -> Option<Vec<Waiter>> {
        let mut lanes = self.lanes();
        match lanes.get_mut(queue) {
            Some(lane) if !lane.waiting.is_empty() => {
                let n = lane.waiting.len().min(MAX_JOBS_PER_CALL);
                Some(lane.waiting.drain(..n).collect())
            }
            _ => {
                lanes.remove(queue);
                None
            }
        }
    }

    /// Removes the lane of `queue` when nobody waits in it (true), in one
    /// hold of the lock.
    fn close_if_idle(&self, queue: &str) -> bool {
        let mut lanes = self.lanes();
        let idle = lanes.get(queue).is_none_or(|lane| lane.waiting.is_empty());
        if idle {
            lanes.remove(queue);
        }
        idle
    }
}

/// Awaits `rx`, polling the lane's `driver` meanwhile (it answers `rx`).
async fn reply_driving(
    mut rx: oneshot::Receiver<Result<EnqueueReply>>,
    driver: Driver,
) -> std::result::Result<Result<EnqueueReply>, oneshot::error::RecvError> {
    let mut driver = Some(driver);
    let mut seen = None;
    std::future::poll_fn(move |cx| loop {
        if let Poll::Ready(reply) = Pin::new(&mut rx).poll(cx) {
            return Poll::Ready(reply);
        }
        // A finished driver has answered (or dropped) every sender it took,
        // this one included: `rx` is ready on the next turn of the loop.
        match driver.as_mut().map(|d| d.poll_for(&mut seen, cx)) {
            Some(Poll::Ready(())) => driver = None,
            _ => return Poll::Pending,
        }
    })
    .await
}

/// A lane's sender: one scheduler turn, then the waiting jobs in one call,
/// each caller answered; again while jobs wait, and the lane removed when
/// none do. Polled by the lane's waiting callers ([`reply_driving`]).
async fn drive(mut end: DriverEnd) {
    let sent = AssertUnwindSafe(async {
        let (group, conn, keys, turns) = (&end.group, &end.conn, &end.keys, &end.turns);
        loop {
            SchedulerTurn::new(turns).await;
            let Some(batch) = group.take(&keys.queue) else {
                return;
            };
            debug!(queue = %keys.queue, jobs = batch.len(), "group commit");
            InFlight::new(conn.clone(), keys.clone(), batch)
                .answer(true)
                .await;
            if group.close_if_idle(&keys.queue) {
                return;
            }
        }
    })
    .catch_unwind()
    .await;
    if sent.is_err() {
        // Not the sending (`InFlight::answer` catches its panics): a bug of
        // the lane itself. Its waiters get `abandoned` rather than a driver
        // that panics for every caller after.
        error!(queue = %end.keys.queue,
            "group commit lane panicked; its waiting callers are answered with an error");
        end.remove_lane(|_| true);
    }
    end.finished = true;
}

/// One scheduler turn of a driver, whoever polls it: it ends at the first
/// poll after the runtime ran every task ready now and read the
/// connections' replies (a deferred wake, as `tokio::task::yield_now`
/// registers). Where there is no scheduler to defer to (the thread of a
/// multi-threaded runtime's `block_on`, another executor), the wake comes at
/// once, and the turn ends once a caller of the lane has been woken and
/// polled again ([`Driver::poll_for`]): the callers polled with it (a
/// `join_all` of producers) have joined by then. `yield_now` itself ends at
/// its second poll: in a driver shared by the callers of a lane, the next
/// caller's poll ended it before the others had enqueued (16 producers
/// joined in one future: two calls per round instead of one). Ending every
/// turn at a caller's second poll instead cost the batching of producers in
/// tasks of their own (a caller that answered itself is woken again at
/// once): 9.7 jobs per call instead of 15 for 16 of them on two threads.
struct SchedulerTurn<'a> {
    turns: &'a Arc<Turns>,
    /// The turn waited on, once started.
    turn: Option<u64>,
}

impl<'a> SchedulerTurn<'a> {
    fn new(turns: &'a Arc<Turns>) -> Self {
        SchedulerTurn { turns, turn: None }
    }
}

/// The deferred wake of a turn: marks it passed (unless it came at once,
/// while it was being registered) and wakes the driver's pollers.
struct TurnWaker {
    turns: Arc<Turns>,
    turn: u64,
    /// Registered: a wake now is the deferred one.
    armed: AtomicBool,
    /// Woken (at once or deferred).
    fired: AtomicBool,
    then: std::task::Waker,
}

impl Drop for TurnWaker {
    /// Dropped unwoken: the deferred wake was thrown away (deferred into a
    /// current-thread runtime's `block_on` that then returned: tokio drops
    /// that list unwoken, taking it for the call's own future, while here
    /// it stands for every caller of the lane). Nothing else passes a turn
    /// with a deferred wake: pass it here and wake the pollers, or every
    /// caller of the lane waits for ever (stop 47 review).
    fn drop(&mut self) {
        if !self.fired.load(Ordering::Acquire) {
            self.turns.pass(self.turn);
            self.then.wake_by_ref();
        }
    }
}

impl std::task::Wake for TurnWaker {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.fired.store(true, Ordering::Release);
        if self.armed.load(Ordering::Acquire) {
            self.turns.pass(self.turn);
        } else {
            self.turns.immediate.store(self.turn, Ordering::Release);
        }
        self.then.wake_by_ref();
    }
}

impl Future for SchedulerTurn<'_> {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> Poll<()> {
        if let Some(turn) = self.turn {
            if self.turns.passed.load(Ordering::Acquire) >= turn {
                return Poll::Ready(());
            }
            // A turn whose wake came at once has no wake left to come: wake
            // the driver's pollers again, so that one polled again within
            // the turn ([`Driver::poll_for`]) ends it, whichever of them is
            // still waiting (review: without it, a caller answered in the
            // turn's first poll stopped polling, and the one left waiting
            // was never polled again: threads looping on `Handle::block_on`
            // hung after one enqueue).
            if self.turns.immediate.load(Ordering::Acquire) == turn {
                cx.waker().wake_by_ref();
            }
            return Poll::Pending;
        }
        let turn = self.turns.started.fetch_add(1, Ordering::AcqRel) + 1;
        let waker = Arc::new(TurnWaker {
            turns: self.turns.clone(),
            turn,
            armed: AtomicBool::new(false),
            fired: AtomicBool::new(false),
            then: cx.waker().clone(),
        });
        let deferred = std::task::Waker::from(waker.clone());
        let _ = std::pin::pin!(tokio::task::yield_now())
            .poll(&mut std::task::Context::from_waker(&deferred));
        waker.armed.store(true, Ordering::Release);
        self.turn = Some(turn);
        Poll::Pending
    }
}

/// A driver's lane and what the driver leaves when it ends: nothing when it
/// finished (it removed its lane). Dropped unfinished (every caller of its
/// lane stopped waiting, or its runtime ended), it removes its lane if
/// nobody waits in it, and otherwise hands the waiting jobs (cancelled
/// callers' jobs, sent as before) to a new driver in a task of its own; that
/// one, dropped unfinished in its turn (a runtime shutting down drops it
/// inside the `spawn`), removes the lane: its waiters get `abandoned`.
struct DriverEnd {
    group: Arc<GroupCommit>,
    conn: RedisConnection,
    /// The keys of the lane's queue (`keys.queue` names the lane).
    keys: Arc<QueueKeys>,
    /// The driver's scheduler turns (shared with its callers).
    turns: Arc<Turns>,
    /// Which driver of the lane this is ([`Lane::generation`]).
    generation: u64,
    /// Runs in a task a dropped driver handed its lane to.
    handed_on: bool,
    finished: bool,
}

impl DriverEnd {
    /// Starts a driver for `lane` (of `group`), recorded as the lane's one.
    fn start(
        group: &Arc<GroupCommit>,
        conn: &RedisConnection,
        keys: &Arc<QueueKeys>,
        lane: &mut Lane,
        handed_on: bool,
    ) -> Driver {
        let generation = group.generations.fetch_add(1, Ordering::Relaxed);
        let turns = Arc::new(Turns::default());
        let end = DriverEnd {
            group: group.clone(),
            conn: conn.clone(),
            keys: keys.clone(),
            turns: turns.clone(),
            generation,
            handed_on,
            finished: false,
        };
        let future = Inside(drive(end).boxed()).boxed().shared();
        lane.driver = future.downgrade().map(|weak| (weak, turns.clone()));
        lane.generation = generation;
        Driver { future, turns }
    }

    /// Removes this driver's lane when `when` holds for it (its waiters then
    /// get `abandoned`: outcome unknown).
    fn remove_lane(&self, when: impl FnOnce(&Lane) -> bool) {
        let mut lanes = self.group.lanes();
        if lanes
            .get(&self.keys.queue)
            .is_some_and(|l| l.generation == self.generation && when(l))
        {
            lanes.remove(&self.keys.queue);
        }
    }
}

impl Drop for DriverEnd {
    fn drop(&mut self) {
        if self.finished {
            return;
        }
        let rt = match tokio::runtime::Handle::try_current() {
            Ok(rt) if !self.handed_on => rt,
            _ => {
                self.remove_lane(|_| true);
                return;
            }
        };
        let mut lanes = self.group.lanes();
        let Some(lane) = lanes
            .get_mut(&self.keys.queue)
            .filter(|l| l.generation == self.generation)
        else {
            return;
        };
        if lane.waiting.is_empty() {
            lanes.remove(&self.keys.queue);
            return;
        }
        let next = DriverEnd::start(&self.group, &self.conn, &self.keys, lane, true);
        // The lock first: a runtime shutting down drops `next` inside the
        // `spawn`, and its drop takes the lock.
        drop(lanes);
        drop(rt.spawn(next.run()));
    }
}

/// A call's jobs from the moment they left the lane until each caller has
/// its answer. It lives in the lane's driver, which the waiting callers
/// poll: if every one of them stops waiting (cancelled: a request handler
/// dropped, a `timeout`, a `select!`) while the call is in flight, dropping
/// this finishes the call in a task of its own for the callers not answered
/// yet (sent again as a retry: the dedupe reads and each job's enqueue token
/// make a job the first call wrote answer as written, not twice). That resend happens
/// once at most (`resent`), and never for callers whose retry window is
/// zero ("send once": they get "outcome unknown").
struct InFlight {
    conn: RedisConnection,
    keys: Arc<QueueKeys>,
    jobs: Vec<PendingJob>,
    /// Each job's caller, until answered.
    txs: Vec<Option<oneshot::Sender<Result<EnqueueReply>>>>,
    /// This is the resend `drop` made of a call dropped in flight: dropped
    /// in its turn before answering (its task cancelled, or never run: a
    /// `spawn` on a runtime shutting down drops the future at once, inside
    /// the `spawn`), it sends nothing again and its callers get `abandoned`.
    /// Before, that drop spawned again, and was dropped again, without end:
    /// a stack overflow that aborted the process when the runtime shut down
    /// with a call in flight.
    resent: bool,
}

impl InFlight {
    fn new(conn: RedisConnection, keys: Arc<QueueKeys>, batch: Vec<Waiter>) -> Self {
        let (jobs, txs): (Vec<PendingJob>, Vec<_>) =
            batch.into_iter().map(|w| (w.job, Some(w.tx))).unzip();
        InFlight {
            conn,
            keys,
            jobs,
            txs,
            resent: false,
        }
    }

    /// Sends the call (`fresh`: its first try, which may skip the dedupe
    /// reads of generated ids) and answers each caller. A panic of the
    /// sending itself is caught here and answers the callers not answered
    /// yet with an "outcome unknown" error: sending them again (`drop`) would
    /// panic again, in a task of its own, for ever. Every other end of this
    /// future before its callers are answered (its task cancelled, or
    /// panicking for a reason of its own, e.g. a sibling `join!` branch of
    /// the leader's caller) drops it, and `drop` sends the rest again (once,
    /// and not for a zero retry window: see [`InFlight`]).
    async fn answer(mut self, fresh: bool) {
        let sent = AssertUnwindSafe(self.send_and_answer(fresh))
            .catch_unwind()
            .await;
        let queue = &self.keys.queue;
        if let Err(panic) = &sent {
            let msg = panic
                .downcast_ref::<&str>()
                .copied()
                .or_else(|| panic.downcast_ref::<String>().map(String::as_str))
                .unwrap_or("non-string payload");
            error!(queue = %queue, jobs = self.jobs.len(), panic = msg,
                "group commit call panicked; its callers are answered with an error");
        }
        // Every caller has its answer by now (the reply's length is checked
        // against the call's), unless the sending panicked; one without is
        // answered here rather than sent again by `drop`, so that nothing
        // can loop.
        for (job, tx) in self.jobs.iter().zip(&mut self.txs) {
            if let Some(tx) = tx.take() {
                let e = match sent {
                    Ok(()) => QueueError::protocol(queue, Some(&job.id), "no reply for this job"),
                    Err(_) => interrupted(
                        queue,
                        &job.id,
                        "the group commit carrying this enqueue panicked",
                    ),
                };
                let _ = tx.send(Err(e));
            }
        }
    }

    /// [`answer`](Self::answer)'s call and the answer of each caller it
    /// reaches.
    async fn send_and_answer(&mut self, fresh: bool) {
        let keys = &*self.keys;
        #[cfg(test)]
        if self.jobs.iter().any(|j| j.job_type == tests::PANICS) {
            panic!("a bug in the call's sending");
        }
        match send_call(&self.conn, keys, Mode::Each, &self.jobs, fresh).await {
            Ok(replies) => {
                for (i, reply) in replies.into_iter().enumerate() {
                    let result = match reply {
                        Ok(ManyReply::Enqueued(r)) => Ok(r),
                        // Alone, in mode `all`: its caller gets the script's
                        // own error reply, nothing written.
                        Ok(ManyReply::Invalid(_)) => {
                            send_alone(&self.conn, keys, &self.jobs[i]).await
                        }
                        // Its own reply did not decode: only its caller gets
                        // the error (naming its job); the others keep the
                        // outcomes the call gave them.
                        Err(e) => Err(e),
                    };
                    if let Some(tx) = self.txs.get_mut(i).and_then(Option::take) {
                        let _ = tx.send(result);
                    }
                }
            }
            Err(e) => {
                for (job, tx) in self.jobs.iter().zip(&mut self.txs) {
                    if let Some(tx) = tx.take() {
                        let _ = tx.send(Err(for_job(&e, &keys.queue, &job.id)));
                    }
                }
            }
        }
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        // Also when dropped by a panic of its task: `answer` catches a panic
        // of the sending itself (which would repeat here), so this one is
        // another's, and the callers it left are sent again and answered.
        if self.txs.iter().all(Option::is_none) {
            return;
        }
        // A resend dropped in its turn (its task cancelled, or dropped unrun
        // by a runtime shutting down) sends nothing again: its senders drop
        // and each caller gets `abandoned` (outcome unknown). So does a call
        // without a runtime to send it in.
        if self.resent {
            return;
        }
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return;
        };
        // Callers that asked to be sent once (a zero retry window, as
        // docs/IDEMPOTENCY.md recommends with `completion_retention` zero)
        // are not sent again: a job the call wrote could be claimed and
        // acked before the resend, which would then write it a second time.
        // They get "outcome unknown", as for any lost reply; the other
        // callers of the call are sent again (before, one zero window took
        // the resend from every caller of the call).
        let (once, again): (Vec<_>, Vec<_>) = std::mem::take(&mut self.jobs)
            .into_iter()
            .zip(std::mem::take(&mut self.txs))
            .filter(|(_, tx)| tx.is_some())
            .partition(|(job, _)| job.retry_window.is_zero());
        if !once.is_empty() {
            debug!(queue = %self.keys.queue, jobs = once.len(),
                "group commit leader cancelled mid-call; retry window zero: not sent again");
        }
        for (job, tx) in once {
            if let Some(tx) = tx {
                let _ = tx.send(Err(interrupted(
                    &self.keys.queue,
                    &job.id,
                    "the group commit carrying this enqueue was cancelled with its \
                     leader's caller, and a zero retry window sends it only once",
                )));
            }
        }
        if again.is_empty() {
            return;
        }
        let (jobs, txs): (Vec<PendingJob>, Vec<_>) = again.into_iter().unzip();
        let rest = InFlight {
            conn: self.conn.clone(),
            keys: self.keys.clone(),
            jobs,
            txs,
            resent: true,
        };
        // On a runtime that is shutting down, `try_current` still succeeds
        // and `spawn` drops `rest` at once, in this call: `resent` ends it.
        drop(rt.spawn(rest.answer(false)));
    }
}

/// Sends one job alone (a lead call, a full lane, an invalid job's resend).
pub(crate) async fn send_alone(
    conn: &RedisConnection,
    keys: &QueueKeys,
    job: &PendingJob,
) -> Result<EnqueueReply> {
    let replies = send_call(conn, keys, Mode::All, std::slice::from_ref(job), true).await?;
    match replies.into_iter().next() {
        Some(Ok(ManyReply::Enqueued(r))) => Ok(r),
        Some(Err(e)) => Err(e),
        other => Err(QueueError::protocol(
            &keys.queue,
            Some(&job.id),
            format!("enqueue_many in mode all answered {other:?}"),
        )),
    }
}

/// One `enqueue_many.lua` call for `jobs` (at most one call's worth), sent
/// again on a connection failure within the shortest retry window of its
/// jobs; only the first attempt of a `fresh` call skips the dedupe reads of
/// generated ids (a call finished for a cancelled leader is not fresh).
async fn send_call(
    conn: &RedisConnection,
    keys: &QueueKeys,
    mode: Mode,
    jobs: &[PendingJob],
    fresh: bool,
) -> Result<Vec<Result<ManyReply>>> {
    let window = jobs
        .iter()
        .map(|j| j.retry_window)
        .min()
        .unwrap_or_default();
    let first = jobs
        .first()
        .map(|j| j.id.clone())
        .unwrap_or_else(|| JobId::from(""));
    let mut attempt = 0u32;
    with_retries(window, &keys.queue, &first, || {
        let fresh = fresh && attempt == 0 && !conn.may_resend();
        attempt += 1;
        let mut conn = conn.clone();
        async move {
            let many: Vec<ManyJob<'_>> = jobs
                .iter()
                .map(|j| ManyJob {
                    job: script_job(
                        keys,
                        &j.id,
                        &j.job_type,
                        j.schema_version,
                        j.max_attempts,
                        &j.opts,
                        &j.payload,
                    ),
                    token: &j.token,
                    fresh: fresh && j.generated,
                })
                .collect();
            enqueue_many::run_each(&mut conn, keys, mode, &many).await
        }
    })
    .await
}

/// The error of a failed call as seen by one of its callers: the same
/// failure, naming that caller's job.
fn for_job(e: &QueueError, queue: &str, id: &JobId) -> QueueError {
    let (queue, job_id) = (queue.to_string(), Some(id.clone()));
    match e {
        QueueError::Redis { source, .. } => QueueError::Redis {
            queue,
            job_id,
            source: source.clone(),
        },
        QueueError::ReadOnlyReplica { .. } => QueueError::ReadOnlyReplica { queue, job_id },
        QueueError::Protocol { detail, .. } => QueueError::Protocol {
            queue,
            job_id,
            detail: detail.clone(),
        },
        other => QueueError::Protocol {
            queue,
            job_id,
            detail: other.to_string(),
        },
    }
}

/// The error of a waiter whose call was never answered (its task ended with
/// the runtime): the job may or may not have been written.
fn abandoned(queue: &str, id: &JobId) -> QueueError {
    interrupted(
        queue,
        id,
        "the group commit carrying this enqueue ended without a reply",
    )
}

/// An "outcome unknown" error (`Interrupted`): the call carrying the job
/// ended without its reply, for the reason `why`.
fn interrupted(queue: &str, id: &JobId, why: &str) -> QueueError {
    QueueError::redis(
        queue,
        Some(id),
        redis::RedisError::from(std::io::Error::new(std::io::ErrorKind::Interrupted, why)),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The job type whose call panics in its sending (`send_and_answer`).
    pub(super) const PANICS: &str = "panics-in-send";

    fn pending(id: &str) -> PendingJob {
        PendingJob {
            id: JobId::from(id),
            job_type: PANICS.to_string(),
            schema_version: 1,
            max_attempts: 3,
            opts: EnqueueOptions::new(),
            payload: Vec::new(),
            token: String::new(),
            generated: false,
            retry_window: Duration::ZERO,
        }
    }

    /// Counts the wakes of a poller.
    #[derive(Default)]
    struct Wakes(AtomicU64);

    impl std::task::Wake for Wakes {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    /// A poller that visits the driver twice while another poller is inside
    /// it (on another thread, in a turn without a deferred wake: the thread
    /// of a `Handle::block_on`) gets `Pending` from `Shared` both times
    /// without polling the driver, so the driver never sees the turn its
    /// second visit passed, and the turn's one wake went out before it was
    /// registered. It must come back by itself: the driver then goes on at
    /// its next poll. Before, only a first visit came back, and when the
    /// poller inside the driver was answered and left, the lane hung (CI:
    /// `producers_looping_on_block_on_are_all_answered`, 1 run in ~180).
    #[test]
    fn a_poller_that_finds_the_driver_busy_in_an_immediate_turn_comes_back() {
        type Visit = Box<dyn FnOnce() + Send>;
        let turns = Arc::new(Turns::default());
        let visit: Arc<Mutex<Option<Visit>>> = Arc::default();
        let future = {
            let (turns, visit) = (turns.clone(), visit.clone());
            let future = async move {
                let mut turn = SchedulerTurn::new(&turns);
                std::future::poll_fn(|cx| {
                    let polled = Pin::new(&mut turn).poll(cx);
                    // The other poller comes while this one is inside.
                    if let Some(visit) = visit.lock().unwrap().take() {
                        visit();
                    }
                    polled
                })
                .await
            }
            .boxed();
            Inside(future).boxed().shared()
        };
        let mut inside = Driver {
            future: future.clone(),
            turns: turns.clone(),
        };
        let other = Arc::new(Mutex::new((
            Driver {
                future,
                turns: turns.clone(),
            },
            None,
        )));
        let wakes = Arc::new(Wakes::default());
        let waker = std::task::Waker::from(wakes.clone());
        let woken_at_visits = Arc::new(Mutex::new(Vec::new()));
        *visit.lock().unwrap() = Some(Box::new({
            let (other, waker, wakes, woken) = (
                other.clone(),
                waker.clone(),
                wakes.clone(),
                woken_at_visits.clone(),
            );
            move || {
                let (driver, seen) = &mut *other.lock().unwrap();
                for _ in 0..2 {
                    let mut cx = std::task::Context::from_waker(&waker);
                    assert!(driver.poll_for(seen, &mut cx).is_pending());
                    woken.lock().unwrap().push(wakes.0.load(Ordering::SeqCst));
                }
            }
        }));
        let mut seen = None;
        let mut cx = std::task::Context::from_waker(futures::task::noop_waker_ref());
        assert!(inside.poll_for(&mut seen, &mut cx).is_pending());
        // The poller inside was answered, and leaves.
        drop(inside);
        let woken = woken_at_visits.lock().unwrap().clone();
        assert_eq!(woken.len(), 2, "the other poller visited twice");
        assert!(
            woken[1] > woken[0],
            "woken again at its second visit (wakes after each visit: {woken:?})"
        );
        let (driver, seen) = &mut *other.lock().unwrap();
        let mut cx = std::task::Context::from_waker(&waker);
        assert!(
            driver.poll_for(seen, &mut cx).is_ready(),
            "the driver goes on at the poller's next visit"
        );
    }

    /// A scheduler turn whose deferred wake is thrown away unwoken (the
    /// wake was deferred into a current-thread runtime's `block_on` that
    /// then returned: tokio drops that list without waking it, as it
    /// belongs to the call's own future) still passes, and wakes the
    /// driver's pollers. Before, nothing else could pass a turn with a
    /// deferred wake: every caller of the lane waited for ever (review).
    #[test]
    fn a_turn_whose_deferred_wake_is_dropped_unwoken_passes() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let turns = Arc::new(Turns::default());
        let wakes = Arc::new(Wakes::default());
        let waker = std::task::Waker::from(wakes.clone());
        rt.block_on(async {
            let mut turn = SchedulerTurn::new(&turns);
            let mut cx = std::task::Context::from_waker(&waker);
            assert!(Pin::new(&mut turn).poll(&mut cx).is_pending());
        });
        assert_eq!(turns.immediate.load(Ordering::SeqCst), 0, "deferred");
        assert!(
            turns.passed.load(Ordering::SeqCst) >= 1,
            "the turn passed when its wake was dropped"
        );
        assert!(wakes.0.load(Ordering::SeqCst) > 0, "its pollers were woken");
    }

    /// A poller that finds another one inside the driver, which then wakes
    /// the driver's pollers (a deferred turn's wake, a Redis reply) before
    /// this one was registered, and leaves: `Shared` gives it `Pending`
    /// without polling the driver, and no wake is left to come. It must come
    /// back by itself whatever the turn: the driver then goes on at its next
    /// poll. Before, only a poller in a turn without a deferred wake came
    /// back (review: futures-rs issue 2706's lost wake).
    #[test]
    fn a_poller_that_finds_the_driver_busy_in_any_turn_comes_back() {
        type Visit = Box<dyn FnOnce() + Send>;
        let turns = Arc::new(Turns::default());
        let visit: Arc<Mutex<Option<Visit>>> = Arc::default();
        let inner_polls = Arc::new(AtomicU64::new(0));
        let future = {
            let (visit, inner_polls) = (visit.clone(), inner_polls.clone());
            let future = std::future::poll_fn(move |cx| {
                if inner_polls.fetch_add(1, Ordering::SeqCst) > 0 {
                    return Poll::Ready(());
                }
                // The driver's pollers are woken (a reply came)...
                cx.waker().wake_by_ref();
                // ...before the other poller comes, while this one is inside.
                if let Some(visit) = visit.lock().unwrap().take() {
                    visit();
                }
                Poll::Pending
            })
            .boxed();
            Inside(future).boxed().shared()
        };
        let mut inside = Driver {
            future: future.clone(),
            turns: turns.clone(),
        };
        let other = Arc::new(Mutex::new(Driver {
            future,
            turns: turns.clone(),
        }));
        let wakes = Arc::new(Wakes::default());
        let waker = std::task::Waker::from(wakes.clone());
        *visit.lock().unwrap() = Some(Box::new({
            let (other, waker) = (other.clone(), waker.clone());
            move || {
                let mut cx = std::task::Context::from_waker(&waker);
                let mut seen = None;
                assert!(other
                    .lock()
                    .unwrap()
                    .poll_for(&mut seen, &mut cx)
                    .is_pending());
            }
        }));
        let mut seen = None;
        let mut cx = std::task::Context::from_waker(futures::task::noop_waker_ref());
        assert!(inside.poll_for(&mut seen, &mut cx).is_pending());
        // The poller inside was answered, and leaves.
        drop(inside);
        assert!(
            wakes.0.load(Ordering::SeqCst) > 0,
            "the poller that found the driver busy comes back"
        );
        let mut cx = std::task::Context::from_waker(&waker);
        assert!(other
            .lock()
            .unwrap()
            .poll_for(&mut None, &mut cx)
            .is_ready());
        assert_eq!(inner_polls.load(Ordering::SeqCst), 2);
    }

    /// A panic of a group call's own sending answers each of its callers
    /// with an "outcome unknown" error and ends there: the call's task does
    /// not panic, and nothing is sent again (a resend would panic again, in
    /// a task of its own, for ever). Before, the panic escaped the task and
    /// the callers learnt only that their senders were dropped.
    #[tokio::test]
    async fn a_panic_in_the_sending_answers_every_caller_and_ends() {
        let (_server, conn) = crate::scripts::test_redis().await;
        let keys = Arc::new(QueueKeys::new("tasks"));
        let mut rxs = Vec::new();
        let batch = ["a", "b"]
            .into_iter()
            .map(|id| {
                let (tx, rx) = oneshot::channel();
                rxs.push(rx);
                Waiter {
                    job: pending(id),
                    tx,
                }
            })
            .collect();
        let call = tokio::spawn(InFlight::new(conn, keys, batch).answer(true));
        call.await.expect("the panic is caught in the call");
        for rx in rxs {
            let err = rx.await.expect("answered").unwrap_err();
            assert!(err.outcome_unknown(), "{err}");
            assert!(err.to_string().contains("panicked"), "{err}");
        }
    }

    /// A call dropped while in flight with callers of both kinds (its lane's
    /// driver dropped: every caller of the lane stopped waiting): the
    /// callers with a zero retry window get "outcome unknown" and their jobs
    /// are not sent again; the others are sent again in a task of their own
    /// and answered. Before, one zero window in a call took the resend from
    /// every caller of it. (Callers still waiting keep driving their call,
    /// so a cancel no longer drops a call with a caller still listening:
    /// this is the rule, pinned without the lane.)
    #[tokio::test]
    async fn a_dropped_call_resends_only_its_callers_with_a_retry_window() {
        let (_server, conn) = crate::scripts::test_redis().await;
        let keys = Arc::new(QueueKeys::new("tasks"));
        let job = |id: &str, retry_window| PendingJob {
            job_type: "send".to_string(),
            payload: b"\x80".to_vec(),
            token: format!("token-{id}"),
            retry_window,
            ..pending(id)
        };
        let (once_tx, once_rx) = oneshot::channel();
        let (again_tx, again_rx) = oneshot::channel();
        let batch = vec![
            Waiter {
                job: job("once", Duration::ZERO),
                tx: once_tx,
            },
            Waiter {
                job: job("again", Duration::from_secs(5)),
                tx: again_tx,
            },
        ];
        drop(InFlight::new(conn.clone(), keys.clone(), batch));
        let err = once_rx.await.expect("answered").unwrap_err();
        assert!(err.outcome_unknown(), "{err}");
        assert_eq!(err.job_id().map(JobId::as_str), Some("once"), "{err}");
        assert!(err.to_string().contains("zero retry window"), "{err}");
        let again = again_rx.await.expect("answered").expect("sent again");
        assert!(matches!(again, EnqueueReply::Created { .. }), "{again:?}");
        let mut c = conn.clone();
        let main: Vec<String> = redis::AsyncCommands::lrange(&mut c, &keys.main, 0, -1)
            .await
            .unwrap();
        assert_eq!(main, ["again"]);
    }
}
