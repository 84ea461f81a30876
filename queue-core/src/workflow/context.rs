//! What a handler can do with the batch or flow its job belongs to:
//! add members to an open batch, read the batch's counts (callbacks), read
//! the children's results (a flow's parent), set a typed result for its
//! parent. Each is one or two Redis calls, made only when called.

use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::context::JobContext;
use crate::enqueue_options::Enqueued;
use crate::error::QueueError;
use crate::job::JobError;
use crate::queue::Queue;

use super::engine::{parse_key, BatchRef, MEMBER_FIELD, SPAWNED_BY_FIELD};
use super::summary::{decode_result, read_results, TYPED_PREFIX};
use super::{BatchSummary, ChildResult, JobSpec};

impl JobContext {
    /// (member of, spawned by): the batch keys in this job's hash.
    async fn batch_fields(&self) -> Result<(Option<String>, Option<String>), JobError> {
        let Some(conn) = &self.inner.conn else {
            return Ok((None, None));
        };
        let key = self.inner.keys.job(self.inner.job_id.as_str());
        let (member, spawned): (Option<String>, Option<String>) = redis::cmd("HMGET")
            .arg(key)
            .arg(MEMBER_FIELD)
            .arg(SPAWNED_BY_FIELD)
            .query_async(&mut conn.clone())
            .await
            .map_err(|e| JobError::retryable(format!("cannot read the job's batch: {e}")))?;
        Ok((member, spawned))
    }

    fn batch_ref(&self, key: &str) -> Result<BatchRef, JobError> {
        parse_key(key).ok_or_else(|| JobError::permanent(format!("corrupt batch key {key:?}")))
    }

    /// Adds a member to the batch this job is a member of, from inside the
    /// job: registered before this job's own ack, so the batch cannot fire
    /// in between. Give `job` a stable id (e.g. derived from this job's id):
    /// a re-run of this job then adds nothing twice.
    ///
    /// `job` is checked before it is registered, as
    /// [`Batch::enqueue`](crate::Batch::enqueue) checks its members (queue
    /// name, id — e.g. at most [`JobId::MAX_LEN`](crate::JobId::MAX_LEN)
    /// bytes —, extra field names): a refusal is a permanent [`JobError`]
    /// and the batch does not count it.
    pub async fn batch_add(&self, mut job: JobSpec) -> Result<Enqueued, JobError> {
        let (member, _) = self.batch_fields().await?;
        let Some(key) = member else {
            return Err(JobError::permanent(
                "batch_add: this job is not a batch member",
            ));
        };
        if key.contains('\n') {
            // Several batch keys, one per line: a DAG step that several
            // steps run after. Which batch would the member join? Refused
            // for good (a retry would fail the same way).
            return Err(JobError::permanent(format!(
                "batch_add: this job is a member of {} batches (a DAG step that several steps \
                 run after), not one: a member can be added to a single batch only",
                key.lines().count()
            )));
        }
        let batch = self.batch_ref(&key)?;
        let id = job.ensure_id().to_string();
        // Before it is registered: the member as its enqueue will send it
        // (queue name, id, extra field names with the `batch` field), as
        // `Batch::enqueue` checks its members. Registered first, a member
        // its enqueue then refuses (a derived id past 512 bytes) was counted
        // in `total` with no job to finish it: the batch never fired. The
        // same spec is refused again on a retry, so for good.
        job.check_member(true).map_err(|e| {
            JobError::permanent(format!(
                "batch_add to batch `{}` on queue `{}`: {e}",
                batch.id, batch.queue
            ))
        })?;
        let conn = self.inner.conn.clone().expect("checked by batch_fields");
        // Before it is registered: the batch is sealed, and an id taken by a
        // job outside it would be counted by none, so the batch would never
        // fire. That is refused for good (a retry finds the same job).
        batch
            .check_free_member(&mut conn.clone(), &job.queue, &id)
            .await
            .map_err(|e| match e {
                QueueError::Workflow { .. } => JobError::permanent(e),
                e => JobError::retryable(e),
            })?;
        // The batch fired already, or is gone (its keys expired, or deleted):
        // no member can join it, now or on a retry. Refused for good, naming
        // the batch (before, retried until the adder's attempts ran out).
        batch
            .register(&mut conn.clone(), "", &[(job.queue.as_str(), id.as_str())])
            .await
            .map_err(|e| match e {
                QueueError::Workflow { .. } => JobError::permanent(format!("batch_add: {e}")),
                e => JobError::retryable(e),
            })?;
        let queue = Queue::from_connection(conn);
        let mut out = batch
            .enqueue_members(&queue, vec![job])
            .await
            .map_err(JobError::retryable)?;
        out.pop()
            .ok_or_else(|| JobError::retryable("batch_add: empty enqueue reply"))
    }

    /// The counts of the batch that spawned this job (a callback or a flow's
    /// parent), or else of the batch it is a member of; `None` outside a batch.
    /// A member of several batches (a DAG step that several steps run
    /// after: its `batch` field holds their keys, one per line) gets the
    /// first one's (before, the whole field was read as one key: `None`).
    pub async fn batch_summary(&self) -> Result<Option<BatchSummary>, JobError> {
        let (member, spawned) = self.batch_fields().await?;
        let Some(key) = spawned.or(member) else {
            return Ok(None);
        };
        let key = key.lines().next().unwrap_or_default();
        let batch = self.batch_ref(key)?;
        let mut conn = self.inner.conn.clone().expect("checked by batch_fields");
        BatchSummary::read(&mut conn, &batch)
            .await
            .map_err(JobError::retryable)
    }

    /// A flow parent's children outcomes, by child id (children under
    /// [`ChildPolicy::Ignore`](crate::ChildPolicy::Ignore) that failed are
    /// left out). A child's result is the value its `#[job]` fn returned
    /// (`Result<T, JobError>`, stored by [`set_output`](Self::set_output)),
    /// or what it set with [`set_child_result`](Self::set_child_result) or
    /// [`set_result_ref`](Self::set_result_ref). These share the one
    /// `result` of the completion record: the last one set wins, and a
    /// `#[job]` fn's returned value is stored after the handler returned, so
    /// it wins over a `set_child_result` of the same run. Empty outside a
    /// flow.
    pub async fn child_results<T: DeserializeOwned>(
        &self,
    ) -> Result<Vec<ChildResult<T>>, JobError> {
        let (_, spawned) = self.batch_fields().await?;
        let Some(key) = spawned else {
            return Ok(Vec::new());
        };
        let batch = self.batch_ref(&key)?;
        let mut conn = self.inner.conn.clone().expect("checked by batch_fields");
        read_results(&mut conn, &batch)
            .await
            .map_err(JobError::permanent)
    }

    /// Sets this job's result for its flow parent (MessagePack, stored in the
    /// completion record like [`set_result_ref`](Self::set_result_ref)). For
    /// a `#[job]` fn returning `Result<T, JobError>` with `T` other than
    /// `()`, the returned value replaces it (see
    /// [`child_results`](Self::child_results)): return the value instead.
    ///
    /// ```
    /// let ctx = queue_core::JobContext::for_test("invoice-7", "orders", 1);
    /// ctx.set_child_result(&("INV-7".to_string(), 1200u32)).unwrap();
    /// ```
    pub fn set_child_result<T: Serialize>(&self, value: &T) -> Result<(), JobError> {
        let bytes = rmp_serde::to_vec_named(value)
            .map_err(|e| JobError::permanent(format!("child result does not encode: {e}")))?;
        let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
        debug_assert!(decode_result::<serde::de::IgnoredAny>(
            format!("{TYPED_PREFIX}{hex}").as_bytes()
        )
        .is_ok());
        self.set_result_ref(format!("{TYPED_PREFIX}{hex}"));
        Ok(())
    }
}
