//! The operator's flow control: pause / resume a queue and cancel a job,
//! as [`Admin`] calls over [`Queue::pause`], [`Queue::resume`] and
//! [`Queue::cancel`] (docs/FLOW-CONTROL.md).

use super::{Admin, Result};
use crate::flow::{CancelOutcome, PauseChange};
use crate::job::JobId;
#[cfg(doc)]
use crate::queue::Queue;

impl Admin {
    /// Pauses `queue`: [`Queue::pause`].
    pub async fn pause(&self, queue: &str) -> Result<PauseChange> {
        Ok(self.queue.pause(queue).await?)
    }

    /// Resumes `queue`: [`Queue::resume`].
    pub async fn resume(&self, queue: &str) -> Result<PauseChange> {
        Ok(self.queue.resume(queue).await?)
    }

    /// Cancels job `id` of `queue`: [`Queue::cancel`].
    pub async fn cancel(&self, queue: &str, id: impl Into<JobId>) -> Result<CancelOutcome> {
        Ok(self.queue.cancel(queue, id).await?)
    }
}

impl Admin {
    /// Pauses group `group` of `queue`: [`Queue::pause_group`].
    pub async fn pause_group(&self, queue: &str, group: &str) -> Result<PauseChange> {
        Ok(self.queue.pause_group(queue, group).await?)
    }

    /// Resumes group `group` of `queue`: [`Queue::resume_group`].
    pub async fn resume_group(&self, queue: &str, group: &str) -> Result<PauseChange> {
        Ok(self.queue.resume_group(queue, group).await?)
    }
}
