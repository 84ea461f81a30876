//! The doctor's text report: one line per finding with why and fix, then the verdict.

use queue_core::admin::redact_url;

use super::{count, Facts, Finding, Severity};

/// The human-readable report.
pub fn render(findings: &[Finding], facts: &Facts, url: &str, strict: bool) -> String {
    let mut s = format!(
        "queue-watchdog doctor: redis {} at {} (role {}){}\n\n",
        facts.info("redis_version").unwrap_or("?"),
        redact_url(url),
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
    let critical = count(findings, Severity::Critical);
    let warnings = count(findings, Severity::Warning);
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
