//! `doctor`: the Redis settings and states that lose queue data, each
//! reported with why it loses data and the fix.
//!
//! "Safe for critical queues" (exit 0) means no CRITICAL finding:
//! - AOF on (`appendonly yes`) with `appendfsync everysec` or `always`
//!   (`--strict`: only `always`, and fsync also during rewrites);
//! - no evicting `maxmemory-policy` (only `noeviction`: `volatile-*` evicts
//!   completion records, so completed jobs run again), no evictions so far,
//!   no TTL on queue keys;
//! - AOF writes succeeding;
//! - the URL points at a primary, not a replica.
//!
//! Warnings (no replica, no memory limit, a lagging replica, ...) narrow the
//! margin without losing acknowledged jobs on their own; they do not change
//! the exit code.
//!
//! `gather.rs` reads the server into [`Facts`]; `checks.rs` holds one
//! function per check and the list [`CHECKS`] that [`analyze`] runs in order
//! (add a check there); `render.rs` writes the report.

mod checks;
mod gather;
mod render;

use std::collections::HashMap;

use serde::Serialize;

pub use checks::CHECKS;
pub use gather::gather;
pub use render::render;

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
    /// maxmemory, ttl, evictions, expirations, replication, replica-url, version, config,
    /// functions.
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
    /// Dead-letter list lengths found by the scan: (queue key, length).
    pub dead_lengths: Vec<(String, u64)>,
    /// Dead-letter keys found by the scan that are not lists: (key, its
    /// Redis type).
    pub dead_wrong_type: Vec<(String, String)>,
    /// Dead-letter keys whose length could not be read for another reason
    /// than their type (`NOPERM`, `BUSY`): (key, the error).
    pub dead_unreadable: Vec<(String, String)>,
    /// The queue-core function libraries on the server (`FUNCTION LIST
    /// LIBRARYNAME queue_core_*`); `None` when that could not be read.
    pub libraries: Option<Vec<String>>,
}

impl Facts {
    /// Whether AOF is on: INFO `aof_enabled`, else CONFIG `appendonly`.
    fn aof(&self) -> Option<bool> {
        self.info("aof_enabled")
            .map(|v| v == "1")
            .or_else(|| self.config("appendonly").map(|v| v == "yes"))
    }

    pub fn info(&self, k: &str) -> Option<&str> {
        self.info.get(k).map(String::as_str)
    }
    fn info_u64(&self, k: &str) -> Option<u64> {
        self.info(k)?.parse().ok()
    }
    fn config(&self, k: &str) -> Option<&str> {
        self.config.get(k).map(String::as_str)
    }
}

/// Findings being collected; each is filed under the check that runs.
#[derive(Default)]
pub struct Findings {
    check: &'static str,
    found: Vec<Finding>,
}

impl Findings {
    /// Adds a finding of the running check.
    pub fn add(&mut self, severity: Severity, what: String, why: &str, fix: &str) {
        self.found.push(Finding {
            severity,
            check: self.check,
            what,
            why: why.to_string(),
            fix: fix.to_string(),
        });
    }
}

/// Runs every check of [`CHECKS`] in order; the findings, most severe first
/// (in check order within a severity).
pub fn analyze(f: &Facts, opts: Options) -> Vec<Finding> {
    let mut findings = Findings::default();
    for check in CHECKS {
        findings.check = check.name;
        (check.run)(f, opts, &mut findings);
    }
    let mut out = findings.found;
    out.sort_by_key(|f| f.severity);
    out
}

/// True when nothing can lose acknowledged queue data.
pub fn is_safe(findings: &[Finding]) -> bool {
    !findings.iter().any(|f| f.severity == Severity::Critical)
}

/// How many findings have `severity`.
pub fn count(findings: &[Finding], severity: Severity) -> usize {
    findings.iter().filter(|f| f.severity == severity).count()
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
    fn function_libraries_unreadable_or_missing_are_info_only() {
        let mut f = facts(&safe_info(), &[("appendfsync", "everysec"), ("save", "")]);
        let found = analyze(&f, OPTS);
        let info = |found: &[Finding]| {
            found
                .iter()
                .filter(|x| x.check == "functions" && x.severity == Severity::Info)
                .count()
        };
        assert_eq!(info(&found), 1, "not readable: one INFO line");
        assert!(is_safe(&found));
        f.libraries = Some(vec![queue_core::admin::function_library()]);
        let found = analyze(&f, OPTS);
        assert!(checks(&found, Severity::Ok).contains(&"functions"));
        assert_eq!(info(&found), 0, "this version's library only: OK alone");
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

    /// Evicted completion records make completed jobs run again: a
    /// `volatile-*` policy is as critical as `allkeys-*`, TTL'd queue keys or not.
    #[test]
    fn volatile_policy_is_critical_like_allkeys() {
        let mut info = safe_info();
        info.retain(|(k, _)| *k != "maxmemory" && *k != "maxmemory_policy");
        info.push(("maxmemory", "10485760"));
        info.push(("maxmemory_policy", "volatile-lru"));
        let mut f = facts(&info, &[("appendfsync", "everysec")]);
        assert_eq!(
            checks(&analyze(&f, OPTS), Severity::Critical),
            ["maxmemory"]
        );
        f.ttl_count = 1;
        f.ttl_keys = vec![("q:{a}:main".into(), 1000)];
        let found = analyze(&f, OPTS);
        assert_eq!(checks(&found, Severity::Critical), ["maxmemory", "ttl"]);
    }

    #[test]
    fn more_than_ten_thousand_dead_letters_warn() {
        let mut f = facts(&safe_info(), &[("appendfsync", "everysec")]);
        f.dead_lengths = vec![("q:{a}:dead".into(), 10), ("q:{b}:dead".into(), 10_001)];
        let found = analyze(&f, OPTS);
        assert!(is_safe(&found));
        assert!(checks(&found, Severity::Warning).contains(&"dead-letters"));
        f.dead_lengths.truncate(1);
        let found = analyze(&f, OPTS);
        assert!(!checks(&found, Severity::Warning).contains(&"dead-letters"));
        assert!(checks(&found, Severity::Ok).contains(&"dead-letters"));
    }

    /// A dead-letter length refused for another reason than the key's type
    /// (an ACL without LLEN) is a warning, not the CRITICAL "another type".
    #[test]
    fn an_unreadable_dead_letter_length_warns_and_is_not_another_type() {
        let mut f = facts(&safe_info(), &[("appendfsync", "everysec")]);
        f.dead_unreadable = vec![("q:{a}:dead".into(), "NOPERM no LLEN".into())];
        let found = analyze(&f, OPTS);
        assert!(is_safe(&found), "{found:#?}");
        assert!(checks(&found, Severity::Warning).contains(&"dead-letters"));
        f.dead_wrong_type = vec![("q:{b}:dead".into(), "string".into())];
        assert_eq!(
            checks(&analyze(&f, OPTS), Severity::Critical),
            ["dead-letters"]
        );
    }
}
