//! Reconciliation with the outbox of the same database: events whose job's
//! effect never committed through the inbox.

use std::time::{Duration, SystemTime};

use queue_core::JobId;
use queue_outbox::Outbox;
use tokio_postgres::GenericClient;

use crate::error::{InboxError, Result};
use crate::inbox::Inbox;
use crate::table;

/// What [`Inbox::reconcile`] looks at.
///
/// ```
/// use std::time::Duration;
/// let opts = queue_inbox::InboxReconcileOptions::new(Duration::from_secs(3600))
///     .queue("billing")
///     .limit(100);
/// assert_eq!(opts.queues, vec!["billing".to_string()]);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InboxReconcileOptions {
    /// Only outbox rows created at least this long ago (leave time for the
    /// relay and the worker).
    pub older_than: Duration,
    /// Only outbox rows created at most this long ago (`None`: no bound); set
    /// it below the inbox's prune age, or pruned rows show up as missing.
    pub max_age: Option<Duration>,
    /// Only these queues (empty: all). Name the queues whose handlers use the
    /// inbox: rows of other queues never get an inbox row.
    pub queues: Vec<String>,
    /// At most this many rows (oldest first).
    pub limit: usize,
}

impl InboxReconcileOptions {
    /// Rows older than `older_than`, all queues, no upper age, at most 1000.
    pub fn new(older_than: Duration) -> Self {
        InboxReconcileOptions {
            older_than,
            max_age: None,
            queues: Vec::new(),
            limit: 1000,
        }
    }

    /// Skip rows older than `max_age`.
    pub fn max_age(mut self, max_age: Duration) -> Self {
        self.max_age = Some(max_age);
        self
    }

    /// Add a queue to look at.
    pub fn queue(mut self, queue: impl Into<String>) -> Self {
        self.queues.push(queue.into());
        self
    }

    /// Return at most `n` rows.
    pub fn limit(mut self, n: usize) -> Self {
        self.limit = n;
        self
    }
}

/// An outbox row whose job has no `done` inbox row.
#[derive(Debug, Clone, PartialEq)]
pub struct InboxReconcileRow {
    /// The outbox row's `id`.
    pub outbox_row_id: i64,
    /// Queue.
    pub queue: String,
    /// Job id.
    pub job_id: JobId,
    /// Job type.
    pub job_type: String,
    /// When the event was written (PostgreSQL clock).
    pub created_at: SystemTime,
    /// Its age at reconciliation.
    pub age: Duration,
    /// Whether a relay published it to Redis.
    pub published: bool,
    /// Whether the relay rejected it for good (`rejected_at` set: a row it
    /// can never publish, with the reason in the outbox's `last_error`): no
    /// job will ever run for it, unlike a row not yet published.
    pub rejected: bool,
    /// Whether a `running` inbox row exists (claimed, committed, never completed).
    pub inbox_running: bool,
}

impl Inbox {
    /// Outbox rows (of `outbox`, in the same database) older than
    /// `opts.older_than` whose job has no `done` inbox row, neither under its
    /// job id as key nor completed by that job: events whose database effect
    /// never committed. Oldest first. Read-only.
    ///
    /// A job that found its business key already done by another job writes
    /// no row of its own and is listed; use the job id as the outbox id and
    /// the inbox key (the default) where reconciliation matters.
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// # async fn f(client: &tokio_postgres::Client) -> Result<(), queue_inbox::InboxError> {
    /// let opts = queue_inbox::InboxReconcileOptions::new(Duration::from_secs(3600)).queue("billing");
    /// for row in queue_inbox::Inbox::new().reconcile(client, &queue_outbox::Outbox::new(), &opts).await? {
    ///     println!("{} {} published={} age {:?}", row.queue, row.job_id, row.published, row.age);
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn reconcile(
        &self,
        client: &impl GenericClient,
        outbox: &Outbox,
        opts: &InboxReconcileOptions,
    ) -> Result<Vec<InboxReconcileRow>> {
        let err = |e| InboxError::pg(self.table(), "reconciling with the outbox", e);
        let older = i64::try_from(opts.older_than.as_secs()).unwrap_or(i64::MAX);
        let max_age = opts
            .max_age
            .map(|d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX));
        let queues = (!opts.queues.is_empty()).then_some(&opts.queues);
        let limit = i64::try_from(opts.limit).unwrap_or(i64::MAX);
        let rows = client
            .query(
                &table::reconcile_sql(&self.table, outbox.table_name()),
                &[&older, &max_age, &limit, &queues],
            )
            .await
            .map_err(err)?;
        rows.iter()
            .map(|r| {
                let job_id: String = r.try_get(2).map_err(err)?;
                let published: Option<SystemTime> = r.try_get(5).map_err(err)?;
                let age: Option<f64> = r.try_get(6).map_err(err)?;
                Ok(InboxReconcileRow {
                    outbox_row_id: r.try_get(0).map_err(err)?,
                    queue: r.try_get(1).map_err(err)?,
                    job_id: JobId::from(job_id),
                    job_type: r.try_get(3).map_err(err)?,
                    created_at: r.try_get(4).map_err(err)?,
                    age: age
                        .and_then(|s| Duration::try_from_secs_f64(s.max(0.0)).ok())
                        .unwrap_or_default(),
                    published: published.is_some(),
                    inbox_running: r.try_get(7).map_err(err)?,
                    rejected: r.try_get(8).map_err(err)?,
                })
            })
            .collect()
    }
}
