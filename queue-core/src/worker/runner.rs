//! Running one claimed delivery: find its handler, decode the payload, run
//! the handler under its timeout with a heartbeat, then record the outcome
//! (a success goes to the queue's acker, which batches `ack.lua` calls; a
//! failure is `fail.lua`, here). An older schema version, or a payload that
//! does not decode, is dead-lettered with the reason, never retried (DESIGN
//! rule 9); a newer schema version, or a type this worker has no handler for,
//! is deferred for a worker that can run it (`defer.rs`); a panic
//! (in the decode, a hand-written `Job::run` or the handler's future) is a
//! retryable error. A delivery whose lease is already lost locally when it
//! would start gets one extend (heartbeat.rs): run when Redis confirms the
//! lease is still its own, else not run (the watchdog returns it).

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tracing::{debug, error, warn, Instrument};

use super::acker::{AckRequest, AckSender, AckedJob};
use super::handler_guard::{GuardedHandler, HeartbeatTask};
use super::heartbeat::{heartbeat_after_first_interval, keep_lease_at_late_start, next_beat};
use super::{wait_true, Inner};
use crate::error::{QueueError, Result};
use crate::job::{ContextInner, JobContext, JobError};
use crate::keys::QueueKeys;
use crate::metrics::JobLabels;
use crate::registry::Registration;
use crate::results::MAX_RESULT_BYTES;
use crate::scripts::ack::AckItem;
use crate::scripts::claim::Delivery;
use crate::scripts::cut_error;
use crate::scripts::fail::{Fail, FailKind, FailReply};

/// Runs one delivery: decode, heartbeat, handler, then ack or fail.
pub(super) struct JobRunner {
    pub(super) inner: Arc<Inner>,
    pub(super) keys: Arc<QueueKeys>,
    pub(super) hard_stop: watch::Receiver<bool>,
    /// The acker of this delivery's queue.
    pub(super) acker: AckSender,
}

/// What to tell Redis after a failed (or never started) handler.
enum Outcome {
    Retry(String),
    Dead(String),
}

impl JobRunner {
    /// Runs one delivery to its end. The rare paths (defer, retry,
    /// dead-letter, waiting for room in a full ack channel) are awaited
    /// boxed: inline, their futures would size every runner's future, which
    /// is copied three times on its way into its task (2.8 KB → 1.8 KB,
    /// issue #12).
    pub(super) async fn run(mut self, d: Delivery) {
        let labels = self.inner.labels.get(&self.keys.queue, &d.job_type);
        // One lookup of the handler per job (issue #12).
        let Some(found) = self.handler(&d) else {
            // A type this worker has no handler for: left for a worker that
            // has one (a rolling deploy that added the type, or a queue
            // shared by workers handling different types).
            return Box::pin(self.defer(&d, &labels, None)).await;
        };
        if let Some(known) = Self::newer_than_handler(found, &d) {
            return Box::pin(self.defer(&d, &labels, Some(known))).await;
        }
        let reg = match self.registration(found, &d) {
            Ok(reg) => reg,
            Err(reason) => {
                return Box::pin(self.finish(&d, &labels, Outcome::Dead(reason), None)).await
            }
        };
        let budget = match execution_budget(&reg, &d) {
            Ok(budget) => budget,
            Err(reason) => {
                return Box::pin(self.finish(&d, &labels, Outcome::Dead(reason), None)).await
            }
        };
        let ctx = self.context(&d);
        // The decode (the Args' `Deserialize`) and a hand-written
        // `Job::run` run here, before the handler's future: a panic in them
        // is the handler's panic too (it unwound the runner and left the job
        // leased, with no reason recorded, on every delivery).
        let made =
            std::panic::catch_unwind(AssertUnwindSafe(|| (reg.runner)(ctx.clone(), &d.payload)));
        let fut = match made {
            Ok(Ok(f)) => f,
            Ok(Err(msg)) => {
                let reason = format!("payload does not decode as `{}`: {msg}", d.job_type);
                return Box::pin(self.finish(&d, &labels, Outcome::Dead(reason), None)).await;
            }
            Err(panic) => {
                let outcome = Outcome::Retry(panicked(&*panic));
                return Box::pin(self.finish(&d, &labels, outcome, None)).await;
            }
        };
        // Decoded this late (a slow decode, a long wait since the claim), the
        // job may already be another worker's: one extend (extend.lua checks
        // the token) tells. Lost: leave it to the watchdog.
        let lease_sent_at = if ctx.inner.lease.is_lost() {
            let kept = keep_lease_at_late_start(&self.inner, &self.keys, &d.id, &d.token, &ctx);
            match Box::pin(kept).await {
                Some(sent_at) => sent_at,
                None => return,
            }
        } else {
            d.claim_sent_at
        };
        crate::failpoint::hit("after_claim");
        // The user's metrics recorder and tracing layers run here, after the
        // claim: a panic in them costs the job its start metric and log
        // line, not its run. Before, it ended the runner with the job
        // leased and its attempt spent, on every delivery.
        let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            crate::metrics::started(&labels);
            debug!("started");
        }));
        let started = std::time::Instant::now();
        // The heartbeat task starts only for a job still running one
        // interval after its claim (or its late-start extend) was sent
        // (heartbeat.rs); until then this timer stands in for it.
        let first_at = next_beat(lease_sent_at, self.inner.config.heartbeat_interval())
            .filter(|_| self.inner.config.heartbeat_enabled);
        let first_beat = async move {
            match first_at {
                Some(at) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        // Aborted however the run ends, an unwinding runner included
        // (handler_guard.rs). It stops by itself a lease after the
        // handler's timeout or budget: a runner that has not ended it by
        // then is stuck behind a handler blocking its thread.
        let mut heartbeat = HeartbeatTask::default();
        let beats_until = beats_until(
            reg.timeout
                .and_then(|t| tokio::time::Instant::now().checked_add(t)),
            budget,
            self.inner.config.lease,
        );

        let guarded = GuardedHandler::new(fut);
        let timed = async {
            match reg.timeout {
                Some(limit) => match tokio::time::timeout(limit, guarded).await {
                    Ok(r) => r,
                    Err(_) => Ok(Err(JobError::retryable(format!(
                        "handler timed out after {limit:?}"
                    )))),
                },
                None => guarded.await,
            }
        };
        let over_budget = async {
            match budget {
                Some(until) => tokio::time::sleep_until(until).await,
                None => std::future::pending().await,
            }
        };
        let ended = race(
            timed,
            first_beat,
            over_budget,
            wait_true(&mut self.hard_stop),
            || {
                heartbeat.start(tokio::spawn(
                    heartbeat_after_first_interval(
                        self.inner.clone(),
                        self.keys.clone(),
                        d.id.clone(),
                        d.token.clone(),
                        ctx.clone(),
                        beats_until,
                    )
                    .in_current_span(),
                ));
            },
        )
        .await;
        let result = match ended {
            Ended::Returned(r) => r,
            Ended::OverBudget => {
                heartbeat.stop();
                let reason = deadline_reason(reg.deadline, "the handler was stopped");
                return Box::pin(self.finish(
                    &d,
                    &labels,
                    Outcome::Dead(reason),
                    Some(started.elapsed()),
                ))
                .await;
            }
            Ended::HardStop => {
                heartbeat.stop();
                warn!("shutdown grace over: job left leased; the watchdog will return it");
                return;
            }
        };
        heartbeat.stop();
        let elapsed = started.elapsed();
        let elapsed_ms = elapsed.as_millis() as u64;
        debug!(elapsed_ms, "handler returned");
        let outcome = match result {
            Ok(Ok(())) => {
                let result = kept_result(ctx.take_result_ref(), MAX_RESULT_BYTES);
                if let Some(req) = self.complete(d, labels, result, elapsed) {
                    // The acker is a whole channel behind: wait for room.
                    Box::pin(self.send_ack(req)).await;
                }
                return;
            }
            // Cut to what the scripts store (a 1 MB message is not logged
            // whole at every retry either).
            Ok(Err(e)) if e.is_retryable() => Outcome::Retry(cut_error(e.message()).into_owned()),
            Ok(Err(e)) => {
                Outcome::Dead(cut_error(&format!("permanent error: {}", e.message())).into_owned())
            }
            Err(panic) => Outcome::Retry(cut_error(&panicked(&*panic)).into_owned()),
        };
        Box::pin(self.finish(&d, &labels, outcome, Some(elapsed))).await;
    }

    /// The handler registered for the delivery's `(queue, type)`, if any.
    fn handler<'a>(&'a self, d: &'a Delivery) -> Option<&'a Registration> {
        self.inner
            .handlers
            .get(&(self.keys.queue.as_str(), d.job_type.as_str()))
    }

    /// The handler found for the delivery's `(queue, type)` (from
    /// [`handler`](Self::handler)), or the dead-letter reason when its
    /// schema version is older than the handler's (a newer one is deferred).
    fn registration(
        &self,
        found: &Registration,
        d: &Delivery,
    ) -> std::result::Result<Registration, String> {
        if d.version != found.version {
            return Err(format!(
                "unknown schema version {} for job type `{}` (the handler expects version {})",
                d.version, d.job_type, found.version
            ));
        }
        Ok(found.clone())
    }

    /// The handler's view of the delivery.
    fn context(&self, d: &Delivery) -> JobContext {
        JobContext {
            inner: Arc::new(ContextInner {
                job_id: d.id.clone(),
                keys: self.keys.clone(),
                job_type: d.job_type.clone(),
                attempt: d.attempt,
                max_attempts: d.max_attempts,
                enqueued_at_ms: d.enqueued_at_ms,
                delivered_at_ms: d.delivered_at_ms,
                fence: d.fence,
                token: d.token.clone(),
                lease: crate::lease_clock::LeaseClock::new(
                    d.claim_sent_at,
                    self.inner.config.lease,
                ),
                conn: Some(self.inner.conn.clone()),
                result_ref: std::sync::Mutex::new(None),
                cancel: crate::context::CancelFlag::default(),
            }),
        }
    }

    /// Success: hands the ack to the queue's acker, which batches it with
    /// others and retries Redis errors until one lease after the handler
    /// returned (see `acker.rs`);
    /// the request back when the acker's channel is full (the caller then
    /// waits for room). The delivery's slot is free once it is queued.
    fn complete(
        &self,
        d: Delivery,
        labels: JobLabels,
        result_ref: Option<Vec<u8>>,
        elapsed: Duration,
    ) -> Option<AckRequest> {
        crate::failpoint::hit("before_ack");
        let req = AckRequest {
            item: AckItem::taking(d, result_ref),
            job: AckedJob {
                labels,
                elapsed,
                span: tracing::Span::current(),
                deadline: tokio::time::Instant::now() + self.inner.config.lease,
            },
        };
        self.acker.try_send(req)
    }

    /// Waits for room in the acker's channel, or for the hard stop (then the
    /// job stays leased: the watchdog returns it).
    async fn send_ack(&mut self, req: AckRequest) {
        tokio::select! {
            biased;
            () = self.acker.send(req) => {}
            () = wait_true(&mut self.hard_stop) => {
                warn!("shutdown grace over before the job's ack was handed to the acker: job left leased; the watchdog will return it");
            }
        }
    }

    /// Retry / dead-letter, retrying Redis errors until one lease after the
    /// handler returned (its heartbeat stopped then: the lease has expired,
    /// the watchdog owns the job), or until the shutdown's hard stop (the
    /// job stays leased for the watchdog). The first call is always sent,
    /// even at the hard stop ([`first_call`]): only the retries stop there.
    /// `elapsed` is the handler's run time; `None` when it never started
    /// (unknown type or version, undecodable payload).
    async fn finish(
        &self,
        d: &Delivery,
        labels: &JobLabels,
        outcome: Outcome,
        elapsed: Option<Duration>,
    ) {
        let deadline = tokio::time::Instant::now() + self.inner.config.lease;
        let mut delay = Duration::from_millis(50);
        let mut hard_stop = self.hard_stop.clone();
        let mut first = true;
        loop {
            crate::failpoint::hit("before_fail");
            let call = async {
                match &outcome {
                    Outcome::Retry(msg) => self.fail(d, FailKind::Retry, msg).await,
                    Outcome::Dead(reason) => self.fail(d, FailKind::Permanent, reason).await,
                }
            };
            let sent = result_call(&mut first, call, &mut hard_stop).await;
            let res = match sent {
                Ok(res) => res,
                Err(maybe) => return left_at_hard_stop(maybe),
            };
            match res {
                Ok(label) => {
                    crate::metrics::finished(labels, label, elapsed);
                    return;
                }
                Err(e) if e.is_lease_lost() => {
                    warn!(error = %e, "result discarded: lease lost");
                    return;
                }
                Err(e) if tokio::time::Instant::now() + delay < deadline => {
                    warn!(error = %e, retry_in_ms = delay.as_millis() as u64, "could not record the job's result; retrying");
                    tokio::select! {
                        biased;
                        () = tokio::time::sleep(delay) => {}
                        () = wait_true(&mut hard_stop) => return left_at_hard_stop(e.outcome_unknown()),
                    }
                    delay = (delay * 2).min(Duration::from_secs(2));
                }
                Err(e) => {
                    error!(error = %e, "could not record the job's result before its lease expired; the watchdog will return it");
                    return;
                }
            }
        }
    }

    /// Runs the fail script; the metrics label on success.
    async fn fail(&self, d: &Delivery, kind: FailKind, message: &str) -> Result<&'static str> {
        let delay = self.inner.config.backoff.delay(d.attempt);
        let mut conn = self.inner.conn.clone();
        let reply = Fail {
            keys: &self.keys,
            id: &d.id,
            token: &d.token,
            kind,
            message,
            delay,
            far_from_tail: d.far_from_tail,
        }
        .run(&mut conn)
        .await?;
        match reply {
            FailReply::Retry { .. } => {
                warn!(
                    error = message,
                    retry_in_ms = delay.as_millis() as u64,
                    "failed; will retry"
                );
                Ok("retried")
            }
            FailReply::Dead { reason } => {
                error!(reason = %reason, "dead-lettered");
                Ok("dead_lettered")
            }
            FailReply::LeaseLost => Err(self.lease_lost(d)),
            FailReply::CancelRequested => self.end_cancelled(d, message).await,
        }
    }

    pub(super) fn lease_lost(&self, d: &Delivery) -> QueueError {
        QueueError::LeaseLost {
            queue: self.keys.queue.clone(),
            job_id: d.id.clone(),
        }
    }
}

/// How the handler's run ended (see [`race`]).
enum Ended<T> {
    Returned(T),
    OverBudget,
    HardStop,
}

/// Runs the handler's future `handler` against the execution budget
/// (`over_budget`) and the shutdown's hard stop; `beat` runs once, when
/// `first_beat` fires (it starts the heartbeat task). Biased, the handler
/// first: a handler whose future completes in the same poll as the budget's
/// timer or the hard stop returned, and its result is recorded (unbiased,
/// `select!` picked a branch at random: a handler that returned `Ok` could
/// be dead-lettered "deadline exceeded" or left leased).
async fn race<T>(
    handler: impl Future<Output = T>,
    first_beat: impl Future<Output = ()>,
    over_budget: impl Future<Output = ()>,
    hard_stop: impl Future<Output = ()>,
    mut beat: impl FnMut(),
) -> Ended<T> {
    tokio::pin!(handler, first_beat, over_budget, hard_stop);
    let mut beaten = false;
    loop {
        tokio::select! {
            biased;
            r = &mut handler => return Ended::Returned(r),
            () = &mut over_budget => return Ended::OverBudget,
            () = &mut hard_stop => return Ended::HardStop,
            () = &mut first_beat, if !beaten => {
                beaten = true;
                beat();
            }
        }
    }
}

/// The first call recording a delivery's result (`fail.lua` in
/// [`JobRunner::finish`], `defer.lua` in `defer`): always sent, even when
/// the shutdown's hard stop is already set. The handler's race counts a
/// handler that returned in the same poll as the hard stop as returned (and
/// a runner polled late, after the hard stop, finds it set): left leased
/// instead, the job was returned by the watchdog and a permanent error or a
/// spent deadline budget ran again, while a success in the same case is
/// acked (its ack goes to the acker).
/// The call is bounded by the connection's response timeout, and once the
/// hard stop is set by [`HARD_STOP_WAIT`], the time the worker waits for
/// its tasks then; `Err(true)` when that ran out with the call in flight
/// (it may have landed).
///
/// [`HARD_STOP_WAIT`]: super::HARD_STOP_WAIT
pub(super) async fn first_call<T>(
    call: impl Future<Output = T>,
    hard_stop: &mut watch::Receiver<bool>,
) -> std::result::Result<T, bool> {
    let given_up = async {
        wait_true(hard_stop).await;
        tokio::time::sleep(super::HARD_STOP_WAIT).await;
    };
    tokio::select! {
        biased;
        res = call => Ok(res),
        () = given_up => Err(true),
    }
}

/// A retry of the call recording a delivery's result: not sent once the
/// shutdown's hard stop is set (`Err(false)`), and given up when it is set
/// with the call in flight (`Err(true)`: it may have landed). Either way the
/// job stays leased for the watchdog.
pub(super) async fn retry_call<T>(
    call: impl Future<Output = T>,
    hard_stop: &mut watch::Receiver<bool>,
) -> std::result::Result<T, bool> {
    if *hard_stop.borrow() {
        return Err(false);
    }
    tokio::select! {
        biased;
        res = call => Ok(res),
        () = wait_true(hard_stop) => Err(true),
    }
}

/// The log line of a delivery whose result (retry, dead-letter, defer) the
/// shutdown's hard stop left unrecorded; `maybe`: a call had been sent, and
/// may have landed.
/// One call of a result write's loop: the first one always sent
/// ([`first_call`]), a retry only before the hard stop ([`retry_call`]).
pub(super) async fn result_call<T>(
    first: &mut bool,
    call: impl Future<Output = T>,
    hard_stop: &mut watch::Receiver<bool>,
) -> std::result::Result<T, bool> {
    if std::mem::take(first) {
        first_call(call, hard_stop).await
    } else {
        retry_call(call, hard_stop).await
    }
}

pub(super) fn left_at_hard_stop(maybe: bool) {
    if maybe {
        warn!("shutdown grace over before Redis confirmed the job's result: it may have been recorded; if not, the job stays leased and the watchdog returns it");
    } else {
        warn!("shutdown grace over before the job's result was recorded: job left leased; the watchdog will return it");
    }
}

/// When the delivery's execution deadline ([`Job::DEADLINE`]: a budget
/// across attempts since the job's first start, Redis clock) passes, on the
/// local monotonic clock measured from the claim; `None` without a deadline.
/// Already spent (a retry due after it): the dead-letter reason.
///
/// [`Job::DEADLINE`]: crate::Job::DEADLINE
/// When a running job's heartbeat gives up: a lease after the earlier of
/// its handler's timeout and its execution budget; `None` without either.
fn beats_until(
    timeout_at: Option<tokio::time::Instant>,
    budget: Option<tokio::time::Instant>,
    lease: Duration,
) -> Option<tokio::time::Instant> {
    let end = match (timeout_at, budget) {
        (Some(a), Some(b)) => a.min(b),
        (a, b) => a.or(b)?,
    };
    end.checked_add(lease)
}

fn execution_budget(
    reg: &Registration,
    d: &Delivery,
) -> std::result::Result<Option<tokio::time::Instant>, String> {
    let Some(limit) = reg.deadline else {
        return Ok(None);
    };
    let spent = Duration::from_millis(
        d.delivered_at_ms
            .saturating_sub(d.first_started_at_ms)
            .max(0) as u64,
    );
    match limit.checked_sub(spent) {
        // Beyond the clock (`Some(Duration::MAX)`): no budget to enforce.
        Some(left) if !left.is_zero() => Ok(d.claim_sent_at.checked_add(left)),
        _ => Err(deadline_reason(Some(limit), "this attempt was not started")),
    }
}

/// The result a handler that returned `Ok` leaves in its completion record:
/// its own, or none when it is larger than `max` ([`MAX_RESULT_BYTES`],
/// below Redis's 512 MB argument limit, which would refuse the ack at every
/// redelivery). The job completes either way: its work is done, and
/// dead-lettering it would invite a replay that does it again. A result
/// dropped is logged (job id and queue: the runner's span).
fn kept_result(result: Option<Vec<u8>>, max: usize) -> Option<Vec<u8>> {
    match result {
        Some(r) if r.len() > max => {
            error!(
                result_bytes = r.len(),
                max_bytes = max,
                "the job's result is larger than a completion record keeps: the job completes \
                 without it (store a large result elsewhere and keep its reference)"
            );
            None
        }
        other => other,
    }
}

/// The retry reason of a handler that panicked (in its future, or before:
/// the decode or a hand-written `Job::run`).
fn panicked(panic: &(dyn std::any::Any + Send)) -> String {
    format!("handler panicked: {}", super::panic_message(panic))
}

/// The dead-letter reason of a job past its execution deadline.
fn deadline_reason(limit: Option<Duration>, what: &str) -> String {
    let limit = limit.unwrap_or_default();
    format!("deadline exceeded: {limit:?} since the first start passed; {what}")
}

#[cfg(test)]
mod tests {
    use super::{kept_result, race, Ended};

    /// A result up to the limit is kept; a larger one is dropped, not turned
    /// into a failure (the job's work is done).
    #[test]
    fn a_result_over_the_limit_is_dropped_and_the_job_still_completes() {
        assert_eq!(kept_result(Some(vec![1; 8]), 8), Some(vec![1; 8]));
        assert_eq!(kept_result(Some(vec![1; 9]), 8), None);
        assert_eq!(kept_result(None, 8), None);
    }

    /// A handler whose future completes in the same poll as the execution
    /// budget's timer, the hard stop and the first heartbeat: its result is
    /// what the runner records, every time. Unbiased, the runner's `select!`
    /// picked a ready branch at random: a handler that returned `Ok` was
    /// dead-lettered "deadline exceeded" or left leased about two runs in
    /// three.
    #[tokio::test(start_paused = true)]
    async fn a_handler_that_returns_with_the_budget_and_the_hard_stop_wins() {
        let mut beats = 0;
        for run in 0..100 {
            let now = tokio::time::Instant::now();
            let ended = race(
                std::future::ready(run),
                tokio::time::sleep_until(now),
                tokio::time::sleep_until(now),
                std::future::ready(()),
                || beats += 1,
            )
            .await;
            let got = match ended {
                Ended::Returned(r) => format!("returned {r}"),
                Ended::OverBudget => "over budget".into(),
                Ended::HardStop => "hard stop".into(),
            };
            assert_eq!(got, format!("returned {run}"), "run {run}");
        }
        assert_eq!(beats, 0, "no heartbeat for a handler that returned");
    }
}

/// A runner whose shutdown's hard stop is already set when it records a
/// delivery's result (a handler that returned in the same poll as the hard
/// stop: `race` counts it as returned; or a runner first polled after it),
/// against a real Redis.
#[cfg(test)]
mod at_the_hard_stop {
    use std::sync::Arc;

    use tokio::sync::watch;

    use super::{JobRunner, Outcome};
    use crate::job::{BoxFuture, Job, JobContext, JobError, JobId};
    use crate::registry::Registration;
    use crate::scripts::claim::{ClaimRow, Delivery};
    use crate::scripts::enqueue::Enqueue;
    use crate::scripts::fetch::Fetch;
    use crate::{Queue, QueueStats};

    const QUEUE: &str = "at_stop";

    /// Job type `t` of the queue (what `Enqueue::test_job` enqueues).
    struct T;
    impl Job for T {
        type Args = ();
        const NAME: &'static str = "t";
        const QUEUE: &'static str = QUEUE;
        fn run(_: JobContext, _: ()) -> BoxFuture<'static, Result<(), JobError>> {
            Box::pin(async { Ok(()) })
        }
    }

    /// A worker's runner for the queue, with the hard stop set, and job
    /// `job` (`max_attempts`) enqueued and claimed: its delivery. The
    /// sender keeps the hard stop set.
    struct AtStop {
        runner: JobRunner,
        d: Delivery,
        queue: Queue,
        _hard_stop: watch::Sender<bool>,
        _acker_stop: watch::Sender<bool>,
        _server: queue_testkit::RedisServer,
    }

    async fn claimed_at_the_hard_stop(max_attempts: u32) -> AtStop {
        let server = queue_testkit::RedisServer::start().unwrap();
        let url = server.url();
        let worker = crate::Worker::builder(&url)
            .register(Registration::of::<T>())
            .build()
            .await
            .unwrap();
        let inner = worker.inner.clone();
        let keys = inner.queues[0].keys.clone();
        let mut conn = inner.conn.clone();
        let id = JobId::from("job");
        Enqueue::test_job(&keys, &id, max_attempts)
            .run(&mut conn)
            .await
            .unwrap();
        let fetch = Fetch {
            keys: &keys,
            lease: std::time::Duration::from_secs(30),
            token_base: "at-stop",
            count: 1,
            first_try: false,
        };
        let d = match fetch.run(&mut conn).await.unwrap().pop() {
            Some(ClaimRow::Claimed(d)) => d,
            other => panic!("expected a claimed row, got {other:?}"),
        };
        let (acker_stop, acker_stop_rx) = watch::channel(false);
        let (acker, _task) = super::super::acker::spawn(inner.clone(), keys.clone(), acker_stop_rx);
        let (hard_stop, hard_stop_rx) = watch::channel(true);
        AtStop {
            runner: JobRunner {
                inner: Arc::clone(&inner),
                keys,
                hard_stop: hard_stop_rx,
                acker,
            },
            d,
            queue: Queue::connect(&url).await.unwrap(),
            _hard_stop: hard_stop,
            _acker_stop: acker_stop,
            _server: server,
        }
    }

    impl AtStop {
        async fn finish(&self, outcome: Outcome) {
            let labels = self.runner.inner.labels.get(QUEUE, &self.d.job_type);
            let elapsed = Some(std::time::Duration::from_millis(1));
            self.runner.finish(&self.d, &labels, outcome, elapsed).await;
        }

        async fn stats(&self) -> QueueStats {
            self.queue.stats(QUEUE).await.unwrap()
        }

        async fn field(&self, name: &str) -> Option<String> {
            let job = self
                .queue
                .job(QUEUE, "job")
                .await
                .unwrap()
                .expect("the job");
            job.field(name).map(str::to_string)
        }
    }

    /// A handler that returned a permanent error at the hard stop: the job
    /// is dead-lettered. Before, `finish()` saw the hard stop before its
    /// first call and left the job leased: the watchdog returned it and,
    /// with attempts left, it ran again.
    #[tokio::test]
    async fn a_permanent_error_at_the_hard_stop_is_dead_lettered() {
        let at = claimed_at_the_hard_stop(3).await;
        at.finish(Outcome::Dead("permanent error: no such account".into()))
            .await;
        let s = at.stats().await;
        assert_eq!(
            (s.processing, s.delayed, s.dead),
            (0, 0, 1),
            "dead-lettered, not left leased: {s:?}"
        );
        assert_eq!(at.field("state").await.as_deref(), Some("dead"));
    }

    /// A retryable error at the hard stop, attempts left: the retry is
    /// recorded (delayed, its attempt counted), not left leased for the
    /// watchdog.
    #[tokio::test]
    async fn a_retryable_error_at_the_hard_stop_is_delayed_for_its_retry() {
        let at = claimed_at_the_hard_stop(3).await;
        at.finish(Outcome::Retry("connection refused".into())).await;
        let s = at.stats().await;
        assert_eq!(
            (s.processing, s.delayed, s.dead),
            (0, 1, 0),
            "delayed for its retry, not left leased: {s:?}"
        );
        assert_eq!(at.field("state").await.as_deref(), Some("delayed"));
        assert_eq!(at.field("attempts").await.as_deref(), Some("1"));
        assert_eq!(
            at.field("last_error").await.as_deref(),
            Some("connection refused")
        );
    }

    /// A delivery of a type this worker has no handler for, deferred at the
    /// hard stop: it goes back to the delayed set (attempt not counted).
    #[tokio::test]
    async fn a_defer_at_the_hard_stop_is_recorded() {
        let at = claimed_at_the_hard_stop(3).await;
        let labels = at.runner.inner.labels.get(QUEUE, &at.d.job_type);
        at.runner.defer(&at.d, &labels, None).await;
        let s = at.stats().await;
        assert_eq!(
            (s.processing, s.delayed, s.dead),
            (0, 1, 0),
            "deferred, not left leased: {s:?}"
        );
        assert_eq!(at.field("state").await.as_deref(), Some("delayed"));
    }
}
