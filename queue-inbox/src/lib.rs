//! # queue-inbox
//!
//! A transactional inbox on PostgreSQL for `queue-core`: the consumer-side
//! twin of `queue-outbox`. A handler records "this job's effect is done" in
//! an inbox table **in the same transaction as the effect**, so the two
//! commit together or not at all, and a redelivered job (worker killed after
//! the commit and before the Redis ack, lease expired, duplicate enqueue after
//! the Redis completion record expired) finds the row done and is acked
//! without repeating the change.
//!
//! ```text
//! handler:  BEGIN
//!           already_done()  INSERT inbox row 'running' (or lock the existing one)
//!                           -> done? return Ok(()): acked, nothing repeated
//!           business change
//!           complete(ref)   UPDATE inbox row 'done'
//!           COMMIT          the change and "done", or neither
//! ```
//!
//! - **Concurrent deliveries** of the same key: the row (or its uncommitted
//!   insert) is locked by the first transaction; the second waits in
//!   `already_done()` and then sees `done` (commit) or claims it (rollback);
//!   at most [`Inbox::with_lock_timeout`] (30 s by default), then
//!   [`InboxError::LockTimeout`] (retryable).
//! - **Fenced**: the row carries the delivery's fencing token
//!   ([`JobContext::fencing_token`](queue_core::JobContext::fencing_token));
//!   a stale delivery finding a row written by a newer delivery of the same
//!   job is refused with [`InboxError::Fenced`] (permanent).
//! - **Business keys**: `ctx.inbox(&tx).key("cust-7:2026-11")` makes every job
//!   with that key on the queue done once, not just every delivery of one job.
//!   A key belongs to the job type that claimed it: another type finding it
//!   is refused with [`InboxError::KeyCollision`] unless
//!   [`InboxTx::share_key_across_types`] says the sharing is meant.
//! - **Operations**: [`Inbox::prune`], [`Inbox::stats`], [`Inbox::reconcile`]
//!   (outbox rows of the same database whose effect never committed), also as
//!   `queue-watchdog inbox migrate | prune | stats | reconcile`.
//!
//! The guarantee is about effects **in this database**: an external API call
//! made by the handler is outside the transaction and still needs
//! `ctx.idempotency_key()` (see `docs/IDEMPOTENCY.md`).
//!
//! A runnable example (needs PostgreSQL, `DATABASE_URL`, default
//! `postgres://postgres@127.0.0.1:5432/test`; the hidden lines give it a
//! throwaway schema with the `ledger` and `queue_inbox` tables):
//!
//! ```
//! use queue_core::{job, JobContext, JobError};
//! use queue_inbox::{InboxError, InboxExt};
//! use serde::{Deserialize, Serialize};
//!
//! #[derive(Serialize, Deserialize)]
//! pub struct Charge { pub invoice: i64, pub cents: i64 }
//!
//! #[job(queue = "billing")]
//! async fn book_charge(ctx: JobContext, c: Charge) -> Result<(), JobError> {
//!     let mut db = connect().await?;
//!     let tx = db.transaction().await.map_err(JobError::retryable)?;
//!     if ctx.inbox(&tx).already_done().await.map_err(InboxError::into_job_error)? {
//!         return Ok(()); // committed by an earlier delivery: ack, change nothing
//!     }
//!     let row = tx
//!         .query_one("INSERT INTO ledger (invoice, cents) VALUES ($1, $2) RETURNING id",
//!                    &[&c.invoice, &c.cents])
//!         .await
//!         .map_err(JobError::retryable)?;
//!     let entry: i64 = row.get(0);
//!     // Not a bare `?`: that would make every InboxError retryable.
//!     ctx.inbox(&tx)
//!         .complete(format!("ledger-{entry}"))
//!         .await
//!         .map_err(InboxError::into_job_error)?;
//!     tx.commit().await.map_err(JobError::retryable)?; // the entry and "done", or neither
//!     Ok(())
//! }
//! # static DB: std::sync::OnceLock<String> = std::sync::OnceLock::new();
//! # async fn connect() -> Result<tokio_postgres::Client, JobError> {
//! #     let (client, conn) = tokio_postgres::connect(DB.get().unwrap(), tokio_postgres::NoTls)
//! #         .await
//! #         .map_err(JobError::retryable)?;
//! #     tokio::spawn(conn);
//! #     Ok(client)
//! # }
//!
//! # #[tokio::main] async fn main() -> Result<(), JobError> {
//! # // Skipped without PostgreSQL, like the test suite (QUEUE_TEST_SKIP_POSTGRES).
//! # let Some(pg) = queue_testkit::postgres::require() else { return Ok(()) };
//! # let schema = queue_testkit::postgres::TempSchema::create(&pg)?;
//! # DB.set(schema.url().to_string()).unwrap();
//! # let db = connect().await?;
//! # db.batch_execute("CREATE TABLE ledger (id bigserial PRIMARY KEY, invoice bigint, cents bigint)").await?;
//! queue_inbox::Inbox::new().migrate(&db).await?; // once, at deploy time
//!
//! // Two deliveries of one job (the worker was killed after the commit, before
//! // the Redis ack): the second finds the inbox row done and books nothing.
//! let charge = || Charge { invoice: 7, cents: 1250 };
//! book_charge(JobContext::for_test("invoice-7", "billing", 1), charge()).await?;
//! book_charge(JobContext::for_test("invoice-7", "billing", 2), charge()).await?;
//! let entries: i64 = db.query_one("SELECT count(*) FROM ledger", &[]).await?.get(0);
//! assert_eq!(entries, 1);
//! # Ok(()) }
//! ```
//!
//! ## The table
//!
//! [`Inbox::migrate`] creates it (default name `queue_inbox`; safe to run from
//! several processes at once):
//!
//! | column | type | |
//! |---|---|---|
//! | `queue`, `key` | text, primary key | the job id, or the business key the handler named |
//! | `job_id` | text | the job that claimed (and completed) the row |
//! | `status` | text | `running` or `done` |
//! | `fence` | bigint | that delivery's fencing token |
//! | `attempts` | int | that delivery's attempt number |
//! | `worker` | text | `hostname:pid` |
//! | `result_ref` | text | from [`InboxTx::complete`] |
//! | `started_at`, `finished_at` | timestamptz | PostgreSQL clock |
//! | `job_type` | text | the type of that job (NULL in rows written before the column was added) |
//!
//! plus indexes on `(queue, job_id)` and on `finished_at` of done rows.
//! Done rows stay until [`Inbox::prune`].
//!
//! Use the default READ COMMITTED isolation for the handler's transaction: under
//! REPEATABLE READ or SERIALIZABLE a delivery that waited for a concurrent one
//! gets a serialization error (retryable) instead of seeing `done`.

#![warn(missing_docs)]

mod delivery;
mod error;
mod inbox;
mod maintenance;
mod metrics;
mod reconcile;
mod table;

pub use delivery::{worker_identity, InboxExt, InboxTx};
pub use error::{InboxError, Result};
pub use inbox::{Inbox, InboxRecord, InboxStatus, DEFAULT_LOCK_TIMEOUT, DEFAULT_TABLE};
pub use maintenance::InboxQueueStats;
pub use reconcile::{InboxReconcileOptions, InboxReconcileRow};

/// The PostgreSQL driver this crate uses, re-exported so your version matches.
pub use tokio_postgres;
