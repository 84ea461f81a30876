//! [`Batch`]: a set of ordinary jobs with callbacks enqueued exactly once
//! when every member finished — `on_success` when all succeeded,
//! `on_complete` always (docs/WORKFLOWS.md).

use tracing::debug;

use crate::enqueue_options::Enqueued;
use crate::error::Result;
use crate::queue::Queue;

use super::engine::{check_unique_ids, BatchRef};
use super::JobSpec;

/// A batch of jobs with callbacks. The members are ordinary jobs carrying
/// the batch key; each one's ack, dead-letter or cancel counts it in the
/// same script (once per job id), and the one that finishes the batch
/// enqueues the callbacks in that script: exactly once, whatever crashes.
///
/// Members may be on any queue: a member on another queue than the batch's
/// is counted through the relay (docs/WORKFLOWS.md, "Relay"). The callbacks
/// are on the batch's queue (its home: by default the callbacks' queue).
///
/// ```
/// # use queue_core::{BoxFuture, Job, JobContext, JobError, JobSpec, Batch, Queue};
/// # struct Resize;
/// # impl Job for Resize {
/// #     type Args = u32;
/// #     const NAME: &'static str = "resize";
/// #     const QUEUE: &'static str = "images";
/// #     fn run(_: JobContext, _: u32) -> BoxFuture<'static, Result<(), JobError>> { Box::pin(async { Ok(()) }) }
/// # }
/// # #[tokio::main] async fn main() -> Result<(), queue_core::QueueError> {
/// # let server = queue_testkit::RedisServer::start().unwrap();
/// let queue = Queue::connect(&server.url()).await?;
/// let created = Batch::new(&queue)
///     .id("album-7")
///     .on_success(JobSpec::new::<Resize>(&0)?)
///     .add(JobSpec::new::<Resize>(&1)?)
///     .add(JobSpec::new::<Resize>(&2)?)
///     .enqueue()
///     .await?;
/// assert_eq!(created.members.len(), 2);
/// let summary = queue.batch("images", "album-7").await?.unwrap();
/// assert_eq!((summary.total, summary.state.as_str()), (2, "sealed"));
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct Batch {
    queue: Queue,
    id: Option<String>,
    home: Option<String>,
    on_success: Option<JobSpec>,
    on_complete: Option<JobSpec>,
    members: Vec<JobSpec>,
}

/// What [`Batch::enqueue`] created.
#[derive(Debug, Clone)]
pub struct BatchCreated {
    /// The batch id (read it back with [`Queue::batch`]).
    pub id: String,
    /// The queue its hash lives on.
    pub queue: String,
    /// One outcome per member, in order (`Duplicate` on a retried enqueue).
    pub members: Vec<Enqueued>,
}

impl Batch {
    /// An empty batch enqueued through `queue`'s connection.
    pub fn new(queue: &Queue) -> Batch {
        Batch {
            queue: queue.clone(),
            id: None,
            home: None,
            on_success: None,
            on_complete: None,
            members: Vec::new(),
        }
    }

    /// A stable batch id (default: random). Enqueuing the same batch again
    /// (same batch and member ids) after an error is a no-op for what landed.
    pub fn id(mut self, id: impl Into<String>) -> Self {
        self.id = Some(id.into());
        self
    }

    /// The queue the batch hash lives on (default: the success callback's,
    /// else the complete callback's, else the first member's queue).
    pub fn home(mut self, queue: &str) -> Self {
        self.home = Some(queue.to_string());
        self
    }

    /// Enqueued once, when every member succeeded (default id `<batch>:success`).
    pub fn on_success(mut self, job: JobSpec) -> Self {
        self.on_success = Some(job);
        self
    }

    /// Enqueued once, when every member finished: succeeded, dead-lettered or
    /// cancelled (default id `<batch>:complete`).
    pub fn on_complete(mut self, job: JobSpec) -> Self {
        self.on_complete = Some(job);
        self
    }

    /// Adds a member.
    // The builder's verb, as issue #14 names it; not arithmetic.
    #[allow(clippy::should_implement_trait)]
    pub fn add(mut self, job: JobSpec) -> Self {
        self.members.push(job);
        self
    }

    /// Opens the batch, registers and enqueues the members, then seals it.
    /// A crash before the seal leaves the batch open (it never fires): call
    /// again with the same batch and member ids.
    ///
    /// The home queue's name, every member (queue name, id, extra field
    /// names: [`EnqueueOptions::validate`](crate::EnqueueOptions::validate))
    /// and every callback (queue name, id) are checked before anything is
    /// written: a refused batch leaves nothing in Redis. So is an id given
    /// twice among the members and callbacks (whatever their queues): a
    /// batch counts a member id once, and a callback whose id a member took
    /// could not be created.
    pub async fn enqueue(mut self) -> Result<BatchCreated> {
        let home = self
            .home
            .clone()
            .or_else(|| self.on_success.as_ref().map(|j| j.queue.clone()))
            .or_else(|| self.on_complete.as_ref().map(|j| j.queue.clone()))
            .or_else(|| self.members.first().map(|j| j.queue.clone()))
            .ok_or_else(|| {
                crate::QueueError::Config("a batch needs a member or a callback".into())
            })?;
        let id = self
            .id
            .clone()
            .unwrap_or_else(|| uuid::Uuid::new_v4().to_string());
        BatchRef::check_id(&home, &id)?;
        crate::enqueue_options::check_queue_name(&home)?;
        for job in self.on_success.iter().chain(&self.on_complete) {
            job.check_callback()?;
        }
        for m in &self.members {
            m.check_member(true)?;
        }
        let batch = BatchRef::new(&home, &id);
        let mut spec = Vec::new();
        if let Some(job) = &mut self.on_success {
            batch.check_callback_queue(&job.queue)?;
            if job.job_id().is_none() {
                *job = job.clone().id(format!("{id}:success"));
            }
            spec.extend(job.callback_fields("s_", None));
        }
        if let Some(job) = &mut self.on_complete {
            batch.check_callback_queue(&job.queue)?;
            if job.job_id().is_none() {
                *job = job.clone().id(format!("{id}:complete"));
            }
            spec.extend(job.callback_fields("c_", None));
        }
        let mut ids = Vec::with_capacity(self.members.len());
        for m in &mut self.members {
            ids.push(m.ensure_id().to_string());
        }
        let callbacks = self.on_success.iter().chain(&self.on_complete);
        check_unique_ids(
            &batch,
            ids.iter()
                .map(String::as_str)
                .chain(callbacks.filter_map(|j| j.job_id()).map(|id| id.as_str())),
        )?;
        let mut conn = self.queue.connection();
        batch.open(&mut conn, "", &spec).await?;
        let registered: Vec<(&str, &str)> = self
            .members
            .iter()
            .zip(&ids)
            .map(|(m, id)| (m.queue.as_str(), id.as_str()))
            .collect();
        batch.register(&mut conn, "", &registered).await?;
        let members = batch.enqueue_members(&self.queue, self.members).await?;
        let state = batch.seal(&mut conn).await?;
        debug!(queue = %home, batch = %id, members = ids.len(), %state, "batch enqueued");
        Ok(BatchCreated {
            id,
            queue: home,
            members,
        })
    }
}
