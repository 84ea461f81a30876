//! The inbox table: its name, migration, and reading one row.

use std::sync::LazyLock;
use std::time::{Duration, SystemTime};

use queue_core::{JobContext, JobId};
use queue_outbox::TableName;
use tokio_postgres::{GenericClient, Row, Transaction};
use tracing::debug;

use crate::delivery::InboxTx;
use crate::error::{InboxError, Result};
use crate::table;

/// The default inbox table name.
pub const DEFAULT_TABLE: &str = "queue_inbox";

/// How long [`InboxTx::already_done`] waits by default for an inbox row that
/// another transaction holds (a concurrent delivery of the same key) before
/// it gives up with the retryable [`InboxError::LockTimeout`]:
/// [`Inbox::with_lock_timeout`] changes it.
pub const DEFAULT_LOCK_TIMEOUT: Duration = Duration::from_secs(30);

pub(crate) static DEFAULT_INBOX: LazyLock<Inbox> = LazyLock::new(Inbox::new);

/// An inbox table: one row per (queue, key) recording that a job's database
/// effect committed. Cheap to clone; the table name is validated once, here.
///
/// ```
/// use queue_inbox::Inbox;
/// assert_eq!(Inbox::new().table(), "queue_inbox");
/// assert_eq!(Inbox::with_table("billing.inbox").unwrap().table(), "billing.inbox");
/// assert!(Inbox::with_table("inbox; drop table users").is_err());
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Inbox {
    pub(crate) table: TableName,
    pub(crate) lock_timeout: Duration,
}

impl Default for Inbox {
    fn default() -> Self {
        Self::new()
    }
}

/// Where a row is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum InboxStatus {
    /// Claimed by a delivery whose transaction committed without
    /// [`complete`](InboxTx::complete) (rows claimed in a transaction that
    /// is still open are invisible to others).
    Running,
    /// The job's effect committed.
    Done,
}

impl InboxStatus {
    /// `running` or `done`, as stored.
    pub fn as_str(self) -> &'static str {
        match self {
            InboxStatus::Running => "running",
            InboxStatus::Done => "done",
        }
    }
}

/// One row of the inbox table. Read with [`Inbox::record`]; more columns
/// may come (`#[non_exhaustive]`), so it is not built outside this crate.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct InboxRecord {
    /// Queue of the job.
    pub queue: String,
    /// The key: the job id, or the business key the handler named.
    pub key: String,
    /// The job that claimed (and, when done, completed) the row.
    pub job_id: JobId,
    /// Running or done.
    pub status: InboxStatus,
    /// The fencing token of that delivery.
    pub fence: u64,
    /// The delivery attempt (`ctx.attempt()`) that claimed the row last.
    pub attempts: u32,
    /// `hostname:pid` of that worker.
    pub worker: String,
    /// The result reference given to [`complete`](InboxTx::complete).
    pub result_ref: Option<String>,
    /// When the row was claimed (PostgreSQL clock).
    pub started_at: SystemTime,
    /// When it was completed.
    pub finished_at: Option<SystemTime>,
    /// The type of the job that claimed (and, when done, completed) the
    /// row; `None` for a row written before the column existed (by a
    /// version before it, or before [`Inbox::migrate`] added it).
    pub job_type: Option<String>,
}

impl InboxRecord {
    pub(crate) fn from_row(table: &str, row: &Row) -> Result<Self> {
        let bad = |e| InboxError::pg(table, "reading an inbox row", e);
        let status: String = row.try_get(3).map_err(bad)?;
        let fence: i64 = row.try_get(4).map_err(bad)?;
        let attempts: i32 = row.try_get(5).map_err(bad)?;
        let job_id: String = row.try_get(2).map_err(bad)?;
        Ok(InboxRecord {
            queue: row.try_get(0).map_err(bad)?,
            key: row.try_get(1).map_err(bad)?,
            job_id: JobId::from(job_id),
            // The CHECK constraint allows only these two.
            status: if status == "done" {
                InboxStatus::Done
            } else {
                InboxStatus::Running
            },
            fence: fence.max(0) as u64,
            attempts: attempts.max(0) as u32,
            worker: row.try_get(6).map_err(bad)?,
            result_ref: row.try_get(7).map_err(bad)?,
            started_at: row.try_get(8).map_err(bad)?,
            finished_at: row.try_get(9).map_err(bad)?,
            job_type: row.try_get(10).map_err(bad)?,
        })
    }
}

impl Inbox {
    /// The default table, `queue_inbox`.
    pub fn new() -> Self {
        Inbox {
            table: TableName::try_new(DEFAULT_TABLE).expect("the default table name is valid"),
            lock_timeout: DEFAULT_LOCK_TIMEOUT,
        }
    }

    /// Another table: a plain lower-case identifier (`[a-z_][a-z0-9_]*`, at
    /// most 40 bytes), optionally schema-qualified (`billing.inbox`); the
    /// same rules as `queue-outbox`'s table names.
    pub fn with_table(name: &str) -> Result<Self> {
        let table = TableName::try_new(name).map_err(|reason| InboxError::InvalidTableName {
            name: name.to_string(),
            reason,
        })?;
        Ok(Inbox {
            table,
            lock_timeout: DEFAULT_LOCK_TIMEOUT,
        })
    }

    /// How long a delivery waits in [`InboxTx::already_done`] (and
    /// [`InboxTx::complete`]) for its inbox row while another transaction
    /// holds it ([`DEFAULT_LOCK_TIMEOUT`], 30 s, unless changed): a
    /// concurrent delivery of the same key whose worker stopped without
    /// dying (its transaction still open) would otherwise hold the next
    /// delivery, and its worker slot, for as long as that transaction
    /// stays open. Past it the delivery fails with the retryable
    /// [`InboxError::LockTimeout`] naming the job, queue and key. Keep it
    /// above the time a handler's transaction normally takes (a concurrent
    /// delivery waiting for a healthy one then sees its commit);
    /// `Duration::ZERO` waits without a bound (the behaviour before).
    ///
    /// The bound is PostgreSQL's `lock_timeout`, set for the inbox's own
    /// statements only: the handler's statements in the same transaction
    /// keep the transaction's `lock_timeout`.
    ///
    /// ```
    /// use std::time::Duration;
    /// let inbox = queue_inbox::Inbox::new().with_lock_timeout(Duration::from_secs(5));
    /// assert_eq!(inbox.lock_timeout(), Duration::from_secs(5));
    /// assert_eq!(queue_inbox::Inbox::new().lock_timeout(), queue_inbox::DEFAULT_LOCK_TIMEOUT);
    /// ```
    ///
    /// PostgreSQL takes whole milliseconds up to `i32::MAX` (about 24.8
    /// days): a bound below a millisecond waits one (`0 ms` would mean no
    /// bound), and one at or above `i32::MAX` ms (`Duration::MAX` as "wait
    /// without a bound") is `Duration::ZERO`, no bound. [`lock_timeout`]
    /// answers the bound used.
    ///
    /// ```
    /// use std::time::Duration;
    /// let inbox = queue_inbox::Inbox::new();
    /// assert_eq!(inbox.clone().with_lock_timeout(Duration::MAX).lock_timeout(), Duration::ZERO);
    /// assert_eq!(
    ///     inbox.with_lock_timeout(Duration::from_micros(10)).lock_timeout(),
    ///     Duration::from_millis(1)
    /// );
    /// ```
    ///
    /// [`lock_timeout`]: Self::lock_timeout
    pub fn with_lock_timeout(mut self, bound: Duration) -> Self {
        const MAX_MS: u128 = i32::MAX as u128;
        self.lock_timeout = match bound.as_millis() {
            _ if bound.is_zero() => Duration::ZERO,
            0 => Duration::from_millis(1),
            ms if ms >= MAX_MS => Duration::ZERO,
            _ => bound,
        };
        self
    }

    /// The bound of [`with_lock_timeout`](Self::with_lock_timeout).
    pub fn lock_timeout(&self) -> Duration {
        self.lock_timeout
    }

    /// The table name as given.
    pub fn table(&self) -> &str {
        self.table.name()
    }

    /// Creates the table and its indexes if absent. Idempotent, and safe to run
    /// from several processes at once (serialised by an advisory lock on the
    /// schema-qualified name).
    ///
    /// It looks the table and its indexes up first and changes only what is
    /// missing: run again on an up-to-date table it takes no lock on it, so an
    /// open transaction on the table holds neither it nor the writers behind
    /// it up. When it has something to change it waits at most
    /// [`MIGRATE_LOCK_TIMEOUT`](queue_outbox::MIGRATE_LOCK_TIMEOUT) for the
    /// table's lock, then fails ([`InboxError::Postgres`], SQLSTATE `55P03`).
    ///
    /// ```no_run
    /// # async fn f(client: &tokio_postgres::Client) -> Result<(), queue_inbox::InboxError> {
    /// queue_inbox::Inbox::new().migrate(client).await?;
    /// # Ok(()) }
    /// ```
    pub async fn migrate(&self, client: &impl GenericClient) -> Result<()> {
        client
            .batch_execute(&table::migrate_sql(&self.table))
            .await
            .map_err(|e| InboxError::pg(self.table(), TableName::migrate_action(&e), e))?;
        debug!(table = %self.table(), "inbox table ready");
        Ok(())
    }

    /// The inbox of one delivery in the handler's transaction, on this table
    /// (with the default table, use [`InboxExt::inbox`](crate::InboxExt::inbox)).
    pub fn delivery<'a, 't>(
        &'a self,
        ctx: &'a JobContext,
        tx: &'a Transaction<'t>,
    ) -> InboxTx<'a, 't> {
        InboxTx::new(self, ctx, tx)
    }

    /// The row of `(queue, key)`, if any (not locked).
    pub async fn record(
        &self,
        client: &impl GenericClient,
        queue: &str,
        key: &str,
    ) -> Result<Option<InboxRecord>> {
        let row = client
            .query_opt(&table::select_row_sql(&self.table), &[&queue, &key])
            .await
            .map_err(|e| InboxError::pg(self.table(), "reading an inbox row", e))?;
        row.map(|r| InboxRecord::from_row(self.table(), &r))
            .transpose()
    }
}
