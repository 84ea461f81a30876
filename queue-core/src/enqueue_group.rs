//! Group commit of concurrent single enqueues on one [`Queue`](crate::Queue)
//! (its clones share it, as they share the multiplexed connection).
//!
//! A call that finds no enqueue of its queue in flight leads the next call:
//! it lets the scheduler run once (`yield_now`, no timer). When nobody joined
//! it meanwhile, it takes its job back out of the lane, which removes the
//! lane, and sends it alone inside its own future, with no task (a lone
//! producer leads every call; a task per call cost it a spawn and a wake-up
//! per enqueue, issue #12). The first call that joins a lane whose leader has
//! not taken its job out yet takes the lane from it: it spawns a task that,
//! after one scheduler turn of its own, sends everything waiting (the
//! leader's job first) in one `enqueue_many.lua` call (at most
//! [`MAX_JOBS_PER_CALL`](crate::scripts::enqueue_many::MAX_JOBS_PER_CALL));
//! the leader then only awaits its own reply. Calls that arrive while that
//! task's call is in flight wait in the lane; when it returns, the lane is
//! handed on to another task, and so on until the lane is empty; a call that
//! returns with nobody waiting removes the lane at once. A job waits at most
//! for the call ahead of it and one scheduler turn; a trickle of enqueues
//! sees no added latency beyond that turn. A full lane (4 calls' worth) sends
//! the newcomer alone.
//!
//! No caller waits on another caller's future: a call carrying more than its
//! own caller's job runs in a task, and a leader's lone call is out of the
//! lane. A leader kept alive but not polled (a `select!` on `&mut fut` whose
//! other branch, or the code after it, enqueues on the same queue; a future
//! stored and forgotten) holds up nobody, and cannot hang its own task.
//! Before, the leader sent every call it led inside its own future and kept
//! the lane until that future ended: the callers that joined it, and every
//! enqueue of its queue after them, waited until it was polled again or
//! dropped; in one task, for ever (a "futurelock").
//!
//! Order: a lane's calls are in flight one at a time, each with the jobs
//! that waited longest; a leader's lone call and the next lane's call can be
//! in flight together (their requests leave on the connection in the order
//! they were sent, but a retry after a connection failure can put one behind
//! the other). So jobs of enqueues that overlap in time have no order among
//! them in main; an enqueue started after another returned is after it.
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
//! job's own enqueue token, and never skip the dedupe reads; a call dropped
//! mid-call (a lone leader cancelled, a task dropped by its runtime) is
//! finished once in a task of its own (`InFlight`), unless a caller's retry
//! window is zero.

use std::collections::HashMap;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

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

/// The enqueues of one queue waiting for the lane's next call. A lane
/// exists while its first caller gathers that call, or while a task holds
/// its turn (gathering, or with a call in flight).
struct Lane {
    waiting: Vec<Waiter>,
    /// `Some(n)`: [`Lead`] `n`, the caller that made the lane, still holds
    /// it in its own future (in its scheduler turn), and its job is the only
    /// one waiting. `None`: a task holds the lane's turn ([`Turn`]).
    led_by: Option<u64>,
}

/// The lanes of one `Queue` and its clones, one per queue name.
#[derive(Default)]
pub(crate) struct GroupCommit {
    lanes: Mutex<HashMap<String, Lane>>,
    /// The number of the next [`Lead`] (a lane removed and made again has a
    /// new leader, told apart by its number).
    leads: AtomicU64,
}

/// Waiters beyond this many (per queue) send alone: bounded memory.
const MAX_WAITING: usize = 4 * MAX_JOBS_PER_CALL;

/// What [`GroupCommit::admit`] decided for a call.
enum Admit {
    /// Nothing in flight: the caller made the lane and leads it
    /// ([`Lead::send`]: its job alone after one scheduler turn, unless
    /// another caller took the lane meanwhile), then awaits its own reply.
    Lead(oneshot::Receiver<Result<EnqueueReply>>, Lead),
    /// Joined the next call: await the reply. With a runtime handle: this
    /// caller took the lane from its leading caller, and spawns on it the
    /// task that sends the lane's next call (after `admit` let go of the
    /// lock: a `spawn` on a runtime shutting down drops the task at once,
    /// and that drop takes the lock).
    Joined(
        oneshot::Receiver<Result<EnqueueReply>>,
        Option<tokio::runtime::Handle>,
    ),
    /// The lane is full, or led by a caller while this one has no runtime
    /// to spawn a task on: send alone, outside the group.
    Alone(PendingJob),
}

impl GroupCommit {
    fn lanes(&self) -> MutexGuard<'_, HashMap<String, Lane>> {
        self.lanes.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Enqueues `job` through the lane of `queue`: leads its next call,
    /// joins it, or (the lane full) goes alone; answers the job's own reply.
    pub(crate) async fn enqueue(
        self: &Arc<Self>,
        conn: &RedisConnection,
        keys: Arc<QueueKeys>,
        job: PendingJob,
    ) -> Result<EnqueueReply> {
        let id = job.id.clone();
        let rx = match self.admit(conn, &keys, job) {
            Admit::Lead(rx, lead) => {
                lead.send().await;
                rx
            }
            Admit::Joined(rx, took) => {
                if let Some(rt) = took {
                    let turn = Turn::fresh(self.clone(), conn.clone(), keys.clone());
                    drop(rt.spawn(turn.send_waiting()));
                }
                rx
            }
            Admit::Alone(job) => return send_alone(conn, &keys, &job).await,
        };
        // Answered by this caller's own call, or by a task: never by
        // another caller's future (module doc).
        rx.await
            .unwrap_or_else(|_| Err(abandoned(&keys.queue, &id)))
    }

    /// Removes the lane of `queue` when nobody waits in it (true), in one
    /// hold of the lock, so that no caller can join it in between.
    fn close_if_idle(&self, queue: &str) -> bool {
        let mut lanes = self.lanes();
        let idle = lanes.get(queue).is_none_or(|lane| lane.waiting.is_empty());
        if idle {
            lanes.remove(queue);
        }
        idle
    }

    fn admit(
        self: &Arc<Self>,
        conn: &RedisConnection,
        keys: &Arc<QueueKeys>,
        job: PendingJob,
    ) -> Admit {
        let mut lanes = self.lanes();
        match lanes.get_mut(&keys.queue) {
            None => {
                let (tx, rx) = oneshot::channel();
                let n = self.leads.fetch_add(1, Ordering::Relaxed);
                lanes.insert(
                    keys.queue.clone(),
                    Lane {
                        waiting: vec![Waiter { job, tx }],
                        led_by: Some(n),
                    },
                );
                let lead = Lead {
                    group: self.clone(),
                    conn: conn.clone(),
                    keys: keys.clone(),
                    n,
                    done: false,
                };
                Admit::Lead(rx, lead)
            }
            // The lane's call now carries another caller's job: it goes to
            // a task, so that nobody waits on the leader's future. Without a
            // runtime to spawn it on, the newcomer goes alone instead.
            Some(lane) if lane.led_by.is_some() => match tokio::runtime::Handle::try_current() {
                Ok(rt) => {
                    let (tx, rx) = oneshot::channel();
                    lane.waiting.push(Waiter { job, tx });
                    lane.led_by = None;
                    Admit::Joined(rx, Some(rt))
                }
                Err(_) => Admit::Alone(job),
            },
            Some(lane) if lane.waiting.len() < MAX_WAITING => {
                let (tx, rx) = oneshot::channel();
                lane.waiting.push(Waiter { job, tx });
                Admit::Joined(rx, None)
            }
            Some(_) => Admit::Alone(job),
        }
    }
}

/// The lead of a caller that made its queue's lane: the right to send the
/// lane's next call from its own future while that call carries only its
/// own job ([`Lane::led_by`]).
struct Lead {
    group: Arc<GroupCommit>,
    conn: RedisConnection,
    /// The keys of the lane's queue (`keys.queue` names the lane).
    keys: Arc<QueueKeys>,
    /// Its number, in [`Lane::led_by`] while it holds the lane.
    n: u64,
    /// [`send`](Self::send) took its job out, or found the lane taken:
    /// nothing left for `drop`.
    done: bool,
}

impl Lead {
    /// One scheduler turn (module doc); then, if the lane is still this
    /// lead's (nobody joined), takes its job out, which removes the lane (a
    /// caller arriving from now on leads its own), and sends it alone. If
    /// another caller took the lane meanwhile, a task sends this job with
    /// theirs: nothing to do.
    async fn send(mut self) {
        tokio::task::yield_now().await;
        let lane = {
            let mut lanes = self.group.lanes();
            match lanes.get(&self.keys.queue) {
                Some(lane) if lane.led_by == Some(self.n) => lanes.remove(&self.keys.queue),
                _ => None,
            }
        };
        self.done = true;
        let Some(lane) = lane else { return };
        // Its own job only: a caller that joins a led lane takes it from its
        // lead (or, with no runtime to spawn a task on, goes alone).
        debug!(queue = %self.keys.queue, jobs = lane.waiting.len(), "group commit, lone call");
        InFlight::new(self.conn.clone(), self.keys.clone(), lane.waiting)
            .answer(true)
            .await;
    }
}

impl Drop for Lead {
    /// A lead dropped in its scheduler turn (its caller cancelled, or its
    /// task panicking) leaves its job to a task, as a cancelled waiter leaves
    /// its job in the lane: the task sends it with whoever joins meanwhile.
    /// With no runtime (it is shutting down) the lane goes: its waiters get
    /// `abandoned` (outcome unknown).
    fn drop(&mut self) {
        if self.done {
            return;
        }
        let mut lanes = self.group.lanes();
        let Some(lane) = lanes.get_mut(&self.keys.queue) else {
            return;
        };
        if lane.led_by != Some(self.n) {
            return;
        }
        match tokio::runtime::Handle::try_current() {
            Ok(rt) => {
                lane.led_by = None;
                drop(lanes);
                let turn = Turn::fresh(self.group.clone(), self.conn.clone(), self.keys.clone());
                drop(rt.spawn(turn.send_waiting()));
            }
            Err(_) => drop(lanes.remove(&self.keys.queue)),
        }
    }
}

/// The turn of a lane held by a task: the right to send the lane's next
/// call. Dropped (after its call returned, or when its task is dropped by
/// its runtime), it hands the lane on to another task that sends what waits
/// then, or removes the lane when none wait.
pub(crate) struct Turn {
    group: Arc<GroupCommit>,
    conn: RedisConnection,
    /// The keys of the lane's queue (`keys.queue` names the lane).
    keys: Arc<QueueKeys>,
    state: TurnState,
}

/// What dropping a [`Turn`] does.
#[derive(Clone, Copy, PartialEq, Eq)]
enum TurnState {
    /// It sent (or is sending) a call: hand the lane on.
    Sent,
    /// A task not yet run (dropped unrun: its runtime is shutting down):
    /// remove the lane, so its waiters get `abandoned`.
    Fresh,
    /// It found the lane empty and removed it: nothing left to do.
    Closed,
}

impl Turn {
    /// The turn of a task about to be spawned for a lane already marked as
    /// held by a task (`led_by` `None`).
    fn fresh(group: Arc<GroupCommit>, conn: RedisConnection, keys: Arc<QueueKeys>) -> Self {
        Turn {
            group,
            conn,
            keys,
            state: TurnState::Fresh,
        }
    }
}

impl Drop for Turn {
    fn drop(&mut self) {
        match self.state {
            TurnState::Closed => {}
            TurnState::Sent => match tokio::runtime::Handle::try_current() {
                // Nobody joined while the call was in flight: the lane goes
                // now, and the next caller leads (its own scheduler turn
                // gathers whoever comes with it), instead of a task that
                // yields, finds the lane empty and removes it.
                Ok(_) if self.group.close_if_idle(&self.keys.queue) => {}
                Ok(rt) => {
                    let next =
                        Turn::fresh(self.group.clone(), self.conn.clone(), self.keys.clone());
                    drop(rt.spawn(next.send_waiting()));
                }
                // No runtime (it is shutting down): dropping the waiters drops
                // their senders; each caller gets `abandoned` (outcome unknown).
                Err(_) => drop(self.group.lanes().remove(&self.keys.queue)),
            },
            TurnState::Fresh => drop(self.group.lanes().remove(&self.keys.queue)),
        }
    }
}

impl Turn {
    /// Sends one call with the lane's waiters (at most one call's worth) and
    /// answers each; dropping `self` then hands the lane on. One scheduler
    /// turn first, so that callers just answered can join (module doc); an
    /// empty lane then is removed. Always run in a task of its own.
    async fn send_waiting(mut self) {
        tokio::task::yield_now().await;
        let batch: Vec<Waiter> = {
            let mut lanes = self.group.lanes();
            match lanes.get_mut(&self.keys.queue) {
                Some(lane) if !lane.waiting.is_empty() => {
                    let n = lane.waiting.len().min(MAX_JOBS_PER_CALL);
                    lane.waiting.drain(..n).collect()
                }
                _ => {
                    lanes.remove(&self.keys.queue);
                    self.state = TurnState::Closed;
                    return;
                }
            }
        };
        self.state = TurnState::Sent;
        debug!(queue = %self.keys.queue, jobs = batch.len(), "group commit");
        InFlight::new(self.conn.clone(), self.keys.clone(), batch)
            .answer(true)
            .await;
    }
}

/// A call's jobs from the moment they left the lane until each caller has
/// its answer. Dropped while the call is in flight (a lone leader's caller
/// cancelled: a request handler dropped, a `timeout`, a `select!`; or the
/// task of a lane's call dropped by its runtime), it finishes the call in a
/// task of its own for the callers not answered yet (sent again as a retry:
/// the dedupe reads and each job's enqueue token make a job the first call
/// wrote answer as written, not twice). That resend happens once at most
/// (`resent`), and never for callers whose retry window is zero ("send
/// once": they get "outcome unknown"). A call carrying other callers' jobs
/// runs in a task, so their leader's cancel does not reach it (before, the
/// leader sent it in its own future, and a cancel of the leader's caller
/// took it down with it; before that, every caller of it got "outcome
/// unknown").
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

/// Sends one job alone (group commit off, a full lane, an invalid job's
/// resend).
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

    /// A call dropped while in flight with callers of both kinds (a lone
    /// leader's caller cancelled, a lane's task dropped): the callers with a
    /// zero retry window get "outcome unknown" and their jobs are not sent
    /// again; the others are sent again in a task of their own and answered.
    /// Before, one zero window in a call took the resend from every caller
    /// of it. (A lane's call runs in a task since the first caller joined a
    /// leader, so a leader's cancel no longer drops a call with callers of
    /// both kinds: this is the rule, pinned without the lane.)
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
