//! The binary as an operator runs it, against a real redis-server.

use std::process::Command;

use queue_testkit::RedisServer;

const BIN: &str = env!("CARGO_BIN_EXE_queue-watchdog");

fn run(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(BIN).args(args).output().expect("binary runs");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Puts job `id` in processing with a lease that expired, as a dead worker leaves it.
fn expired_delivery(server: &RedisServer, id: &str, attempts: u32, max: u32) {
    let key = format!("q:{{emails}}:job:{id}");
    server
        .command(&[
            "HSET", &key, "state", "active", "type", "send", "v", "1", "attempts", &attempts.to_string(),
            "max_attempts", &max.to_string(), "token", "t1", "payload", "x",
        ])
        .unwrap();
    server.command(&["LPUSH", "q:{emails}:processing", id]).unwrap();
    server.command(&["ZADD", "q:{emails}:leases", "1", id]).unwrap();
}

#[test]
fn run_once_reclaims_and_dead_letters_and_reports_counts() {
    let server = RedisServer::start().unwrap();
    let url = server.url();
    expired_delivery(&server, "a", 1, 5);
    expired_delivery(&server, "b", 5, 5);
    let (ok, stdout, stderr) = run(&["run", "--redis", &url, "--queue", "emails", "--once", "--backoff-base-ms", "1"]);
    assert!(ok, "{stderr}");
    assert!(stdout.contains("reclaimed=1 dead_lettered=1"), "{stdout}");
    assert!(stderr.contains("watchdog pass"), "tracing line per pass: {stderr}");

    let (ok, stdout, _) = run(&["dead", "list", "--redis", &url, "--queue", "emails"]);
    assert!(ok);
    assert!(stdout.contains("b\t") && stdout.contains("attempts exhausted (5 of 5)"), "{stdout}");

    let (ok, stdout, _) = run(&["stats", "--redis", &url, "--queue", "emails", "--json"]);
    assert!(ok);
    assert!(stdout.contains("\"dead\":1"), "{stdout}");

    let (ok, _, stderr) = run(&["dead", "replay", "--redis", &url, "--queue", "emails", "--dry-run", "b"]);
    assert!(ok);
    assert!(stderr.contains("would replay 1"), "{stderr}");
    let (ok, stdout, _) = run(&["dead", "replay", "--redis", &url, "--queue", "emails", "b", "--reset-attempts"]);
    assert!(ok && stdout.contains("replayed b"), "{stdout}");
    assert!(server.command(&["LRANGE", "q:{emails}:main", "0", "-1"]).unwrap().contains('b'));
    let (ok, _, stderr) = run(&["dead", "replay", "--redis", &url, "--queue", "emails", "nope"]);
    assert!(!ok, "replaying an unknown id fails: {stderr}");
}

#[test]
fn unreachable_redis_is_a_clear_error() {
    let port = queue_testkit::free_port().unwrap();
    let url = format!("redis://127.0.0.1:{port}/");
    let (ok, _, stderr) = run(&["stats", "--redis", &url, "--queue", "emails"]);
    assert!(!ok);
    assert!(stderr.contains("cannot connect to redis"), "{stderr}");
}
