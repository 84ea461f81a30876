//! The transactional inbox under process crashes (issue #16): the `chaos
//! inbox` workload with 1000 jobs, 3 worker processes, 10 SIGKILLs and
//! self-crashes before the transaction, inside it, after the commit and
//! before the ack (`before_ack` failpoint). Through the inbox no job's DB
//! effect is applied twice or missing; the control without the inbox, under
//! the same faults, applies some twice.

use std::process::Command;
use std::time::Instant;

const CHAOS: &str = env!("CARGO_BIN_EXE_chaos");

/// The value of `key` in the flat JSON report (numbers and bools only).
fn field(json: &str, key: &str) -> u64 {
    let start = json
        .find(&format!("\"{key}\":"))
        .unwrap_or_else(|| panic!("no {key} in {json}"))
        + key.len()
        + 3;
    let rest = &json[start..];
    let end = rest.find([',', '}']).unwrap_or(rest.len());
    match rest[..end].trim() {
        "true" => 1,
        "false" => 0,
        n => n
            .parse()
            .unwrap_or_else(|_| panic!("{key} is not a number in {json}")),
    }
}

/// Runs the workload and returns its JSON report.
fn run_inbox_workload(extra: &[&str]) -> String {
    if queue_testkit::postgres::require().is_none() {
        return String::new();
    }
    let mut args = vec![
        "inbox",
        "--jobs",
        "1000",
        "--workers",
        "3",
        "--concurrency",
        "4",
        "--kills",
        "10",
        "--crash-rate",
        "0.005",
        "--lease-ms",
        "1000",
        "--timeout-secs",
        "90",
        "--json",
    ];
    args.extend_from_slice(extra);
    let started = Instant::now();
    let out = Command::new(CHAOS)
        .args(&args)
        .output()
        .expect("the chaos binary runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!(
        "chaos {} ({:.1?})\n{stdout}\n{stderr}",
        args.join(" "),
        started.elapsed()
    );
    let json = stdout
        .lines()
        .rev()
        .find(|l| l.starts_with('{'))
        .unwrap_or_else(|| panic!("no JSON report:\n{stdout}\n{stderr}"))
        .to_string();
    assert_eq!(field(&json, "jobs"), 1000, "{json}");
    assert_eq!(field(&json, "completed"), 1000, "every job acked: {json}");
    assert_eq!(
        field(&json, "missing"),
        0,
        "every job's effect applied: {json}"
    );
    assert_eq!(field(&json, "dead"), 0, "{json}");
    assert_eq!(field(&json, "kills"), 10, "{json}");
    json
}

#[test]
fn inbox_applies_each_db_effect_once_across_kills_and_crashes() {
    let json = run_inbox_workload(&[]);
    if json.is_empty() {
        return;
    }
    assert_eq!(
        field(&json, "duplicates"),
        0,
        "DB effects applied twice: {json}"
    );
    assert_eq!(field(&json, "effects"), 1000, "{json}");
    assert_eq!(field(&json, "passed"), 1, "{json}");
}

/// The control: the same faults without the inbox apply some effects twice
/// (a crash after the commit and before the ack runs the job again).
#[test]
fn without_the_inbox_the_same_faults_apply_effects_twice() {
    let json = run_inbox_workload(&["--no-inbox"]);
    if json.is_empty() {
        return;
    }
    assert!(
        field(&json, "duplicates") > 0,
        "the control should show duplicates: {json}"
    );
    assert_eq!(field(&json, "already_done"), 0, "{json}");
}
