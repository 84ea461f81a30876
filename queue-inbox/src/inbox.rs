//! The inbox table: its name, migration, and reading one row.

use std::sync::LazyLock;
use std::time::SystemTime;

use queue_core::{JobContext, JobId};
use queue_outbox::TableName;
use tokio_postgres::{GenericClient, Row, Transaction};
use tracing::debug;

use crate::delivery::InboxTx;
use crate::error::{InboxError, Result};
use crate::table;

/// The default inbox table name.
pub const DEFAULT_TABLE: &str = "queue_inbox";

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

/// One row of the inbox table.
#[derive(Debug, Clone, PartialEq, Eq)]
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
        })
    }
}

impl Inbox {
    /// The default table, `queue_inbox`.
    pub fn new() -> Self {
        Inbox {
            table: TableName::try_new(DEFAULT_TABLE).expect("the default table name is valid"),
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
        Ok(Inbox { table })
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
