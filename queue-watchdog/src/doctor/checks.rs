//! The doctor's checks: one function per check, run in the order of
//! [`CHECKS`]. To add a check, write a function that reads [`Facts`] and adds
//! findings, and list it in [`CHECKS`] (its name files the findings).

use std::collections::HashMap;

use super::Severity::*;
use super::{Facts, Findings, Options};

/// One check: its name (the `check` of its findings) and its function.
pub struct Check {
    /// Name shown next to each finding (persistence, appendfsync, ...).
    pub name: &'static str,
    /// Reads the facts and adds findings.
    pub run: fn(&Facts, Options, &mut Findings),
}

/// Every check, in report order (findings are then sorted by severity, this
/// order kept within a severity).
pub const CHECKS: &[Check] = &[
    Check {
        name: "version",
        run: version,
    },
    Check {
        name: "config",
        run: config_access,
    },
    Check {
        name: "functions",
        run: functions,
    },
    Check {
        name: "persistence",
        run: persistence,
    },
    Check {
        name: "appendfsync",
        run: appendfsync,
    },
    Check {
        name: "rewrite-fsync",
        run: rewrite_fsync,
    },
    Check {
        name: "save",
        run: save,
    },
    Check {
        name: "last-write",
        run: last_write,
    },
    Check {
        name: "maxmemory",
        run: maxmemory,
    },
    Check {
        name: "ttl",
        run: ttl,
    },
    Check {
        name: "evictions",
        run: evictions,
    },
    Check {
        name: "expirations",
        run: expirations,
    },
    Check {
        name: "dead-letters",
        run: dead_letters,
    },
    Check {
        name: "replica-url",
        run: replica_url,
    },
    Check {
        name: "replication",
        run: replication,
    },
];

/// Redis version: queue-core needs Redis 7.0 (its scripts are functions of
/// one library, `FUNCTION LOAD` / `FCALL`, with script flags; LMOVE/BLMOVE).
fn version(f: &Facts, _opts: Options, out: &mut Findings) {
    if let Some(v) = f.info("redis_version") {
        let parts: Vec<u64> = v.split('.').filter_map(|p| p.parse().ok()).collect();
        let (major, minor) = (
            parts.first().copied().unwrap_or(0),
            parts.get(1).copied().unwrap_or(0),
        );
        if (major, minor) < (7, 0) {
            out.add(Critical, format!("redis {v}"),
                "queue-core needs Redis 7.0 or newer (its scripts are Redis functions, FCALL); producers and workers fail on older servers",
                "upgrade to Redis 7");
        } else {
            out.add(Ok, format!("redis {v}"), "", "");
        }
    }
}

/// queue-core's function libraries: this version's, and those other
/// versions left (docs/OPERATIONS.md, "The scripts on the server").
fn functions(f: &Facts, _opts: Options, out: &mut Findings) {
    let Some(libraries) = &f.libraries else {
        out.add(Info, "FUNCTION LIST is not allowed here: queue-core's function libraries were not listed".into(),
            "producers and workers need FCALL and FUNCTION LOAD (+fcall +function|load) to run at all",
            "");
        return;
    };
    let own = queue_core::admin::function_library();
    if libraries.contains(&own) {
        out.add(Ok, format!("{own} loaded (this version's scripts)"), "", "");
    } else {
        out.add(
            Info,
            format!("{own} (this version's scripts) is not loaded yet"),
            "the first producer or worker of this version loads it; nothing to do",
            "",
        );
    }
    let others: Vec<&String> = libraries.iter().filter(|l| **l != own).collect();
    if !others.is_empty() {
        let names: Vec<&str> = others.iter().map(|s| s.as_str()).collect();
        out.add(
            Info,
            format!(
                "{} library(ies) of other queue-core versions: {}",
                others.len(),
                names.join(", ")
            ),
            "each version loads its own; an old one stays until deleted (a few hundred KB each)",
            &format!(
                "once no process of that version runs: FUNCTION DELETE {}",
                names[0]
            ),
        );
    }
}

/// Whether CONFIG GET answered (else the CONFIG-based checks fall back to INFO).
fn config_access(f: &Facts, _opts: Options, out: &mut Findings) {
    if let Some(e) = &f.config_error {
        out.add(Warning, format!("CONFIG GET is not allowed here: {e}"),
            "appendfsync, save and no-appendfsync-on-rewrite cannot be checked; the checks below use INFO only",
            "run doctor as a user allowed CONFIG GET, or check those settings in redis.conf by hand");
    }
}

/// AOF on, or what a crash loses without it.
fn persistence(f: &Facts, _opts: Options, out: &mut Findings) {
    let save = f.config("save");
    match f.aof() {
        Some(true) => out.add(
            Ok,
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
                Some("") => out.add(Critical, "appendonly no and no RDB snapshots (save \"\"): nothing is written to disk".into(),
                    "a restart or crash of Redis loses every queue: waiting, running, delayed and dead-lettered jobs",
                    "appendonly yes\nappendfsync everysec"),
                other => out.add(Critical, format!("appendonly no: only RDB snapshots (save \"{}\"); last snapshot {}, {changes} change(s) since",
                        other.unwrap_or("?"),
                        since.map(|s| format!("{s} s ago")).unwrap_or_else(|| "unknown".into())),
                    "a crash loses every enqueue, ack and retry since the last snapshot: acknowledged jobs disappear, completed ones run again",
                    "appendonly yes\nappendfsync everysec"),
            }
        }
        None => out.add(
            Warning,
            "cannot tell whether AOF is on".into(),
            "neither INFO persistence nor CONFIG answered",
            "appendonly yes\nappendfsync everysec",
        ),
    }
}

/// How often the AOF is fsynced (with AOF on).
fn appendfsync(f: &Facts, opts: Options, out: &mut Findings) {
    if f.aof() != Some(true) {
        return;
    }
    match f.config("appendfsync") {
        Some("always") => out.add(Ok, "appendfsync always".into(),
            "each write is fsynced before Redis replies: an acknowledged enqueue survives a power loss (slower writes)", ""),
        Some("everysec") if opts.strict => out.add(Critical, "appendfsync everysec (--strict requires always)".into(),
            "a power loss or kernel crash can lose the last second of acknowledged writes (a Redis crash alone loses nothing)",
            "appendfsync always"),
        Some("everysec") => out.add(Ok, "appendfsync everysec".into(),
            "a Redis crash loses nothing; a power loss or kernel crash can lose up to ~1 s of acknowledged writes (use --strict to require always)", ""),
        Some("no") => out.add(Critical, "appendfsync no".into(),
            "the kernel flushes the AOF when it likes (typically every 30 s): a power loss or kernel crash loses up to that much acknowledged work",
            "appendfsync everysec"),
        Some(other) => out.add(Warning, format!("appendfsync {other}"), "unknown value", "appendfsync everysec"),
        None if opts.strict => out.add(Critical, "cannot read appendfsync".into(),
            "--strict requires proving appendfsync always", "appendfsync always"),
        None => out.add(Warning, "cannot read appendfsync".into(),
            "with appendfsync no a power loss loses up to ~30 s of acknowledged writes", "appendfsync everysec"),
    }
}

/// Whether fsync pauses during rewrites (with AOF on).
fn rewrite_fsync(f: &Facts, opts: Options, out: &mut Findings) {
    if f.aof() == Some(true) && f.config("no-appendfsync-on-rewrite") == Some("yes") {
        out.add(if opts.strict { Critical } else { Warning }, "no-appendfsync-on-rewrite yes".into(),
            "while a BGSAVE or AOF rewrite runs Redis skips fsync: a power loss then can lose up to ~30 s of acknowledged writes",
            "no-appendfsync-on-rewrite no");
    }
}

/// RDB snapshots next to the AOF (with AOF on).
fn save(f: &Facts, _opts: Options, out: &mut Findings) {
    if f.aof() != Some(true) {
        return;
    }
    match f.config("save") {
        Some("") => out.add(
            Info,
            "no RDB snapshots (save \"\")".into(),
            "fine for durability with AOF on; snapshots are handy for backups and faster restarts",
            "save 3600 1 300 100 60 10000   (optional)",
        ),
        Some(s) => out.add(
            Ok,
            format!("save \"{s}\""),
            "RDB snapshots as well as the AOF",
            "",
        ),
        None => {}
    }
}

/// Whether the latest AOF write, AOF rewrite and RDB snapshot succeeded.
fn last_write(f: &Facts, _opts: Options, out: &mut Findings) {
    let aof = f.aof();
    if f.info("aof_last_write_status").is_some_and(|s| s != "ok") {
        out.add(Critical, format!("aof_last_write_status:{}", f.info("aof_last_write_status").unwrap_or("")),
            "Redis failed to write the AOF (disk full or failing): writes are refused or not on disk",
            "free disk space or fix the disk under `dir`, then check `INFO persistence`");
    }
    if f.info("aof_last_bgrewrite_status")
        .is_some_and(|s| s != "ok")
    {
        out.add(Warning, "the last AOF rewrite failed (aof_last_bgrewrite_status:err)".into(),
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
        out.add(
            sev,
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
        out.add(
            Ok,
            "the AOF is being written (aof_last_write_status:ok)".into(),
            "",
            "",
        );
    }
}

/// The memory limit and what Redis deletes when it is reached.
fn maxmemory(f: &Facts, _opts: Options, out: &mut Findings) {
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
        out.add(Warning, "no memory limit (maxmemory 0)".into(),
            "when the host runs out of memory the kernel kills Redis (jobs survive only as far as the AOF reaches); with a limit and noeviction an enqueue fails loudly instead",
            "maxmemory <about 3/4 of the RAM for Redis>\nmaxmemory-policy noeviction");
    } else if policy.starts_with("allkeys") {
        out.add(Critical, format!("maxmemory {maxmemory} with maxmemory-policy {policy}"),
            "when memory is full Redis deletes any key, including job hashes and the main, processing and dead lists: jobs vanish without an error",
            "maxmemory-policy noeviction");
    } else if policy.starts_with("volatile") {
        out.add(Critical, format!("maxmemory {maxmemory} with maxmemory-policy {policy}"),
            "when memory is full Redis deletes keys that have a TTL: completion records and step results go early (a completed job that is redelivered or re-enqueued runs its side effects again), and any queue key with a TTL vanishes",
            "maxmemory-policy noeviction");
    } else {
        let pct = used as f64 * 100.0 / maxmemory as f64;
        if pct >= 90.0 {
            out.add(
                Warning,
                format!("{pct:.0}% of maxmemory used ({used} of {maxmemory} bytes)"),
                "nothing is evicted (noeviction), but enqueues will soon fail with OOM errors",
                "raise maxmemory or drain/purge queues",
            );
        } else {
            out.add(
                Ok,
                format!("maxmemory {maxmemory} with maxmemory-policy {policy} ({pct:.0}% used)"),
                "when full, writes fail with an error instead of deleting data",
                "",
            );
        }
    }
}

/// TTLs on queue keys (they vanish with their jobs).
fn ttl(f: &Facts, _opts: Options, out: &mut Findings) {
    if f.ttl_count > 0 {
        let examples: Vec<String> = f
            .ttl_keys
            .iter()
            .take(5)
            .map(|(k, ms)| format!("{k} (expires in {})", crate::format::fmt_dur(*ms as u64)))
            .collect();
        out.add(Critical, format!("{} queue key(s) have a TTL: {}", f.ttl_count, examples.join(", ")),
            "a queue list or job hash with a TTL disappears when it expires: its jobs are lost (a missing hash is dead-lettered as 'job hash missing')",
            &format!("PERSIST each key ({}), and find the code or tool that sets the TTL",
                f.ttl_keys.iter().take(3).map(|(k, _)| format!("PERSIST {k}")).collect::<Vec<_>>().join("; ")));
    } else {
        out.add(Ok, format!("no TTL on queue keys ({} key(s) checked{})", f.scanned,
                if f.scan_complete { "" } else { "; scan limit reached" }),
            "completion records, step results and throughput counters expire by design and are not counted", "");
    }
}

/// Keys evicted since Redis started.
fn evictions(f: &Facts, _opts: Options, out: &mut Findings) {
    let evicted = f.info_u64("evicted_keys").unwrap_or(0);
    if evicted > 0 {
        out.add(Critical, format!("{evicted} key(s) evicted since Redis started (INFO stats evicted_keys)"),
            "evicted queue keys are lost jobs; dead letters with reason 'job hash missing' are the trace they leave",
            "maxmemory-policy noeviction, more memory; then CONFIG RESETSTAT to restart the counter");
    } else {
        out.add(Ok, "no key evicted since Redis started".into(), "", "");
    }
}

/// Dead-letter lists above this length get a warning (the watchdog's
/// default `--dead-max-len`).
const DEAD_WARN: u64 = 10_000;

/// Dead-letter lists that grew past [`DEAD_WARN`] (the watchdog trims them
/// unless its trim is off).
fn dead_letters(f: &Facts, _opts: Options, out: &mut Findings) {
    if !f.dead_wrong_type.is_empty() {
        let keys: Vec<String> = f
            .dead_wrong_type
            .iter()
            .map(|(k, t)| format!("{} ({})", crate::format::printable(k), t))
            .collect();
        out.add(Critical, format!("{} dead-letter key(s) of another type than list: {}", keys.len(), keys.join(", ")),
            "the queue's scripts refuse a dead-letter key of another type: every fetch, failure, promotion and watchdog pass of that queue fails, so its jobs stop running and the jobs of dead workers are never returned",
            "inspect the key (TYPE, DUMP); RENAME it aside, then the queue runs again with a new dead-letter list; find the code or tool that wrote it");
    }
    if let Some((_, error)) = f.dead_unreadable.first() {
        let keys: Vec<String> = f
            .dead_unreadable
            .iter()
            .map(|(k, _)| crate::format::printable(k).into_owned())
            .collect();
        out.add(Warning, format!("could not read the length of {} dead-letter list(s): {} ({})", keys.len(), keys.join(", "), crate::format::printable(error)),
            "LLEN was refused (an ACL without it, a busy script): whether these lists grew past the limit is not known; the refusal says nothing about the keys themselves",
            "run doctor as a user allowed LLEN (and TYPE), or again once Redis is not busy");
    }
    let over: Vec<String> = f
        .dead_lengths
        .iter()
        .filter(|(_, n)| *n > DEAD_WARN)
        .map(|(k, n)| format!("{k} ({n})"))
        .collect();
    if !over.is_empty() {
        out.add(Warning, format!("{} dead-letter list(s) over {DEAD_WARN} entries: {}", over.len(), over.join(", ")),
            "dead letters and their job hashes use memory until they are replayed or purged; at maxmemory, enqueues fail",
            "inspect with `queue-watchdog dead list`, then replay or purge; run the watchdog with its dead-letter trim on (--dead-max-len, --dead-retention-hours)");
    } else if let Some(max) = f.dead_lengths.iter().map(|(_, n)| *n).max() {
        out.add(
            Ok,
            format!("dead-letter lists at most {max} entries"),
            "",
            "",
        );
    }
}

/// Keys expired since Redis started (informational).
fn expirations(f: &Facts, _opts: Options, out: &mut Findings) {
    if let Some(expired) = f.info_u64("expired_keys") {
        out.add(Info, format!("{expired} key(s) expired since Redis started"),
            "completion records, step results and throughput counters expire by design; a queue key with a TTL would also count here", "");
    }
}

/// The URL must reach the primary, not a replica.
fn replica_url(f: &Facts, _opts: Options, out: &mut Findings) {
    if !matches!(f.info("role"), Some("slave") | Some("replica")) {
        return;
    }
    let master = format!(
        "{}:{}",
        f.info("master_host").unwrap_or("?"),
        f.info("master_port").unwrap_or("?")
    );
    let writable = f.config("replica-read-only") == Some("no");
    out.add(Critical, format!(
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

/// Replicas of a primary: connected, online, lagging.
fn replication(f: &Facts, opts: Options, out: &mut Findings) {
    if f.info("role") != Some("master") {
        return;
    }
    let n = f.info_u64("connected_slaves").unwrap_or(0);
    if n == 0 {
        out.add(Warning, "no replica connected".into(),
            "if this host or its disk is lost, every queue is lost with it",
            "run a replica (replicaof <this-host> <port>) and enqueue critical jobs with EnqueueOptions::wait_for_replicas");
    }
    let master_offset = f.info_u64("master_repl_offset").unwrap_or(0);
    for i in 0..n {
        let Some(line) = f.info(&format!("slave{i}")) else {
            continue;
        };
        replica(line, master_offset, opts.max_lag_secs, out);
    }
    if n > 0 && f.config("min-replicas-to-write").is_some_and(|v| v == "0") {
        out.add(
            Info,
            "min-replicas-to-write 0".into(),
            "the primary keeps accepting writes when every replica is gone or lagging",
            "min-replicas-to-write 1\nmin-replicas-max-lag 10",
        );
    }
}

/// One replica line of `INFO replication` (`ip=..,port=..,state=..,offset=..,lag=..`).
fn replica(line: &str, master_offset: u64, max_lag_secs: u64, out: &mut Findings) {
    let kv: HashMap<&str, &str> = line.split(',').filter_map(|p| p.split_once('=')).collect();
    let addr = format!(
        "{}:{}",
        kv.get("ip").unwrap_or(&"?"),
        kv.get("port").unwrap_or(&"?")
    );
    let state = kv.get("state").copied().unwrap_or("?");
    let lag: u64 = kv.get("lag").and_then(|l| l.parse().ok()).unwrap_or(0);
    let behind =
        master_offset.saturating_sub(kv.get("offset").and_then(|o| o.parse().ok()).unwrap_or(0));
    if state != "online" {
        out.add(
            Warning,
            format!("replica {addr} is {state}"),
            "a failover to it now would lose everything it has not received",
            "check the replica's log and network",
        );
    } else if lag > max_lag_secs {
        out.add(
            Warning,
            format!("replica {addr} lags {lag} s ({behind} bytes behind)"),
            "a failover to it now loses the writes it has not received",
            "check the replica's load and network",
        );
    } else {
        out.add(
            Ok,
            format!("replica {addr} online, lag {lag} s, {behind} bytes behind"),
            "a failover loses at most what is in flight",
            "",
        );
    }
}
