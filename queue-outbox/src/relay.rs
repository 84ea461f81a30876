//! The relay: publishes committed outbox rows to Redis and marks them published.
//!
//! One batch is one PostgreSQL transaction:
//!
//! 1. `SELECT .. WHERE published_at IS NULL AND rejected_at IS NULL AND
//!    (next_attempt_at IS NULL OR next_attempt_at <= now()) ORDER BY id LIMIT n
//!    FOR UPDATE SKIP LOCKED` — rows another relay is publishing are skipped,
//!    so several relays can run at once and each row is sent by one, and a row
//!    Redis refused on its own waits for its retry time (`next_attempt_at`);
//! 2. each row is enqueued to Redis with its stable job id
//!    ([`Queue::enqueue_raw`]); `Created`, `Duplicate` and `AlreadyCompleted`
//!    all mean "Redis has (or had) this job";
//! 3. `UPDATE .. SET published_at = now()` for those rows, and `COMMIT`.
//!
//! A crash anywhere before the commit rolls the transaction back: the rows
//! stay unpublished and the next batch sends them again, which Redis answers
//! with `Duplicate` (or `AlreadyCompleted`) without writing anything.

use std::future::Future;
use std::ops::ControlFlow;
use std::time::Duration;

use queue_core::{EnqueueOptions, EnqueueOutcome, Enqueued, JobId, Queue, QueueError};
use tokio_postgres::{Client, IsolationLevel, Row, Transaction};
use tracing::{debug, error, info, warn};

use crate::error::{OutboxError, Result};
use crate::outbox::{check_queue, Outbox, OutboxRow};
use crate::table::TableName;

/// Default rows per batch.
pub const DEFAULT_BATCH_SIZE: usize = 100;

/// What one [`Relay::publish_batch`] did.
///
/// `#[non_exhaustive]`: a later version may add a field without breaking
/// your code. Outside this crate build one (in a test, say) from `Default`
/// and set its fields; a struct expression does not compile:
///
/// ```
/// let mut expected = queue_outbox::RelayReport::default();
/// expected.selected = 2;
/// expected.published = 2;
/// assert_eq!(expected.failed, 0);
/// ```
///
/// ```compile_fail,E0639
/// let expected = queue_outbox::RelayReport { published: 2, ..Default::default() };
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct RelayReport {
    /// Unpublished rows the batch locked.
    pub selected: usize,
    /// Rows marked published (Redis created the job, or already had it).
    pub published: usize,
    /// Of `published`, rows Redis already had (`Duplicate` or
    /// `AlreadyCompleted`): re-sends after a crash, or jobs also enqueued directly.
    pub duplicates: usize,
    /// Rows left unpublished after a Redis error; the row's `attempts` and
    /// `last_error` are updated. A failure of Redis itself (unreachable,
    /// timed out, read-only, not replicated) stops the batch at the first
    /// one (see `stopped`); a refusal of one row (an error reply for its job:
    /// a corrupt key of its job, say) does not, and the row is not selected
    /// again before its `next_attempt_at` (1 s, 2 s, 4 s, … up to 10 min by
    /// its attempts), so one row can never hold back the others.
    pub failed: usize,
    /// Rows marked rejected: they can never be published (e.g. an invalid job
    /// id written by hand). See [`ReconcileStatus::Rejected`](crate::ReconcileStatus::Rejected).
    pub rejected: usize,
    /// The last Redis error of the batch, if any.
    pub error: Option<String>,
    /// The batch stopped at a failure of Redis itself (not at a refusal of
    /// one row): [`Relay::run_until`] backs off before the next batch.
    pub stopped: bool,
}

/// Totals of a [`Relay::run_until`] loop.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RelaySummary {
    /// Batches run.
    pub batches: u64,
    /// Rows published.
    pub published: u64,
    /// Of those, rows Redis already had.
    pub duplicates: u64,
    /// Rows left unpublished after a Redis error (sent again later).
    pub failed: u64,
    /// Batches stopped by a failure of Redis itself (each followed by a backoff).
    pub stopped: u64,
    /// Rows marked rejected.
    pub rejected: u64,
    /// Batches that failed as a whole (PostgreSQL errors).
    pub errors: u64,
}

impl RelaySummary {
    fn add(&mut self, r: &RelayReport) {
        self.batches += 1;
        self.published += r.published as u64;
        self.duplicates += r.duplicates as u64;
        self.failed += r.failed as u64;
        self.rejected += r.rejected as u64;
        self.stopped += u64::from(r.stopped);
    }
}

/// A point inside a relay batch, passed to the hook of
/// [`Relay::publish_batch_with_hook`].
#[derive(Debug)]
#[non_exhaustive]
pub enum RelayStep<'a> {
    /// About to enqueue this row to Redis.
    BeforeEnqueue(&'a OutboxRow),
    /// Redis answered for this row; it is not yet marked published.
    AfterEnqueue(&'a OutboxRow, &'a Enqueued),
    /// Rows are marked published in the transaction; about to commit.
    BeforeCommit {
        /// Rows about to be committed as published.
        published: usize,
    },
}

impl RelayStep<'_> {
    /// `before_enqueue`, `after_enqueue` or `before_commit`.
    pub fn name(&self) -> &'static str {
        match self {
            RelayStep::BeforeEnqueue(_) => "before_enqueue",
            RelayStep::AfterEnqueue(..) => "after_enqueue",
            RelayStep::BeforeCommit { .. } => "before_commit",
        }
    }

    fn row(&self) -> Option<&OutboxRow> {
        match self {
            RelayStep::BeforeEnqueue(row) | RelayStep::AfterEnqueue(row, _) => Some(row),
            RelayStep::BeforeCommit { .. } => None,
        }
    }
}

/// Publishes outbox rows to Redis. Run one or several (on as many machines as
/// you like): `FOR UPDATE SKIP LOCKED` gives each row to one relay at a time.
///
/// Running until ctrl-c (the [crate example](crate) runs a relay end to end
/// with a worker). Runnable: needs PostgreSQL (`DATABASE_URL`, default
/// `postgres://postgres@127.0.0.1:5432/test`, or skipped with
/// `QUEUE_TEST_SKIP_POSTGRES=1`); the hidden
/// lines give it a throwaway schema and redis-server, stage one row, and end
/// the run once that row's job is in Redis instead of at ctrl-c:
///
/// ```
/// use std::time::Duration;
/// use queue_outbox::{Outbox, Relay};
/// # use queue_core::{job, JobContext, JobError};
/// # #[derive(serde::Serialize, serde::Deserialize)]
/// # pub struct Invoice { pub order: i64 }
/// # #[job(queue = "billing")]
/// # async fn send_invoice(_ctx: JobContext, _args: Invoice) -> Result<(), JobError> { Ok(()) }
///
/// # #[tokio::main] async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # // Skipped without PostgreSQL, like the test suite (QUEUE_TEST_SKIP_POSTGRES).
/// # let Some(pg) = queue_testkit::postgres::require() else { return Ok(()) };
/// # let schema = queue_testkit::postgres::TempSchema::create(&pg)?;
/// # let redis = queue_testkit::RedisServer::start()?;
/// # let (db, redis_url) = (schema.url(), redis.url());
/// # let mut client = queue_outbox::connect_postgres(db).await?;
/// # Outbox::new().migrate(&client).await?;
/// # let tx = client.transaction().await?;
/// # Outbox::new()
/// #     .enqueue_in_tx::<send_invoice::Job>(&tx, &Invoice { order: 7 }, Some("invoice-7".into()))
/// #     .await?;
/// # tx.commit().await?;
/// // e.g. db = "postgres://app@127.0.0.1/app", redis_url = "redis://127.0.0.1:6379/"
/// let queue = queue_core::Queue::connect(&redis_url).await?;
/// let relay = Relay::connect(Outbox::new(), db, queue.clone())
///     .await?
///     .batch_size(200);
/// let stop = async { let _ = tokio::signal::ctrl_c().await; };
/// # let published = async {
/// #     let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
/// #     while queue.job("billing", "invoice-7").await.ok().flatten().is_none()
/// #         && tokio::time::Instant::now() < deadline
/// #     {
/// #         tokio::time::sleep(Duration::from_millis(20)).await;
/// #     }
/// # };
/// # let stop = async { tokio::select! { _ = stop => {}, _ = published => {} } };
/// let summary = relay.run_until(stop, Duration::from_millis(500)).await?;
/// println!("published {} rows", summary.published);
/// # assert_eq!(summary.published, 1);
/// # Ok(()) }
/// ```
pub struct Relay {
    outbox: Outbox,
    queue: Queue,
    client: Client,
    /// Where to reconnect when the connection closes (set by [`Relay::connect`]).
    url: Option<String>,
    batch_size: usize,
    replicas: Option<(u32, Duration)>,
    /// A PostgreSQL error happened: reconnect before the next batch.
    suspect: bool,
}

impl std::fmt::Debug for Relay {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Relay")
            .field("table", &self.outbox.table())
            .field("batch_size", &self.batch_size)
            .field("reconnects", &self.url.is_some())
            .field("replicas", &self.replicas)
            .finish_non_exhaustive()
    }
}

impl Relay {
    /// A relay on an existing connection. The relay needs the connection for
    /// itself (it opens transactions on it); it cannot reconnect if it closes:
    /// [`run_until`](Self::run_until) then returns the error.
    pub fn new(outbox: Outbox, client: Client, queue: Queue) -> Self {
        Relay {
            outbox,
            queue,
            client,
            url: None,
            batch_size: DEFAULT_BATCH_SIZE,
            replicas: None,
            suspect: false,
        }
    }

    /// A relay with its own connection to `database_url` (no TLS; see
    /// [`connect_postgres`](crate::connect_postgres)). It reconnects by itself
    /// when the connection closes.
    pub async fn connect(outbox: Outbox, database_url: &str, queue: Queue) -> Result<Self> {
        let client = crate::connect_postgres(database_url).await?;
        Ok(Relay {
            url: Some(database_url.to_string()),
            ..Relay::new(outbox, client, queue)
        })
    }

    /// Rows per batch for [`run_until`](Self::run_until) (default 100). A batch
    /// holds its rows' locks while it talks to Redis: keep it in the hundreds.
    pub fn batch_size(mut self, n: usize) -> Self {
        self.batch_size = n.max(1);
        self
    }

    /// Mark a row published only once `replicas` Redis replicas confirmed its
    /// job (Redis `WAIT`, at most `timeout` per row). A row whose job was
    /// written on the primary but not replicated in time stays unpublished
    /// with the error, like any Redis error, and is sent again (a no-op
    /// enqueue followed by a new `WAIT`). Use it when a Redis failover must
    /// not lose a published job.
    pub fn wait_for_replicas(mut self, replicas: u32, timeout: Duration) -> Self {
        self.replicas = Some((replicas, timeout));
        self
    }

    /// The outbox this relay publishes.
    pub fn outbox(&self) -> &Outbox {
        &self.outbox
    }

    async fn ensure_connected(&mut self) -> Result<()> {
        if self.client.is_closed() || self.suspect {
            if let Some(url) = &self.url {
                info!(table = %self.outbox.table(), "reconnecting to postgres");
                self.client = crate::connect_postgres(url).await?;
            }
            self.suspect = false;
        }
        Ok(())
    }

    /// Publishes up to `limit` unpublished rows (oldest first) in one transaction.
    ///
    /// A Redis error is not an `Err`: the row that met it gets `attempts + 1`
    /// and `last_error`, and the report counts it in `failed`. A failure of
    /// Redis itself stops the batch there (`stopped`; what was published
    /// before it is committed); a refusal of that row alone does not, and the
    /// row waits for its `next_attempt_at`. A row that can never be published
    /// (an invalid job id, a malformed `extra`, arguments the enqueue script
    /// refuses) is marked rejected with the reason. `Err` means PostgreSQL
    /// failed and nothing of this batch was committed (so it is sent again).
    pub async fn publish_batch(&mut self, limit: usize) -> Result<RelayReport> {
        self.publish_batch_with_hook(limit, |_| ControlFlow::Continue(()))
            .await
    }

    /// [`publish_batch`](Self::publish_batch) with a hook called at each
    /// [`RelayStep`]. When the hook returns `Break`, the batch stops at once and
    /// its transaction is dropped without commit — exactly what a crash at
    /// that point does — and the call returns [`OutboxError::Interrupted`].
    ///
    /// A test seam for crash tests, and a place for instrumentation.
    ///
    /// ```no_run
    /// use std::ops::ControlFlow;
    /// use queue_outbox::RelayStep;
    /// # async fn f(relay: &mut queue_outbox::Relay) {
    /// // "Crash" after the first row reached Redis, before anything is committed.
    /// let result = relay
    ///     .publish_batch_with_hook(10, |step| match step {
    ///         RelayStep::AfterEnqueue(..) => ControlFlow::Break(()),
    ///         _ => ControlFlow::Continue(()),
    ///     })
    ///     .await;
    /// assert!(result.is_err());
    /// # }
    /// ```
    pub async fn publish_batch_with_hook<H>(&mut self, limit: usize, hook: H) -> Result<RelayReport>
    where
        H: FnMut(&RelayStep<'_>) -> ControlFlow<()>,
    {
        self.ensure_connected().await?;
        let result = self.batch(limit, hook).await;
        // After a PostgreSQL error the connection may be dying without being
        // closed yet (e.g. the server terminated the session): a relay that
        // can reconnect starts the next batch on a fresh one.
        if let Err(OutboxError::Postgres { .. }) = &result {
            self.suspect = true;
        }
        result
    }

    async fn batch<H>(&mut self, limit: usize, mut hook: H) -> Result<RelayReport>
    where
        H: FnMut(&RelayStep<'_>) -> ControlFlow<()>,
    {
        let Relay {
            outbox,
            queue,
            client,
            replicas,
            ..
        } = self;
        let table = outbox.table_name();
        let tname = table.name.as_str();

        let tx = client
            .build_transaction()
            .isolation_level(IsolationLevel::ReadCommitted)
            .start()
            .await
            .map_err(|e| OutboxError::pg(tname, "starting a relay transaction", e))?;
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let rows = tx
            .query(&table.select_batch_sql(), &[&limit])
            .await
            .map_err(|e| OutboxError::pg(tname, "selecting unpublished rows", e))?;

        let mut report = RelayReport {
            selected: rows.len(),
            ..RelayReport::default()
        };
        let mut published: Vec<i64> = Vec::with_capacity(rows.len());
        for raw in &rows {
            // A column of the wrong type is a table problem, not a row problem:
            // fail the batch (rolled back) rather than reject every row. A
            // value of this row alone that cannot be sent rejects the row.
            let (row, problem, delay_ms, finite) = decode_row(table, raw)?;

            if let Err(reason) = problem.map_or(Ok(()), Err).and(unpublishable(&row, finite)) {
                let why = "it can never be published";
                reject_row(&tx, table, &row, &reason, why).await?;
                report.rejected += 1;
                continue;
            }

            check_hook(&mut hook, tname, RelayStep::BeforeEnqueue(&row))?;
            match send_row(queue, &row, delay_ms, *replicas).await {
                Ok(enqueued) => {
                    check_hook(&mut hook, tname, RelayStep::AfterEnqueue(&row, &enqueued))?;
                    if log_published(tname, &row, &enqueued.outcome) {
                        report.duplicates += 1;
                    }
                    published.push(row.row_id);
                }
                Err(e) if refused_for_good(&e, &row.job_id) => {
                    let why = "its arguments are refused";
                    reject_row(&tx, table, &row, &e.to_string(), why).await?;
                    report.rejected += 1;
                }
                Err(e) => {
                    // Redis down, timed out, read-only, not replicated in
                    // time, or refused this row. The write may or may not have
                    // landed: leave the row unpublished (a re-send is a
                    // no-op). A failure of Redis itself stops the batch (the
                    // row stays first for when Redis is back); a refusal of
                    // this row alone does not, and defers the row
                    // (`row_only`: an operator may repair its data meanwhile).
                    let reason = e.to_string();
                    let stop = !row_only(&e);
                    warn!(
                        table = %tname,
                        row_id = row.row_id,
                        queue = %row.queue,
                        job_id = %row.job_id,
                        attempts = row.attempts + 1,
                        error = %reason,
                        stopped = stop,
                        "outbox row not published; will retry"
                    );
                    let what = "recording a publish error";
                    let sql = if stop {
                        table.mark_failed_sql()
                    } else {
                        table.mark_deferred_sql()
                    };
                    mark_row(&tx, &sql, tname, what, &row, &reason).await?;
                    report.failed += 1;
                    report.error = Some(reason);
                    if stop {
                        report.stopped = true;
                        break;
                    }
                }
            }
        }

        commit_batch(tx, table, &published, &mut hook, report).await
    }

    /// Publishes batches until `stop` completes: at once again while batches
    /// come back full, otherwise every `interval`; after a batch that failed
    /// (PostgreSQL) or stopped at a failure of Redis itself it backs off
    /// (doubling up to 30 s). Rows Redis refused on their own do not slow it
    /// down: each waits for its own retry time. A batch in progress when
    /// `stop` completes is finished first. Returns the totals.
    ///
    /// PostgreSQL and Redis errors are logged and retried (a relay from
    /// [`Relay::connect`] reconnects). It returns `Err` only when the
    /// PostgreSQL connection of a relay from [`Relay::new`] is closed.
    pub async fn run_until<F>(mut self, stop: F, interval: Duration) -> Result<RelaySummary>
    where
        F: Future<Output = ()>,
    {
        tokio::pin!(stop);
        let mut summary = RelaySummary::default();
        let mut errors_in_a_row: u32 = 0;
        info!(
            table = %self.outbox.table(),
            batch_size = self.batch_size,
            interval_ms = interval.as_millis() as u64,
            "outbox relay started"
        );
        loop {
            tokio::select! {
                biased;
                _ = &mut stop => break,
                _ = std::future::ready(()) => {}
            }
            let wait = match self.publish_batch(self.batch_size).await {
                Ok(report) => {
                    summary.add(&report);
                    if report.stopped {
                        errors_in_a_row += 1;
                        backoff(interval, errors_in_a_row)
                    } else {
                        errors_in_a_row = 0;
                        if report.selected >= self.batch_size {
                            Duration::ZERO
                        } else {
                            interval
                        }
                    }
                }
                Err(e) => {
                    summary.errors += 1;
                    errors_in_a_row += 1;
                    warn!(
                        table = %self.outbox.table(),
                        queue = e.queue(),
                        job_id = e.job_id().map(|id| id.as_str()),
                        error = %e,
                        "outbox relay batch failed; nothing of it was committed"
                    );
                    if e.is_connection_closed() && self.url.is_none() {
                        error!(
                            table = %self.outbox.table(),
                            "postgres connection closed and the relay cannot reconnect; stopping"
                        );
                        return Err(e);
                    }
                    backoff(interval, errors_in_a_row)
                }
            };
            if !wait.is_zero() {
                tokio::select! {
                    biased;
                    _ = &mut stop => break,
                    _ = tokio::time::sleep(wait) => {}
                }
            }
        }
        info!(
            table = %self.outbox.table(),
            batches = summary.batches,
            published = summary.published,
            duplicates = summary.duplicates,
            failed = summary.failed,
            rejected = summary.rejected,
            stopped = summary.stopped,
            errors = summary.errors,
            "outbox relay stopped"
        );
        Ok(summary)
    }
}

/// Marks `published` rows published, asks the hook, commits, logs the batch.
async fn commit_batch<H>(
    tx: Transaction<'_>,
    table: &TableName,
    published: &[i64],
    hook: &mut H,
    mut report: RelayReport,
) -> Result<RelayReport>
where
    H: FnMut(&RelayStep<'_>) -> ControlFlow<()>,
{
    let tname = table.name.as_str();
    if !published.is_empty() {
        tx.execute(&table.mark_published_sql(), &[&published])
            .await
            .map_err(|e| OutboxError::pg(tname, "marking rows published", e))?;
    }
    check_hook(
        hook,
        tname,
        RelayStep::BeforeCommit {
            published: published.len(),
        },
    )?;
    tx.commit()
        .await
        .map_err(|e| OutboxError::pg(tname, "committing a relay batch", e))?;
    report.published = published.len();
    if report.selected > 0 {
        info!(
            table = %tname,
            selected = report.selected,
            published = report.published,
            duplicates = report.duplicates,
            failed = report.failed,
            rejected = report.rejected,
            "outbox batch done"
        );
    }
    Ok(report)
}

/// Asks the test hook about `step`: `Break` stops the batch with
/// [`OutboxError::Interrupted`] (the transaction rolls back).
fn check_hook<H>(hook: &mut H, tname: &str, step: RelayStep<'_>) -> Result<()>
where
    H: FnMut(&RelayStep<'_>) -> ControlFlow<()>,
{
    match hook(&step) {
        ControlFlow::Continue(()) => Ok(()),
        ControlFlow::Break(()) => {
            let row = step.row();
            warn!(
                table = %tname,
                step = step.name(),
                queue = row.map(|r| r.queue.as_str()),
                job_id = row.map(|r| r.job_id.as_str()),
                "relay batch interrupted by its hook; rolling back"
            );
            Err(OutboxError::Interrupted {
                step: step.name(),
                queue: row.map(|r| r.queue.clone()),
                job_id: row.map(|r| r.job_id.clone()),
            })
        }
    }
}

/// A selected row, why it can never be published if a value of it says so
/// ([`OutboxRow::from_row`]), its delay in ms (none: due now) and whether its
/// `run_at` is a finite time (`infinity` is a valid `timestamptz`; the delay
/// is then not computed, since `infinity - now()` fails the whole `SELECT`).
type Decoded = (OutboxRow, Option<String>, Option<i64>, bool);

fn decode_row(table: &TableName, raw: &Row) -> Result<Decoded> {
    let (row, problem) = OutboxRow::from_row(table, raw)?;
    let bad = |what: &str, e: tokio_postgres::Error| OutboxError::InvalidRow {
        table: table.name.clone(),
        row_id: row.row_id,
        queue: Some(row.queue.clone()),
        job_id: Some(row.job_id.clone()),
        reason: format!("{what}: {e}"),
    };
    let delay_ms: Option<i64> = raw.try_get(15).map_err(|e| bad("computed delay", e))?;
    let finite: bool = raw.try_get(16).map_err(|e| bad("run_at finiteness", e))?;
    Ok((row, problem, delay_ms, finite))
}

/// Enqueues one row to Redis under its stable job id.
///
/// With replicas required, a row sent before (`attempts` > 0) is first sent
/// without them: a job that already ran (`AlreadyCompleted`) is published
/// whatever the replicas say. Held back until they confirm, it was sent again
/// at every batch, and once its completion record expired the re-send created
/// the job anew and it ran a second time.
async fn send_row(
    queue: &Queue,
    row: &OutboxRow,
    delay_ms: Option<i64>,
    replicas: Option<(u32, Duration)>,
) -> std::result::Result<Enqueued, QueueError> {
    let mut opts = EnqueueOptions::new().id(row.job_id.clone());
    if let Some(ms) = delay_ms.filter(|ms| *ms > 0) {
        opts = opts.delay(Duration::from_millis(ms as u64));
    }
    for (name, value) in &row.extra_fields {
        opts = opts.extra_field(name, value.as_str());
    }
    let send = |opts: EnqueueOptions| {
        queue.enqueue_raw(
            &row.queue,
            &row.job_type,
            row.schema_version as u32,
            row.max_attempts as u32,
            opts,
            &row.payload,
        )
    };
    let Some((n, timeout)) = replicas else {
        return send(opts).await;
    };
    if row.attempts > 0 {
        let probe = send(opts.clone()).await?;
        if probe.outcome == EnqueueOutcome::AlreadyCompleted {
            return Ok(probe);
        }
    }
    send(opts.wait_for_replicas(n, timeout)).await
}

/// A send error that concerns this row alone: an error reply to its own
/// call for its data ([`QueueError::is_data_error`]: a queue key of another
/// type, corrupt data under its id, anything the script refused) or a reply
/// this version does not understand. The batch goes on past it. Every other
/// error (Redis unreachable, timed out, read-only, loading, busy with a long
/// script, out of memory, a cluster redirection, not replicated) hits every
/// row alike and stops the batch.
fn row_only(e: &QueueError) -> bool {
    match e {
        QueueError::Redis { .. } => e.is_data_error(),
        QueueError::Protocol { .. } => true,
        _ => false,
    }
}

/// A send error that no retry can fix: queue-core refused the job id, the
/// queue name, an extra field, or an argument longer than the relay's
/// `Queue` sends ([`QueueError::ArgumentTooLarge`]: the payload or an extra
/// field above [`Queue::with_max_arg_len`]), or the enqueue script refused
/// the call for the job's own arguments — a name of a core job field
/// (`state`, `token`, …) or an empty name among its extra fields, numbers
/// that are not counts, an empty id. Such a refusal answers the same
/// arguments the same way every time, so the row is rejected with it.
/// Before, an oversized payload was taken for a failure of Redis: the row
/// was marked failed, the batch stopped, and every later batch selected it
/// first again, so no row behind it was ever published. The script's other `invalid argument` refusals are about data in
/// Redis (a corrupt key of the job or of its group) that an operator can
/// repair: they stay failures, retried after a backoff.
fn refused_for_good(e: &QueueError, id: &JobId) -> bool {
    /// What follows `ERR invalid argument job <id>: ` in enqueue_many.lua's
    /// refusals of a job's arguments (its parse, before anything is read).
    const ARGUMENT_REFUSALS: [&str; 3] = [
        "extra field name: ",
        "max_attempts, delay_ms, run_at_ms and once ttl_ms must be counts",
        "empty id",
    ];
    match e {
        QueueError::InvalidJobId { .. }
        | QueueError::InvalidQueueName { .. }
        | QueueError::InvalidExtraField { .. }
        | QueueError::ArgumentTooLarge { .. } => true,
        QueueError::Redis { source, .. } if source.code() == Some("ERR") => {
            let text = source.to_string();
            let prefix = format!("invalid argument job {id}: ");
            ARGUMENT_REFUSALS
                .iter()
                .any(|r| text.contains(&format!("{prefix}{r}")))
        }
        _ => false,
    }
}

/// Logs a published row; `true` when Redis already had the job (a re-send).
fn log_published(tname: &str, row: &OutboxRow, outcome: &EnqueueOutcome) -> bool {
    match outcome {
        EnqueueOutcome::Created => {
            debug!(
                table = %tname,
                row_id = row.row_id,
                queue = %row.queue,
                job_id = %row.job_id,
                "outbox row published"
            );
            false
        }
        EnqueueOutcome::Duplicate { state } => {
            info!(
                table = %tname,
                row_id = row.row_id,
                queue = %row.queue,
                job_id = %row.job_id,
                state = %state,
                "outbox row was already in redis (re-send); marked published"
            );
            true
        }
        EnqueueOutcome::AlreadyCompleted => {
            info!(
                table = %tname,
                row_id = row.row_id,
                queue = %row.queue,
                job_id = %row.job_id,
                "outbox row's job already completed (re-send); marked published"
            );
            true
        }
    }
}

/// Marks a row rejected (it can never be published), logged with `why`.
async fn reject_row(
    tx: &Transaction<'_>,
    table: &TableName,
    row: &OutboxRow,
    reason: &str,
    why: &'static str,
) -> Result<()> {
    let tname = table.name.as_str();
    error!(
        table = %tname,
        row_id = row.row_id,
        queue = %row.queue,
        job_id = %row.job_id,
        reason,
        "outbox row rejected: {why}"
    );
    let sql = table.mark_rejected_sql();
    mark_row(tx, &sql, tname, "rejecting a row", row, reason).await
}

/// Runs `sql` (mark rejected / mark failed) for one row with its reason.
async fn mark_row(
    tx: &Transaction<'_>,
    sql: &str,
    tname: &str,
    what: &'static str,
    row: &OutboxRow,
    reason: &str,
) -> Result<()> {
    tx.execute(sql, &[&row.row_id, &reason])
        .await
        .map_err(|e| OutboxError::pg_job(tname, what, &row.queue, &row.job_id, e))?;
    Ok(())
}

/// Why a row can never be published, checked before it is sent.
fn unpublishable(row: &OutboxRow, finite_run_at: bool) -> std::result::Result<(), String> {
    if !finite_run_at {
        return Err("run_at is not a finite time (infinity)".into());
    }
    row.job_id.validate().map_err(str::to_string)?;
    check_queue(&row.queue)?;
    if row.job_type.is_empty() {
        return Err("job type must not be empty".into());
    }
    if row.schema_version < 0 {
        return Err(format!("negative schema version {}", row.schema_version));
    }
    if row.max_attempts < 1 {
        return Err(format!("max_attempts {} is below 1", row.max_attempts));
    }
    Ok(())
}

fn backoff(interval: Duration, errors_in_a_row: u32) -> Duration {
    let base = interval.max(Duration::from_millis(100));
    let cap = interval.max(Duration::from_secs(30));
    base.saturating_mul(1u32 << errors_in_a_row.saturating_sub(1).min(16))
        .min(cap)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_up_to_the_cap() {
        let i = Duration::from_millis(500);
        assert_eq!(backoff(i, 1), Duration::from_millis(500));
        assert_eq!(backoff(i, 2), Duration::from_secs(1));
        assert_eq!(backoff(i, 3), Duration::from_secs(2));
        assert_eq!(backoff(i, 40), Duration::from_secs(30));
        assert_eq!(backoff(Duration::from_secs(60), 5), Duration::from_secs(60));
        assert_eq!(backoff(Duration::ZERO, 1), Duration::from_millis(100));
    }

    /// The refusals `refused_for_good` recognises are still the texts the
    /// enqueue script answers: a change there fails here, not in production
    /// (where such rows would be retried forever instead of rejected).
    #[test]
    fn argument_refusals_match_the_enqueue_script() {
        let script = include_str!("../../queue-core/src/scripts/enqueue_many.lua");
        assert!(script.contains("'ERR invalid argument job ' .. ARGV[i] .. ': ' .. bad"));
        for text in [
            "bad = 'extra field name: '",
            "bad = 'max_attempts, delay_ms, run_at_ms and once ttl_ms must be counts'",
            "bad = 'empty id'",
        ] {
            assert!(script.contains(text), "{text}");
        }
    }
}
