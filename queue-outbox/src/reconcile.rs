//! Reconciliation: outbox rows whose job has not completed after a given age.

use std::fmt;
use std::time::{Duration, SystemTime};

use queue_core::{JobId, Queue};
use tokio_postgres::GenericClient;
use tracing::warn;

use crate::error::{OutboxError, Result};
use crate::outbox::{pg_now, row_reader, Outbox};
use crate::table::TableName;

/// Rows read from PostgreSQL per round trip.
const PAGE: i64 = 500;

/// Where the job of a listed outbox row is.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ReconcileStatus {
    /// Not published yet: no relay runs, or Redis keeps failing (see `last_error`).
    Unpublished,
    /// A relay gave up on the row (see `last_error`); fix it and set
    /// `rejected_at = NULL` to have it sent.
    Rejected,
    /// Published; waiting in the queue.
    Queued,
    /// Published; waiting for a retry or its delay.
    Delayed,
    /// Published; a worker holds it.
    Active,
    /// Published; dead-lettered (see `job_error`).
    Dead,
    /// Published, but Redis has neither the job nor a completion record:
    /// lost (e.g. Redis restarted without persistence), or completed longer
    /// ago than the workers' completion retention.
    Missing,
    /// Published; the job hash has a state this version does not know.
    Other(String),
    /// Published, but Redis refused to read the job's data (its job key or
    /// completion record holds another type: corrupt data; see `job_error`).
    Unreadable,
}

impl ReconcileStatus {
    /// `unpublished`, `rejected`, `queued`, `delayed`, `active`, `dead`,
    /// `missing`, `unreadable`, or the unknown state.
    pub fn as_str(&self) -> &str {
        match self {
            ReconcileStatus::Unpublished => "unpublished",
            ReconcileStatus::Rejected => "rejected",
            ReconcileStatus::Queued => "queued",
            ReconcileStatus::Delayed => "delayed",
            ReconcileStatus::Active => "active",
            ReconcileStatus::Dead => "dead",
            ReconcileStatus::Missing => "missing",
            ReconcileStatus::Unreadable => "unreadable",
            ReconcileStatus::Other(s) => s,
        }
    }

    fn from_state(state: &str) -> Self {
        match state {
            "queued" => ReconcileStatus::Queued,
            "delayed" => ReconcileStatus::Delayed,
            "active" => ReconcileStatus::Active,
            "dead" => ReconcileStatus::Dead,
            other => ReconcileStatus::Other(other.to_string()),
        }
    }
}

impl fmt::Display for ReconcileStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One outbox row whose job has not completed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReconcileRow {
    /// The row's `id`.
    pub row_id: i64,
    /// Queue.
    pub queue: String,
    /// Job id.
    pub job_id: JobId,
    /// Job type.
    pub job_type: String,
    /// Insert time (PostgreSQL clock).
    pub created_at: SystemTime,
    /// Age at reconciliation (PostgreSQL clock).
    pub age: Duration,
    /// When it was published, if it was.
    pub published_at: Option<SystemTime>,
    /// Publish attempts.
    pub publish_attempts: i32,
    /// The last publish error.
    pub publish_error: Option<String>,
    /// For an unpublished row Redis refused on its own: how long until a
    /// relay sends it again (its `next_attempt_at`, PostgreSQL clock).
    /// `None`: due now, or not waiting to be published.
    pub publish_retry_in: Option<Duration>,
    /// Where the job is.
    pub status: ReconcileStatus,
    /// Deliveries so far, when the job is in Redis.
    pub job_attempts: Option<u32>,
    /// The job's `dead_reason` or `last_error`, when it is in Redis and has one.
    pub job_error: Option<String>,
}

/// What [`Outbox::reconcile_with`] looks at.
///
/// ```
/// use std::time::Duration;
/// let opts = queue_outbox::ReconcileOptions::new(Duration::from_secs(3600))
///     .max_age(Duration::from_secs(24 * 3600))
///     .limit(100);
/// assert_eq!(opts.limit, 100);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReconcileOptions {
    /// Only rows created at least this long ago.
    pub older_than: Duration,
    /// Only rows created at most this long ago (`None`: no bound). Set it to
    /// the completion retention to skip rows whose completion record has expired
    /// anyway (they would all show as `missing`).
    pub max_age: Option<Duration>,
    /// At most this many rows are returned (oldest first).
    pub limit: usize,
}

impl ReconcileOptions {
    /// Rows older than `older_than`, no upper bound, at most 1000.
    pub fn new(older_than: Duration) -> Self {
        ReconcileOptions {
            older_than,
            max_age: None,
            limit: 1000,
        }
    }

    /// Skip rows older than `max_age`.
    pub fn max_age(mut self, max_age: Duration) -> Self {
        self.max_age = Some(max_age);
        self
    }

    /// Return at most `n` rows.
    pub fn limit(mut self, n: usize) -> Self {
        self.limit = n;
        self
    }
}

impl Outbox {
    /// Outbox rows created more than `older_than` ago whose job has not
    /// completed: unpublished or rejected rows, and published rows whose job
    /// is still queued, delayed, active, dead-lettered, or missing from Redis.
    /// Oldest first, at most 1000; see [`reconcile_with`](Self::reconcile_with).
    ///
    /// Ages use the PostgreSQL clock. Read-only: it changes nothing.
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// # async fn f(client: &tokio_postgres::Client, queue: &queue_core::Queue) -> Result<(), queue_outbox::OutboxError> {
    /// let outbox = queue_outbox::Outbox::new();
    /// for row in outbox.reconcile(client, queue, Duration::from_secs(3600)).await? {
    ///     println!("{} {} {} age {:?}", row.queue, row.job_id, row.status, row.age);
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn reconcile(
        &self,
        client: &impl GenericClient,
        queue: &Queue,
        older_than: Duration,
    ) -> Result<Vec<ReconcileRow>> {
        self.reconcile_with(client, queue, &ReconcileOptions::new(older_than))
            .await
    }

    /// [`reconcile`](Self::reconcile) with an age window and a limit.
    ///
    /// For a published row it reads the job hash first and the completion
    /// record only when there is no hash: an ack deletes the one and writes
    /// the other atomically, so a job completing meanwhile is never reported
    /// as missing.
    pub async fn reconcile_with(
        &self,
        client: &impl GenericClient,
        queue: &Queue,
        opts: &ReconcileOptions,
    ) -> Result<Vec<ReconcileRow>> {
        let table = self.table_name();
        let now = pg_now(client, table).await?;
        let newest = now
            .checked_sub(opts.older_than)
            .unwrap_or(SystemTime::UNIX_EPOCH);
        let oldest = opts
            .max_age
            .and_then(|age| now.checked_sub(age))
            .unwrap_or(SystemTime::UNIX_EPOCH);
        let sql = table.reconcile_page_sql();
        let mut out = Vec::new();
        let mut after = i64::MIN;
        while out.len() < opts.limit {
            let rows = client
                .query(&sql, &[&after, &newest, &oldest, &PAGE])
                .await
                .map_err(|e| OutboxError::pg(&table.name, "selecting rows to reconcile", e))?;
            for raw in &rows {
                let row = Unfinished::from_row(table, raw)?;
                after = row.row_id;
                if let Some(listed) = check(queue, row, now).await? {
                    out.push(listed);
                    if out.len() >= opts.limit {
                        break;
                    }
                }
            }
            if (rows.len() as i64) < PAGE {
                break;
            }
        }
        Ok(out)
    }
}

/// The columns of an outbox row that reconciliation reads
/// ([`TableName::RECONCILE_COLUMNS`]): no payload, no extra fields.
struct Unfinished {
    row_id: i64,
    job_id: JobId,
    queue: String,
    job_type: String,
    created_at: SystemTime,
    published_at: Option<SystemTime>,
    rejected_at: Option<SystemTime>,
    attempts: i32,
    last_error: Option<String>,
    next_attempt_at: Option<SystemTime>,
}

impl Unfinished {
    /// A column of an unexpected type is an error naming the row (a table
    /// problem), never a panic.
    fn from_row(table: &TableName, row: &tokio_postgres::Row) -> Result<Self> {
        let (row_id, bad) = row_reader(table, row)?;
        Ok(Unfinished {
            row_id,
            job_id: JobId::from(row.try_get::<_, String>(1).map_err(|e| bad("job_id", e))?),
            queue: row.try_get(2).map_err(|e| bad("queue", e))?,
            job_type: row.try_get(3).map_err(|e| bad("job_type", e))?,
            created_at: row.try_get(4).map_err(|e| bad("created_at", e))?,
            published_at: row.try_get(5).map_err(|e| bad("published_at", e))?,
            rejected_at: row.try_get(6).map_err(|e| bad("rejected_at", e))?,
            attempts: row.try_get(7).map_err(|e| bad("attempts", e))?,
            last_error: row.try_get(8).map_err(|e| bad("last_error", e))?,
            next_attempt_at: row.try_get(9).map_err(|e| bad("next_attempt_at", e))?,
        })
    }
}

/// Where a published row's job is in Redis: its status, attempts and error,
/// or `None` when it completed.
type JobStatus = Option<(ReconcileStatus, Option<u32>, Option<String>)>;

async fn job_status(queue: &Queue, row: &Unfinished) -> queue_core::Result<JobStatus> {
    if let Some(info) = queue.job(&row.queue, &row.job_id).await? {
        let error = info
            .field("dead_reason")
            .or_else(|| info.field("last_error"))
            .filter(|s| !s.is_empty())
            .map(str::to_string);
        let status = ReconcileStatus::from_state(info.state().unwrap_or(""));
        return Ok(Some((status, Some(info.attempts()), error)));
    }
    if queue.completion(&row.queue, &row.job_id).await?.is_some() {
        return Ok(None);
    }
    Ok(Some((ReconcileStatus::Missing, None, None)))
}

/// The row's job status, or `None` when it completed. A Redis refusal to
/// read this job's data (a key of another type) lists the row as
/// `unreadable` instead of failing the whole reconciliation; a failure of
/// Redis itself is an error.
async fn check(queue: &Queue, row: Unfinished, now: SystemTime) -> Result<Option<ReconcileRow>> {
    let (status, job_attempts, job_error) = if row.rejected_at.is_some() {
        (ReconcileStatus::Rejected, None, None)
    } else if row.published_at.is_none() {
        (ReconcileStatus::Unpublished, None, None)
    } else {
        match job_status(queue, &row).await {
            Ok(Some(found)) => found,
            Ok(None) => return Ok(None),
            Err(e) if e.is_data_error() => {
                warn!(
                    queue = %row.queue,
                    job_id = %row.job_id,
                    row_id = row.row_id,
                    error = %e,
                    "outbox reconcile: the job's data in redis cannot be read"
                );
                (ReconcileStatus::Unreadable, None, Some(e.to_string()))
            }
            Err(e) => return Err(e.into()),
        }
    };
    Ok(Some(ReconcileRow {
        row_id: row.row_id,
        age: now.duration_since(row.created_at).unwrap_or_default(),
        queue: row.queue,
        job_id: row.job_id,
        job_type: row.job_type,
        created_at: row.created_at,
        published_at: row.published_at,
        publish_attempts: row.attempts,
        publish_error: row.last_error,
        publish_retry_in: row
            .next_attempt_at
            .filter(|_| status == ReconcileStatus::Unpublished)
            .and_then(|at| at.duration_since(now).ok())
            .filter(|d| !d.is_zero()),
        status,
        job_attempts,
        job_error,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Regression: reconciliation selected the relay's columns, payload
    /// included (up to 512 MiB a row, 500 rows a page), and never used it.
    #[test]
    fn the_reconcile_query_selects_no_payload() {
        let sql = TableName::parse("queue_outbox")
            .unwrap()
            .reconcile_page_sql();
        let columns = &sql[..sql.find(" FROM ").unwrap()];
        assert!(!columns.contains("payload"), "{sql}");
        assert!(!columns.contains('*'), "{sql}");
        for needed in [
            "id",
            "job_id",
            "published_at",
            "rejected_at",
            "next_attempt_at",
        ] {
            assert!(columns.contains(needed), "{needed}: {sql}");
        }
    }
}
