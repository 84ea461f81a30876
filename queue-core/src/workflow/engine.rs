//! The steps every batch and flow is built from, in this order: open the
//! batch hash, register the member ids (each counts once), enqueue the
//! members (ordinary jobs carrying the `batch` field), seal. A member that
//! finishes before the seal is counted; the batch fires only once sealed, so
//! it never fires early. Every step is idempotent: a producer that failed
//! half-way sends the whole batch again with the same ids.

use crate::conn::RedisConnection;
use crate::enqueue_options::{EnqueueOutcome, Enqueued};
use crate::error::{QueueError, Result};
use crate::job::JobId;
use crate::keys::QueueKeys;
use crate::queue::Queue;
use crate::scripts::batch_add::{BatchAdd, BatchAddReply};
use crate::scripts::batch_open::BatchOpen;
use crate::scripts::batch_seal::BatchSeal;

use super::JobSpec;

/// The job-hash field naming the batch a job is a member of (the batch key).
pub(crate) const MEMBER_FIELD: &str = "batch";
/// The job-hash field naming the batch a callback or parent was spawned by.
pub(crate) const SPAWNED_BY_FIELD: &str = "batch_of";

/// Where a batch lives: its home queue, id and hash key.
#[derive(Debug, Clone)]
pub(crate) struct BatchRef {
    pub(crate) queue: String,
    pub(crate) id: String,
    pub(crate) key: String,
}

impl BatchRef {
    pub(crate) fn new(queue: &str, id: &str) -> Self {
        BatchRef {
            queue: queue.to_string(),
            id: id.to_string(),
            key: QueueKeys::new(queue).batch(id),
        }
    }

    /// Refuses a batch id (a flow's: its parent's job id) that is empty,
    /// longer than [`JobId::MAX_LEN`] or holds a control character: a job's
    /// `batch` field holds batch keys one per line, and relay notices are
    /// lines too, so a `\n` in an id would split it (as [`JobId::validate`]
    /// refuses for job ids and `Dag` for step names). Checked before any write.
    pub(crate) fn check_id(queue: &str, id: &str) -> Result<()> {
        JobId::from(id)
            .validate()
            .map_err(|reason| QueueError::Workflow {
                queue: queue.to_string(),
                batch: id.to_string(),
                detail: format!(
                    "invalid batch id {id:?}: {} (the same rules as a job id)",
                    reason.replacen("job id", "batch id", 1)
                ),
            })
    }

    pub(crate) fn error(&self, detail: impl Into<String>) -> QueueError {
        QueueError::Workflow {
            queue: self.queue.clone(),
            batch: self.id.clone(),
            detail: detail.into(),
        }
    }

    /// Refuses a callback on `queue` unless it is the batch's own queue:
    /// the member that finishes the batch creates the callbacks in the same
    /// script as the batch's update (members may be on any queue: the relay
    /// carries their outcome; docs/WORKFLOWS.md, "Relay").
    pub(crate) fn check_callback_queue(&self, queue: &str) -> Result<()> {
        if queue == self.queue {
            return Ok(());
        }
        Err(self.error(format!(
            "callback on queue `{queue}`: a batch's callbacks must be on the batch's queue `{}` \
             (set it with `Batch::home`); members may be on any queue",
            self.queue
        )))
    }

    /// Opens the batch (kept as it is when it exists).
    pub(crate) async fn open(
        &self,
        conn: &mut RedisConnection,
        policy: &str,
        spec: &[(String, Vec<u8>)],
    ) -> Result<()> {
        BatchOpen {
            queue: &self.queue,
            key: &self.key,
            policy,
            spec,
        }
        .run(conn)
        .await
        .map(drop)
    }

    /// Registers member ids under `policy` (`""`: the batch's default).
    pub(crate) async fn register(
        &self,
        conn: &mut RedisConnection,
        policy: &str,
        ids: &[String],
    ) -> Result<u64> {
        if ids.is_empty() {
            return Ok(0);
        }
        let reply = BatchAdd {
            queue: &self.queue,
            key: &self.key,
            policy,
            ids,
        }
        .run(conn)
        .await?;
        match reply {
            BatchAddReply::Added(n) => Ok(n),
            BatchAddReply::Fired => Err(self.error("already fired: no member can be added")),
            BatchAddReply::Missing => Err(self.error("no such batch (never opened, or expired)")),
        }
    }

    /// Enqueues registered members, each carrying the batch key; one pipeline
    /// per run of members with the same queue and type.
    pub(crate) async fn enqueue_members(
        &self,
        queue: &Queue,
        members: Vec<JobSpec>,
    ) -> Result<Vec<Enqueued>> {
        let mut out = Vec::with_capacity(members.len());
        let mut group: Vec<(crate::EnqueueOptions, Vec<u8>)> = Vec::new();
        let mut members = members.into_iter().peekable();
        while let Some(m) = members.next() {
            let max = m.opts.max_attempts.unwrap_or(m.max_attempts);
            let opts = m
                .opts
                .clone()
                .max_attempts(max)
                .extra_field(MEMBER_FIELD, self.key.clone());
            group.push((opts, m.payload.clone()));
            let same_next = members.peek().is_some_and(|n| {
                n.queue == m.queue && n.job_type == m.job_type && n.version == m.version
            });
            if !same_next {
                let items = std::mem::take(&mut group);
                let done = queue
                    .enqueue_raw_batch(&m.queue, &m.job_type, m.version, max, items)
                    .await?;
                for e in &done {
                    if !e.is_new() {
                        self.check_existing_member(&mut queue.connection(), &m.queue, e)
                            .await?;
                    }
                }
                out.extend(done);
            }
        }
        Ok(out)
    }

    /// A member whose enqueue wrote nothing (`Duplicate`, `AlreadyCompleted`)
    /// must be this batch's own job (a retried enqueue): its hash names this
    /// batch, or the batch counted it, or a relay notice for it is on its
    /// way. Otherwise it is a job of the same id outside the batch (e.g. an
    /// id from a business key that ran on its own): no job carries this
    /// batch for it, so the batch would never fire. An error names it,
    /// before the seal. Reads only; the rare path (a non-new member).
    async fn check_existing_member(
        &self,
        conn: &mut RedisConnection,
        member_queue: &str,
        e: &Enqueued,
    ) -> Result<()> {
        let id = e.id.as_str();
        let keys = QueueKeys::new(member_queue);
        let err = |x: redis::RedisError| QueueError::redis(member_queue, Some(&e.id), x);
        if matches!(e.outcome, EnqueueOutcome::Duplicate { .. }) {
            let field: Option<Vec<u8>> = redis::cmd("HGET")
                .arg(keys.job(id))
                .arg(MEMBER_FIELD)
                .query_async(conn)
                .await
                .map_err(err)?;
            let names_this = |f: &[u8]| f.split(|&b| b == b'\n').any(|k| k == self.key.as_bytes());
            if field.as_deref().is_some_and(names_this) {
                return Ok(());
            }
        }
        // A member on another queue that finished: its notice is in its
        // queue's relay list until applied (applied before it is removed, so
        // the list is read first, then `:done`).
        if member_queue != self.queue {
            let notices: Vec<Vec<u8>> = redis::cmd("LRANGE")
                .arg(keys.relay())
                .arg(0)
                .arg(-1)
                .query_async(conn)
                .await
                .map_err(err)?;
            let pending = notices.iter().any(|n| {
                let mut lines = n.split(|&b| b == b'\n').skip(2);
                lines.next() == Some(self.key.as_bytes()) && lines.next() == Some(id.as_bytes())
            });
            if pending {
                return Ok(());
            }
        }
        let counted: bool = redis::cmd("SISMEMBER")
            .arg(format!("{}:done", self.key))
            .arg(id)
            .query_async(conn)
            .await
            .map_err(|x| QueueError::redis(&self.queue, Some(&e.id), x))?;
        if counted {
            return Ok(());
        }
        Err(self.error(format!(
            "member `{id}` on queue `{member_queue}` already exists outside this batch ({}): \
             it is not counted in the batch, which would never fire; give the batch's member \
             an id of its own",
            match &e.outcome {
                EnqueueOutcome::Duplicate { state } => format!("a {state} job"),
                _ => "completed".to_string(),
            }
        )))
    }

    /// Seals the batch: it fires once every member finished. A batch that
    /// is gone (its open TTL ran out before the seal, or it was deleted) is
    /// an error: its members are counted nowhere and its callbacks would
    /// never run.
    pub(crate) async fn seal(&self, conn: &mut RedisConnection) -> Result<String> {
        let state = BatchSeal {
            queue: &self.queue,
            key: &self.key,
        }
        .run(conn)
        .await?;
        if state == "missing" {
            return Err(self.error(
                "no such batch at its seal (its open TTL ran out before the seal, or it was \
                 deleted): its members are not counted and its callbacks will not run; \
                 enqueue the batch again",
            ));
        }
        Ok(state)
    }
}

/// The batch a batch key names: (home queue, id), parsed from
/// `q:{<queue>}:batch:<id>`.
pub(crate) fn parse_key(key: &str) -> Option<BatchRef> {
    let rest = key.strip_prefix("q:{")?;
    let split = rest.find("}:batch:")?;
    let (queue, id) = (&rest[..split], &rest[split + "}:batch:".len()..]);
    Some(BatchRef {
        queue: queue.to_string(),
        id: id.to_string(),
        key: key.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A seal that finds the batch gone answers an error naming the batch
    /// and its queue (before: `Ok("missing")`, passed on as success).
    #[tokio::test]
    async fn a_seal_that_finds_the_batch_gone_is_an_error() {
        let server = queue_testkit::RedisServer::start().unwrap();
        let queue = Queue::connect(&server.url()).await.unwrap();
        let mut conn = queue.connection();
        let batch = BatchRef::new("sealq", "gone-1");
        batch.open(&mut conn, "", &[]).await.unwrap();
        batch
            .register(&mut conn, "", &["m1".to_string()])
            .await
            .unwrap();
        let _: () = redis::cmd("DEL")
            .arg(&batch.key)
            .query_async(&mut conn)
            .await
            .unwrap();
        let e = batch.seal(&mut conn).await.unwrap_err();
        assert!(
            matches!(&e, QueueError::Workflow { queue, batch, .. }
                if queue == "sealq" && batch == "gone-1"),
            "{e}"
        );
        // A live batch seals as before.
        let live = BatchRef::new("sealq", "live-1");
        live.open(&mut conn, "", &[]).await.unwrap();
        assert_eq!(live.seal(&mut conn).await.unwrap(), "fired");
    }
}
