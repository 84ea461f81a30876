//! The chaos job and the worker-process mode.
//!
//! The handler's side effect goes through a fake external API (a Lua script
//! on the ledger server) that deduplicates by idempotency key, the way payment
//! providers do. The handler calls it inside `ctx.step("effect", ..)` with
//! `ctx.step_key("effect")`, which is the framework's idempotency support.
//! The ledger records:
//!
//! - `chaos:ledger:runs` — job id → handler executions (raw, at-least-once);
//! - `chaos:ledger:calls` — job id → calls of the external API (raw);
//! - `chaos:ledger:effects` — job id → side effects the API actually made
//!   (logical; more than one for a job is a duplicate side effect);
//! - `chaos:ledger:charge:<key>` — the effect made for an idempotency key.

use std::sync::{LazyLock, OnceLock};
use std::time::Duration;

use queue_core::{job, Backoff, JobContext, JobError, Worker, WorkerConfig};
use redis::aio::ConnectionManager;
use redis::AsyncCommands;
use serde::{Deserialize, Serialize};

use crate::args::Args;

/// The queue the harness uses.
pub const QUEUE: &str = "chaos";
/// The job type name.
pub const JOB_TYPE: &str = "chaos_job";
/// Attempts per job.
pub const MAX_ATTEMPTS: u32 = 10;
pub const LEDGER_RUNS: &str = "chaos:ledger:runs";
pub const LEDGER_CALLS: &str = "chaos:ledger:calls";
pub const LEDGER_EFFECTS: &str = "chaos:ledger:effects";
pub const LEDGER_CHARGE_PREFIX: &str = "chaos:ledger:charge:";

/// The payload.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Work {
    /// Sequence number (also in the id).
    pub seq: u64,
    /// Simulated work, split around the side effect, so kills land mid-job.
    pub work_ms: u32,
    /// Fail (retryable) on the first attempt, after the side effect.
    pub fail_once: bool,
}

static LEDGER: OnceLock<ConnectionManager> = OnceLock::new();

/// The fake external API: counts every call, makes the effect once per key.
static EXTERNAL_API: LazyLock<redis::Script> = LazyLock::new(|| {
    redis::Script::new(
        r"
-- KEYS: 1 calls, 2 effects, 3 charge key   ARGV: 1 job id, 2 new charge id
redis.call('HINCRBY', KEYS[1], ARGV[1], 1)
if redis.call('SET', KEYS[3], ARGV[2], 'NX') then
  redis.call('HINCRBY', KEYS[2], ARGV[1], 1)
  return ARGV[2]
end
return redis.call('GET', KEYS[3])
",
    )
});

/// Calls the fake external API with an idempotency key; returns the effect's id.
pub async fn external_effect(
    ledger: &mut ConnectionManager,
    job_id: &str,
    idempotency_key: &str,
) -> Result<String, JobError> {
    let charge_id = format!("fx_{}", uuid::Uuid::new_v4().simple());
    let id: String = EXTERNAL_API
        .key(LEDGER_CALLS)
        .key(LEDGER_EFFECTS)
        .key(format!("{LEDGER_CHARGE_PREFIX}{idempotency_key}"))
        .arg(job_id)
        .arg(charge_id)
        .invoke_async(ledger)
        .await?;
    Ok(id)
}

/// The idempotency key the handler uses for job `id` (what `ctx.step_key("effect")` returns).
pub fn effect_key(id: &str) -> String {
    format!("{QUEUE}:{id}:effect")
}

/// The chaos handler.
#[job(
    queue = "chaos",
    name = "chaos_job",
    max_attempts = 10,
    timeout = "60s"
)]
pub async fn chaos_job(ctx: JobContext, w: Work) -> Result<(), JobError> {
    let ledger = LEDGER
        .get()
        .ok_or_else(|| JobError::permanent("no ledger connection"))?
        .clone();
    let id = ctx.job_id().to_string();
    let _: i64 = ledger.clone().hincr(LEDGER_RUNS, &id, 1).await?;
    let half = Duration::from_millis(u64::from(w.work_ms) / 2);
    tokio::time::sleep(half).await;
    let key = ctx.step_key("effect");
    let effect = ctx
        .step("effect", || {
            let (mut ledger, id, key) = (ledger.clone(), id.clone(), key.clone());
            async move { external_effect(&mut ledger, &id, &key).await }
        })
        .await?;
    tokio::time::sleep(half).await;
    if w.fail_once && ctx.attempt() == 1 {
        return Err(JobError::retryable("planned failure on the first attempt"));
    }
    ctx.set_result_ref(effect);
    Ok(())
}

/// Worker settings of the harness (`lease` from `--lease-ms`).
/// `CHAOS_ACK_WINDOW_MS` (inherited from the orchestrator) overrides the
/// workers' `ack_window`, to measure its effect on re-runs per crash;
/// `CHAOS_COMPACT_RECORDS=0` turns `compact_records` off (hash records;
/// on by default, as in the library).
pub fn worker_config(concurrency: usize, lease: Duration) -> WorkerConfig {
    let defaults = WorkerConfig::default();
    let compact_records =
        std::env::var("CHAOS_COMPACT_RECORDS").map_or(defaults.compact_records, |v| v != "0");
    let ack_window = std::env::var("CHAOS_ACK_WINDOW_MS")
        .ok()
        .and_then(|ms| ms.parse().ok())
        .map_or(defaults.ack_window, Duration::from_millis);
    WorkerConfig {
        concurrency,
        lease,
        block_timeout: Duration::from_millis(200),
        promote_interval: Duration::from_millis(50),
        grace: Duration::from_secs(5),
        backoff: Backoff {
            base: Duration::from_millis(50),
            max: Duration::from_millis(500),
        },
        ack_window,
        compact_records,
        // Future-version poison jobs: given back (no attempt) for half a
        // second, then dead-lettered, since no chaos worker announces them.
        newer_version_wait: Duration::from_millis(500),
        newer_version_delay: Duration::from_millis(100),
        ..defaults
    }
}

/// `chaos worker --redis-url U --ledger-url L [--concurrency N] [--lease-ms M]`:
/// runs the chaos job until SIGTERM. `QUEUE_FAILPOINT` arms crash points.
pub async fn worker_main(argv: &[String]) -> i32 {
    let args = match Args::parse(
        argv,
        &[],
        &["redis-url", "ledger-url", "concurrency", "lease-ms"],
    ) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("chaos worker: {e}");
            return 2;
        }
    };
    let (Some(url), Some(ledger_url)) = (args.string("redis-url"), args.string("ledger-url"))
    else {
        eprintln!("chaos worker: --redis-url and --ledger-url are required");
        return 2;
    };
    let concurrency: usize = args.get("concurrency", 8).unwrap_or(8);
    let lease_ms: u64 = args.get("lease-ms", 2000).unwrap_or(2000);
    let ledger = match redis::Client::open(ledger_url.as_str()) {
        Ok(c) => c.get_connection_manager().await,
        Err(e) => Err(e),
    };
    match ledger {
        Ok(c) => {
            let _ = LEDGER.set(c);
        }
        Err(e) => {
            eprintln!("chaos worker: cannot connect to the ledger: {e}");
            return 3;
        }
    }
    let worker = Worker::builder(&url)
        .register(chaos_job::handler())
        .config(worker_config(concurrency, Duration::from_millis(lease_ms)))
        .build()
        .await;
    let worker = match worker {
        Ok(w) => w,
        Err(e) => {
            eprintln!("chaos worker: {e}");
            return 3;
        }
    };
    match worker.run().await {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("chaos worker: {e}");
            4
        }
    }
}
