//! [`Flow`]: a parent job that waits for its children (which may have
//! children of their own), compiled to batches: the parent is the batch's
//! complete callback, enqueued when the last child finished, or
//! dead-lettered when a child under [`ChildPolicy::FailParent`] failed.

use crate::enqueue_options::Enqueued;
use crate::error::Result;
use crate::job::JobId;
use crate::queue::Queue;
use crate::BoxFuture;

use super::engine::{check_unique_ids, BatchRef};
use super::JobSpec;

/// What a child's failure (dead-lettered or cancelled) does to its parent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ChildPolicy {
    /// The parent is dead-lettered (naming the child) instead of enqueued,
    /// once every child finished. The default.
    #[default]
    FailParent,
    /// The parent runs; the failure is recorded in
    /// [`child_results`](crate::JobContext::child_results).
    Continue,
    /// The parent runs; the child is left out of its results.
    Ignore,
}

impl ChildPolicy {
    pub(crate) fn as_arg(self) -> &'static str {
        match self {
            ChildPolicy::FailParent => "fail",
            ChildPolicy::Continue => "continue",
            ChildPolicy::Ignore => "ignore",
        }
    }
}

#[derive(Debug, Clone)]
enum Child {
    Job(JobSpec),
    Flow(Flow),
}

/// A parent job enqueued once all its children finished; it reads their
/// results with [`JobContext::child_results`](crate::JobContext::child_results).
/// The flow's batch id is the parent's job id. All jobs of a flow are on
/// the parent's queue (different job types; see docs/WORKFLOWS.md, "Limits").
///
/// ```
/// # use queue_core::{BoxFuture, Job, JobContext, JobError, JobSpec, Flow, ChildPolicy, Queue};
/// # struct Step;
/// # impl Job for Step {
/// #     type Args = String;
/// #     const NAME: &'static str = "step";
/// #     const QUEUE: &'static str = "orders";
/// #     fn run(_: JobContext, _: String) -> BoxFuture<'static, Result<(), JobError>> { Box::pin(async { Ok(()) }) }
/// # }
/// # #[tokio::main] async fn main() -> Result<(), queue_core::QueueError> {
/// # let server = queue_testkit::RedisServer::start().unwrap();
/// let queue = Queue::connect(&server.url()).await?;
/// let step = |s: &str| JobSpec::new::<Step>(&s.to_string());
/// Flow::new(step("close")?.id("close-7"))
///     .child(step("invoice")?)
///     .child_with(ChildPolicy::Continue, step("email")?)
///     .enqueue(&queue)
///     .await?;
/// let summary = queue.batch("orders", "close-7").await?.unwrap();
/// assert_eq!(summary.total, 2);
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct Flow {
    parent: JobSpec,
    children: Vec<(ChildPolicy, Child)>,
}

/// What [`Flow::enqueue`] created.
#[derive(Debug, Clone)]
pub struct FlowCreated {
    /// The parent's id (also the flow's batch id).
    pub parent: String,
    /// The parent's queue (where the flow's batch hash lives).
    pub queue: String,
    /// The leaf children enqueued now, in order (a nested flow's children
    /// follow its own).
    pub children: Vec<Enqueued>,
}

impl Flow {
    /// A flow whose parent is `parent`.
    pub fn new(parent: JobSpec) -> Flow {
        Flow {
            parent,
            children: Vec::new(),
        }
    }

    /// A child whose failure fails the parent.
    pub fn child(self, job: JobSpec) -> Self {
        self.child_with(ChildPolicy::FailParent, job)
    }

    /// A child with its own failure policy.
    pub fn child_with(mut self, policy: ChildPolicy, job: JobSpec) -> Self {
        self.children.push((policy, Child::Job(job)));
        self
    }

    /// A child that is itself a flow: its parent counts as this flow's child
    /// (it finishes when it ran, after its own children).
    pub fn child_flow(self, flow: Flow) -> Self {
        self.child_flow_with(ChildPolicy::FailParent, flow)
    }

    /// A nested flow with a failure policy for its parent.
    pub fn child_flow_with(mut self, policy: ChildPolicy, flow: Flow) -> Self {
        self.children.push((policy, Child::Flow(flow)));
        self
    }

    /// Opens the flow's batch (nested ones first), enqueues the leaf
    /// children and seals. Idempotent with stable ids: after an error,
    /// enqueue the same flow again.
    ///
    /// Refused before any write ([`QueueError::Workflow`](crate::QueueError::Workflow),
    /// naming the flow and the id): an id given twice among one flow's
    /// parent and children (a batch counts a member id once, whatever its
    /// queue; a parent whose id a child took is never created), or a
    /// (queue, id) given twice anywhere in the tree. The same id on two
    /// queues in sibling nested flows is two jobs, and accepted.
    pub async fn enqueue(mut self, queue: &Queue) -> Result<FlowCreated> {
        self.check()?;
        self.assign_ids();
        self.check_levels()?;
        let mut ids = Vec::new();
        self.collect_ids(&mut ids);
        let id = self.parent.ensure_id();
        let outer = BatchRef::new(&self.parent.queue, id.as_str());
        // Across the whole tree a job is (queue, id): the same id on two
        // queues is two jobs of two batches (nested flows' children), the
        // same on one queue would be enqueued once.
        let mut seen = std::collections::HashSet::new();
        for (q, id) in &ids {
            if !seen.insert((q.as_str(), id.as_str())) {
                return Err(outer.error(format!(
                    "job id `{id}` is given twice in the flow on queue `{q}`: \
                     each job of a flow needs an id of its own"
                )));
            }
        }
        self.enqueue_in(queue, None).await
    }

    /// Gives every parent and child without an id a random one (what
    /// `enqueue_in` would give it), so that the ids can be checked first.
    fn assign_ids(&mut self) {
        self.parent.ensure_id();
        for (_, child) in &mut self.children {
            match child {
                Child::Job(j) => {
                    j.ensure_id();
                }
                Child::Flow(f) => f.assign_ids(),
            }
        }
    }

    /// The ids of every job of the flow, nested flows' included: each
    /// parent once (a nested flow's parent is both a child of the outer
    /// flow and its own flow's callback: one job), each leaf child once.
    fn collect_ids(&self, out: &mut Vec<(String, JobId)>) {
        out.extend(
            self.parent
                .job_id()
                .map(|id| (self.parent.queue.clone(), id.clone())),
        );
        for (_, child) in &self.children {
            match child {
                Child::Job(j) => out.extend(j.job_id().map(|id| (j.queue.clone(), id.clone()))),
                Child::Flow(f) => f.collect_ids(out),
            }
        }
    }

    /// Each flow's own batch counts its children by id whatever their
    /// queues, and its parent is created under its id: the parent's and the
    /// children's ids (a nested flow's parent being its child here) must
    /// differ, level by level (called after `assign_ids`).
    fn check_levels(&self) -> Result<()> {
        let Some(id) = self.parent.job_id() else {
            return Ok(());
        };
        let batch = BatchRef::new(&self.parent.queue, id.as_str());
        let children = self.children.iter().filter_map(|(_, child)| match child {
            Child::Job(j) => j.job_id(),
            Child::Flow(f) => f.parent.job_id(),
        });
        check_unique_ids(
            &batch,
            std::iter::once(id.as_str()).chain(children.map(JobId::as_str)),
        )?;
        for (_, child) in &self.children {
            if let Child::Flow(f) = child {
                f.check_levels()?;
            }
        }
        Ok(())
    }

    /// Refuses, before any write, a flow whose parent's id (its batch id),
    /// or a nested flow's, is not a valid batch id (see `BatchRef::check_id`),
    /// or whose parents (queue name, id) or leaf children (queue name, id,
    /// extra field names) would be refused: `JobSpec::check_callback`,
    /// `JobSpec::check_member`.
    fn check(&self) -> Result<()> {
        if let Some(id) = self.parent.job_id() {
            BatchRef::check_id(&self.parent.queue, id.as_str())?;
        }
        self.parent.check_callback()?;
        for (_, child) in &self.children {
            match child {
                Child::Job(j) => j.check_member(true)?,
                Child::Flow(f) => f.check()?,
            }
        }
        Ok(())
    }

    fn enqueue_in<'a>(
        mut self,
        queue: &'a Queue,
        member_of: Option<BatchRef>,
    ) -> BoxFuture<'a, Result<FlowCreated>> {
        Box::pin(async move {
            let id = self.parent.ensure_id().to_string();
            let batch = BatchRef::new(&self.parent.queue, &id);
            // (policy, queue, id) of each child (a nested flow: its parent).
            let mut ids: Vec<(ChildPolicy, String, String)> = Vec::new();
            for (policy, child) in &mut self.children {
                let spec = match child {
                    Child::Job(j) => j,
                    Child::Flow(f) => &mut f.parent,
                };
                let child_id = spec.ensure_id().to_string();
                ids.push((*policy, spec.queue.clone(), child_id));
            }
            let spec = self
                .parent
                .callback_fields("c_", member_of.as_ref().map(|b| b.key.as_str()));
            let mut conn = queue.connection();
            batch
                .open(&mut conn, ChildPolicy::FailParent.as_arg(), &spec)
                .await?;
            for policy in [
                ChildPolicy::FailParent,
                ChildPolicy::Continue,
                ChildPolicy::Ignore,
            ] {
                let these: Vec<(&str, &str)> = ids
                    .iter()
                    .filter(|(p, _, _)| *p == policy)
                    .map(|(_, q, id)| (q.as_str(), id.as_str()))
                    .collect();
                batch.register(&mut conn, policy.as_arg(), &these).await?;
            }
            let mut leaves = Vec::new();
            let mut children = Vec::new();
            for (_, child) in self.children {
                match child {
                    Child::Job(j) => leaves.push(j),
                    Child::Flow(f) => {
                        let nested = f.enqueue_in(queue, Some(batch.clone())).await?;
                        children.extend(nested.children);
                    }
                }
            }
            let mut enqueued = batch.enqueue_members(queue, leaves).await?;
            enqueued.extend(children);
            batch.seal(&mut conn).await?;
            Ok(FlowCreated {
                parent: id,
                queue: batch.queue,
                children: enqueued,
            })
        })
    }
}
