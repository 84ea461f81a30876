//! A small run of the `chaos` harness (docs/RELIABILITY.md) as part of the
//! test suite: 1000 jobs, 3 worker processes, 10 random SIGKILLs plus crashes
//! at every failpoint, a SIGSTOP past the lease and two watchdogs; the second
//! test also SIGKILLs and restarts Redis (appendonly, appendfsync always)
//! mid-run. Each must report nothing lost, no duplicate side effect and no
//! invariant violation (`Admin::check` after the run).

use std::process::Command;
use std::time::{Duration, Instant};

const CHAOS: &str = env!("CARGO_BIN_EXE_chaos");

/// The value of `key` in the flat JSON report (numbers and bools only).
fn field<'a>(json: &'a str, key: &str) -> Option<&'a str> {
    let start = json.find(&format!("\"{key}\":"))? + key.len() + 3;
    let rest = &json[start..];
    let end = rest.find([',', '}']).unwrap_or(rest.len());
    Some(rest[..end].trim())
}

fn run_chaos(extra: &[&str]) {
    run_chaos_with(extra, &[]);
}

/// [`run_chaos`] with environment variables for the harness (and so for its
/// worker processes).
fn run_chaos_with(extra: &[&str], env: &[(&str, &str)]) {
    let mut args = vec![
        "--jobs",
        "1000",
        "--workers",
        "3",
        "--kills",
        "10",
        "--timeout-secs",
        "150",
        "--json",
    ];
    args.extend_from_slice(extra);
    let started = Instant::now();
    let out = Command::new(CHAOS)
        .args(&args)
        .envs(env.iter().copied())
        .output()
        .expect("the chaos binary runs");
    let elapsed = started.elapsed();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!(
        "chaos {} ({elapsed:.1?})\nstdout:\n{stdout}\nstderr:\n{stderr}",
        args.join(" ")
    );
    let json = stdout
        .lines()
        .rev()
        .find(|l| l.starts_with('{'))
        .unwrap_or_else(|| panic!("no JSON report:\n{stdout}\n{stderr}"));
    assert_eq!(field(json, "lost"), Some("0"), "lost jobs: {json}");
    assert_eq!(
        field(json, "duplicates"),
        Some("0"),
        "duplicate side effects: {json}"
    );
    assert_eq!(field(json, "pending"), Some("0"), "{json}");
    assert_eq!(
        field(json, "violations"),
        Some("0"),
        "invariant check after the run: {json}"
    );
    assert_eq!(field(json, "enqueued"), Some("1000"), "{json}");
    assert_eq!(field(json, "kills"), Some("10"), "{json}");
    assert_eq!(field(json, "passed"), Some("true"), "{json}");
    assert!(
        out.status.success(),
        "chaos exited with {}: {json}",
        out.status
    );
    assert!(
        elapsed < Duration::from_secs(120),
        "the CI run took {elapsed:?}"
    );
}

#[test]
fn chaos_1k_jobs_10_kills_loses_nothing_and_duplicates_nothing() {
    run_chaos(&[]);
}

#[test]
fn chaos_1k_jobs_10_kills_with_a_redis_restart_loses_nothing() {
    run_chaos(&["--appendonly"]);
}

/// The same with hash completion records (`WorkerConfig::compact_records`
/// false; compact strings are the default since stop 48): the dedupe of
/// redeliveries and retried acks reads the hash records.
#[test]
fn chaos_1k_jobs_10_kills_with_hash_records_loses_nothing() {
    run_chaos_with(&[], &[("CHAOS_COMPACT_RECORDS", "0")]);
}

/// The `flow` workload (docs/WORKFLOWS.md), CI-sized: 40 batches of 25
/// members, 3 worker processes, 6 SIGKILLs: every batch's callback fires
/// exactly once, each seeing all its members counted once.
#[test]
fn chaos_flow_fires_every_batch_callback_exactly_once() {
    chaos_flow(&[]);
}

/// The same with `--cross-queue`: members on `emails` and `billing`,
/// batches and callbacks on `orders`, every count through the relay; no
/// notice lost.
#[test]
fn chaos_flow_cross_queue_fires_every_callback_exactly_once_and_loses_no_notice() {
    let json = chaos_flow(&["--cross-queue"]);
    assert_eq!(field(&json, "lost"), Some("0"), "{json}");
    assert_eq!(field(&json, "relayed"), Some("1000"), "{json}");
}

fn chaos_flow(extra: &[&str]) -> String {
    let started = Instant::now();
    let out = Command::new(CHAOS)
        .args([
            "flow",
            "--batches",
            "40",
            "--members",
            "25",
            "--workers",
            "3",
            "--kills",
            "6",
        ])
        .args(extra)
        .args(["--timeout-secs", "60", "--json"])
        .output()
        .expect("the chaos binary runs");
    let elapsed = started.elapsed();
    let stdout = String::from_utf8_lossy(&out.stdout);
    println!(
        "chaos flow ({elapsed:.1?}): {stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let json = stdout
        .lines()
        .rev()
        .find(|l| l.starts_with('{'))
        .expect("a JSON report")
        .to_string();
    assert_eq!(field(&json, "callbacks_fired"), Some("40"), "{json}");
    assert_eq!(field(&json, "callback_jobs_enqueued"), Some("40"), "{json}");
    assert_eq!(field(&json, "miscounted"), Some("0"), "{json}");
    assert_eq!(field(&json, "kills"), Some("6"), "{json}");
    assert_eq!(field(&json, "passed"), Some("true"), "{json}");
    assert!(
        out.status.success(),
        "chaos flow exited with {}",
        out.status
    );
    assert!(
        elapsed < Duration::from_secs(30),
        "the CI flow run took {elapsed:?}"
    );
    json
}
