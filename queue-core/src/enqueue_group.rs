//! Group commit of concurrent single enqueues on one [`Queue`](crate::Queue)
//! (its clones share it, as they share the multiplexed connection).
//!
//! A call that finds no enqueue of its queue in flight leads the next call:
//! it lets the scheduler run once (`yield_now`, no timer), then sends its own
//! job with every call that joined meanwhile. Calls that arrive while one is
//! in flight wait in the queue's lane; when the call in flight returns, the
//! lane is handed on to a task that, after one scheduler turn of its own,
//! sends everything waiting in one `enqueue_many.lua` call (at most
//! [`MAX_JOBS_PER_CALL`](crate::scripts::enqueue_many::MAX_JOBS_PER_CALL)),
//! and so on until the lane is empty. A call that returns with nobody
//! waiting removes the lane at once, with no task: the next caller leads (a
//! lone producer leads every call; a hand-on task per call cost it a spawn
//! and a wake-up per enqueue, issue #12). A job waits at most for the call ahead
//! of it and one scheduler turn; a trickle of enqueues sees no added latency
//! beyond that turn. A full lane (4 calls' worth) sends the newcomer alone.
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
//! job's own enqueue token, and never skip the dedupe reads; a call whose
//! leader is cancelled mid-call is finished once in a task of its own
//! (`InFlight`), unless a caller's retry window is zero.
//!
//! One thing a caller must not do: keep an enqueue future alive without
//! polling it while it waits for another enqueue on the same queue (e.g.
//! `tokio::select!` on `&mut fut` whose other branch awaits a second
//! enqueue). The calls behind a leader's in-flight call are answered when
//! the leader's future is polled on (or dropped): such code waits for ever
//! ("futurelock"). Poll every enqueue to its end or drop it, or use
//! `with_group_commit(false)` for that handle. A change that sent every
//! joined call from a task of its own (stop 44) lost the batching this
//! module exists for (16 looping producers: 12–14 jobs per call instead of
//! 16, callgrind-free count of `enqueue_many` calls) and was not kept; a
//! design that lets the waiting callers drive the leader's call (a shared
//! future) is the way to remove the hazard without that cost.

use std::collections::HashMap;
use std::panic::AssertUnwindSafe;
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

/// The enqueues of one queue waiting behind the call in flight. A lane
/// exists while a call is in flight (its presence is the "in flight" flag).
#[derive(Default)]
struct Lane {
    waiting: Vec<Waiter>,
}

/// The lanes of one `Queue` and its clones, one per queue name.
#[derive(Default)]
pub(crate) struct GroupCommit {
    lanes: Mutex<HashMap<String, Lane>>,
}

/// Waiters beyond this many (per queue) send alone: bounded memory.
const MAX_WAITING: usize = 4 * MAX_JOBS_PER_CALL;

/// What [`GroupCommit::admit`] decided for a call.
enum Admit {
    /// Nothing in flight: the caller runs the lane's next call itself
    /// ([`Turn::send_waiting`]: its own job and whoever joined within one
    /// scheduler turn), then awaits its own reply; the turn hands the lane on
    /// when dropped.
    Lead(oneshot::Receiver<Result<EnqueueReply>>, Turn),
    /// Joined the next call: await the reply.
    Joined(oneshot::Receiver<Result<EnqueueReply>>),
    /// The lane is full: send alone, outside the group.
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
            Admit::Lead(rx, turn) => {
                turn.send_waiting().await;
                rx
            }
            Admit::Joined(rx) => rx,
            Admit::Alone(job) => return send_alone(conn, &keys, &job).await,
        };
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
                lanes.insert(
                    keys.queue.clone(),
                    Lane {
                        waiting: vec![Waiter { job, tx }],
                    },
                );
                Admit::Lead(rx, Turn::lead(self.clone(), conn.clone(), keys.clone()))
            }
            Some(lane) if lane.waiting.len() < MAX_WAITING => {
                let (tx, rx) = oneshot::channel();
                lane.waiting.push(Waiter { job, tx });
                Admit::Joined(rx)
            }
            Some(_) => Admit::Alone(job),
        }
    }
}

/// The right to send the next call of a lane. Dropped (after its call
/// returned, or when its task is cancelled or panics), it hands the lane on
/// to a task that sends what waits then, or removes the lane when none wait.
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
    /// A lead's turn, or one that sent (or is sending) a call: hand the lane
    /// on (a lead cancelled by its caller leaves its job and the joined ones
    /// to the next turn, as a cancelled waiter leaves its job in the lane).
    Sent,
    /// A hand-on task not yet run (dropped unrun: its runtime is shutting
    /// down): remove the lane, so its waiters get `abandoned`.
    Fresh,
    /// It found the lane empty and removed it: nothing left to do.
    Closed,
}

impl Turn {
    /// The turn of a caller that found no lane (its job is the lane's first).
    fn lead(group: Arc<GroupCommit>, conn: RedisConnection, keys: Arc<QueueKeys>) -> Self {
        Turn {
            group,
            conn,
            keys,
            state: TurnState::Sent,
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
                // gathers whoever comes with it), instead of a hand-on task
                // per call that yields, finds the lane empty and removes it
                // (a task spawn and a wake-up per call of a lone producer).
                Ok(_) if self.group.close_if_idle(&self.keys.queue) => {}
                Ok(rt) => {
                    let next = Turn {
                        group: self.group.clone(),
                        conn: self.conn.clone(),
                        keys: self.keys.clone(),
                        state: TurnState::Fresh,
                    };
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
    /// empty lane then is removed. A lead awaits it in its own task; a
    /// hand-on runs it in a task of its own.
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
/// its answer. The leader sends its call inside its own caller's future: if
/// that caller is cancelled (a request handler dropped, a `timeout`, a
/// `select!`) while the call is in flight, dropping this finishes the call in
/// a task of its own for the callers not answered yet (sent again as a
/// retry: the dedupe reads and each job's enqueue token make a job the first
/// call wrote answer as written, not twice). Before, they all got
/// "outcome unknown" for a cancel that was not theirs. That resend happens
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
}
