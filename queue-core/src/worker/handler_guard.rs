//! What a running delivery's runner holds that must end with it, however it
//! ends: the handler's future ([`GuardedHandler`]: its panics caught when
//! polled *and when dropped*) and the heartbeat task ([`HeartbeatTask`]:
//! aborted when the runner drops it, an unwinding runner included).
//!
//! Before, a handler future that panicked while dropped (dropped at its
//! timeout, over its deadline budget or at the hard stop: a guard that
//! panics when not committed, a blocking client dropped in async code)
//! unwound the runner, and the heartbeat's plain `JoinHandle` was dropped
//! with it: dropping a tokio handle detaches the task, so the heartbeat kept
//! extending the lease of a job nothing ran any more, and the watchdog never
//! returned it (stop 46 review).

use std::any::Any;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::task::JoinHandle;
use tracing::error;

use crate::job::{BoxFuture, JobError};

/// What a guarded handler ends with: its result, or its panic's payload.
pub(super) type HandlerEnd = std::result::Result<Result<(), JobError>, Box<dyn Any + Send>>;

/// A handler's future, polled with its panics caught, and dropped with the
/// panic of its drop caught and logged (the job's span is the caller's): the
/// runner then goes on to record the outcome it decided (timed out, over
/// budget) or to leave the job leased at the hard stop.
pub(super) struct GuardedHandler {
    fut: Option<BoxFuture<'static, Result<(), JobError>>>,
}

impl GuardedHandler {
    pub(super) fn new(fut: BoxFuture<'static, Result<(), JobError>>) -> Self {
        GuardedHandler { fut: Some(fut) }
    }

    /// Drops the handler's future (once), its drop's panic caught and
    /// logged.
    fn drop_handler(&mut self) {
        if let Some(fut) = self.fut.take() {
            if let Err(panic) = std::panic::catch_unwind(AssertUnwindSafe(move || drop(fut))) {
                error!(
                    panic = %super::panic_message(&*panic),
                    "the handler's future panicked while it was dropped; the run's outcome stands"
                );
            }
        }
    }
}

impl Future for GuardedHandler {
    type Output = HandlerEnd;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<HandlerEnd> {
        let Some(fut) = self.fut.as_mut() else {
            return Poll::Pending;
        };
        match std::panic::catch_unwind(AssertUnwindSafe(|| fut.as_mut().poll(cx))) {
            Ok(Poll::Pending) => Poll::Pending,
            Ok(Poll::Ready(r)) => Poll::Ready(Ok(r)),
            Err(panic) => {
                // Its state after a panic is not to be polled again; its drop
                // is guarded like any other.
                self.drop_handler();
                Poll::Ready(Err(panic))
            }
        }
    }
}

impl Drop for GuardedHandler {
    fn drop(&mut self) {
        self.drop_handler();
    }
}

/// The heartbeat task of a running delivery, once the runner started it:
/// aborted when stopped or dropped.
#[derive(Default)]
pub(super) struct HeartbeatTask(Option<JoinHandle<()>>);

impl HeartbeatTask {
    pub(super) fn start(&mut self, task: JoinHandle<()>) {
        self.stop();
        self.0 = Some(task);
    }

    pub(super) fn stop(&mut self) {
        if let Some(task) = self.0.take() {
            task.abort();
        }
    }
}

impl Drop for HeartbeatTask {
    fn drop(&mut self) {
        self.stop();
    }
}
