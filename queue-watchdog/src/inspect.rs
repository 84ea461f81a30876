//! Read-only views of queues for the CLI and the dashboard: queue discovery,
//! stats with lease health, processing jobs with their lease, waiting and
//! delayed jobs, one job's location and history. Reads that must agree with
//! each other are one read-only script each (a consistent snapshot).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::LazyLock;

use queue_core::{JobInfo, Queue, QueueKeys, RedisConnection};
use serde::Serialize;

use crate::error::{CliError, Result};
use crate::util::{fmt_ts, payload_json, TIMESTAMP_FIELDS};

static HEALTH: LazyLock<redis::Script> =
    LazyLock::new(|| redis::Script::new(include_str!("lua/health.lua")));
static PROCESSING: LazyLock<redis::Script> =
    LazyLock::new(|| redis::Script::new(include_str!("lua/processing.lua")));
static WAITING: LazyLock<redis::Script> =
    LazyLock::new(|| redis::Script::new(include_str!("lua/waiting.lua")));
static LOCATE: LazyLock<redis::Script> =
    LazyLock::new(|| redis::Script::new(include_str!("lua/locate.lua")));

/// Finds queue names from their keys: `q:{Q}:stats` hashes and `q:{Q}:*`
/// lists (main, processing, dead). Scans the whole keyspace (SCAN, so without
/// blocking Redis); pass queues explicitly on big or clustered deployments.
pub async fn discover_queues(conn: &RedisConnection) -> Result<Vec<String>> {
    if conn.is_cluster() {
        return Err(CliError::Other(
            "queue discovery needs a single Redis; on a cluster name the queues with --queue"
                .into(),
        ));
    }
    let mut found = BTreeSet::new();
    for (pattern, kind) in [("q:{*}:stats", None), ("q:{*}:*", Some("list"))] {
        let mut cursor = 0u64;
        loop {
            let mut cmd = redis::cmd("SCAN");
            cmd.arg(cursor)
                .arg("MATCH")
                .arg(pattern)
                .arg("COUNT")
                .arg(1000);
            if let Some(kind) = kind {
                cmd.arg("TYPE").arg(kind);
            }
            let (next, keys): (u64, Vec<String>) = cmd
                .query_async(&mut conn.clone())
                .await
                .map_err(CliError::redis("SCAN for queue keys"))?;
            for key in keys {
                if let Some(q) = queue_of_key(&key) {
                    found.insert(q.to_string());
                }
            }
            cursor = next;
            if cursor == 0 {
                break;
            }
        }
    }
    Ok(found.into_iter().collect())
}

/// `q:{emails}:main` → `emails`.
pub fn queue_of_key(key: &str) -> Option<&str> {
    let rest = key.strip_prefix("q:{")?;
    let end = rest.find('}')?;
    rest[end..].starts_with("}:").then(|| &rest[..end])
}

/// The queues named on the command line, or every queue found in Redis.
pub async fn resolve_queues(queue: &Queue, named: &[String]) -> Result<Vec<String>> {
    if !named.is_empty() {
        return Ok(named.to_vec());
    }
    discover_queues(&queue.connection()).await
}

/// One queue's numbers: [`queue_core::QueueStats`] plus lease and delay health.
#[derive(Debug, Clone, Serialize)]
pub struct QueueHealth {
    pub queue: String,
    /// Jobs waiting in main.
    pub main: u64,
    /// Jobs taken by workers (running, or lost and waiting for the watchdog).
    pub processing: u64,
    /// Retries and scheduled jobs.
    pub delayed: u64,
    /// Dead-lettered jobs.
    pub dead: u64,
    /// Lifetime counters (enqueued, completed, failed, retried, dead, reclaimed, ...).
    pub counters: BTreeMap<String, i64>,
    /// Age of the oldest job waiting in main: high means slow (too few workers).
    pub oldest_waiting_ms: Option<u64>,
    /// Completions in the last 60 s.
    pub completed_last_minute: u64,
    /// Processing entries whose lease expired: lost deliveries (worker died or
    /// stalled) that a running watchdog returns within one pass.
    pub expired_leases: u64,
    /// Processing entries without a lease yet (taken, not claimed).
    pub unleased: u64,
    /// Delayed jobs whose run time has come but that are not promoted yet.
    pub delayed_due: u64,
    /// Time since the oldest processing entry was delivered.
    pub oldest_processing_ms: Option<u64>,
    /// Time until the next delayed job is due (negative: overdue).
    pub next_delayed_in_ms: Option<i64>,
    /// Redis clock at the snapshot.
    pub now_ms: i64,
}

impl QueueHealth {
    pub fn counter(&self, name: &str) -> i64 {
        self.counters.get(name).copied().unwrap_or(0)
    }
}

/// Stats and lease health of `name`.
pub async fn health(queue: &Queue, name: &str) -> Result<QueueHealth> {
    let s = queue.stats(name).await?;
    let k = QueueKeys::new(name);
    let (now, expired, leased, due, oldest, next): (i64, u64, u64, u64, i64, i64) = HEALTH
        .key(&k.processing)
        .key(&k.leases)
        .key(&k.delayed)
        .arg(&k.job_prefix)
        .invoke_async(&mut queue.connection())
        .await
        .map_err(CliError::redis(format!("lease health of queue `{name}`")))?;
    Ok(QueueHealth {
        queue: s.queue.clone(),
        main: s.main,
        processing: s.processing,
        delayed: s.delayed,
        dead: s.dead,
        oldest_waiting_ms: s.oldest_waiting_ms,
        completed_last_minute: s.completed_last_minute,
        counters: s.counters,
        expired_leases: expired,
        unleased: s.processing.saturating_sub(leased),
        delayed_due: due,
        oldest_processing_ms: (oldest > 0 && s.processing > 0)
            .then(|| (now - oldest).max(0) as u64),
        next_delayed_in_ms: (next > 0).then_some(next - now),
        now_ms: now,
    })
}

/// Where a processing entry's lease stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum LeaseStatus {
    /// The lease runs: the worker is alive (its heartbeat extends it).
    Running,
    /// The lease expired: the worker died or stalled; the job is lost until
    /// the watchdog returns it.
    Expired,
    /// Taken from main but never claimed (the worker died between BLMOVE and
    /// claim, or is about to claim); the watchdog gives it a provisional lease.
    Unleased,
}

impl LeaseStatus {
    pub fn label(self) -> &'static str {
        match self {
            LeaseStatus::Running => "running",
            LeaseStatus::Expired => "lost: lease expired",
            LeaseStatus::Unleased => "unclaimed: no lease",
        }
    }
}

/// One job in processing.
#[derive(Debug, Clone, Serialize)]
pub struct ProcessingJob {
    pub id: String,
    pub state: String,
    pub job_type: String,
    pub attempts: String,
    pub max_attempts: String,
    pub delivered_at: Option<i64>,
    pub lease_until: Option<i64>,
    /// Lease time left in ms (negative: expired that long ago).
    pub lease_left_ms: Option<i64>,
    pub status: LeaseStatus,
}

/// The oldest `limit` processing entries, oldest first, and the list's length.
pub async fn processing(
    queue: &Queue,
    name: &str,
    limit: usize,
) -> Result<(i64, u64, Vec<ProcessingJob>)> {
    let k = QueueKeys::new(name);
    let (now, total, rows): (i64, u64, Vec<Vec<String>>) = PROCESSING
        .key(&k.processing)
        .key(&k.leases)
        .arg(&k.job_prefix)
        .arg(limit.max(1))
        .invoke_async(&mut queue.connection())
        .await
        .map_err(CliError::redis(format!(
            "processing list of queue `{name}`"
        )))?;
    let jobs = rows
        .into_iter()
        .map(|r| {
            let get = |i: usize| r.get(i).cloned().unwrap_or_default();
            let lease_until = parse_ms(&get(1));
            let status = match lease_until {
                Some(t) if t > now => LeaseStatus::Running,
                Some(_) => LeaseStatus::Expired,
                None => LeaseStatus::Unleased,
            };
            ProcessingJob {
                id: get(0),
                state: get(2),
                job_type: get(3),
                attempts: get(4),
                max_attempts: get(5),
                delivered_at: parse_ms(&get(6)),
                lease_until,
                lease_left_ms: lease_until.map(|t| t - now),
                status,
            }
        })
        .collect();
    Ok((now, total, jobs))
}

/// A job waiting in main or in the delayed set.
#[derive(Debug, Clone, Serialize)]
pub struct WaitingJob {
    pub id: String,
    /// enqueued_at (main) or run_at (delayed).
    pub at: Option<i64>,
    pub job_type: String,
    pub attempts: String,
    pub last_error: String,
}

/// The next `limit` jobs of main (oldest first) and of the delayed set (soonest first).
pub async fn waiting(
    queue: &Queue,
    name: &str,
    limit: usize,
) -> Result<(i64, Vec<WaitingJob>, Vec<WaitingJob>)> {
    let k = QueueKeys::new(name);
    type Rows = Vec<Vec<String>>;
    let (now, main, delayed): (i64, Rows, Rows) = WAITING
        .key(&k.main)
        .key(&k.delayed)
        .arg(&k.job_prefix)
        .arg(limit.max(1))
        .invoke_async(&mut queue.connection())
        .await
        .map_err(CliError::redis(format!("waiting jobs of queue `{name}`")))?;
    let conv = |rows: Rows| -> Vec<WaitingJob> {
        rows.into_iter()
            .map(|r| {
                let get = |i: usize| r.get(i).cloned().unwrap_or_default();
                WaitingJob {
                    id: get(0),
                    at: parse_ms(&get(1)),
                    job_type: get(2),
                    attempts: get(3),
                    last_error: get(4),
                }
            })
            .collect()
    };
    Ok((now, conv(main), conv(delayed)))
}

/// Where a job is.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
#[serde(tag = "list", rename_all = "snake_case")]
pub enum Location {
    /// Waiting in main; `ahead` jobs run before it.
    Main { ahead: u64 },
    /// Taken by a worker.
    Processing {
        lease_until: Option<i64>,
        lease_left_ms: Option<i64>,
        status: LeaseStatus,
    },
    /// In the delayed set until `run_at`.
    Delayed { run_at: i64 },
    /// Dead-lettered; `position` 0 is the newest.
    Dead { position: u64 },
    /// Completed (only the completion record is left).
    Completed,
    /// Not in any list (e.g. a hash whose id was lost from the lists).
    Nowhere,
}

impl Location {
    pub fn describe(&self) -> String {
        match self {
            Location::Main { ahead } => format!("main (waiting; {ahead} job(s) ahead of it)"),
            Location::Processing {
                lease_left_ms,
                status,
                ..
            } => match (status, lease_left_ms) {
                (LeaseStatus::Running, Some(ms)) => format!(
                    "processing (running; lease {} left)",
                    crate::util::fmt_dur(*ms as u64)
                ),
                (LeaseStatus::Expired, Some(ms)) => format!(
                    "processing (LOST: lease expired {} ago; the watchdog returns it on its next pass)",
                    crate::util::fmt_dur(ms.unsigned_abs())
                ),
                _ => "processing (taken but not claimed: no lease yet)".to_string(),
            },
            Location::Delayed { .. } => "delayed (retry or scheduled run)".to_string(),
            Location::Dead { position } => format!("dead-letter list (position {position})"),
            Location::Completed => "completed".to_string(),
            Location::Nowhere => {
                "in no list (hash without a list entry: inspect before acting)".to_string()
            }
        }
    }
}

/// One event in a job's life, from the timestamps its hash keeps.
#[derive(Debug, Clone, Serialize)]
pub struct HistoryEvent {
    pub at: i64,
    pub at_text: String,
    pub event: String,
    pub detail: String,
}

/// Everything known about one job.
#[derive(Debug, Clone, Serialize)]
pub struct JobDetail {
    pub queue: String,
    pub id: String,
    pub now_ms: i64,
    pub location: Location,
    /// Hash fields except the payload.
    pub fields: BTreeMap<String, String>,
    pub payload: serde_json::Value,
    pub payload_bytes: usize,
    pub completion: Option<BTreeMap<String, String>>,
    /// Names of the `ctx.step(..)` results stored for it.
    pub steps: Vec<String>,
    /// Events, oldest first. The hash keeps the latest time of each kind of
    /// event, so an earlier failure overwritten by a later one is not listed.
    pub history: Vec<HistoryEvent>,
}

/// The job `id` of `name`, or `None` when Redis knows nothing about it.
pub async fn job_detail(queue: &Queue, name: &str, id: &str) -> Result<Option<JobDetail>> {
    let k = QueueKeys::new(name);
    let info: Option<JobInfo> = queue.job(name, id).await?;
    let completion = queue.completion(name, id).await?;
    let mut conn = queue.connection();
    let steps: Vec<String> = redis::cmd("HKEYS")
        .arg(k.steps(id))
        .query_async(&mut conn)
        .await
        .map_err(CliError::redis(format!("steps of job `{id}`")))?;
    type Loc = (i64, i64, u64, i64, String, i64, String);
    let (now, in_main, main_len, in_proc, delayed_at, in_dead, lease): Loc = LOCATE
        .key(&k.main)
        .key(&k.processing)
        .key(&k.delayed)
        .key(&k.dead)
        .key(&k.leases)
        .arg(id)
        .invoke_async(&mut conn)
        .await
        .map_err(CliError::redis(format!("location of job `{id}`")))?;
    if info.is_none() && completion.is_none() && in_main < 0 && in_proc < 0 && in_dead < 0 {
        return Ok(None);
    }
    let location = if in_proc >= 0 {
        let lease_until = parse_ms(&lease);
        Location::Processing {
            lease_until,
            lease_left_ms: lease_until.map(|t| t - now),
            status: match lease_until {
                Some(t) if t > now => LeaseStatus::Running,
                Some(_) => LeaseStatus::Expired,
                None => LeaseStatus::Unleased,
            },
        }
    } else if in_main >= 0 {
        Location::Main {
            ahead: main_len.saturating_sub(in_main as u64 + 1),
        }
    } else if let Some(run_at) = parse_ms(&delayed_at) {
        Location::Delayed { run_at }
    } else if in_dead >= 0 {
        Location::Dead {
            position: in_dead as u64,
        }
    } else if info.is_none() && completion.is_some() {
        Location::Completed
    } else {
        Location::Nowhere
    };
    let (fields, payload, payload_bytes) = match &info {
        Some(i) => (i.fields.clone(), payload_json(&i.payload), i.payload.len()),
        None => (BTreeMap::new(), serde_json::Value::Null, 0),
    };
    let history = history(&fields, completion.as_ref());
    Ok(Some(JobDetail {
        queue: name.to_string(),
        id: id.to_string(),
        now_ms: now,
        location,
        fields,
        payload,
        payload_bytes,
        completion,
        steps,
        history,
    }))
}

fn history(
    fields: &BTreeMap<String, String>,
    completion: Option<&BTreeMap<String, String>>,
) -> Vec<HistoryEvent> {
    let f = |name: &str| fields.get(name).map(String::as_str).unwrap_or("");
    let mut out = Vec::new();
    let mut push = |at: Option<i64>, event: &str, detail: String| {
        if let Some(at) = at {
            out.push(HistoryEvent {
                at,
                at_text: fmt_ts(at),
                event: event.to_string(),
                detail,
            });
        }
    };
    push(
        parse_ms(f("enqueued_at")).or_else(|| {
            completion.and_then(|c| parse_ms(c.get("enqueued_at").map(String::as_str)?))
        }),
        "enqueued",
        format!(
            "type {} v{}, max {} attempt(s)",
            f("type"),
            f("v"),
            f("max_attempts")
        ),
    );
    push(
        parse_ms(f("delivered_at")),
        "delivered",
        format!("attempt {} (latest delivery)", f("attempts")),
    );
    push(
        parse_ms(f("failed_at")),
        "failed",
        f("last_error").to_string(),
    );
    push(
        parse_ms(f("dead_at")),
        "dead-lettered",
        f("dead_reason").to_string(),
    );
    push(
        parse_ms(f("replayed_at")),
        "replayed",
        match f("previous_dead_reason") {
            "" => "back to main from the dead-letter list".to_string(),
            r => format!("back to main; it had died with: {r}"),
        },
    );
    push(
        parse_ms(f("run_at")),
        "scheduled",
        "due to run (delayed set)".to_string(),
    );
    if let Some(c) = completion {
        push(
            parse_ms(c.get("finished_at").map(String::as_str).unwrap_or("")),
            "completed",
            format!(
                "status {} after {} attempt(s)",
                c.get("status").map(String::as_str).unwrap_or("?"),
                c.get("attempts").map(String::as_str).unwrap_or("?")
            ),
        );
    }
    out.sort_by_key(|e| e.at);
    out
}

/// A millisecond timestamp stored as text (`""` / `0` / garbage: none).
pub fn parse_ms(s: &str) -> Option<i64> {
    let v = s.trim().parse::<f64>().ok()?;
    (v > 0.0).then_some(v as i64)
}

/// A hash field for display: timestamps become `ms (UTC time)`.
pub fn display_field(name: &str, value: &str) -> String {
    if TIMESTAMP_FIELDS.contains(&name) {
        if let Some(ms) = parse_ms(value) {
            return format!("{} ({value})", fmt_ts(ms));
        }
    }
    value.to_string()
}

/// Dead-lettered jobs of `name`, newest first, optionally filtered; `offset`
/// and `limit` count matching jobs. Reads in pages.
pub async fn dead_letters(
    queue: &Queue,
    name: &str,
    filter: Option<&str>,
    offset: u64,
    limit: u64,
) -> Result<(u64, Vec<JobInfo>)> {
    let total = queue.stats(name).await?.dead;
    if filter.is_none() {
        let count = limit.min(total.saturating_sub(offset));
        return Ok((total, queue.dead_letters(name, offset, count).await?));
    }
    let needle = filter.unwrap_or_default();
    let mut out = Vec::new();
    let mut skipped = 0u64;
    let mut pos = 0u64;
    const PAGE: u64 = 500;
    while pos < total && (out.len() as u64) < limit {
        let page = queue.dead_letters(name, pos, PAGE).await?;
        if page.is_empty() {
            break;
        }
        pos += page.len() as u64;
        for j in page {
            if !crate::util::matches_filter(&j.fields, needle) {
                continue;
            }
            if skipped < offset {
                skipped += 1;
                continue;
            }
            if (out.len() as u64) < limit {
                out.push(j);
            }
        }
    }
    Ok((total, out))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queue_names_from_keys() {
        assert_eq!(queue_of_key("q:{emails}:main"), Some("emails"));
        assert_eq!(queue_of_key("q:{a:b}:job:1"), Some("a:b"));
        assert_eq!(queue_of_key("lock:{x}"), None);
        assert_eq!(queue_of_key("q:{broken"), None);
    }

    #[test]
    fn history_is_sorted_and_readable() {
        let mut f = BTreeMap::new();
        f.insert("enqueued_at".into(), "1000".into());
        f.insert("delivered_at".into(), "3000".into());
        f.insert("failed_at".into(), "2000".into());
        f.insert("last_error".into(), "boom".into());
        f.insert("attempts".into(), "2".into());
        let h = history(&f, None);
        let events: Vec<_> = h.iter().map(|e| e.event.as_str()).collect();
        assert_eq!(events, ["enqueued", "failed", "delivered"]);
        assert_eq!(h[1].detail, "boom");
        assert_eq!(
            display_field("enqueued_at", "1000"),
            "1970-01-01 00:00:01.000Z (1000)"
        );
        assert_eq!(display_field("type", "send"), "send");
    }
}
