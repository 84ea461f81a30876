//! `doctor`: the Redis settings and states that lose queue data, each
//! reported with why it loses data and the fix.
//!
//! "Safe for critical queues" (exit 0) means no CRITICAL finding:
//! - AOF on (`appendonly yes`) with `appendfsync everysec` or `always`
//!   (`--strict`: only `always`, and fsync also during rewrites);
//! - no evicting `maxmemory-policy` (`noeviction`, or `volatile-*` while no
//!   queue key has a TTL), no evictions so far, no TTL on queue keys;
//! - AOF writes succeeding;
//! - the URL points at a primary, not a replica.
//!
//! Warnings (no replica, no memory limit, a lagging replica, ...) narrow the
//! margin without losing acknowledged jobs on their own; they do not change
//! the exit code.

use std::collections::HashMap;

use queue_core::{ConnectionConfig, RedisConnection};
use serde::Serialize;

use crate::error::{CliError, Result};

/// How bad a finding is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Severity {
    /// Can lose acknowledged queue data: not safe for critical queues.
    Critical,
    /// Narrows the safety margin or needs a look; not a loss on its own.
    Warning,
    /// Worth knowing.
    Info,
    /// Checked and fine.
    Ok,
}

impl Severity {
    pub fn label(self) -> &'static str {
        match self {
            Severity::Critical => "CRITICAL",
            Severity::Warning => "WARNING",
            Severity::Info => "INFO",
            Severity::Ok => "OK",
        }
    }
}

/// One result of a check.
#[derive(Debug, Clone, Serialize)]
pub struct Finding {
    pub severity: Severity,
    /// Which check: persistence, appendfsync, rewrite-fsync, save, last-write,
    /// maxmemory, ttl, evictions, expirations, replication, replica-url, version, config.
    pub check: &'static str,
    /// What was found.
    pub what: String,
    /// Why it loses (or does not lose) data.
    pub why: String,
    /// The fix, as redis.conf lines or commands ("" when nothing to do).
    pub fix: String,
}

/// Options of the analysis.
#[derive(Debug, Clone, Copy)]
pub struct Options {
    pub strict: bool,
    pub max_lag_secs: u64,
}

/// What was read from the server.
#[derive(Debug, Clone, Default)]
pub struct Facts {
    /// `INFO` fields (all default sections).
    pub info: HashMap<String, String>,
    /// `CONFIG GET` values that could be read.
    pub config: HashMap<String, String>,
    /// Why CONFIG could not be read, if it could not.
    pub config_error: Option<String>,
    /// Queue keys found with a TTL: (key, ms left). At most 20 kept.
    pub ttl_keys: Vec<(String, i64)>,
    /// All queue keys found with a TTL.
    pub ttl_count: u64,
    /// Queue keys looked at by the TTL scan.
    pub scanned: u64,
    /// False when the scan stopped at the limit.
    pub scan_complete: bool,
}

impl Facts {
    fn info(&self, k: &str) -> Option<&str> {
        self.info.get(k).map(String::as_str)
    }
    fn info_u64(&self, k: &str) -> Option<u64> {
        self.info(k)?.parse().ok()
    }
    fn config(&self, k: &str) -> Option<&str> {
        self.config.get(k).map(String::as_str)
    }
}

const CONFIG_KEYS: &[&str] = &[
    "appendonly",
    "appendfsync",
    "save",
    "maxmemory",
    "maxmemory-policy",
    "no-appendfsync-on-rewrite",
    "replica-read-only",
    "min-replicas-to-write",
    "min-replicas-max-lag",
    "stop-writes-on-bgsave-error",
];

/// Connects (error = exit 2) and reads INFO, CONFIG and the queue keys' TTLs.
pub async fn gather(url: &str, scan_limit: u64) -> Result<Facts> {
    let cfg = ConnectionConfig::default();
    let conn = RedisConnection::connect(url, &cfg).await?;
    let mut c = conn.clone();
    let info: String = redis::cmd("INFO")
        .query_async(&mut c)
        .await
        .map_err(CliError::redis("INFO"))?;
    let mut facts = Facts {
        info: parse_info(&info),
        ..Facts::default()
    };
    for key in CONFIG_KEYS {
        let r: redis::RedisResult<Vec<String>> = redis::cmd("CONFIG")
            .arg("GET")
            .arg(*key)
            .query_async(&mut c)
            .await;
        match r {
            Ok(pairs) => {
                for kv in pairs.chunks(2) {
                    if let [k, v] = kv {
                        facts.config.insert(k.clone(), v.clone());
                    }
                }
            }
            Err(e) => {
                facts.config_error = Some(e.to_string());
                break;
            }
        }
    }
    scan_ttls(&conn, scan_limit, &mut facts).await?;
    Ok(facts)
}

/// `INFO` text → field map (`# Section` lines and blanks skipped).
pub fn parse_info(text: &str) -> HashMap<String, String> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        .collect()
}

/// Keys of a queue that expire by design: completion records, step results,
/// per-minute throughput counters.
fn expires_by_design(key: &str) -> bool {
    let Some(rest) = key.find("}:").map(|i| &key[i + 2..]) else {
        return false;
    };
    ["done:", "steps:", "tput:"]
        .iter()
        .any(|p| rest.starts_with(p))
}

async fn scan_ttls(conn: &RedisConnection, limit: u64, facts: &mut Facts) -> Result<()> {
    let mut c = conn.clone();
    let mut cursor = 0u64;
    let mut calls = 0u64;
    facts.scan_complete = true;
    loop {
        let (next, keys): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg("q:{*}:*")
            .arg("COUNT")
            .arg(1000)
            .query_async(&mut c)
            .await
            .map_err(CliError::redis("SCAN for queue keys"))?;
        calls += 1;
        let keys: Vec<String> = keys.into_iter().filter(|k| !expires_by_design(k)).collect();
        if !keys.is_empty() {
            let mut pipe = redis::pipe();
            for k in &keys {
                pipe.cmd("PTTL").arg(k);
            }
            let ttls: Vec<i64> = pipe
                .query_async(&mut c)
                .await
                .map_err(CliError::redis("PTTL of queue keys"))?;
            for (k, ttl) in keys.iter().zip(ttls) {
                if ttl >= 0 {
                    facts.ttl_count += 1;
                    if facts.ttl_keys.len() < 20 {
                        facts.ttl_keys.push((k.clone(), ttl));
                    }
                }
            }
        }
        facts.scanned += keys.len() as u64;
        cursor = next;
        if cursor == 0 {
            break;
        }
        // Bounded: the keys returned and the keyspace walked (COUNT 1000 per call).
        if facts.scanned >= limit || calls * 1000 >= limit.saturating_mul(10) {
            facts.scan_complete = false;
            break;
        }
    }
    Ok(())
}

/// The findings, most severe first.
pub fn analyze(f: &Facts, opts: Options) -> Vec<Finding> {
    let mut out = Vec::new();
    let mut add = |severity, check, what: String, why: &str, fix: &str| {
        out.push(Finding {
            severity,
            check,
            what,
            why: why.to_string(),
            fix: fix.to_string(),
        })
    };
    use Severity::*;

    // Version: queue-core needs LMOVE/BLMOVE (6.2).
    if let Some(v) = f.info("redis_version") {
        let parts: Vec<u64> = v.split('.').filter_map(|p| p.parse().ok()).collect();
        let (major, minor) = (
            parts.first().copied().unwrap_or(0),
            parts.get(1).copied().unwrap_or(0),
        );
        if (major, minor) < (6, 2) {
            add(Critical, "version", format!("redis {v}"),
                "queue-core needs Redis 6.2 or newer (LMOVE/BLMOVE); workers cannot move jobs safely on older servers",
                "upgrade to Redis 7");
        } else {
            add(Ok, "version", format!("redis {v}"), "", "");
        }
    }

    if let Some(e) = &f.config_error {
        add(Warning, "config", format!("CONFIG GET is not allowed here: {e}"),
            "appendfsync, save and no-appendfsync-on-rewrite cannot be checked; the checks below use INFO only",
            "run doctor as a user allowed CONFIG GET, or check those settings in redis.conf by hand");
    }

    // Persistence.
    let aof = f
        .info("aof_enabled")
        .map(|v| v == "1")
        .or_else(|| f.config("appendonly").map(|v| v == "yes"));
    let save = f.config("save");
    match aof {
        Some(true) => add(
            Ok,
            "persistence",
            "appendonly yes (AOF on)".into(),
            "every write is logged to the append-only file and replayed on restart",
            "",
        ),
        Some(false) => {
            let since = f.info_u64("rdb_last_save_time").and_then(|t| {
                let now = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .ok()?
                    .as_secs();
                Some(now.saturating_sub(t))
            });
            let changes = f.info_u64("rdb_changes_since_last_save").unwrap_or(0);
            match save {
                Some("") => add(Critical, "persistence",
                    "appendonly no and no RDB snapshots (save \"\"): nothing is written to disk".into(),
                    "a restart or crash of Redis loses every queue: waiting, running, delayed and dead-lettered jobs",
                    "appendonly yes\nappendfsync everysec"),
                other => add(Critical, "persistence",
                    format!("appendonly no: only RDB snapshots (save \"{}\"); last snapshot {}, {changes} change(s) since",
                        other.unwrap_or("?"),
                        since.map(|s| format!("{s} s ago")).unwrap_or_else(|| "unknown".into())),
                    "a crash loses every enqueue, ack and retry since the last snapshot: acknowledged jobs disappear, completed ones run again",
                    "appendonly yes\nappendfsync everysec"),
            }
        }
        None => add(
            Warning,
            "persistence",
            "cannot tell whether AOF is on".into(),
            "neither INFO persistence nor CONFIG answered",
            "appendonly yes\nappendfsync everysec",
        ),
    }

    if aof == Some(true) {
        match f.config("appendfsync") {
            Some("always") => add(Ok, "appendfsync", "appendfsync always".into(),
                "each write is fsynced before Redis replies: an acknowledged enqueue survives a power loss (slower writes)", ""),
            Some("everysec") if opts.strict => add(Critical, "appendfsync", "appendfsync everysec (--strict requires always)".into(),
                "a power loss or kernel crash can lose the last second of acknowledged writes (a Redis crash alone loses nothing)",
                "appendfsync always"),
            Some("everysec") => add(Ok, "appendfsync", "appendfsync everysec".into(),
                "a Redis crash loses nothing; a power loss or kernel crash can lose up to ~1 s of acknowledged writes (use --strict to require always)", ""),
            Some("no") => add(Critical, "appendfsync", "appendfsync no".into(),
                "the kernel flushes the AOF when it likes (typically every 30 s): a power loss or kernel crash loses up to that much acknowledged work",
                "appendfsync everysec"),
            Some(other) => add(Warning, "appendfsync", format!("appendfsync {other}"), "unknown value", "appendfsync everysec"),
            None if opts.strict => add(Critical, "appendfsync", "cannot read appendfsync".into(),
                "--strict requires proving appendfsync always", "appendfsync always"),
            None => add(Warning, "appendfsync", "cannot read appendfsync".into(),
                "with appendfsync no a power loss loses up to ~30 s of acknowledged writes", "appendfsync everysec"),
        }
        if f.config("no-appendfsync-on-rewrite") == Some("yes") {
            add(if opts.strict { Critical } else { Warning }, "rewrite-fsync", "no-appendfsync-on-rewrite yes".into(),
                "while a BGSAVE or AOF rewrite runs Redis skips fsync: a power loss then can lose up to ~30 s of acknowledged writes",
                "no-appendfsync-on-rewrite no");
        }
        match save {
            Some("") => add(Info, "save", "no RDB snapshots (save \"\")".into(),
                "fine for durability with AOF on; snapshots are handy for backups and faster restarts",
                "save 3600 1 300 100 60 10000   (optional)"),
            Some(s) => add(Ok, "save", format!("save \"{s}\""), "RDB snapshots as well as the AOF", ""),
            None => {}
        }
    }

    // Last save / rewrite / write status.
    if f.info("aof_last_write_status").is_some_and(|s| s != "ok") {
        add(Critical, "last-write", format!("aof_last_write_status:{}", f.info("aof_last_write_status").unwrap_or("")),
            "Redis failed to write the AOF (disk full or failing): writes are refused or not on disk",
            "free disk space or fix the disk under `dir`, then check `INFO persistence`");
    }
    if f.info("aof_last_bgrewrite_status")
        .is_some_and(|s| s != "ok")
    {
        add(Warning, "last-write", "the last AOF rewrite failed (aof_last_bgrewrite_status:err)".into(),
            "the AOF keeps growing; a persistent failure usually means disk or fork (memory) trouble",
            "check the Redis log, free disk space, set vm.overcommit_memory = 1");
    }
    if f.info("rdb_last_bgsave_status").is_some_and(|s| s != "ok") {
        let sev = if aof == Some(false) {
            Critical
        } else {
            Warning
        };
        let stop = f.config("stop-writes-on-bgsave-error") != Some("no");
        add(
            sev,
            "last-write",
            format!(
                "the last RDB snapshot failed (rdb_last_bgsave_status:err){}",
                if stop {
                    "; Redis refuses writes until one succeeds"
                } else {
                    ""
                }
            ),
            if aof == Some(false) {
                "snapshots are the only copy on disk and they are failing"
            } else {
                "snapshots fail (disk or fork trouble); enqueues may be refused"
            },
            "check the Redis log, free disk space, set vm.overcommit_memory = 1",
        );
    }
    if aof == Some(true) && f.info("aof_last_write_status").is_some_and(|s| s == "ok") {
        add(
            Ok,
            "last-write",
            "the AOF is being written (aof_last_write_status:ok)".into(),
            "",
            "",
        );
    }

    // Memory.
    let maxmemory = f
        .info_u64("maxmemory")
        .or_else(|| f.config("maxmemory").and_then(|v| v.parse().ok()))
        .unwrap_or(0);
    let policy = f
        .info("maxmemory_policy")
        .or_else(|| f.config("maxmemory-policy"))
        .unwrap_or("noeviction");
    let used = f.info_u64("used_memory").unwrap_or(0);
    if maxmemory == 0 {
        add(Warning, "maxmemory", "no memory limit (maxmemory 0)".into(),
            "when the host runs out of memory the kernel kills Redis (jobs survive only as far as the AOF reaches); with a limit and noeviction an enqueue fails loudly instead",
            "maxmemory <about 3/4 of the RAM for Redis>\nmaxmemory-policy noeviction");
    } else if policy.starts_with("allkeys") {
        add(Critical, "maxmemory", format!("maxmemory {maxmemory} with maxmemory-policy {policy}"),
            "when memory is full Redis deletes any key, including job hashes and the main, processing and dead lists: jobs vanish without an error",
            "maxmemory-policy noeviction");
    } else if policy.starts_with("volatile") {
        let sev = if f.ttl_count > 0 { Critical } else { Warning };
        add(sev, "maxmemory", format!("maxmemory {maxmemory} with maxmemory-policy {policy}"),
            "when memory is full Redis deletes keys that have a TTL: completion records go early (a re-enqueued or redelivered job runs again), and any queue key with a TTL vanishes",
            "maxmemory-policy noeviction");
    } else {
        let pct = used as f64 * 100.0 / maxmemory as f64;
        if pct >= 90.0 {
            add(
                Warning,
                "maxmemory",
                format!("{pct:.0}% of maxmemory used ({used} of {maxmemory} bytes)"),
                "nothing is evicted (noeviction), but enqueues will soon fail with OOM errors",
                "raise maxmemory or drain/purge queues",
            );
        } else {
            add(
                Ok,
                "maxmemory",
                format!("maxmemory {maxmemory} with maxmemory-policy {policy} ({pct:.0}% used)"),
                "when full, writes fail with an error instead of deleting data",
                "",
            );
        }
    }

    // TTLs on queue keys.
    if f.ttl_count > 0 {
        let examples: Vec<String> = f
            .ttl_keys
            .iter()
            .take(5)
            .map(|(k, ms)| format!("{k} (expires in {})", crate::util::fmt_dur(*ms as u64)))
            .collect();
        add(Critical, "ttl", format!("{} queue key(s) have a TTL: {}", f.ttl_count, examples.join(", ")),
            "a queue list or job hash with a TTL disappears when it expires: its jobs are lost (a missing hash is dead-lettered as 'job hash missing')",
            &format!("PERSIST each key ({}), and find the code or tool that sets the TTL",
                f.ttl_keys.iter().take(3).map(|(k, _)| format!("PERSIST {k}")).collect::<Vec<_>>().join("; ")));
    } else {
        add(Ok, "ttl", format!("no TTL on queue keys ({} key(s) checked{})", f.scanned,
                if f.scan_complete { "" } else { "; scan limit reached" }),
            "completion records, step results and throughput counters expire by design and are not counted", "");
    }

    // Eviction / expiration counters.
    let evicted = f.info_u64("evicted_keys").unwrap_or(0);
    if evicted > 0 {
        add(Critical, "evictions", format!("{evicted} key(s) evicted since Redis started (INFO stats evicted_keys)"),
            "evicted queue keys are lost jobs; dead letters with reason 'job hash missing' are the trace they leave",
            "maxmemory-policy noeviction, more memory; then CONFIG RESETSTAT to restart the counter");
    } else {
        add(
            Ok,
            "evictions",
            "no key evicted since Redis started".into(),
            "",
            "",
        );
    }
    if let Some(expired) = f.info_u64("expired_keys") {
        add(Info, "expirations", format!("{expired} key(s) expired since Redis started"),
            "completion records, step results and throughput counters expire by design; a queue key with a TTL would also count here", "");
    }

    // Replication.
    match f.info("role") {
        Some("slave") | Some("replica") => {
            let master = format!(
                "{}:{}",
                f.info("master_host").unwrap_or("?"),
                f.info("master_port").unwrap_or("?")
            );
            let writable = f.config("replica-read-only") == Some("no");
            add(
                Critical,
                "replica-url",
                format!(
                    "this URL points at a replica of {master} (master_link_status:{}){}",
                    f.info("master_link_status").unwrap_or("?"),
                    if writable {
                        " that accepts writes (replica-read-only no)"
                    } else {
                        ""
                    }
                ),
                if writable {
                    "enqueues are written to the replica only and discarded at its next resync with the primary"
                } else {
                    "enqueues fail with READONLY and workers cannot move jobs; a client that falls back silently loses jobs"
                },
                &format!(
                    "point REDIS_URL at the primary ({master}), or discover it through Sentinel"
                ),
            );
        }
        Some("master") => {
            let n = f.info_u64("connected_slaves").unwrap_or(0);
            if n == 0 {
                add(Warning, "replication", "no replica connected".into(),
                    "if this host or its disk is lost, every queue is lost with it",
                    "run a replica (replicaof <this-host> <port>) and enqueue critical jobs with EnqueueOptions::wait_for_replicas");
            }
            let master_offset = f.info_u64("master_repl_offset").unwrap_or(0);
            for i in 0..n {
                let Some(line) = f.info(&format!("slave{i}")) else {
                    continue;
                };
                let kv: HashMap<&str, &str> =
                    line.split(',').filter_map(|p| p.split_once('=')).collect();
                let addr = format!(
                    "{}:{}",
                    kv.get("ip").unwrap_or(&"?"),
                    kv.get("port").unwrap_or(&"?")
                );
                let state = kv.get("state").copied().unwrap_or("?");
                let lag: u64 = kv.get("lag").and_then(|l| l.parse().ok()).unwrap_or(0);
                let behind = master_offset
                    .saturating_sub(kv.get("offset").and_then(|o| o.parse().ok()).unwrap_or(0));
                if state != "online" {
                    add(
                        Warning,
                        "replication",
                        format!("replica {addr} is {state}"),
                        "a failover to it now would lose everything it has not received",
                        "check the replica's log and network",
                    );
                } else if lag > opts.max_lag_secs {
                    add(
                        Warning,
                        "replication",
                        format!("replica {addr} lags {lag} s ({behind} bytes behind)"),
                        "a failover to it now loses the writes it has not received",
                        "check the replica's load and network",
                    );
                } else {
                    add(
                        Ok,
                        "replication",
                        format!("replica {addr} online, lag {lag} s, {behind} bytes behind"),
                        "a failover loses at most what is in flight",
                        "",
                    );
                }
            }
            if n > 0 && f.config("min-replicas-to-write").is_some_and(|v| v == "0") {
                add(
                    Info,
                    "replication",
                    "min-replicas-to-write 0".into(),
                    "the primary keeps accepting writes when every replica is gone or lagging",
                    "min-replicas-to-write 1\nmin-replicas-max-lag 10",
                );
            }
        }
        _ => {}
    }

    out.sort_by_key(|f| f.severity);
    out
}

/// True when nothing can lose acknowledged queue data.
pub fn is_safe(findings: &[Finding]) -> bool {
    !findings.iter().any(|f| f.severity == Severity::Critical)
}

/// The human-readable report.
pub fn render(findings: &[Finding], facts: &Facts, url: &str, strict: bool) -> String {
    let mut s = format!(
        "queue-watchdog doctor: redis {} at {} (role {}){}\n\n",
        facts.info("redis_version").unwrap_or("?"),
        redact(url),
        facts.info("role").unwrap_or("?"),
        if strict { ", strict" } else { "" }
    );
    for f in findings {
        s.push_str(&format!(
            "{:<9} {:<12} {}\n",
            f.severity.label(),
            f.check,
            f.what
        ));
        if !f.why.is_empty() && f.severity != Severity::Ok {
            s.push_str(&format!("{:23}why: {}\n", "", f.why));
        }
        if !f.fix.is_empty() {
            for (i, line) in f.fix.lines().enumerate() {
                s.push_str(&format!(
                    "{:23}{} {}\n",
                    "",
                    if i == 0 { "fix:" } else { "    " },
                    line
                ));
            }
        }
    }
    let critical = findings
        .iter()
        .filter(|f| f.severity == Severity::Critical)
        .count();
    let warnings = findings
        .iter()
        .filter(|f| f.severity == Severity::Warning)
        .count();
    s.push('\n');
    if critical == 0 {
        s.push_str(&format!(
            "verdict: SAFE for critical queues ({warnings} warning(s)).\n"
        ));
    } else {
        s.push_str(&format!(
            "verdict: NOT SAFE for critical queues: {critical} finding(s) can lose data, {warnings} warning(s). Apply the fixes above (CONFIG SET <name> <value>, then CONFIG REWRITE to keep them).\n"
        ));
    }
    s
}

fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            format!("{}://***@{}", &url[..scheme], &url[at + 1..])
        }
        _ => url.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn facts(info: &[(&str, &str)], config: &[(&str, &str)]) -> Facts {
        Facts {
            info: info
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            config: config
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            scan_complete: true,
            ..Facts::default()
        }
    }

    const OPTS: Options = Options {
        strict: false,
        max_lag_secs: 10,
    };

    fn safe_info() -> Vec<(&'static str, &'static str)> {
        vec![
            ("redis_version", "7.0.15"),
            ("aof_enabled", "1"),
            ("aof_last_write_status", "ok"),
            ("aof_last_bgrewrite_status", "ok"),
            ("rdb_last_bgsave_status", "ok"),
            ("maxmemory", "0"),
            ("maxmemory_policy", "noeviction"),
            ("evicted_keys", "0"),
            ("role", "master"),
            ("connected_slaves", "0"),
        ]
    }

    fn checks(findings: &[Finding], sev: Severity) -> Vec<&'static str> {
        findings
            .iter()
            .filter(|f| f.severity == sev)
            .map(|f| f.check)
            .collect()
    }

    #[test]
    fn aof_everysec_is_safe_unless_strict() {
        let f = facts(&safe_info(), &[("appendfsync", "everysec"), ("save", "")]);
        let found = analyze(&f, OPTS);
        assert!(is_safe(&found), "{found:#?}");
        let strict = analyze(
            &f,
            Options {
                strict: true,
                ..OPTS
            },
        );
        assert_eq!(checks(&strict, Severity::Critical), ["appendfsync"]);
    }

    #[test]
    fn failing_writes_and_snapshots_are_reported() {
        let mut info = safe_info();
        info.retain(|(k, _)| *k != "aof_last_write_status" && *k != "rdb_last_bgsave_status");
        info.push(("aof_last_write_status", "err"));
        info.push(("rdb_last_bgsave_status", "err"));
        let found = analyze(&facts(&info, &[("appendfsync", "always")]), OPTS);
        assert_eq!(checks(&found, Severity::Critical), ["last-write"]);
        assert!(checks(&found, Severity::Warning).contains(&"last-write"));
    }

    #[test]
    fn rewrite_without_fsync_and_lagging_replica_warn() {
        let mut info = safe_info();
        info.retain(|(k, _)| *k != "connected_slaves");
        info.push(("connected_slaves", "1"));
        info.push(("master_repl_offset", "5000"));
        info.push((
            "slave0",
            "ip=10.0.0.2,port=6380,state=online,offset=1000,lag=42",
        ));
        let found = analyze(
            &facts(
                &info,
                &[
                    ("appendfsync", "everysec"),
                    ("no-appendfsync-on-rewrite", "yes"),
                    ("min-replicas-to-write", "0"),
                ],
            ),
            OPTS,
        );
        assert!(is_safe(&found));
        let warnings: Vec<_> = found
            .iter()
            .filter(|f| f.severity == Severity::Warning)
            .map(|f| f.what.as_str())
            .collect();
        assert!(warnings.contains(&"no-appendfsync-on-rewrite yes"));
        assert!(
            warnings
                .iter()
                .any(|w| w.contains("lags 42 s (4000 bytes behind)")),
            "{warnings:?}"
        );
    }

    #[test]
    fn config_unavailable_is_a_warning_not_a_pass_in_strict_mode() {
        let mut f = facts(&safe_info(), &[]);
        f.config_error = Some("NOPERM".into());
        assert!(is_safe(&analyze(&f, OPTS)));
        assert!(!is_safe(&analyze(
            &f,
            Options {
                strict: true,
                ..OPTS
            }
        )));
    }

    #[test]
    fn volatile_policy_is_critical_only_with_ttl_keys() {
        let mut info = safe_info();
        info.retain(|(k, _)| *k != "maxmemory" && *k != "maxmemory_policy");
        info.push(("maxmemory", "10485760"));
        info.push(("maxmemory_policy", "volatile-lru"));
        let mut f = facts(&info, &[("appendfsync", "everysec")]);
        assert!(is_safe(&analyze(&f, OPTS)));
        f.ttl_count = 1;
        f.ttl_keys = vec![("q:{a}:main".into(), 1000)];
        let found = analyze(&f, OPTS);
        assert_eq!(checks(&found, Severity::Critical), ["maxmemory", "ttl"]);
    }

    #[test]
    fn design_ttls_are_not_findings() {
        assert!(expires_by_design("q:{a}:done:1"));
        assert!(expires_by_design("q:{a}:steps:1"));
        assert!(expires_by_design("q:{a}:tput:29000000"));
        assert!(!expires_by_design("q:{a}:job:done:1"));
        assert!(!expires_by_design("q:{a}:main"));
    }
}
