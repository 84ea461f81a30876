//! The inbox workload's job and its worker-process mode (`chaos inbox-worker`).
//!
//! The handler books one row per job in a PostgreSQL effect table, through
//! the transactional inbox (`queue-inbox`), or, with `--no-inbox` (the
//! control), without it. It may abort its own process at a crash point:
//! `before_tx`, `in_tx` (effect inserted, not committed) or `after_commit`
//! (committed, not acked); each abort is first counted in Redis under
//! [`CRASH_PREFIX`]`<point>`. The `before_ack` failpoint of `queue-core`
//! (armed through `QUEUE_FAILPOINT`) adds crashes after the handler returned.

use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use queue_core::{job, JobContext, JobError, Worker};
use queue_inbox::tokio_postgres::{self, Client, NoTls};
use queue_inbox::{Inbox, InboxError};
use redis::aio::ConnectionManager;
use redis::AsyncCommands;
use serde::{Deserialize, Serialize};

use crate::args::Args;
use crate::rng::Rng;

/// The queue of the workload.
pub const QUEUE: &str = "chaos_inbox";
/// Redis counter prefix of the handler's self-crashes, per point.
pub const CRASH_PREFIX: &str = "chaos:inbox:crash:";
/// Redis counter of redeliveries the inbox acked as already done.
pub const ALREADY_DONE: &str = "chaos:inbox:already_done";
/// The handler's crash points, in the order a delivery reaches them.
pub const CRASH_POINTS: [&str; 3] = ["before_tx", "in_tx", "after_commit"];

/// The payload.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Booking {
    /// Sequence number (also in the id).
    pub seq: u64,
    /// Simulated work inside the transaction, so kills land in it.
    pub work_ms: u32,
}

/// What a worker process was started with.
struct Setup {
    inbox: Option<Inbox>,
    effects_sql: String,
    crash_rate: f64,
    ledger: ConnectionManager,
    rng: Mutex<Rng>,
    pool: Pool,
}

static SETUP: OnceLock<Setup> = OnceLock::new();

/// Idle PostgreSQL connections of this process (a transaction needs a
/// connection of its own).
struct Pool {
    url: String,
    idle: Mutex<Vec<Client>>,
}

impl Pool {
    async fn get(&self) -> Result<Client, JobError> {
        while let Some(c) = self.idle.lock().map_err(JobError::retryable)?.pop() {
            if !c.is_closed() {
                return Ok(c);
            }
        }
        let (client, conn) = tokio_postgres::connect(&self.url, NoTls)
            .await
            .map_err(JobError::retryable)?;
        tokio::spawn(conn);
        Ok(client)
    }

    fn put(&self, c: Client) {
        if let Ok(mut idle) = self.idle.lock() {
            idle.push(c);
        }
    }
}

/// Aborts the process at `point` with the configured probability, after
/// counting the crash.
async fn maybe_crash(s: &Setup, point: &str) {
    let hit = s
        .rng
        .lock()
        .map(|mut r| r.chance(s.crash_rate))
        .unwrap_or(false);
    if hit {
        let _: Result<i64, _> = s
            .ledger
            .clone()
            .incr(format!("{CRASH_PREFIX}{point}"), 1)
            .await;
        eprintln!("inbox workload: crash point `{point}`: aborting the process");
        std::process::abort();
    }
}

/// Books the job's effect in PostgreSQL (through the inbox unless this is the control).
#[job(
    queue = "chaos_inbox",
    name = "booking",
    max_attempts = 100,
    timeout = "30s"
)]
pub async fn booking(ctx: JobContext, b: Booking) -> Result<(), JobError> {
    let s = SETUP
        .get()
        .ok_or_else(|| JobError::permanent("worker not set up"))?;
    maybe_crash(s, "before_tx").await;
    let mut client = s.pool.get().await?;
    let tx = client.transaction().await.map_err(JobError::retryable)?;
    if let Some(inbox) = &s.inbox {
        let done = inbox
            .delivery(&ctx, &tx)
            .already_done()
            .await
            .map_err(InboxError::into_job_error)?;
        if done {
            let _: i64 = s.ledger.clone().incr(ALREADY_DONE, 1).await?;
            drop(tx);
            s.pool.put(client);
            return Ok(());
        }
    }
    let row = tx
        .query_one(&s.effects_sql, &[&ctx.job_id().as_str(), &(b.seq as i64)])
        .await
        .map_err(JobError::retryable)?;
    let entry: i64 = row.get(0);
    tokio::time::sleep(Duration::from_millis(u64::from(b.work_ms))).await;
    maybe_crash(s, "in_tx").await;
    if let Some(inbox) = &s.inbox {
        inbox
            .delivery(&ctx, &tx)
            .complete(format!("fx-{entry}"))
            .await
            .map_err(InboxError::into_job_error)?;
    }
    tx.commit().await.map_err(JobError::retryable)?;
    s.pool.put(client);
    maybe_crash(s, "after_commit").await;
    Ok(())
}

/// `chaos inbox-worker --redis-url U --database-url D --effects-table T
/// [--inbox-table I | --no-inbox] [--crash-rate F] [--concurrency N] [--lease-ms M]`.
pub async fn worker_main(argv: &[String]) -> i32 {
    let args = match Args::parse(
        argv,
        &["no-inbox"],
        &[
            "redis-url",
            "database-url",
            "effects-table",
            "inbox-table",
            "crash-rate",
            "concurrency",
            "lease-ms",
        ],
    ) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("chaos inbox-worker: {e}");
            return 2;
        }
    };
    let (Some(url), Some(db), Some(fx)) = (
        args.string("redis-url"),
        args.string("database-url"),
        args.string("effects-table"),
    ) else {
        eprintln!(
            "chaos inbox-worker: --redis-url, --database-url and --effects-table are required"
        );
        return 2;
    };
    let inbox = match (args.switch("no-inbox"), args.string("inbox-table")) {
        (true, _) => None,
        (false, Some(t)) => match Inbox::with_table(&t) {
            Ok(i) => Some(i),
            Err(e) => {
                eprintln!("chaos inbox-worker: {e}");
                return 2;
            }
        },
        (false, None) => {
            eprintln!("chaos inbox-worker: --inbox-table or --no-inbox is required");
            return 2;
        }
    };
    let ledger = match redis::Client::open(url.as_str()) {
        Ok(c) => c.get_connection_manager().await,
        Err(e) => Err(e),
    };
    let ledger = match ledger {
        Ok(l) => l,
        Err(e) => {
            eprintln!("chaos inbox-worker: cannot connect to redis: {e}");
            return 3;
        }
    };
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(1)
        ^ u64::from(std::process::id());
    let _ = SETUP.set(Setup {
        inbox,
        effects_sql: format!("INSERT INTO \"{fx}\" (job_id, seq) VALUES ($1, $2) RETURNING id"),
        crash_rate: args.get("crash-rate", 0.0).unwrap_or(0.0),
        ledger,
        rng: Mutex::new(Rng::new(seed)),
        pool: Pool {
            url: db,
            idle: Mutex::new(Vec::new()),
        },
    });
    let concurrency: usize = args.get("concurrency", 8).unwrap_or(8);
    let lease = Duration::from_millis(args.get("lease-ms", 2000).unwrap_or(2000));
    let worker = Worker::builder(&url)
        .register(booking::handler())
        .config(crate::job::worker_config(concurrency, lease))
        .build()
        .await;
    match worker {
        Ok(w) => match w.run().await {
            Ok(()) => 0,
            Err(e) => {
                eprintln!("chaos inbox-worker: {e}");
                4
            }
        },
        Err(e) => {
            eprintln!("chaos inbox-worker: {e}");
            3
        }
    }
}
