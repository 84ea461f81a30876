//! The `limited` test job of `tests/limits.rs` (docs/LIMITS.md): its rate key
//! is the args' `tenant` (`#[job(rate_key = tenant)]`). Each start appends
//! `<tenant> <Redis time ms> <attempt> <claim time ms>` to
//! `ledger:limited:starts`.

use std::time::Duration;

use queue_core::{job, JobContext, JobError};
use redis::AsyncCommands;
use serde::{Deserialize, Serialize};

/// The payload of the `limited` job.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct Limited {
    /// Redis URL of the ledger.
    pub ledger: String,
    /// The rate key.
    pub tenant: String,
    /// Sleep this long after the start is recorded.
    pub sleep_ms: u64,
}

/// One recorded start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Start {
    /// The job's tenant (rate key).
    pub tenant: String,
    /// Redis time of the start (ms).
    pub at_ms: i64,
    /// The attempt it started as.
    pub attempt: u32,
    /// Redis time of the claim that started this delivery (ms): the score
    /// the limiter logged it with in `<limits>:started` (the claim writes
    /// both in one script, with one `TIME`), so windows counted over it are
    /// the limiter's own, without the skew of the handler's start.
    pub claimed_ms: i64,
}

/// Records its start (Redis clock), then sleeps `sleep_ms`.
#[job(queue = "limited", max_attempts = 3, rate_key = tenant)]
pub async fn limited(ctx: JobContext, t: Limited) -> Result<(), JobError> {
    let mut c = crate::ledger_conn(&t.ledger).await?;
    let _: () = redis::Script::new(
        "local t = redis.call('TIME') \
         redis.call('RPUSH', KEYS[1], ARGV[1] .. ' ' .. (t[1] * 1000 + math.floor(t[2] / 1000)) .. ' ' .. ARGV[2] .. ' ' .. ARGV[3])",
    )
    .key("ledger:limited:starts")
    .arg(&t.tenant)
    .arg(ctx.attempt())
    .arg(ctx.delivered_at_ms())
    .invoke_async(&mut c)
    .await?;
    if t.sleep_ms > 0 {
        tokio::time::sleep(Duration::from_millis(t.sleep_ms)).await;
    }
    Ok(())
}

/// The starts recorded so far, in order.
pub async fn starts(ledger_url: &str) -> Vec<Start> {
    let mut c = crate::ledger_conn(ledger_url).await.expect("ledger");
    let rows: Vec<String> = c
        .lrange("ledger:limited:starts", 0, -1)
        .await
        .expect("starts");
    rows.iter()
        .filter_map(|r| {
            let mut it = r.split(' ');
            Some(Start {
                tenant: it.next()?.to_string(),
                at_ms: it.next()?.parse().ok()?,
                attempt: it.next()?.parse().ok()?,
                claimed_ms: it.next()?.parse().ok()?,
            })
        })
        .collect()
}

/// The payload of the periodic `tenant_sweep` job: its default tenant is the
/// rate key of every firing.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Sweep {
    /// The rate key.
    pub tenant: String,
}

impl Default for Sweep {
    fn default() -> Self {
        Sweep {
            tenant: "nightly".to_string(),
        }
    }
}

/// A periodic job (every second) whose rate key is its args' `tenant`.
#[job(queue = "limited-cron", cron = "*/1 * * * * *", rate_key = tenant)]
pub async fn tenant_sweep(_ctx: JobContext, _s: Sweep) -> Result<(), JobError> {
    Ok(())
}
