//! # queue-outbox
//!
//! A transactional outbox on PostgreSQL for `queue-core`: a job is written to
//! an outbox table **in the same transaction as your business data**, so it
//! exists if and only if that transaction commits. A [`Relay`] then publishes
//! committed rows to Redis and marks them published.
//!
//! ```text
//! your transaction:  UPDATE orders ...; INSERT INTO queue_outbox ...; COMMIT
//! relay batch:       SELECT unpublished FOR UPDATE SKIP LOCKED
//!                    -> enqueue each to Redis under its stable job id
//!                    -> UPDATE published_at = now(); COMMIT
//! ```
//!
//! - **Crash-safe relay.** A relay that dies before its commit leaves its rows
//!   unpublished; the next batch sends them again, and because every row
//!   carries its job id, Redis answers `Duplicate` (or `AlreadyCompleted`)
//!   and writes nothing. A row is published *at least once* and becomes
//!   *exactly one job* in Redis — as long as the re-send happens while Redis
//!   still knows the job (it exists, or completed within the workers'
//!   completion retention, 24 h by default).
//! - **Several relays** can run at once: `SKIP LOCKED` gives each row to one.
//! - **Reconciliation** ([`Outbox::reconcile`]) lists rows whose job has not
//!   completed after a given age, with where the job is.
//!
//! A runnable example (needs PostgreSQL, `DATABASE_URL`, default
//! `postgres://postgres@127.0.0.1:5432/test`; the hidden lines give it a
//! throwaway schema and redis-server):
//!
//! ```
//! use std::time::Duration;
//! use queue_core::{job, JobContext, JobError, Queue, Worker};
//! use queue_outbox::{Outbox, Relay};
//! use serde::{Deserialize, Serialize};
//!
//! #[derive(Serialize, Deserialize)]
//! pub struct Invoice { pub order: i64 }
//!
//! #[job(queue = "billing", max_attempts = 10)]
//! async fn send_invoice(_ctx: JobContext, args: Invoice) -> Result<(), JobError> { Ok(()) }
//!
//! # #[tokio::main] async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # // Skipped without PostgreSQL, like the test suite (QUEUE_TEST_SKIP_POSTGRES).
//! # let Some(pg) = queue_testkit::postgres::require() else { return Ok(()) };
//! # let schema = queue_testkit::postgres::TempSchema::create(&pg)?;
//! # let redis = queue_testkit::RedisServer::start()?;
//! # let (db, redis_url) = (schema.url(), redis.url());
//! // e.g. db = "postgres://app@127.0.0.1/app", redis_url = "redis://127.0.0.1:6379/"
//! let outbox = Outbox::new();
//! let mut client = queue_outbox::connect_postgres(db).await?;
//! outbox.migrate(&client).await?;
//! # client.batch_execute("CREATE TABLE orders (id bigint PRIMARY KEY, state text);
//! #                       INSERT INTO orders VALUES (7, 'new')").await?;
//!
//! // In the request handler: business write and job, one transaction.
//! let tx = client.transaction().await?;
//! tx.execute("UPDATE orders SET state = 'paid' WHERE id = $1", &[&7_i64]).await?;
//! let staged = outbox
//!     .enqueue_in_tx::<send_invoice::Job>(&tx, &Invoice { order: 7 }, Some("invoice-7".into()))
//!     .await?;
//! tx.commit().await?;
//!
//! // In a background task (or `queue-watchdog outbox relay`):
//! let queue = Queue::connect(&redis_url).await?;
//! let mut relay = Relay::connect(outbox.clone(), db, queue.clone()).await?;
//! // One batch here; `relay.run_until(stop, Duration::from_millis(500))` loops until `stop`.
//! let report = relay.publish_batch(100).await?;
//! assert_eq!(report.published, 1);
//!
//! // Workers run the published job like any other.
//! let worker = Worker::builder(&redis_url).register(send_invoice::handler()).build().await?;
//! let stop_worker = worker.shutdown_handle();
//! let working = tokio::spawn(worker.run());
//! queue.wait_completion("billing", &staged.id, Duration::from_secs(10)).await?;
//!
//! // From an operator's cron: what has not completed after an hour?
//! for row in outbox.reconcile(&client, &queue, Duration::from_secs(3600)).await? {
//!     eprintln!("{} {} {}", row.queue, row.job_id, row.status);
//! }
//! # stop_worker.shutdown();
//! # working.await??;
//! # Ok(()) }
//! ```
//!
//! ## The table
//!
//! [`Outbox::migrate`] creates it (default name `queue_outbox`):
//!
//! | column | type | |
//! |---|---|---|
//! | `id` | bigserial primary key | insertion order; the relay publishes oldest first (a row waiting for its `next_attempt_at` is passed by the rows behind it) |
//! | `job_id`, `queue` | text, `UNIQUE (queue, job_id)` | the job's identity in Redis |
//! | `job_type`, `schema_version`, `max_attempts`, `payload` | text, int, int, bytea | what the relay enqueues (MessagePack payload) |
//! | `created_at` | timestamptz default now() | |
//! | `published_at` | timestamptz | set by the relay's commit |
//! | `rejected_at` | timestamptz | set when a row can never be published (e.g. a hand-written invalid job id, a payload longer than the relay's `Queue::with_max_arg_len`) |
//! | `attempts`, `last_error` | int, text | committed publish attempts and the last Redis error (kept after success) |
//! | `run_at` | timestamptz | from [`EnqueueOptions::delay`](queue_core::EnqueueOptions::delay) (counted from the insert: `clock_timestamp()`) or `run_at` |
//! | `extra` | text[] (name, value, …) | the job's extra fields: rate key, group, start deadline ([`OutboxRow::extra_fields`]); added to an older table by [`Outbox::migrate`] |
//! | `next_attempt_at` | timestamptz | after Redis refused the row on its own: not sent again before this (1 s doubling to 10 min by `attempts`; NULL: at once); added to an older table by [`Outbox::migrate`] |
//!
//! plus a partial index on unpublished rows and an index on `created_at`.
//! Published rows stay until [`Outbox::prune`].

#![warn(missing_docs)]

mod error;
mod outbox;
mod reconcile;
mod relay;
mod table;

pub use error::{OutboxError, Result};
pub use outbox::{Outbox, OutboxEnqueued, OutboxOutcome, OutboxRow, OutboxStats, DEFAULT_TABLE};
pub use reconcile::{ReconcileOptions, ReconcileRow, ReconcileStatus};
pub use relay::{Relay, RelayReport, RelayStep, RelaySummary, DEFAULT_BATCH_SIZE};
pub use table::{TableName, MAX_IDENT_LEN, MIGRATE_LOCK_TIMEOUT};

/// The PostgreSQL driver this crate uses, re-exported so your version matches.
pub use tokio_postgres;

/// Connects to PostgreSQL without TLS and drives the connection on a spawned
/// tokio task (a connection error is logged there and makes the client
/// report [`is_closed`](tokio_postgres::Client::is_closed)).
///
/// For TLS, connect with `tokio_postgres::connect(url, your_tls_connector)`
/// yourself and hand the client to [`Relay::new`].
///
/// ```
/// # #[tokio::main] async fn main() -> Result<(), queue_outbox::OutboxError> {
/// # let Some(url) = queue_testkit::postgres::require() else { return Ok(()) };
/// // e.g. url = "postgres://postgres@127.0.0.1:5432/test"
/// let client = queue_outbox::connect_postgres(&url).await?;
/// assert!(!client.is_closed());
/// # Ok(()) }
/// ```
pub async fn connect_postgres(database_url: &str) -> Result<tokio_postgres::Client> {
    let (client, connection) = tokio_postgres::connect(database_url, tokio_postgres::NoTls)
        .await
        .map_err(|source| OutboxError::Connect { source })?;
    tokio::spawn(async move {
        if let Err(e) = connection.await {
            tracing::warn!(error = %e, "postgres connection closed with an error");
        }
    });
    Ok(client)
}
