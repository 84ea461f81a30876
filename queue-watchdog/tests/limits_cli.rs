//! `queue-watchdog queue limit` and the limits in `stats` (docs/LIMITS.md),
//! as an operator runs them, against a real redis-server.

use queue_testkit::RedisServer;

#[path = "support/cli_run.rs"]
mod cli_run;

/// `run(args, url)`: this file's argument order.
fn run(args: &[&str], url: &str) -> (bool, String, String) {
    cli_run::run(url, args)
}

#[test]
fn queue_limit_sets_shows_and_clears_limits_and_stats_shows_them() {
    let server = RedisServer::start().unwrap();
    let url = server.url();
    let (ok, out, err) = run(
        &["queue", "limit", "-q", "emails", "--rate", "100/1s"],
        &url,
    );
    assert!(
        ok && out.contains("rate 100/1s (0 in window)"),
        "{out}{err}"
    );
    let (ok, out, _) = run(
        &["queue", "limit", "-q", "emails", "--concurrency", "8"],
        &url,
    );
    assert!(ok && out.contains("concurrency 8 (0 running)"), "{out}");
    let (ok, out, _) = run(
        &[
            "queue",
            "limit",
            "-q",
            "emails",
            "--every-key",
            "--rate",
            "5/250ms",
        ],
        &url,
    );
    assert!(ok && out.contains("per key rate 5/250ms"), "{out}");
    let (ok, out, _) = run(
        &[
            "queue",
            "limit",
            "-q",
            "emails",
            "--key",
            "acme",
            "--concurrency",
            "2",
            "--json",
        ],
        &url,
    );
    assert!(
        ok && out.contains(r#""acme":{"rate":null,"concurrency":2}"#),
        "{out}"
    );
    let stored = server
        .command(&["HGET", "q:{emails}:limits", "rate"])
        .unwrap();
    assert!(stored.contains("100/1000"), "{stored}");

    let (_, out, _) = run(&["stats", "-q", "emails"], &url);
    assert!(out.contains("emails: LIMITED: rate 100/1s"), "{out}");
    assert!(out.contains("key acme: concurrency 2"), "{out}");
    let (_, out, _) = run(&["stats", "-q", "emails", "--json"], &url);
    assert!(out.contains(r#""rate":{"max":100,"per_ms":1000}"#), "{out}");

    let (ok, _, err) = run(&["queue", "limit", "-q", "emails", "--rate", "fast"], &url);
    assert!(!ok && err.contains("want N/<window>"), "{err}");
    let (ok, out, _) = run(
        &["queue", "limit", "-q", "emails", "--key", "acme", "--clear"],
        &url,
    );
    assert!(ok && !out.contains("acme"), "{out}");
    let (ok, out, _) = run(&["queue", "limit", "-q", "emails", "--clear"], &url);
    assert!(ok && out.contains("limits: none"), "{out}");
    let (_, out, _) = run(&["stats", "-q", "emails"], &url);
    assert!(!out.contains("LIMITED"), "{out}");
}

/// `queue limit --key K --release` makes the jobs deferred for key K due
/// now (here the layout a deferral writes: the job's booked start in
/// `limit_slot`, the delayed set, the key's index of deferred jobs).
#[test]
fn queue_limit_release_makes_a_keys_deferred_jobs_due() {
    let server = RedisServer::start().unwrap();
    let url = server.url();
    let k = queue_core::QueueKeys::new("emails");
    let far = "99999999999999";
    let job = k.job("j1");
    let index = format!("{}:deferred:acme", k.limits());
    for cmd in [
        vec![
            "HSET",
            &job,
            "state",
            "delayed",
            "run_at",
            far,
            "limit_slot",
            far,
            "rate_key",
            "acme",
        ],
        vec!["ZADD", &k.delayed, far, "j1"],
        vec!["ZADD", &index, "1", "j1"],
    ] {
        server.command(&cmd).unwrap();
    }
    let (ok, out, err) = run(
        &[
            "queue",
            "limit",
            "-q",
            "emails",
            "--key",
            "acme",
            "--release",
        ],
        &url,
    );
    assert!(ok && out.contains("1 deferred jobs made due"), "{out}{err}");
    let score = server.command(&["ZSCORE", &k.delayed, "j1"]).unwrap();
    assert!(!score.contains(far), "{score}");
    let slot = server.command(&["HEXISTS", &job, "limit_slot"]).unwrap();
    assert!(slot.contains('0'), "{slot}");

    // With --json the count is in the JSON (before, it was left out: a
    // script could not tell how many were released).
    server
        .command(&["HSET", &job, "run_at", far, "limit_slot", far])
        .unwrap();
    server.command(&["ZADD", &k.delayed, far, "j1"]).unwrap();
    server.command(&["ZADD", &index, "1", "j1"]).unwrap();
    let (ok, out, err) = run(
        &[
            "queue",
            "limit",
            "-q",
            "emails",
            "--key",
            "acme",
            "--release",
            "--json",
        ],
        &url,
    );
    assert!(ok, "{out}{err}");
    let v: serde_json::Value = serde_json::from_str(out.trim()).expect(&out);
    assert_eq!(v["released"], 1, "{out}");
    assert!(
        v.get("unreadable").is_some(),
        "still the limits object: {out}"
    );
}
