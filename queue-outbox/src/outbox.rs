//! The outbox table: migration, enqueue in the caller's transaction, rows,
//! pruning and counts.

use std::time::{Duration, SystemTime};

use queue_core::{EnqueueOptions, Job, JobId, QueueError};
use tokio_postgres::{GenericClient, Row, Transaction};
use tracing::debug;

use crate::error::{OutboxError, Result};
use crate::table::TableName;

/// The default outbox table name.
pub const DEFAULT_TABLE: &str = "queue_outbox";

/// An outbox table: jobs written in the caller's PostgreSQL transaction and
/// published to Redis later by a [`Relay`](crate::Relay).
///
/// Cheap to clone. The table name is validated once, here.
///
/// ```
/// use queue_outbox::Outbox;
/// assert_eq!(Outbox::new().table(), "queue_outbox");
/// assert_eq!(Outbox::with_table("billing.outbox").unwrap().table(), "billing.outbox");
/// assert!(Outbox::with_table("outbox; drop table users").is_err());
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outbox {
    table: TableName,
    /// The longest payload or extra field staged ([`Outbox::with_max_arg_len`]).
    max_arg_len: usize,
}

/// Default of [`Outbox::with_max_arg_len`]: the default of
/// `Queue::with_max_arg_len`, Redis' default `proto-max-bulk-len`.
const DEFAULT_MAX_ARG_LEN: usize = 512 << 20;

impl Default for Outbox {
    fn default() -> Self {
        Self::new()
    }
}

/// Whether [`Outbox::enqueue_in_tx`] wrote a row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutboxOutcome {
    /// A row was inserted; it is published when the transaction commits and a relay runs.
    Inserted,
    /// A row with this queue and job id is already in the outbox (published
    /// or not); nothing was written. The existing row's payload is kept.
    Duplicate,
}

/// The result of [`Outbox::enqueue_in_tx`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutboxEnqueued {
    /// The job id (the same one the job will have in Redis).
    pub id: JobId,
    /// The queue the job will be published to.
    pub queue: String,
    /// Whether a row was written.
    pub outcome: OutboxOutcome,
}

impl OutboxEnqueued {
    /// True when this call inserted the row.
    pub fn is_new(&self) -> bool {
        self.outcome == OutboxOutcome::Inserted
    }
}

/// One row of the outbox table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutboxRow {
    /// The row's `id` (insertion order).
    pub row_id: i64,
    /// The job id used in Redis.
    pub job_id: JobId,
    /// Target queue.
    pub queue: String,
    /// Job type name.
    pub job_type: String,
    /// Payload schema version (the table checks `>= 0`).
    pub schema_version: i32,
    /// Attempt limit of the job.
    pub max_attempts: i32,
    /// MessagePack payload.
    pub payload: Vec<u8>,
    /// Insert time (PostgreSQL clock; the start of the inserting transaction).
    pub created_at: SystemTime,
    /// When a relay published it.
    pub published_at: Option<SystemTime>,
    /// When a relay gave up on it (a row no retry can fix, e.g. an invalid job id).
    pub rejected_at: Option<SystemTime>,
    /// Publish attempts whose outcome was committed: the successful one and
    /// each recorded Redis error. A batch that crashed leaves no trace here.
    pub attempts: i32,
    /// The last publish error.
    pub last_error: Option<String>,
    /// Run no earlier than this (from [`EnqueueOptions::delay`] or [`EnqueueOptions::run_at`]).
    pub run_at: Option<SystemTime>,
    /// The job's extra fields (name, value), as [`EnqueueOptions::extra_field`]
    /// and the options built on it set them: a rate key (given, or the job
    /// type's `#[job(rate_key = ..)]`), a group, a start deadline. The relay
    /// enqueues the job with them. Column `extra` (`text[]`: name, value, …).
    pub extra_fields: Vec<(String, String)>,
    /// Not sent again before this time: set when Redis refused the row on
    /// its own (its data or a corrupt key of its job), doubling from 1 s to
    /// 10 min with its `attempts`. `None` (or past): due now. Set it to NULL
    /// to have the next batch send it at once.
    pub next_attempt_at: Option<SystemTime>,
}

/// The id of an outbox row (columns `id`, `job_id`, `queue` first, as every
/// column list of [`TableName`] starts), and how a column of it of an
/// unexpected type is reported: an error naming the row (a table problem),
/// never a panic.
pub(crate) fn row_reader<'r>(
    table: &'r TableName,
    row: &'r Row,
) -> Result<(
    i64,
    impl Fn(&str, tokio_postgres::Error) -> OutboxError + 'r,
)> {
    let row_id: i64 = row.try_get(0).map_err(|e| OutboxError::InvalidRow {
        table: table.name.clone(),
        row_id: -1,
        queue: None,
        job_id: None,
        reason: format!("column `id`: {e}"),
    })?;
    let bad = move |column: &str, e: tokio_postgres::Error| OutboxError::InvalidRow {
        table: table.name.clone(),
        row_id,
        queue: row.try_get::<_, String>(2).ok(),
        job_id: row.try_get::<_, String>(1).ok().map(JobId::from),
        reason: format!("column `{column}`: {e}"),
    };
    Ok((row_id, bad))
}

impl OutboxRow {
    /// Reads a row selected with [`TableName::COLUMNS`]. A column of an
    /// unexpected type is an error (a table problem), never a panic. A value
    /// that only this row holds and that cannot be sent (an `extra` with a
    /// NULL element, more than one dimension or an odd length, which only a
    /// hand-written row can hold) is not: the row is read with no extra
    /// fields and the second value says why it can never be published.
    pub(crate) fn from_row(table: &TableName, row: &Row) -> Result<(Self, Option<String>)> {
        let (row_id, bad) = row_reader(table, row)?;
        let (extra_fields, unpublishable) = match row.try_get(13) {
            Ok(flat) => match pairs(Option::unwrap_or_default(flat)) {
                Ok(fields) => (fields, None),
                Err(why) => (Vec::new(), Some(why)),
            },
            Err(e) if is_wrong_type(&e) => return Err(bad("extra", e)),
            Err(e) => {
                // The driver's own message says "error deserializing column
                // 13"; its source says what was wrong (e.g. too many dimensions).
                let why = std::error::Error::source(&e).map_or(e.to_string(), |s| s.to_string());
                (Vec::new(), Some(format!("column `extra`: {why}")))
            }
        };
        let decoded = OutboxRow {
            row_id,
            job_id: JobId::from(row.try_get::<_, String>(1).map_err(|e| bad("job_id", e))?),
            queue: row.try_get(2).map_err(|e| bad("queue", e))?,
            job_type: row.try_get(3).map_err(|e| bad("job_type", e))?,
            schema_version: row.try_get(4).map_err(|e| bad("schema_version", e))?,
            max_attempts: row.try_get(5).map_err(|e| bad("max_attempts", e))?,
            payload: row.try_get(6).map_err(|e| bad("payload", e))?,
            created_at: row.try_get(7).map_err(|e| bad("created_at", e))?,
            published_at: row.try_get(8).map_err(|e| bad("published_at", e))?,
            rejected_at: row.try_get(9).map_err(|e| bad("rejected_at", e))?,
            attempts: row.try_get(10).map_err(|e| bad("attempts", e))?,
            last_error: row.try_get(11).map_err(|e| bad("last_error", e))?,
            run_at: row.try_get(12).map_err(|e| bad("run_at", e))?,
            extra_fields,
            next_attempt_at: row.try_get(14).map_err(|e| bad("next_attempt_at", e))?,
        };
        Ok((decoded, unpublishable))
    }
}

/// Whether a column read failed because the column's type is not the one
/// this version reads (a table problem), not because of this row's value.
fn is_wrong_type(e: &tokio_postgres::Error) -> bool {
    std::error::Error::source(e).is_some_and(|s| s.is::<tokio_postgres::types::WrongType>())
}

/// The (name, value) pairs of an `extra` column, or why it holds none that
/// can be sent: a NULL element, an odd length (a name without its value) or
/// a name given twice.
fn pairs(flat: Vec<Option<String>>) -> std::result::Result<Vec<(String, String)>, String> {
    if let Some(i) = flat.iter().position(Option::is_none) {
        return Err(format!(
            "column `extra`: element {} is NULL (name, value pairs of text expected)",
            i + 1
        ));
    }
    if !flat.len().is_multiple_of(2) {
        return Err(format!(
            "column `extra`: {} elements, a name without its value (name, value pairs expected)",
            flat.len()
        ));
    }
    let mut it = flat.into_iter().flatten();
    let mut out = Vec::new();
    while let (Some(name), Some(value)) = (it.next(), it.next()) {
        // As `EnqueueOptions::validate` refuses when staged: sent as they are,
        // the last value would win without a word.
        if out.iter().any(|(n, _)| *n == name) {
            return Err(format!(
                "column `extra`: field name `{name}` given twice (each name at most once)"
            ));
        }
        out.push((name, value));
    }
    Ok(out)
}

/// Row counts of an outbox table (see [`Outbox::stats`]).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct OutboxStats {
    /// Rows waiting for a relay.
    pub unpublished: u64,
    /// Rows a relay gave up on (`rejected_at` set); they need an operator.
    pub rejected: u64,
    /// Rows published (kept until [`Outbox::prune`]).
    pub published: u64,
    /// Age of the oldest unpublished row (PostgreSQL clock): the relay's lag.
    pub oldest_unpublished: Option<Duration>,
}

/// queue-core's rule for queue names (the one `Queue` applies before
/// sending), checked before a row is written so that no row the relay must
/// reject gets in through this API; job ids are checked the same way, with
/// [`JobId::validate`].
pub(crate) fn check_queue(queue: &str) -> std::result::Result<(), String> {
    queue_core::validate_queue_name(queue).map_err(|reason| format!("queue name {reason}"))
}

impl Outbox {
    /// The default table, `queue_outbox`.
    pub fn new() -> Self {
        Outbox {
            table: TableName::parse(DEFAULT_TABLE).expect("the default table name is valid"),
            max_arg_len: DEFAULT_MAX_ARG_LEN,
        }
    }

    /// Another table: a plain lower-case identifier (`[a-z_][a-z0-9_]*`, at
    /// most 40 bytes), optionally schema-qualified (`billing.outbox`). It is
    /// always quoted in SQL, so it cannot inject anything.
    pub fn with_table(name: &str) -> Result<Self> {
        Ok(Outbox {
            table: TableName::parse(name)?,
            max_arg_len: DEFAULT_MAX_ARG_LEN,
        })
    }

    /// The longest payload, or extra field name or value, that
    /// [`enqueue_in_tx_with`](Self::enqueue_in_tx_with) stages, in bytes: a
    /// longer one is refused with [`OutboxError::InvalidJob`] before
    /// anything is written. Default 512 MiB, Redis' default
    /// `proto-max-bulk-len`, as `Queue::with_max_arg_len`. Set both to the
    /// server's `proto-max-bulk-len` when that is lower: the relay's `Queue`
    /// rejects a longer row it finds (written before, or by another
    /// program), and Redis closes the connection on one sent anyway.
    ///
    /// ```
    /// let outbox = queue_outbox::Outbox::new().with_max_arg_len(1 << 20);
    /// assert_eq!(outbox.max_arg_len(), 1 << 20);
    /// ```
    pub fn with_max_arg_len(mut self, bytes: usize) -> Self {
        self.max_arg_len = bytes;
        self
    }

    /// The current argument limit (see [`with_max_arg_len`](Self::with_max_arg_len)).
    pub fn max_arg_len(&self) -> usize {
        self.max_arg_len
    }

    /// The table name as given.
    pub fn table(&self) -> &str {
        &self.table.name
    }

    /// The validated table name (with its quoted SQL form).
    pub fn table_name(&self) -> &TableName {
        &self.table
    }

    /// Creates the table and its indexes if absent, and adds the columns a
    /// newer version needs to an existing table (`extra` for a table made
    /// before stop 36, `next_attempt_at` before stop 38: run it after
    /// upgrading, before the new version writes or relays). Idempotent, and safe to run from several
    /// processes at once (serialised by an advisory lock on the
    /// schema-qualified name).
    ///
    /// It looks the table, its columns and indexes up first and changes only
    /// what is missing: run again on an up-to-date table it takes no lock on
    /// it, so an open transaction on the table (a relay batch waiting for
    /// Redis) neither blocks it nor gets writers queued behind it. When it has
    /// something to change it waits at most
    /// [`MIGRATE_LOCK_TIMEOUT`](crate::MIGRATE_LOCK_TIMEOUT) for the table's
    /// lock, then fails ([`OutboxError::Postgres`], SQLSTATE `55P03`): run it
    /// again when the transactions on the table have ended.
    ///
    /// Works on a [`Client`](tokio_postgres::Client) or inside a
    /// [`Transaction`] (then it commits with it).
    ///
    /// ```
    /// # #[tokio::main] async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let Some(pg) = queue_testkit::postgres::require() else { return Ok(()) };
    /// # let schema = queue_testkit::postgres::TempSchema::create(&pg)?;
    /// # let client = queue_outbox::connect_postgres(schema.url()).await?;
    /// let outbox = queue_outbox::Outbox::new();
    /// outbox.migrate(&client).await?;
    /// outbox.migrate(&client).await?; // idempotent
    /// assert_eq!(outbox.stats(&client).await?.unpublished, 0);
    /// # Ok(()) }
    /// ```
    pub async fn migrate(&self, client: &impl GenericClient) -> Result<()> {
        client
            .batch_execute(&self.table.migrate_sql())
            .await
            .map_err(|e| OutboxError::pg(&self.table.name, TableName::migrate_action(&e), e))?;
        debug!(table = %self.table.name, "outbox table ready");
        Ok(())
    }

    /// Writes job `J` to the outbox inside the caller's transaction.
    ///
    /// The job exists for the relay only if `tx` commits; a rollback leaves no
    /// trace. With `id: None` a random UUID is used. A second row with the same
    /// queue and id (a business key) is not written: the result says
    /// [`OutboxOutcome::Duplicate`].
    ///
    /// ```
    /// use queue_core::{job, JobContext, JobError};
    /// use serde::{Deserialize, Serialize};
    ///
    /// #[derive(Serialize, Deserialize)]
    /// pub struct Receipt { pub order: i64 }
    ///
    /// #[job(queue = "emails")]
    /// async fn send_receipt(_ctx: JobContext, args: Receipt) -> Result<(), JobError> { Ok(()) }
    ///
    /// # #[tokio::main] async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let Some(pg) = queue_testkit::postgres::require() else { return Ok(()) };
    /// # let schema = queue_testkit::postgres::TempSchema::create(&pg)?;
    /// # let mut client = queue_outbox::connect_postgres(schema.url()).await?;
    /// # client.batch_execute("CREATE TABLE orders (id bigint PRIMARY KEY, state text)").await?;
    /// let outbox = queue_outbox::Outbox::new();
    /// # outbox.migrate(&client).await?;
    /// let tx = client.transaction().await?;
    /// tx.execute("UPDATE orders SET state = 'paid' WHERE id = $1", &[&42_i64]).await?;
    /// let staged = outbox
    ///     .enqueue_in_tx::<send_receipt::Job>(&tx, &Receipt { order: 42 }, Some("receipt-42".into()))
    ///     .await?;
    /// tx.commit().await?; // the order update and the job, or neither
    /// assert_eq!(staged.id.as_str(), "receipt-42");
    /// assert_eq!(outbox.stats(&client).await?.unpublished, 1);
    /// # Ok(()) }
    /// ```
    pub async fn enqueue_in_tx<J: Job>(
        &self,
        tx: &Transaction<'_>,
        args: &J::Args,
        id: Option<JobId>,
    ) -> Result<OutboxEnqueued> {
        let opts = EnqueueOptions {
            id,
            ..EnqueueOptions::new()
        };
        self.enqueue_in_tx_with::<J>(tx, opts, args).await
    }

    /// Like [`enqueue_in_tx`](Self::enqueue_in_tx) with [`EnqueueOptions`]:
    /// `id`, `max_attempts`, `delay`, `run_at` and the extra fields (a rate
    /// key, given or from the job type's `#[job(rate_key = ..)]`, a group, a
    /// start deadline: [`OutboxRow::extra_fields`]) are honoured. A start
    /// deadline relative to the enqueue (`expires_in`) counts from the
    /// relay's publish, as the job's `enqueued_at` does.
    ///
    /// The delay counts from the insert (PostgreSQL clock): a relay that
    /// publishes later enqueues the job with whatever remains of it. `run_at`
    /// takes precedence over `delay`, as in `queue-core`.
    ///
    /// A payload, or an extra field name or value, longer than
    /// [`with_max_arg_len`](Self::with_max_arg_len) is refused with
    /// [`OutboxError::InvalidJob`]: the relay could never send it.
    ///
    /// `once_for` and `wait_for_replicas` are refused with
    /// [`OutboxError::InvalidJob`] rather than silently dropped: the outbox
    /// does not store the first, and the second is a relay setting
    /// ([`Relay::wait_for_replicas`](crate::Relay::wait_for_replicas)).
    pub async fn enqueue_in_tx_with<J: Job>(
        &self,
        tx: &Transaction<'_>,
        opts: EnqueueOptions,
        args: &J::Args,
    ) -> Result<OutboxEnqueued> {
        let queue = J::QUEUE;
        // The extra field names the enqueue scripts refuse (empty, a core
        // field, a name given twice): such a row could never be published.
        let extra_names = match opts.validate(queue) {
            Err(QueueError::InvalidExtraField { name, reason, .. }) => {
                Err(format!("extra field `{name}`: {reason}"))
            }
            _ => Ok(()),
        };
        let id = opts.id.unwrap_or_else(JobId::random);
        let invalid = |reason: &str| OutboxError::InvalidJob {
            queue: queue.to_string(),
            id: id.to_string(),
            reason: reason.to_string(),
        };
        id.validate().map_err(invalid)?;
        check_queue(queue).map_err(|reason| invalid(&reason))?;
        extra_names.map_err(|reason| invalid(&reason))?;
        let schema_version =
            i32::try_from(J::SCHEMA_VERSION).map_err(|_| invalid("schema version above 2^31-1"))?;
        let max_attempts = i32::try_from(opts.max_attempts.unwrap_or(J::MAX_ATTEMPTS).max(1))
            .map_err(|_| invalid("max_attempts above 2^31-1"))?;
        if opts.once_for.is_some() {
            return Err(invalid("`once_for` is not supported through the outbox"));
        }
        if opts.replicas.is_some() {
            return Err(invalid(
                "`wait_for_replicas` is a relay setting (Relay::wait_for_replicas), not a per-job one",
            ));
        }
        let delay_us = opts
            .delay
            .map(|d| i64::try_from(d.as_micros()).map_err(|_| invalid("delay too long")))
            .transpose()?;
        let run_at: Option<SystemTime> = opts.run_at;
        if let Some(at) = run_at.filter(|&at| !within_timestamptz(at)) {
            return Err(invalid(&format!(
                "run_at {at:?} is outside what PostgreSQL's timestamptz can hold \
                 (4714-11-24 BC to 294276-12-31 AD)"
            )));
        }
        let mut extra = opts.extra_fields;
        if !extra.iter().any(|(n, _)| n == "rate_key") {
            if let Some(key) = J::rate_key(args) {
                extra.push(("rate_key".to_string(), key));
            }
        }
        let payload = rmp_serde::to_vec_named(args).map_err(|source| OutboxError::Encode {
            queue: queue.to_string(),
            job_type: J::NAME.to_string(),
            job_id: id.clone(),
            source,
        })?;
        let limit = self.max_arg_len;
        let too_long = |what: &str, len: usize| {
            invalid(&format!(
                "its {what} is {len} bytes, more than the {limit} bytes Redis takes as one \
                 argument (Outbox::with_max_arg_len): the relay could never send it"
            ))
        };
        if payload.len() > limit {
            return Err(too_long("payload", payload.len()));
        }
        for (name, value) in &extra {
            if let Some(len) = [name.len(), value.len()].into_iter().find(|&l| l > limit) {
                return Err(too_long(&format!("extra field `{name:.64}`"), len));
            }
        }
        let extra: Option<Vec<String>> =
            (!extra.is_empty()).then(|| extra.into_iter().flat_map(|(n, v)| [n, v]).collect());
        let rows = tx
            .query(
                &self.table.insert_sql(),
                &[
                    &id.as_str(),
                    &queue,
                    &J::NAME,
                    &schema_version,
                    &max_attempts,
                    &payload,
                    &delay_us,
                    &run_at,
                    &extra,
                ],
            )
            .await
            .map_err(|e| OutboxError::pg_job(&self.table.name, "inserting a row", queue, &id, e))?;
        let outcome = if rows.is_empty() {
            OutboxOutcome::Duplicate
        } else {
            OutboxOutcome::Inserted
        };
        debug!(
            table = %self.table.name,
            queue,
            job_id = %id,
            job_type = J::NAME,
            ?outcome,
            "outbox row staged"
        );
        Ok(OutboxEnqueued {
            id,
            queue: queue.to_string(),
            outcome,
        })
    }

    /// Deletes published rows older than `published_before` (by `published_at`),
    /// in chunks of 10 000; returns how many were deleted.
    ///
    /// Keep published rows at least as long as the workers' completion
    /// retention (24 h by default): until then [`reconcile`](Self::reconcile)
    /// can still tell a completed job from a lost one, and a row still in the
    /// table keeps dedupe of its (queue, job id) in the outbox itself.
    pub async fn prune(
        &self,
        client: &impl GenericClient,
        published_before: Duration,
    ) -> Result<u64> {
        let now = pg_now(client, &self.table).await?;
        let cutoff = now
            .checked_sub(published_before)
            .unwrap_or(SystemTime::UNIX_EPOCH);
        let sql = self.table.prune_sql();
        let mut total = 0;
        loop {
            let n = client
                .execute(&sql, &[&cutoff, &10_000_i64])
                .await
                .map_err(|e| OutboxError::pg(&self.table.name, "pruning published rows", e))?;
            total += n;
            if n < 10_000 {
                break;
            }
        }
        debug!(table = %self.table.name, deleted = total, "outbox pruned");
        Ok(total)
    }

    /// Row counts and the age of the oldest unpublished row.
    pub async fn stats(&self, client: &impl GenericClient) -> Result<OutboxStats> {
        let row = client
            .query_one(&self.table.stats_sql(), &[])
            .await
            .map_err(|e| OutboxError::pg(&self.table.name, "counting rows", e))?;
        let count = |i: usize| -> Result<u64> {
            row.try_get::<_, i64>(i)
                .map(|n| n.max(0) as u64)
                .map_err(|e| OutboxError::pg(&self.table.name, "counting rows", e))
        };
        let oldest: Option<f64> = row
            .try_get(3)
            .map_err(|e| OutboxError::pg(&self.table.name, "counting rows", e))?;
        Ok(OutboxStats {
            unpublished: count(0)?,
            rejected: count(1)?,
            published: count(2)?,
            oldest_unpublished: oldest.and_then(|s| Duration::try_from_secs_f64(s.max(0.0)).ok()),
        })
    }
}

/// Whether `at` is within PostgreSQL's `timestamptz` range, which the
/// driver does not check: beyond it its count of microseconds overflows (a
/// panic in a debug build; in a release one `UNIX_EPOCH + i64::MAX` seconds,
/// a "never", wraps to 1969 and the job runs at once).
fn within_timestamptz(at: SystemTime) -> bool {
    // PostgreSQL's MIN_TIMESTAMP and END_TIMESTAMP (datatype/timestamp.h):
    // microseconds from its epoch, 2000-01-01, to 4714-11-24 BC and to
    // 294277-01-01 (excluded).
    const MIN_US: i128 = -211_813_488_000_000_000;
    const END_US: i128 = 9_223_371_331_200_000_000;
    const EPOCH_2000_UNIX_US: i128 = 946_684_800_000_000;
    let unix_us = match at.duration_since(SystemTime::UNIX_EPOCH) {
        Ok(after) => after.as_micros() as i128,
        Err(before) => -(before.duration().as_micros() as i128),
    };
    (MIN_US..END_US).contains(&(unix_us - EPOCH_2000_UNIX_US))
}

/// PostgreSQL's `now()`: every age in this crate is measured on the database clock.
pub(crate) async fn pg_now(client: &impl GenericClient, table: &TableName) -> Result<SystemTime> {
    let row = client
        .query_one("SELECT now()", &[])
        .await
        .map_err(|e| OutboxError::pg(&table.name, "reading the clock", e))?;
    row.try_get(0)
        .map_err(|e| OutboxError::pg(&table.name, "reading the clock", e))
}
