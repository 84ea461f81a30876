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

    /// Registers members, given as (queue, id), under `policy` (`""`: the
    /// batch's default): one `batch_add.lua` call per queue, which records
    /// a queue other than the batch's (batch field `where:<id>`) for `batches show`.
    pub(crate) async fn register(
        &self,
        conn: &mut RedisConnection,
        policy: &str,
        members: &[(&str, &str)],
    ) -> Result<u64> {
        let mut queues: Vec<&str> = Vec::new();
        for (q, _) in members {
            if !queues.contains(q) {
                queues.push(q);
            }
        }
        let mut added = 0;
        for q in queues {
            let ids: Vec<String> = members
                .iter()
                .filter(|(mq, _)| *mq == q)
                .map(|(_, id)| id.to_string())
                .collect();
            let reply = BatchAdd {
                queue: &self.queue,
                key: &self.key,
                policy,
                member_queue: if q == self.queue { "" } else { q },
                ids: &ids,
            }
            .run(conn)
            .await?;
            added += match reply {
                BatchAddReply::Added(n) => n,
                BatchAddReply::Fired => {
                    return Err(self.error("already fired: no member can be added"))
                }
                BatchAddReply::Missing => {
                    return Err(self.error("no such batch (never opened, or expired)"))
                }
            };
        }
        Ok(added)
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
                let taken: Vec<(&str, Option<&str>)> = done
                    .iter()
                    .filter(|e| !e.is_new())
                    .map(|e| match &e.outcome {
                        EnqueueOutcome::Duplicate { state } => {
                            (e.id.as_str(), Some(state.as_str()))
                        }
                        _ => (e.id.as_str(), None),
                    })
                    .collect();
                self.check_existing_members(&mut queue.connection(), &m.queue, &taken)
                    .await?;
                out.extend(done);
            }
        }
        Ok(out)
    }

    /// Members whose enqueue wrote nothing (`Duplicate`, given with the
    /// job's state, or `AlreadyCompleted`, `None`) must be this batch's own
    /// jobs (a retried enqueue): a hash that names this batch, or the batch
    /// counted them, or a relay notice for them is on its way. Otherwise a
    /// job of the same id exists outside the batch (e.g. an id from a
    /// business key that ran on its own): no job carries this batch for it,
    /// so the batch would never fire. An error names the first such id,
    /// before the seal. Reads only, three round trips for the whole run of
    /// members at most (a retried enqueue of a big batch has many).
    async fn check_existing_members(
        &self,
        conn: &mut RedisConnection,
        member_queue: &str,
        members: &[(&str, Option<&str>)],
    ) -> Result<()> {
        if members.is_empty() {
            return Ok(());
        }
        let keys = QueueKeys::new(member_queue);
        let err = |x: redis::RedisError| QueueError::redis(member_queue, None, x);
        let names_this = |f: &[u8]| f.split(|&b| b == b'\n').any(|k| k == self.key.as_bytes());
        // 1. Jobs still there whose hash names this batch.
        let mut pipe = redis::pipe();
        for (id, _) in members {
            pipe.hget(keys.job(id), MEMBER_FIELD);
        }
        let fields: Vec<Option<Vec<u8>>> = pipe.query_async(conn).await.map_err(err)?;
        let mut left: Vec<(&str, Option<&str>)> = members
            .iter()
            .zip(&fields)
            .filter(|((_, state), f)| state.is_none() || !f.as_deref().is_some_and(names_this))
            .map(|(m, _)| *m)
            .collect();
        // 2. A member on another queue that finished: its notice is in its
        // queue's relay list until applied (applied before it is removed, so
        // the list is read first, then `:done`). Read once for the run.
        if !left.is_empty() && member_queue != self.queue {
            let notices: Vec<Vec<u8>> = redis::cmd("LRANGE")
                .arg(keys.relay())
                .arg(0)
                .arg(-1)
                .query_async(conn)
                .await
                .map_err(err)?;
            let pending: std::collections::HashSet<&[u8]> = notices
                .iter()
                .filter_map(|n| {
                    let mut lines = n.split(|&b| b == b'\n').skip(2);
                    (lines.next() == Some(self.key.as_bytes())).then(|| lines.next())?
                })
                .collect();
            left.retain(|(id, _)| !pending.contains(id.as_bytes()));
        }
        // 3. Counted by the batch already.
        if left.is_empty() {
            return Ok(());
        }
        let counted: Vec<bool> = redis::cmd("SMISMEMBER")
            .arg(format!("{}:done", self.key))
            .arg(left.iter().map(|(id, _)| *id).collect::<Vec<_>>())
            .query_async(conn)
            .await
            .map_err(|x| QueueError::redis(&self.queue, None, x))?;
        match left.iter().zip(counted).find(|(_, c)| !c) {
            None => Ok(()),
            Some(((id, state), _)) => Err(self.error(format!(
                "member `{id}` on queue `{member_queue}` already exists outside this batch ({}): \
                 it is not counted in the batch, which would never fire; give the batch's member \
                 an id of its own (a batch enqueued again after its open TTL ran out cannot \
                 count the members that finished before: enqueue it under a new batch id)",
                match state {
                    Some(state) => format!("a {state} job"),
                    None => "completed".to_string(),
                }
            ))),
        }
    }

    /// Whether member `id` may be added to this batch from inside a job
    /// ([`JobContext::batch_add`](crate::JobContext::batch_add)): checked
    /// *before* it is registered, since the batch is sealed by then and a
    /// registered id that no job of this batch carries would keep it from
    /// ever firing. A job or a completion record of that id outside this
    /// batch is an error (the same as [`check_existing_members`]'s).
    pub(crate) async fn check_free_member(
        &self,
        conn: &mut RedisConnection,
        member_queue: &str,
        id: &str,
    ) -> Result<()> {
        let keys = QueueKeys::new(member_queue);
        let (state, record): (Option<String>, bool) = redis::pipe()
            .hget(keys.job(id), "state")
            .exists(keys.done(id))
            .query_async(conn)
            .await
            .map_err(|x| QueueError::redis(member_queue, None, x))?;
        match (state, record) {
            (Some(state), _) => {
                self.check_existing_members(conn, member_queue, &[(id, Some(state.as_str()))])
                    .await
            }
            (None, true) => {
                self.check_existing_members(conn, member_queue, &[(id, None)])
                    .await
            }
            (None, false) => Ok(()),
        }
    }

    /// Seals the batch: it fires once every member finished. A batch that
    /// is gone (its open TTL ran out before the seal, or it was deleted) is
    /// an error: its members are counted nowhere and its callbacks would
    /// never run.
    pub(crate) async fn seal(&self, conn: &mut RedisConnection) -> Result<String> {
        let (state, relay) = BatchSeal {
            queue: &self.queue,
            key: &self.key,
        }
        .run_marked(conn)
        .await?;
        if relay {
            // The fire counted a dead-lettered parent or step in a batch on
            // another queue: its notice is relayed now, not at the
            // watchdog's next pass.
            match super::relay::relay_queue(conn, &self.queue).await {
                Ok(r) => {
                    tracing::debug!(queue = %self.queue, batch = %self.key, applied = r.applied,
                    "the seal fired the batch: its relay notices relayed")
                }
                Err(e) => tracing::warn!(queue = %self.queue, batch = %self.key, error = %e,
                    "the seal fired the batch, but relaying its notices failed: the next relay \
                     run (a worker of the queue, the watchdog's next pass) applies them"),
            }
        }
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

/// Refuses, before any write, an id given twice among the jobs of one batch
/// or flow (members, callbacks, parents; whatever their queues): `batch`
/// names the batch (a flow's outermost one). A batch counts a member id
/// once (`<batch>:members` is a set), so a second member of the same id was
/// never counted: on one queue it was dropped as a duplicate, on two both
/// ran and the batch fired when the first finished. A callback or parent
/// whose id a member (or another callback) took was never created when the
/// batch fired. Before, neither was checked.
pub(crate) fn check_unique_ids<'a>(
    batch: &BatchRef,
    ids: impl IntoIterator<Item = &'a str>,
) -> Result<()> {
    let mut seen = std::collections::HashSet::new();
    for id in ids {
        if !seen.insert(id) {
            return Err(batch.error(format!(
                "job id `{id}` is given twice among the batch's members, callbacks and parents: \
                 each job of a batch or flow needs an id of its own"
            )));
        }
    }
    Ok(())
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
            .register(&mut conn, "", &[("sealq", "m1")])
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
