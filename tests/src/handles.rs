//! Handles on the background tasks a test starts: [`WorkerHandle`] (a
//! `Worker` running in a task; `stop` = shutdown + join) and
//! [`WatchdogHandle`] (a `Watchdog` loop that stops on drop), plus
//! [`add_report`] to sum watchdog reports.

use queue_core::{ReclaimReport, ShutdownHandle, Watchdog, WorkerBuilder};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// A worker running in a background task until [`WorkerHandle::stop`].
///
/// Dropping the handle requests a shutdown (without waiting for it).
pub struct WorkerHandle {
    shutdown: ShutdownHandle,
    join: Option<JoinHandle<queue_core::Result<()>>>,
}

impl WorkerHandle {
    /// Builds the worker (panics if it does not build) and runs it in a task.
    pub async fn start(builder: WorkerBuilder) -> WorkerHandle {
        let worker = builder.build().await.expect("worker builds");
        let shutdown = worker.shutdown_handle();
        let join = tokio::spawn(worker.run_until(std::future::pending()));
        WorkerHandle {
            shutdown,
            join: Some(join),
        }
    }

    /// Requests a graceful shutdown without waiting for it (see [`WorkerHandle::join`]).
    pub fn shutdown(&self) {
        self.shutdown.shutdown();
    }

    /// Waits for the worker to return and asserts it returned `Ok`.
    pub async fn join(mut self) {
        if let Some(join) = self.join.take() {
            join.await.expect("worker task").expect("worker returns Ok");
        }
    }

    /// Graceful shutdown (in-flight jobs finish within the grace period),
    /// then [`WorkerHandle::join`].
    pub async fn stop(self) {
        self.shutdown();
        self.join().await;
    }

    /// The shutdown handle and the task, for callers that manage them by hand.
    pub fn into_parts(mut self) -> (ShutdownHandle, JoinHandle<queue_core::Result<()>>) {
        let join = self.join.take().expect("not joined yet");
        (self.shutdown.clone(), join)
    }
}

impl Drop for WorkerHandle {
    fn drop(&mut self) {
        if self.join.is_some() {
            self.shutdown.shutdown();
        }
    }
}

/// Shuts all `workers` down at once, then joins each.
pub async fn stop_all(workers: Vec<WorkerHandle>) {
    for w in &workers {
        w.shutdown();
    }
    for w in workers {
        w.join().await;
    }
}

/// A watchdog loop (`Watchdog::run_until`) in a background task. Stops on
/// [`WatchdogHandle::stop`], which returns the summed report, or on drop.
pub struct WatchdogHandle {
    stop: Option<oneshot::Sender<()>>,
    join: Option<JoinHandle<ReclaimReport>>,
}

impl WatchdogHandle {
    /// Runs `watchdog` until stopped.
    pub fn spawn(watchdog: Watchdog) -> WatchdogHandle {
        let (tx, rx) = oneshot::channel::<()>();
        let join = tokio::spawn(async move {
            watchdog
                .run_until(async {
                    let _ = rx.await;
                })
                .await
        });
        WatchdogHandle {
            stop: Some(tx),
            join: Some(join),
        }
    }

    /// Stops the loop and returns what all its passes did.
    pub async fn stop(mut self) -> ReclaimReport {
        self.signal();
        let join = self.join.take().expect("not stopped yet");
        join.await.expect("watchdog task")
    }

    fn signal(&mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
    }
}

impl Drop for WatchdogHandle {
    fn drop(&mut self) {
        self.signal();
    }
}

/// Stops all `dogs` at once and returns their reports summed.
pub async fn stop_watchdogs(mut dogs: Vec<WatchdogHandle>) -> ReclaimReport {
    for d in &mut dogs {
        d.signal();
    }
    let mut total = ReclaimReport::default();
    for d in dogs {
        add_report(&mut total, d.stop().await);
    }
    total
}

/// Adds `other`'s counts to `total`.
pub fn add_report(total: &mut ReclaimReport, other: ReclaimReport) {
    total.reclaimed += other.reclaimed;
    total.adopted += other.adopted;
    total.dead_lettered += other.dead_lettered;
    total.promoted += other.promoted;
    total.dropped += other.dropped;
}
