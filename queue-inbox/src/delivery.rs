//! One delivery's inbox in the handler's transaction: claim the row
//! (`already_done`), then mark it done (`complete`) in the same transaction
//! as the business change; and the `ctx.inbox(&tx)` extension.

use std::sync::OnceLock;

use queue_core::{JobContext, JobId};
use tokio_postgres::error::SqlState;
use tokio_postgres::types::ToSql;
use tokio_postgres::{Row, Transaction};
use tracing::{debug, info, warn};

use crate::error::{InboxError, Result};
use crate::inbox::{Inbox, InboxRecord, InboxStatus, DEFAULT_INBOX};
use crate::table;

/// Longest accepted key, in bytes (the same limit as job ids).
const MAX_KEY_LEN: usize = JobId::MAX_LEN;

/// `ctx.inbox(&tx)` on a [`JobContext`]: the inbox of this delivery in the
/// handler's transaction, on the default table (`queue_inbox`).
///
/// Runnable (needs PostgreSQL, `DATABASE_URL`, default
/// `postgres://postgres@127.0.0.1:5432/test`, or skipped with
/// `QUEUE_TEST_SKIP_POSTGRES=1` like the test suite; the hidden
/// lines give it a throwaway schema with the `charges` and `queue_inbox`
/// tables):
///
/// ```
/// use queue_core::{job, JobContext, JobError};
/// use queue_inbox::{InboxError, InboxExt};
/// use serde::{Deserialize, Serialize};
///
/// #[derive(Serialize, Deserialize)]
/// pub struct CloseMonth { pub customer: i64, pub month: String }
///
/// #[job(queue = "billing")]
/// async fn close_month(ctx: JobContext, args: CloseMonth) -> Result<(), JobError> {
///     let mut db = connect().await?;
///     let tx = db.transaction().await.map_err(JobError::retryable)?;
///     let inbox = ctx.inbox(&tx).key(format!("cust-{}:{}", args.customer, args.month));
///     if inbox.already_done().await.map_err(InboxError::into_job_error)? {
///         return Ok(()); // committed by an earlier delivery: ack, change nothing
///     }
///     tx.execute("INSERT INTO charges (customer, month) VALUES ($1, $2)",
///                &[&args.customer, &args.month]).await.map_err(JobError::retryable)?;
///     inbox
///         .complete(format!("charge-{}", args.customer))
///         .await
///         .map_err(InboxError::into_job_error)?; // not a bare `?`: keeps `Fenced` permanent
///     tx.commit().await.map_err(JobError::retryable)?; // the charge and "done", or neither
///     Ok(())
/// }
/// # static DB: std::sync::OnceLock<String> = std::sync::OnceLock::new();
/// # async fn connect() -> Result<tokio_postgres::Client, JobError> {
/// #     let (client, conn) = tokio_postgres::connect(DB.get().unwrap(), tokio_postgres::NoTls)
/// #         .await
/// #         .map_err(JobError::retryable)?;
/// #     tokio::spawn(conn);
/// #     Ok(client)
/// # }
/// #
/// # #[tokio::main] async fn main() -> Result<(), JobError> {
/// # // Skipped without PostgreSQL, like the test suite (QUEUE_TEST_SKIP_POSTGRES).
/// # let Some(pg) = queue_testkit::postgres::require() else { return Ok(()) };
/// # let schema = queue_testkit::postgres::TempSchema::create(&pg)?;
/// # DB.set(schema.url().to_string()).unwrap();
/// # let db = connect().await?;
/// # db.batch_execute("CREATE TABLE charges (customer bigint, month text)").await?;
/// # queue_inbox::Inbox::new().migrate(&db).await?;
/// // Two jobs with the same business key (two enqueues of one monthly close):
/// // the second finds the inbox row done and charges nothing.
/// let args = || CloseMonth { customer: 7, month: "2026-11".into() };
/// close_month(JobContext::for_test("close-a", "billing", 1), args()).await?;
/// close_month(JobContext::for_test("close-b", "billing", 1), args()).await?;
/// let charges: i64 = db.query_one("SELECT count(*) FROM charges", &[]).await?.get(0);
/// assert_eq!(charges, 1);
/// # Ok(()) }
/// ```
pub trait InboxExt {
    /// The inbox of this delivery in `tx`, keyed by the job id (see
    /// [`InboxTx::key`] for a business key).
    fn inbox<'a, 't>(&'a self, tx: &'a Transaction<'t>) -> InboxTx<'a, 't>;
}

impl InboxExt for JobContext {
    fn inbox<'a, 't>(&'a self, tx: &'a Transaction<'t>) -> InboxTx<'a, 't> {
        InboxTx::new(&DEFAULT_INBOX, self, tx)
    }
}

/// The inbox of one delivery inside the handler's transaction.
///
/// Made by [`InboxExt::inbox`] or [`Inbox::delivery`]. Use it in this order,
/// all in one transaction: [`already_done`](Self::already_done) (claims and
/// locks the row), the business change, [`complete`](Self::complete), commit.
pub struct InboxTx<'a, 't> {
    inbox: &'a Inbox,
    ctx: &'a JobContext,
    tx: &'a Transaction<'t>,
    key: String,
    share_across_types: bool,
}

impl std::fmt::Debug for InboxTx<'_, '_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InboxTx")
            .field("table", &self.inbox.table())
            .field("queue", &self.ctx.queue())
            .field("job_id", self.ctx.job_id())
            .field("key", &self.key)
            .finish()
    }
}

impl<'a, 't> InboxTx<'a, 't> {
    pub(crate) fn new(inbox: &'a Inbox, ctx: &'a JobContext, tx: &'a Transaction<'t>) -> Self {
        InboxTx {
            inbox,
            ctx,
            tx,
            key: ctx.job_id().as_str().to_string(),
            share_across_types: false,
        }
    }

    /// Keys the row by a business key (`"cust-7:2026-11"`) instead of the job
    /// id: any job of the same type with the same key on the same queue is
    /// then done once. Checked when the row is claimed (non-empty, at most
    /// 512 bytes, no control characters).
    ///
    /// A key is per queue: a row claimed by a job of another type is refused
    /// with [`InboxError::KeyCollision`] (permanent) unless
    /// [`share_key_across_types`](Self::share_key_across_types) says the
    /// sharing is meant. Prefix keys with the job type
    /// (`format!("ship_order:{}", order)`).
    pub fn key(mut self, key: impl Into<String>) -> Self {
        self.key = key.into();
        self
    }

    /// The key is meant to be shared with jobs of other types on the queue
    /// (one effect, whichever type runs first: a job type renamed while jobs
    /// of the old name are still queued, say): a row claimed or done by a job
    /// of another type counts as this job's, as it did for every key before
    /// the row recorded its job type. Without it such a row is refused with
    /// [`InboxError::KeyCollision`].
    pub fn share_key_across_types(mut self) -> Self {
        self.share_across_types = true;
        self
    }

    /// The key the row is stored under.
    pub fn current_key(&self) -> &str {
        &self.key
    }

    /// Claims this job's row for the transaction and says whether the work was
    /// already done.
    ///
    /// - `false`: the row is claimed (inserted or taken over, locked until the
    ///   transaction ends): do the change, then [`complete`](Self::complete).
    /// - `true`: an earlier delivery committed it: return `Ok(())` without
    ///   changing anything, and the job is acked. Logged (job id, queue, key)
    ///   and counted in `queue_inbox_already_done_total{queue}`.
    ///
    /// A concurrent delivery of the same key waits here until the first one's
    /// transaction ends, then sees `done` (commit) or claims the row (rollback).
    ///
    /// The wait is bounded by the inbox's lock timeout
    /// ([`Inbox::with_lock_timeout`], 30 s by default): a transaction that
    /// holds the row longer (a worker stopped without dying) makes this
    /// delivery fail with the retryable [`InboxError::LockTimeout`].
    ///
    /// Errors: [`InboxError::Fenced`] when a newer delivery of this job has
    /// written the row (this one is stale); [`InboxError::KeyCollision`] when
    /// a job of another type claimed the key; [`InboxError::LockTimeout`] and
    /// [`InboxError::Postgres`] (retryable).
    pub async fn already_done(&self) -> Result<bool> {
        self.check_key()?;
        let t = &self.inbox.table;
        let (queue, job_id) = (self.ctx.queue(), self.ctx.job_id().as_str());
        let fence = self.fence();
        let attempt = i32::try_from(self.ctx.attempt()).unwrap_or(i32::MAX);
        let worker = worker_identity();
        let job_type = self.ctx.job_type();
        let inserted = self
            .bounded_query_opt(
                "claiming the inbox row",
                &table::claim_insert_sql(t),
                &[
                    &queue, &self.key, &job_id, &fence, &attempt, &worker, &job_type,
                ],
            )
            .await?;
        if inserted.is_some() {
            debug!(job_id, queue, key = %self.key, fence, "inbox row claimed");
            return Ok(false);
        }
        // The row exists (committed, or its inserter committed while we waited).
        let Some(row) = self.lock_row().await? else {
            // Pruned between the two statements: claim it afresh.
            return Box::pin(self.already_done()).await;
        };
        self.check_job_type(&row)?;
        match row.status {
            InboxStatus::Done => {
                info!(
                    job_id,
                    queue,
                    key = %self.key,
                    done_by = %row.job_id,
                    finished_at = ?row.finished_at,
                    "inbox: already done by an earlier delivery; acking without repeating the change"
                );
                crate::metrics::already_done(queue);
                if let Some(r) = &row.result_ref {
                    self.ctx.set_result_ref(r.clone());
                }
                Ok(true)
            }
            InboxStatus::Running => {
                self.check_fence(&row)?;
                self.tx
                    .execute(
                        &table::take_over_sql(t),
                        &[
                            &queue, &self.key, &job_id, &fence, &attempt, &worker, &job_type,
                        ],
                    )
                    .await
                    .map_err(|e| self.pg("taking over the inbox row", e))?;
                debug!(job_id, queue, key = %self.key, fence, previous = %row.job_id, "inbox row taken over");
                Ok(false)
            }
        }
    }

    /// Marks the claimed row done, with a result reference (an invoice number,
    /// a ledger entry id), in the same transaction as the business change;
    /// the reference also goes into the Redis completion record
    /// ([`JobContext::set_result_ref`]). Commit the transaction afterwards.
    ///
    /// Errors: [`InboxError::NotClaimed`] when [`already_done`](Self::already_done)
    /// did not claim the row for this delivery first; [`InboxError::Fenced`]
    /// when a newer delivery wrote it.
    pub async fn complete(&self, result_ref: impl Into<String>) -> Result<()> {
        let r = result_ref.into();
        self.finish(Some(&r)).await?;
        self.ctx.set_result_ref(r);
        Ok(())
    }

    /// [`complete`](Self::complete) without a result reference.
    pub async fn complete_without_ref(&self) -> Result<()> {
        self.finish(None).await
    }

    async fn finish(&self, result_ref: Option<&str>) -> Result<()> {
        let (queue, job_id) = (self.ctx.queue(), self.ctx.job_id().as_str());
        let fence = self.fence();
        let done = self
            .tx
            .query_opt(
                &table::complete_sql(&self.inbox.table),
                &[&queue, &self.key, &job_id, &fence, &result_ref],
            )
            .await
            .map_err(|e| self.pg("completing the inbox row", e))?;
        if done.is_some() {
            debug!(job_id, queue, key = %self.key, fence, "inbox row done (commits with the transaction)");
            return Ok(());
        }
        let found = match self.lock_row().await? {
            None => "no row".to_string(),
            Some(row) => {
                self.check_fence(&row)?;
                format!("{} for job `{}`", row.status.as_str(), row.job_id)
            }
        };
        Err(InboxError::NotClaimed {
            job_id: self.ctx.job_id().clone(),
            queue: queue.to_string(),
            key: self.key.clone(),
            found,
        })
    }

    async fn lock_row(&self) -> Result<Option<InboxRecord>> {
        let row = self
            .bounded_query_opt(
                "locking the inbox row",
                &table::lock_row_sql(&self.inbox.table),
                &[&self.ctx.queue(), &self.key],
            )
            .await?;
        row.map(|r| InboxRecord::from_row(self.inbox.table(), &r))
            .transpose()
    }

    /// A statement that may wait for the row's lock, under the inbox's lock
    /// timeout: the bound set before it and the transaction's own value put
    /// back after it, the three sent at once (one round trip, as the
    /// statement alone; its prepare is one more, as before). The handler's
    /// own statements keep the transaction's `lock_timeout`.
    async fn bounded_query_opt(
        &self,
        action: &'static str,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Option<Row>> {
        let bound = self.inbox.lock_timeout;
        if bound.is_zero() {
            return self
                .tx
                .query_opt(sql, params)
                .await
                .map_err(|e| self.pg(action, e));
        }
        let stmt = self.tx.prepare(sql).await.map_err(|e| self.pg(action, e))?;
        let set = table::bound_lock_timeout_sql(bound.as_millis());
        // tokio::join! polls in order, and each request is sent when first
        // polled: PostgreSQL runs them in this order.
        let (set, row, restore) = tokio::join!(
            self.tx.batch_execute(&set),
            self.tx.query_opt(&stmt, params),
            self.tx.batch_execute(table::RESTORE_LOCK_TIMEOUT),
        );
        set.map_err(|e| self.pg("bounding the inbox's lock wait", e))?;
        let row = row.map_err(|e| {
            if e.code() == Some(&SqlState::LOCK_NOT_AVAILABLE) {
                warn!(
                    job_id = %self.ctx.job_id(),
                    queue = %self.ctx.queue(),
                    key = %self.key,
                    lock_timeout = ?bound,
                    "inbox: the row stayed locked by another transaction past the lock timeout; \
                     the delivery fails (retryable)"
                );
                InboxError::LockTimeout {
                    action,
                    job_id: self.ctx.job_id().clone(),
                    queue: self.ctx.queue().to_string(),
                    key: self.key.clone(),
                    waited: bound,
                    source: e,
                }
            } else {
                self.pg(action, e)
            }
        })?;
        restore.map_err(|e| self.pg("restoring the transaction's lock_timeout", e))?;
        Ok(row)
    }

    /// Refuses a row claimed by a job of another type (unless the key is
    /// shared on purpose). A row without a type (written before the column
    /// existed) is taken as before.
    fn check_job_type(&self, row: &InboxRecord) -> Result<()> {
        let Some(owner) = row.job_type.as_deref() else {
            return Ok(());
        };
        if self.share_across_types || owner == self.ctx.job_type() {
            return Ok(());
        }
        warn!(
            job_id = %self.ctx.job_id(),
            queue = %self.ctx.queue(),
            key = %self.key,
            job_type = %self.ctx.job_type(),
            owner_type = %owner,
            owner_job_id = %row.job_id,
            "inbox: the key belongs to a job of another type; refused"
        );
        Err(InboxError::KeyCollision {
            job_id: self.ctx.job_id().clone(),
            queue: self.ctx.queue().to_string(),
            key: self.key.clone(),
            owner: Box::new(row.clone()),
        })
    }

    /// Refuses when a newer delivery of the same job wrote the row. Fencing
    /// tokens only order deliveries of one job: a row of another job (same
    /// business key) is not compared.
    fn check_fence(&self, row: &InboxRecord) -> Result<()> {
        let fence = self.ctx.fencing_token();
        if row.job_id == *self.ctx.job_id() && row.fence > fence {
            tracing::warn!(
                job_id = %row.job_id,
                queue = %row.queue,
                key = %row.key,
                fence,
                newer = row.fence,
                "inbox: refused a write from a stale delivery"
            );
            return Err(InboxError::Fenced {
                job_id: row.job_id.clone(),
                queue: row.queue.clone(),
                key: row.key.clone(),
                fence,
                newer: row.fence,
            });
        }
        Ok(())
    }

    fn fence(&self) -> i64 {
        i64::try_from(self.ctx.fencing_token()).unwrap_or(i64::MAX)
    }

    fn check_key(&self) -> Result<()> {
        let reason = if self.key.is_empty() {
            Some("empty")
        } else if self.key.len() > MAX_KEY_LEN {
            Some("longer than 512 bytes")
        } else if self.key.chars().any(char::is_control) {
            Some("contains control characters")
        } else {
            None
        };
        match reason {
            None => Ok(()),
            Some(reason) => Err(InboxError::InvalidKey {
                job_id: self.ctx.job_id().clone(),
                queue: self.ctx.queue().to_string(),
                key: self.key.clone(),
                reason,
            }),
        }
    }

    fn pg(&self, action: &'static str, source: tokio_postgres::Error) -> InboxError {
        InboxError::Postgres {
            table: self.inbox.table().to_string(),
            action,
            queue: Some(self.ctx.queue().to_string()),
            job_id: Some(self.ctx.job_id().clone()),
            key: Some(self.key.clone()),
            source,
        }
    }
}

/// `hostname:pid` of this process, recorded in the rows it claims.
pub fn worker_identity() -> &'static str {
    static ID: OnceLock<String> = OnceLock::new();
    ID.get_or_init(|| {
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
            .ok()
            .or_else(|| std::env::var("HOSTNAME").ok())
            .map(|h| h.trim().to_string())
            .filter(|h| !h.is_empty())
            .unwrap_or_else(|| "unknown".to_string());
        format!("{host}:{}", std::process::id())
    })
}
