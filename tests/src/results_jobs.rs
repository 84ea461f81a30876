//! Job types of the results, progress and deadline tests
//! (`tests/tests/results.rs`, docs/RESULTS.md), also run by `test-worker`.

use std::time::Duration;

use queue_core::{job, JobContext, JobError, Registration};

/// The environment variable that makes `test-worker` also run these jobs
/// (`TEST_WORKER_RESULTS=1`); other tests' workers serve only their queues.
pub const ENV: &str = "TEST_WORKER_RESULTS";

/// These jobs' registrations when `TEST_WORKER_RESULTS` is set, else none.
pub fn if_asked() -> Vec<Registration> {
    if std::env::var_os(ENV).is_none() {
        return Vec::new();
    }
    vec![square::handler(), budgeted::handler()]
}
use serde::{Deserialize, Serialize};

/// Payload of [`square`].
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct Square {
    /// The number to square.
    pub n: u64,
    /// Report progress 50 ("half way"), then sleep this long before returning.
    pub sleep_ms: u64,
    /// Fail permanently instead of returning.
    pub fail: bool,
}

/// The value [`square`] returns.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Squared {
    /// The input.
    pub n: u64,
    /// `n * n`.
    pub square: u64,
    /// Process id of the worker that ran it.
    pub pid: u32,
}

/// Returns a typed value; reports progress first when it sleeps.
#[job(queue = "results", max_attempts = 2)]
pub async fn square(ctx: JobContext, args: Square) -> Result<Squared, JobError> {
    if args.fail {
        return Err(JobError::permanent("planned failure"));
    }
    if args.sleep_ms > 0 {
        ctx.progress(50, "half way").await?;
        tokio::time::sleep(Duration::from_millis(args.sleep_ms)).await;
    }
    Ok(Squared {
        n: args.n,
        square: args.n * args.n,
        pid: std::process::id(),
    })
}

/// Payload of [`budgeted`].
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct Budgeted {
    /// Sleep this long on every attempt.
    pub sleep_ms: u64,
    /// Fail (retryable) on attempts `1..=fail_first`.
    pub fail_first: u32,
}

/// A job with an execution deadline of 1 s across its attempts.
#[job(queue = "budget", max_attempts = 5, deadline = "1s")]
pub async fn budgeted(ctx: JobContext, args: Budgeted) -> Result<(), JobError> {
    tokio::time::sleep(Duration::from_millis(args.sleep_ms)).await;
    if ctx.attempt() <= args.fail_first {
        return Err(JobError::retryable("planned failure"));
    }
    Ok(())
}
