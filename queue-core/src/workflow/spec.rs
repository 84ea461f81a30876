//! [`JobSpec`]: one job of a batch or flow, encoded but not yet enqueued —
//! a member, a callback or a flow's parent.

use crate::enqueue_options::EnqueueOptions;
use crate::error::Result;
use crate::job::{Job, JobId};

/// A job to enqueue as part of a [`Batch`](crate::Batch) or
/// [`Flow`](crate::Flow): its queue, type, schema version, attempts and
/// MessagePack payload, plus [`EnqueueOptions`] (a member may be delayed or
/// carry other features' extra fields; callbacks and parents use only the id).
///
/// ```
/// # use queue_core::{BoxFuture, Job, JobContext, JobError, JobSpec};
/// # struct Ping;
/// # impl Job for Ping {
/// #     type Args = String;
/// #     const NAME: &'static str = "ping";
/// #     const QUEUE: &'static str = "default";
/// #     fn run(_: JobContext, _: String) -> BoxFuture<'static, Result<(), JobError>> { Box::pin(async { Ok(()) }) }
/// # }
/// let spec = JobSpec::new::<Ping>(&"hi".to_string()).unwrap().id("ping-1");
/// assert_eq!(spec.queue(), "default");
/// assert_eq!(spec.job_id().unwrap().as_str(), "ping-1");
/// ```
#[derive(Debug, Clone)]
pub struct JobSpec {
    pub(crate) queue: String,
    pub(crate) job_type: String,
    pub(crate) version: u32,
    pub(crate) max_attempts: u32,
    pub(crate) payload: Vec<u8>,
    pub(crate) opts: EnqueueOptions,
}

impl JobSpec {
    /// The job `J` with `args` (encoded now: an encoding error is returned
    /// here), with the rate key `J` derives from them (`#[job(rate_key = …)]`,
    /// as [`Queue::enqueue_with`](crate::Queue::enqueue_with) sets it; before,
    /// a batch or flow member ran outside its key's limits).
    pub fn new<J: Job>(args: &J::Args) -> Result<JobSpec> {
        let payload = crate::job::encode_args::<J>(args, None)?;
        let mut spec = Self::raw(
            J::QUEUE,
            J::NAME,
            J::SCHEMA_VERSION,
            J::MAX_ATTEMPTS,
            payload,
        );
        spec.opts = crate::limits::with_rate_key::<J>(spec.opts, args);
        Ok(spec)
    }

    /// A job from already-encoded parts (producers without the Rust type).
    pub fn raw(
        queue: &str,
        job_type: &str,
        schema_version: u32,
        max_attempts: u32,
        payload: Vec<u8>,
    ) -> JobSpec {
        JobSpec {
            queue: queue.to_string(),
            job_type: job_type.to_string(),
            version: schema_version,
            max_attempts,
            payload,
            opts: EnqueueOptions::new(),
        }
    }

    /// A stable id (default: a random one). Enqueuing a batch or flow again
    /// with the same ids is a no-op, so a producer may retry after an error.
    pub fn id(mut self, id: impl Into<JobId>) -> Self {
        self.opts = self.opts.id(id);
        self
    }

    /// Enqueue options of a member (delay, run-at, extra fields; the id set
    /// with [`id`](Self::id) and the rate key [`new`](Self::new) derived are
    /// kept unless `opts` has its own).
    pub fn options(mut self, opts: EnqueueOptions) -> Self {
        let id = self.opts.id.take();
        let rate_key = self
            .opts
            .extra_fields
            .iter()
            .find(|(n, _)| n == "rate_key")
            .cloned();
        self.opts = opts;
        if self.opts.id.is_none() {
            self.opts.id = id;
        }
        if let Some((_, key)) = rate_key {
            if !self.opts.extra_fields.iter().any(|(n, _)| n == "rate_key") {
                self.opts = self.opts.rate_key(key);
            }
        }
        self
    }

    /// The queue the job goes to.
    pub fn queue(&self) -> &str {
        &self.queue
    }

    /// The id, when one was given (or assigned at enqueue).
    pub fn job_id(&self) -> Option<&JobId> {
        self.opts.id.as_ref()
    }

    /// The id, assigning a random one first when none was given.
    pub(crate) fn ensure_id(&mut self) -> JobId {
        self.opts.id.get_or_insert_with(JobId::random).clone()
    }

    /// Checks a member as its enqueue will send it, before the workflow
    /// writes anything: its queue name, its id (when set) and its extra
    /// field names ([`EnqueueOptions::validate`]), with the `batch` field
    /// its enqueue adds (`batch_field`). Before, these were refused by the
    /// members' enqueue, after the batch was opened and its members
    /// registered: the batch stayed open and never fired.
    pub(crate) fn check_member(&self, batch_field: bool) -> Result<()> {
        if !batch_field {
            return self.opts.validate(&self.queue);
        }
        let batch = super::engine::MEMBER_FIELD;
        self.opts
            .clone()
            .extra_field(batch, "")
            .validate(&self.queue)
    }

    /// Checks a callback or a flow's parent before the workflow writes
    /// anything: its queue name and its id (when set). Its other options
    /// are not used (docs/WORKFLOWS.md), so they are not checked.
    pub(crate) fn check_callback(&self) -> Result<()> {
        let id = EnqueueOptions {
            id: self.opts.id.clone(),
            ..EnqueueOptions::new()
        };
        id.validate(&self.queue)
    }

    /// The spec fields a batch hash keeps for a callback (`prefix`: `s_` or
    /// `c_`), read by `wf_spawn` in prelude.lua; `member_of`: the batch key
    /// the spawned job is itself a member of (a nested flow's parent).
    pub(crate) fn callback_fields(
        &mut self,
        prefix: &str,
        member_of: Option<&str>,
    ) -> Vec<(String, Vec<u8>)> {
        let id = self.ensure_id();
        let base = crate::keys::QueueKeys::new(&self.queue)
            .job_prefix
            .trim_end_matches("job:")
            .to_string();
        let mut out = vec![
            (format!("{prefix}base"), base.into_bytes()),
            (format!("{prefix}id"), id.as_str().as_bytes().to_vec()),
            (format!("{prefix}type"), self.job_type.clone().into_bytes()),
            (format!("{prefix}v"), self.version.to_string().into_bytes()),
            (format!("{prefix}payload"), self.payload.clone()),
            (
                format!("{prefix}max"),
                self.opts
                    .max_attempts
                    .unwrap_or(self.max_attempts)
                    .max(1)
                    .to_string()
                    .into_bytes(),
            ),
        ];
        if let Some(key) = member_of {
            out.push((format!("{prefix}member"), key.as_bytes().to_vec()));
        }
        out
    }
}
