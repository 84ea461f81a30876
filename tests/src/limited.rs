//! The `limited` test job of `tests/limits.rs` (docs/LIMITS.md): its rate key
//! is the args' `tenant` (`#[job(rate_key = tenant)]`). Each start appends
//! `<tenant> <Redis time ms> <attempt> <claim time ms>` to
//! `ledger:limited:starts`.
//!
//! And the `keyed` job, which `test-worker` processes also run (with
//! `TEST_WORKER_LIMITED=1`): its rate key is the args' `key`; each delivery
//! logs its start and its end with the worker's process id ([`runs`]).

use std::collections::BTreeMap;
use std::time::Duration;

use queue_core::{job, JobContext, JobError, Registration};
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

/// The environment variable that makes `test-worker` also run [`keyed`]
/// (`TEST_WORKER_LIMITED=1`); other tests' workers serve only their queues.
pub const ENV: &str = "TEST_WORKER_LIMITED";

/// [`keyed`]'s registration when `TEST_WORKER_LIMITED` is set, else none.
pub fn if_asked() -> Vec<Registration> {
    if std::env::var_os(ENV).is_none() {
        return Vec::new();
    }
    vec![keyed::handler()]
}

/// The payload of the `keyed` job.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct Keyed {
    /// Redis URL of the ledger.
    pub ledger: String,
    /// The rate key.
    pub key: String,
    /// Sleep this long between the start and the end it records.
    pub sleep_ms: u64,
}

/// Appends `<event> <id> <key> <pid> <attempt> <claim ms> <Redis time ms>`
/// to `ledger:keyed:runs` (one `TIME`, in the script that appends).
async fn log_run(ctx: &JobContext, k: &Keyed, event: &str) -> Result<(), JobError> {
    let mut c = crate::ledger_conn(&k.ledger).await?;
    let _: () = redis::Script::new(
        "local t = redis.call('TIME') \
         redis.call('RPUSH', KEYS[1], ARGV[1] .. ' ' .. (t[1] * 1000 + math.floor(t[2] / 1000)))",
    )
    .key("ledger:keyed:runs")
    .arg(format!(
        "{event} {} {} {} {} {}",
        ctx.job_id(),
        k.key,
        std::process::id(),
        ctx.attempt(),
        ctx.delivered_at_ms()
    ))
    .invoke_async(&mut c)
    .await?;
    Ok(())
}

/// Logs its start, sleeps `sleep_ms`, logs its end (Redis clock, with the
/// worker's process id), returns `Ok`.
#[job(queue = "keyed", max_attempts = 5, timeout = "60s", rate_key = key)]
pub async fn keyed(ctx: JobContext, k: Keyed) -> Result<(), JobError> {
    log_run(&ctx, &k, "start").await?;
    if k.sleep_ms > 0 {
        tokio::time::sleep(Duration::from_millis(k.sleep_ms)).await;
    }
    log_run(&ctx, &k, "end").await
}

/// One delivery of a `keyed` job as its ledger shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Run {
    /// The job id.
    pub id: String,
    /// Its rate key.
    pub key: String,
    /// The worker process that ran it.
    pub pid: u32,
    /// The attempt it ran as.
    pub attempt: u32,
    /// Redis time of its claim (ms): the score of its start in the key's
    /// rate log.
    pub claimed_ms: i64,
    /// Redis time the handler started (ms).
    pub started_ms: i64,
    /// Redis time the handler ended (ms); `None`: it has not (its process
    /// was killed, or it still runs).
    pub ended_ms: Option<i64>,
}

/// The deliveries of `keyed` jobs logged so far, in the order they started.
pub async fn runs(ledger_url: &str) -> Vec<Run> {
    let mut c = crate::ledger_conn(ledger_url).await.expect("ledger");
    let rows: Vec<String> = c.lrange("ledger:keyed:runs", 0, -1).await.expect("runs");
    let mut out: Vec<Run> = Vec::new();
    let mut open: BTreeMap<(String, u32, u32), usize> = BTreeMap::new();
    for row in &rows {
        let f: Vec<&str> = row.split(' ').collect();
        let [event, id, key, pid, attempt, claimed, at] = f[..] else {
            panic!("a ledger row of 7 fields: {row:?}");
        };
        let (pid, attempt): (u32, u32) = (pid.parse().unwrap(), attempt.parse().unwrap());
        let at: i64 = at.parse().unwrap();
        let delivery = (id.to_string(), pid, attempt);
        match event {
            "start" => {
                open.insert(delivery, out.len());
                out.push(Run {
                    id: id.to_string(),
                    key: key.to_string(),
                    pid,
                    attempt,
                    claimed_ms: claimed.parse().unwrap(),
                    started_ms: at,
                    ended_ms: None,
                });
            }
            "end" => {
                let i = open
                    .remove(&delivery)
                    .unwrap_or_else(|| panic!("an end without its start: {row:?}"));
                out[i].ended_ms = Some(at);
            }
            _ => panic!("unknown event: {row:?}"),
        }
    }
    out
}

/// The most deliveries of one key that ran at once, by the ledger's Redis
/// times: a delivery runs from its start to its end, or to `unended_until`
/// when it logged no end (its process was killed before then). At equal
/// milliseconds an end comes before a start: the limiter frees a slot at
/// the ack, after the end was logged, and fills it at a later claim.
pub fn most_running_at_once(runs: &[&Run], unended_until: i64) -> usize {
    let mut events: Vec<(i64, i32)> = Vec::new();
    for r in runs {
        events.push((r.started_ms, 1));
        events.push((r.ended_ms.unwrap_or(unended_until), -1));
    }
    events.sort_unstable();
    let (mut now, mut most) = (0i32, 0i32);
    for (_, d) in events {
        now += d;
        most = most.max(now);
    }
    most as usize
}
