//! The benchmark tool's workloads run end to end against the current
//! scripts, each on a private redis-server it starts itself (all but
//! `ceiling`, which needs `redis-benchmark`, and the larger bullmq-bench
//! scenarios, which the small ones share their code with): a script
//! signature change that a workload was not updated for fails here, not in
//! the middle of a `scripts/bench.sh` run (stop 29 found `proto` had been
//! failing against the scripts since stop 20's signatures changed).

use std::process::Command;

use serde_json::Value;

/// Runs `queue-bench <args>` and returns its one JSON result line.
fn bench(args: &[&str]) -> Value {
    let out = Command::new(env!("CARGO_BIN_EXE_queue-bench"))
        .args(args)
        .output()
        .expect("queue-bench runs");
    assert!(
        out.status.success(),
        "queue-bench {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text.lines().last().expect("a result line");
    serde_json::from_str(line).expect("the result is JSON")
}

/// Asserts that the result's `field` is a number above zero.
fn positive(r: &Value, field: &str) {
    assert!(r[field].as_f64().unwrap_or(0.0) > 0.0, "{field} in {r}");
}

#[test]
fn proto_runs_queue_cores_scripts_with_acks_one_per_job_and_batched() {
    for extra in [&[][..], &["--batched-ack"][..]] {
        let mut args = vec![
            "proto",
            "--n",
            "500",
            "--fetchers",
            "2",
            "--fetch-batch",
            "16",
        ];
        args.extend_from_slice(extra);
        let r = bench(&args);
        assert_eq!(r["processed"], 500, "{args:?}: {r}");
    }
}

#[test]
fn process_and_end_to_end_complete_every_job() {
    let r = bench(&["process", "--n", "1000", "--concurrency", "8"]);
    assert_eq!(r["cmds"]["scripts"]["acked"], 1000, "{r}");
    let r = bench(&[
        "e2e",
        "--n",
        "1000",
        "--producers",
        "4",
        "--concurrency",
        "8",
    ]);
    assert_eq!(r["cmds"]["scripts"]["acked"], 1000, "{r}");
    assert_eq!(r["cmds"]["scripts"]["enqueued"], 1000, "{r}");
}

#[test]
fn the_other_workloads_run_on_small_sizes() {
    let r = bench(&["enqueue", "--n", "500", "--producers", "4"]);
    assert_eq!(r["cmds"]["scripts"]["enqueued"], 500, "{r}");
    let r = bench(&["memory", "--n", "500"]);
    assert_eq!(r["n"], 500, "{r}");
    let r = bench(&["idle", "--seconds", "1"]);
    assert!(r["calls_per_s"].is_number(), "{r}");
    let r = bench(&["cost-memory", "--n", "500"]);
    positive(&r, "bytes_per_completed_job");
    let r = bench(&[
        "cost-backlog",
        "--n",
        "500",
        "--backlog",
        "200",
        "--runs",
        "1",
    ]);
    positive(&r, "jobs_per_s");
    let r = bench(&[
        "cost-ack",
        "--n",
        "500",
        "--in-flight",
        "16",
        "--workers",
        "2",
    ]);
    assert!(r.is_object(), "{r}");
    for scenario in ["queue-add", "worker-generic"] {
        let r = bench(&["bb", "--scenario", scenario]);
        positive(&r, "jobs_per_s");
    }
}
