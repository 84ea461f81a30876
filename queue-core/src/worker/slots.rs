//! Concurrency permits. A running job holds a [`Slot`]: one permit of the
//! worker-wide limit and, for a queue with `queue_concurrency`, one of that
//! queue's ([`QueuePermit`]). [`WorkerQueue`] is a queue as the worker
//! consumes it: keys, priority and optional limit.

use std::sync::Arc;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::keys::QueueKeys;

/// A queue as a worker consumes it.
pub(super) struct WorkerQueue {
    /// Shared, not copied, by every runner and fetch of the queue (a clone
    /// of the 15 key strings per job was 10% of a worker's instructions).
    pub(super) keys: Arc<QueueKeys>,
    /// Strict priority among the worker's queues (higher first).
    pub(super) priority: i32,
    /// The queue's own concurrency limit, if any.
    limit: Option<Arc<Semaphore>>,
    /// Most jobs per fetch (`WorkerConfig::fetch_batch_for` of its slots).
    pub(super) fetch_batch: usize,
}

/// Room under a queue's own concurrency limit for one more job.
pub(super) enum QueuePermit {
    /// The queue has no limit of its own.
    Unlimited,
    /// One permit of the queue's limit, released when the job ends.
    Limited(#[allow(dead_code)] OwnedSemaphorePermit), // held, not read
}

/// The permits one running job holds until it ends.
pub(super) struct Slot {
    pub(super) global: OwnedSemaphorePermit,
    #[allow(dead_code)] // held (not read) until the job ends
    pub(super) queue: QueuePermit,
}

impl WorkerQueue {
    pub(super) fn new(
        keys: QueueKeys,
        priority: i32,
        limit: Option<usize>,
        fetch_batch: usize,
    ) -> Self {
        WorkerQueue {
            keys: Arc::new(keys),
            priority,
            limit: limit.map(|n| Arc::new(Semaphore::new(n))),
            fetch_batch: fetch_batch.max(1),
        }
    }

    /// A permit if the queue is under its limit now; `None` when it is at it.
    pub(super) fn try_queue_permit(&self) -> Option<QueuePermit> {
        match &self.limit {
            None => Some(QueuePermit::Unlimited),
            Some(sem) => sem
                .clone()
                .try_acquire_owned()
                .ok()
                .map(QueuePermit::Limited),
        }
    }

    /// Waits until the queue is under its limit; `None` if its semaphore closed.
    pub(super) async fn queue_permit(&self) -> Option<QueuePermit> {
        match &self.limit {
            None => Some(QueuePermit::Unlimited),
            Some(sem) => sem
                .clone()
                .acquire_owned()
                .await
                .ok()
                .map(QueuePermit::Limited),
        }
    }
}
