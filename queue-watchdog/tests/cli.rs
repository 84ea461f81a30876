//! The binary as an operator runs it, against a real redis-server.

use std::process::Command;

use queue_testkit::RedisServer;

#[path = "support/metrics_run.rs"]
mod metrics_run;
#[path = "support/results_seed.rs"]
mod results_seed;

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
            "HSET",
            &key,
            "state",
            "active",
            "type",
            "send",
            "v",
            "1",
            "attempts",
            &attempts.to_string(),
            "max_attempts",
            &max.to_string(),
            "token",
            "t1",
            "payload",
            "x",
        ])
        .unwrap();
    server
        .command(&["LPUSH", "q:{emails}:processing", id])
        .unwrap();
    server
        .command(&["ZADD", "q:{emails}:leases", "1", id])
        .unwrap();
}

#[test]
fn run_once_reclaims_and_dead_letters_and_reports_counts() {
    let server = RedisServer::start().unwrap();
    let url = server.url();
    expired_delivery(&server, "a", 1, 5);
    expired_delivery(&server, "b", 5, 5);
    let (ok, stdout, stderr) = run(&[
        "run",
        "--redis",
        &url,
        "--queue",
        "emails",
        "--once",
        "--backoff-base-ms",
        "1",
    ]);
    assert!(ok, "{stderr}");
    assert!(stdout.contains("reclaimed=1 dead_lettered=1"), "{stdout}");
    assert!(
        stderr.contains("watchdog pass"),
        "tracing line per pass: {stderr}"
    );

    let (ok, stdout, _) = run(&["dead", "list", "--redis", &url, "--queue", "emails"]);
    assert!(ok);
    assert!(
        stdout.contains("b\t") && stdout.contains("attempts exhausted (5 of 5)"),
        "{stdout}"
    );

    let (ok, stdout, _) = run(&["stats", "--redis", &url, "--queue", "emails", "--json"]);
    assert!(ok);
    assert!(stdout.contains("\"dead\":1"), "{stdout}");

    let (ok, _, stderr) = run(&[
        "dead",
        "replay",
        "--redis",
        &url,
        "--queue",
        "emails",
        "--dry-run",
        "b",
    ]);
    assert!(ok);
    assert!(stderr.contains("would replay 1"), "{stderr}");
    let (ok, stdout, _) = run(&[
        "dead",
        "replay",
        "--redis",
        &url,
        "--queue",
        "emails",
        "b",
        "--reset-attempts",
    ]);
    assert!(ok && stdout.contains("replayed b"), "{stdout}");
    assert!(server
        .command(&["LRANGE", "q:{emails}:main", "0", "-1"])
        .unwrap()
        .contains('b'));
    let (ok, _, stderr) = run(&[
        "dead", "replay", "--redis", &url, "--queue", "emails", "nope",
    ]);
    assert!(!ok, "replaying an unknown id fails: {stderr}");
}

#[test]
fn unreachable_redis_is_a_clear_error() {
    // Held for the whole test: refused, and no other test's server takes it.
    let nobody = queue_testkit::RefusingPort::bind().unwrap();
    let (ok, _, stderr) = run(&["stats", "--redis", &nobody.redis_url(), "--queue", "emails"]);
    assert!(!ok);
    assert!(stderr.contains("cannot connect to redis"), "{stderr}");
}

// ------------------------------------------------------------------------
// stats, jobs show, dead list/replay/purge, run --metrics-listen, --help

use std::io::Write;
use std::time::{Duration, Instant};

use queue_core::{
    BoxFuture, EnqueueOptions, Job, JobContext, JobError, Queue, Registration, Worker,
};
use serde_json::Value;

#[derive(serde::Serialize, serde::Deserialize)]
struct Ping {
    n: u32,
}

struct PingJob;
impl Job for PingJob {
    type Args = Ping;
    const NAME: &'static str = "ping";
    const QUEUE: &'static str = "emails";
    fn run(ctx: JobContext, _args: Ping) -> BoxFuture<'static, Result<(), JobError>> {
        Box::pin(async move {
            ctx.step("notify", || async { Ok::<_, JobError>(1u8) })
                .await?;
            Ok(())
        })
    }
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// Runs `n` ping jobs to completion through a real worker.
fn complete_pings(url: &str, ids: &[&str]) {
    rt().block_on(async {
        let queue = Queue::connect(url).await.unwrap();
        for (i, id) in ids.iter().enumerate() {
            queue
                .enqueue_with::<PingJob>(EnqueueOptions::new().id(*id), &Ping { n: i as u32 })
                .await
                .unwrap();
        }
        let worker = Worker::builder(url)
            .register(Registration::of::<PingJob>())
            .build()
            .await
            .unwrap();
        let want = ids.len() as i64;
        let q = queue.clone();
        worker
            .run_until(async move {
                for _ in 0..200 {
                    if q.stats("emails").await.unwrap().counter("completed") >= want {
                        return;
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            })
            .await
            .unwrap();
    });
}

fn server_ms(server: &RedisServer) -> i64 {
    let t = server.command(&["TIME"]).unwrap();
    let secs: i64 = t.lines().nth(2).unwrap().trim().parse().unwrap();
    secs * 1000
}

fn seed_job(server: &RedisServer, queue: &str, id: &str, fields: &[(&str, &str)]) {
    let key = format!("q:{{{queue}}}:job:{id}");
    let mut args = vec!["HSET", key.as_str(), "id", id];
    for (k, v) in fields {
        args.push(k);
        args.push(v);
    }
    server.command(&args).unwrap();
}

#[test]
fn stats_tells_lost_from_slow_and_shows_throughput() {
    let server = RedisServer::start().unwrap();
    let url = server.url();
    complete_pings(&url, &["p1", "p2", "p3"]);
    let now = server_ms(&server);
    // Slow: a job has waited in main for two minutes.
    let old = (now - 125_000).to_string();
    seed_job(
        &server,
        "emails",
        "waiting-1",
        &[("state", "queued"), ("type", "ping"), ("enqueued_at", &old)],
    );
    server
        .command(&["LPUSH", "q:{emails}:main", "waiting-1"])
        .unwrap();
    // Lost: a delivery whose lease expired 20 s ago.
    expired_delivery(&server, "lost-1", 1, 5);
    let expired = (now - 20_000).to_string();
    server
        .command(&["ZADD", "q:{emails}:leases", &expired, "lost-1"])
        .unwrap();

    // Without --queue the queues are discovered.
    let (ok, stdout, stderr) = run(&["stats", "--redis", &url]);
    assert!(ok, "{stderr}");
    let header = stdout.lines().next().unwrap();
    for col in [
        "waiting",
        "oldest",
        "processing",
        "lost",
        "done/min",
        "retried",
        "dead-lettered",
    ] {
        assert!(header.contains(col), "{header}");
    }
    let row = stdout.lines().nth(1).unwrap();
    assert!(row.starts_with("emails"), "{row}");
    assert!(row.contains("2m0"), "oldest waiting ~2m05s: {row}");
    assert!(stdout.contains("1 job(s) LOST in processing"), "{stdout}");
    assert!(
        stdout.contains("SLOW: the oldest waiting job has waited 2m0"),
        "{stdout}"
    );

    let (ok, stdout, _) = run(&["stats", "--redis", &url, "-q", "emails", "--json"]);
    assert!(ok);
    let v: Value = serde_json::from_str(stdout.trim()).unwrap();
    let s = &v[0];
    assert_eq!(s["queue"], "emails");
    assert_eq!(s["main"], 1);
    assert_eq!(s["processing"], 1);
    assert_eq!(s["expired_leases"], 1);
    assert_eq!(s["completed_last_minute"], 3);
    assert_eq!(s["counters"]["completed"], 3);
    assert!(s["oldest_waiting_ms"].as_u64().unwrap() >= 120_000, "{s}");
}

#[test]
fn jobs_show_prints_where_a_job_is_its_lease_and_history() {
    let server = RedisServer::start().unwrap();
    let url = server.url();
    complete_pings(&url, &["done-1"]);
    let now = server_ms(&server);
    let (delivered, lease) = ((now - 5_000).to_string(), (now + 60_000).to_string());
    seed_job(
        &server,
        "emails",
        "running-1",
        &[
            ("state", "active"),
            ("type", "ping"),
            ("v", "1"),
            ("attempts", "2"),
            ("max_attempts", "5"),
            ("enqueued_at", &delivered),
            ("delivered_at", &delivered),
            ("failed_at", &delivered),
            ("last_error", "smtp-timeout"),
            ("lease_until", &lease),
            ("token", "t"),
        ],
    );
    server
        .command(&["LPUSH", "q:{emails}:processing", "running-1"])
        .unwrap();
    server
        .command(&["ZADD", "q:{emails}:leases", &lease, "running-1"])
        .unwrap();

    let (ok, stdout, stderr) = run(&["jobs", "show", "running-1", "--redis", &url, "-q", "emails"]);
    assert!(ok, "{stderr}");
    assert!(stdout.contains("job running-1 (queue emails)"), "{stdout}");
    // "lease 59.9s left", or "60.0s" when the CLI reads the clock within
    // 50 ms of the seeding (seen once): the bound is checked on the JSON below.
    assert!(
        stdout.contains("where     processing (running; lease ") && stdout.contains("s left)"),
        "{stdout}"
    );
    assert!(stdout.contains("attempts  2 of 5"), "{stdout}");
    assert!(stdout.contains("failed         smtp-timeout"), "{stdout}");
    assert!(stdout.contains("delivered      attempt 2"), "{stdout}");
    // Timestamps are readable: `2026-12-02 13:05:01.123Z (1796...)`.
    let line = stdout
        .lines()
        .find(|l| l.trim_start().starts_with("delivered_at"))
        .unwrap();
    assert!(line.contains("Z ("), "{line}");

    let (ok, stdout, _) = run(&["jobs", "show", "running-1", "--redis", &url, "--json"]);
    assert!(ok);
    let v: Value = serde_json::from_str(stdout.trim()).unwrap();
    assert_eq!(v["location"]["list"], "processing");
    assert_eq!(v["location"]["status"], "running");
    let left = v["location"]["lease_left_ms"].as_i64().unwrap();
    assert!(left > 50_000 && left <= 60_000, "{left}");

    // A completed job: its completion record and its steps.
    let (ok, stdout, _) = run(&["jobs", "show", "done-1", "--redis", &url, "-q", "emails"]);
    assert!(ok);
    assert!(stdout.contains("where     completed"), "{stdout}");
    assert!(stdout.contains("completion record\n"), "{stdout}");
    assert!(stdout.contains("status        done"), "{stdout}");
    assert!(stdout.contains("steps: notify"), "{stdout}");
    assert!(
        stdout.contains("completed      status done after 1 attempt(s)"),
        "{stdout}"
    );

    let (ok, _, stderr) = run(&["jobs", "show", "nope", "--redis", &url, "-q", "emails"]);
    assert!(!ok);
    assert!(stderr.contains("no job \"nope\""), "{stderr}");
}

fn seed_dead(server: &RedisServer, id: &str, job_type: &str, reason: &str) {
    // The reason goes through HSET on the inline protocol: no spaces.
    seed_job(
        server,
        "emails",
        id,
        &[
            ("state", "dead"),
            ("type", job_type),
            ("attempts", "3"),
            ("max_attempts", "3"),
            ("dead_reason", reason),
            ("dead_at", "1796000000000"),
            ("payload", "x"),
        ],
    );
    server.command(&["LPUSH", "q:{emails}:dead", id]).unwrap();
}

fn lrange(server: &RedisServer, key: &str) -> String {
    server.command(&["LRANGE", key, "0", "-1"]).unwrap()
}

#[test]
fn dead_letters_filter_replay_and_purge() {
    let server = RedisServer::start().unwrap();
    let url = server.url();
    seed_dead(&server, "t1", "send", "SMTP-timeout-after-30s");
    seed_dead(&server, "bad", "send", "invalid-address");
    seed_dead(&server, "t2", "charge", "gateway-timeout");
    seed_dead(&server, "other", "resize", "image-too-large");
    server
        .command(&["HSET", "q:{emails}:steps:other", "s", "x"])
        .unwrap();

    list_filters_by_reason_and_type(&url);
    replay_by_filter(&server, &url);
    purge_needs_confirmation(&server, &url);
    purge_asks_on_a_terminal(&server, &url);
    purge_with_yes_and_replay_needs_ids(&server, &url);
}

/// `dead list --filter` matches the reason or the type, text or JSON.
fn list_filters_by_reason_and_type(url: &str) {
    let (ok, stdout, stderr) = run(&[
        "dead", "list", "--redis", url, "-q", "emails", "--filter", "TIMEOUT",
    ]);
    assert!(ok, "{stderr}");
    assert_eq!(stdout.lines().count(), 2, "{stdout}");
    assert!(
        stdout.contains("t1\t") && stdout.contains("t2\t"),
        "{stdout}"
    );
    assert!(stdout.contains("died=2026-"), "{stdout}");
    assert!(
        stderr.contains("2 dead-lettered job(s) shown of 4"),
        "{stderr}"
    );
    // Filter by type too.
    let (_, stdout, _) = run(&[
        "dead", "list", "--redis", url, "-q", "emails", "--filter", "charge", "--json",
    ]);
    let v: Value = serde_json::from_str(stdout.trim()).unwrap();
    assert_eq!(v.as_array().unwrap().len(), 1);
    assert_eq!(v[0]["id"], "t2");
}

/// `dead replay --filter`: a dry run changes nothing, then both timeouts go back to main.
fn replay_by_filter(server: &RedisServer, url: &str) {
    // Dry run changes nothing.
    let (ok, stdout, stderr) = run(&[
        "dead",
        "replay",
        "--redis",
        url,
        "-q",
        "emails",
        "--filter",
        "timeout",
        "--dry-run",
    ]);
    assert!(ok);
    assert!(
        stdout.contains("would replay t1") && stdout.contains("would replay t2"),
        "{stdout}"
    );
    assert!(stderr.contains("would replay 2 job(s)"), "{stderr}");
    assert!(!lrange(server, "q:{emails}:main").contains("t1"));

    let (ok, stdout, _) = run(&[
        "dead",
        "replay",
        "--redis",
        url,
        "-q",
        "emails",
        "--filter",
        "timeout",
        "--reset-attempts",
        "--json",
    ]);
    assert!(ok);
    let v: Value = serde_json::from_str(stdout.trim()).unwrap();
    assert_eq!(v["replayed"].as_array().unwrap().len(), 2, "{v}");
    let main = lrange(server, "q:{emails}:main");
    assert!(main.contains("t1") && main.contains("t2"), "{main}");
    assert!(server
        .command(&["HGET", "q:{emails}:job:t1", "attempts"])
        .unwrap()
        .contains('0'));
    let dead = lrange(server, "q:{emails}:dead");
    assert!(
        dead.contains("bad") && dead.contains("other") && !dead.contains("t1"),
        "{dead}"
    );
}

/// `dead purge` refuses without a terminal and `--yes`; `--all --dry-run` only lists.
fn purge_needs_confirmation(server: &RedisServer, url: &str) {
    // Purge refuses without a terminal and without --yes.
    let out = Command::new(BIN)
        .args(["dead", "purge", "--redis", url, "-q", "emails", "bad"])
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr)
        .contains("refusing to purge 1 job(s) without confirmation"));
    assert!(lrange(server, "q:{emails}:dead").contains("bad"));

    // Dry run of --all lists, changes nothing.
    let (ok, stdout, _) = run(&[
        "dead",
        "purge",
        "--redis",
        url,
        "-q",
        "emails",
        "--all",
        "--dry-run",
    ]);
    assert!(ok);
    assert!(
        stdout.contains("would purge bad") && stdout.contains("would purge other"),
        "{stdout}"
    );
}

fn purge_asks_on_a_terminal(server: &RedisServer, url: &str) {
    // On a terminal it asks; "no" keeps the job, "yes" deletes it (list entry,
    // hash and step results in one script).
    if let Some(answer) = purge_on_a_tty(url, "other", "no\n") {
        assert!(answer.contains("Type 'yes' to continue"), "{answer}");
        assert!(answer.contains("aborted"), "{answer}");
        assert!(lrange(server, "q:{emails}:dead").contains("other"));
        let answer = purge_on_a_tty(url, "other", "yes\n").unwrap();
        assert!(answer.contains("purged other"), "{answer}");
        assert!(!lrange(server, "q:{emails}:dead").contains("other"));
        assert!(server
            .command(&["EXISTS", "q:{emails}:job:other"])
            .unwrap()
            .contains(":0"));
        assert!(server
            .command(&["EXISTS", "q:{emails}:steps:other"])
            .unwrap()
            .contains(":0"));
    } else {
        eprintln!("`script` (util-linux) not found: terminal prompt not exercised");
    }
}

fn purge_with_yes_and_replay_needs_ids(server: &RedisServer, url: &str) {
    // --yes purges; an id not dead-lettered is reported and exits 1.
    let (ok, stdout, stderr) = run(&[
        "dead", "purge", "--redis", url, "-q", "emails", "bad", "t1", "--yes", "--json",
    ]);
    assert!(!ok, "t1 is not dead any more");
    assert!(
        stderr.contains("not in the dead-letter list: t1"),
        "{stderr}"
    );
    let v: Value = serde_json::from_str(stdout.trim()).unwrap();
    assert_eq!(v["purged"], serde_json::json!(["bad"]));
    assert!(
        lrange(server, "q:{emails}:main").contains("t1"),
        "t1 untouched"
    );
    let stats = server
        .command(&["HGET", "q:{emails}:stats", "purged"])
        .unwrap();
    assert!(stats.contains('1') || stats.contains('2'), "{stats}");

    // Replay needs ids, --filter or --all.
    let (ok, _, stderr) = run(&["dead", "replay", "--redis", url, "-q", "emails"]);
    assert!(!ok);
    assert!(stderr.contains("<IDS|--filter <FILTER>|--all>"), "{stderr}");

    // A blank filter (an unset shell variable) would select every dead
    // letter: refused before anything is read, nothing changes.
    seed_dead(server, "t3", "send", "SMTP-timeout-after-30s");
    let before = server
        .command(&["LLEN", &queue_core::QueueKeys::new("emails").dead])
        .unwrap();
    for blank in ["", "  "] {
        for verb in [&["purge", "--yes"][..], &["replay"]] {
            let mut args = vec!["dead"];
            args.extend_from_slice(verb);
            args.extend_from_slice(&["--redis", url, "-q", "emails", "--filter", blank]);
            let (ok, _, stderr) = run(&args);
            assert!(!ok, "{verb:?} --filter {blank:?} ran");
            assert!(stderr.contains("use --all"), "{stderr}");
        }
    }
    let after = server
        .command(&["LLEN", &queue_core::QueueKeys::new("emails").dead])
        .unwrap();
    assert_eq!(before, after);
    assert!(!after.trim().ends_with(":0"), "{after}");
}

/// Runs `dead purge <id>` on a pseudo-terminal (util-linux `script`), typing `answer`.
fn purge_on_a_tty(url: &str, id: &str, answer: &str) -> Option<String> {
    if Command::new("script").arg("--version").output().is_err() {
        return None;
    }
    let cmd = format!("{BIN} dead purge --redis {url} -q emails {id}");
    let mut child = Command::new("script")
        .args(["-qec", &cmd, "/dev/null"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .ok()?;
    // Let the prompt appear before typing.
    std::thread::sleep(Duration::from_millis(500));
    child
        .stdin
        .take()
        .unwrap()
        .write_all(answer.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    Some(String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr))
}

#[test]
fn run_serves_prometheus_metrics() {
    let server = RedisServer::start().unwrap();
    let url = server.url();
    expired_delivery(&server, "lost-1", 1, 5);
    seed_job(
        &server,
        "emails",
        "w1",
        &[("state", "queued"), ("type", "send"), ("enqueued_at", "1")],
    );
    server.command(&["LPUSH", "q:{emails}:main", "w1"]).unwrap();
    let watchdog = metrics_run::run_with_metrics(&[
        "run",
        "--redis",
        &url,
        "-q",
        "emails",
        "--interval-ms",
        "100",
    ]);
    let body = watchdog.wait_for(
        "queue_jobs_reclaimed_total{queue=\"emails\"} 1",
        Duration::from_secs(20),
    );
    drop(watchdog);
    for needle in [
        "# TYPE queue_jobs_reclaimed_total counter",
        "queue_depth{queue=\"emails\",list=\"main\"}",
        "queue_depth{queue=\"emails\",list=\"delayed\"}",
        "queue_oldest_job_age_seconds{queue=\"emails\"}",
        "queue_completed_last_minute{queue=\"emails\"} 0",
    ] {
        assert!(body.contains(needle), "missing {needle} in\n{body}");
    }
}

#[test]
fn help_describes_every_subcommand() {
    let (ok, stdout, _) = run(&["--help"]);
    assert!(ok);
    for sub in ["run", "stats", "jobs", "dead", "doctor", "dashboard"] {
        assert!(stdout.contains(&format!("\n  {sub} ")), "{sub}: {stdout}");
    }
    let (ok, stdout, _) = run(&["dead", "purge", "--help"]);
    assert!(ok);
    assert!(
        stdout.contains("--yes") && stdout.contains("--dry-run") && stdout.contains("--filter"),
        "{stdout}"
    );
    let (ok, stdout, _) = run(&["doctor", "--help"]);
    assert!(ok && stdout.contains("--strict"), "{stdout}");
}

/// `queue pause|resume` and `jobs cancel` (docs/FLOW-CONTROL.md).
#[test]
fn queue_pause_resume_and_jobs_cancel() {
    let server = RedisServer::start().unwrap();
    let url = server.url();
    let flow = |args: &[&str]| {
        let mut all = args.to_vec();
        all.extend(["--redis", &url]);
        run(&all)
    };
    let (ok, out, _) = flow(&["queue", "pause", "-q", "emails"]);
    assert!(ok && out.contains("queue emails paused"), "{out}");
    let (ok, out, _) = flow(&["queue", "pause", "-q", "emails", "--json"]);
    assert!(ok && out.contains(r#""was_paused":true"#), "{out}");
    let (_, out, _) = flow(&["stats", "-q", "emails"]);
    assert!(out.contains("PAUSED since"), "{out}");
    let (ok, out, _) = flow(&["queue", "resume", "-q", "emails"]);
    assert!(ok && out.contains("resumed"), "{out}");
    let (_, out, _) = flow(&["stats", "-q", "emails"]);
    assert!(!out.contains("PAUSED"), "{out}");

    server
        .command(&[
            "HSET",
            "q:{emails}:job:w1",
            "id",
            "w1",
            "state",
            "queued",
            "type",
            "send",
            "attempts",
            "0",
        ])
        .unwrap();
    server.command(&["LPUSH", "q:{emails}:main", "w1"]).unwrap();
    // Without -q the job's queue is found by discovery.
    let (ok, out, err) = flow(&["jobs", "cancel", "w1"]);
    assert!(
        ok && out.contains("cancelled (it was queued)"),
        "{out}{err}"
    );
    let status = server
        .command(&["HGET", "q:{emails}:done:w1", "status"])
        .unwrap();
    assert!(status.contains("cancelled"), "{status}");
    let (ok, out, _) = flow(&["jobs", "cancel", "w1", "-q", "emails"]);
    assert!(!ok && out.contains("already finished"), "{out}");
    let (_, out, _) = flow(&["jobs", "show", "w1", "-q", "emails"]);
    assert!(out.contains("where     cancelled"), "{out}");
    let (ok, out, _) = flow(&["jobs", "cancel", "nope", "-q", "emails", "--json"]);
    assert!(!ok && out.contains(r#""outcome":"NotFound""#), "{out}");
}

#[test]
fn jobs_show_prints_progress_typed_results_and_expiry() {
    let server = RedisServer::start().unwrap();
    let url = server.url();
    results_seed::seed_progress_result_and_expiry(&server);
    let show = |id: &str| {
        let (ok, stdout, stderr) = run(&["jobs", "show", id, "--redis", &url, "-q", "emails"]);
        assert!(ok, "{stderr}");
        stdout
    };
    let running = show("p1");
    assert!(
        running.contains("  progress  50 — half way (at 2025-"),
        "{running}"
    );
    let done = show("r1");
    assert!(done.contains(r#"{"n":7} (MessagePack)"#), "{done}");
    let expired = show("x1");
    assert!(
        expired.contains("expired: not started before its deadline"),
        "{expired}"
    );
}

/// `run --interval-ms 0` would run passes back to back (a busy loop on
/// Redis, and a flood of warnings while it fails): refused at the start.
#[test]
fn run_refuses_an_interval_of_zero() {
    let server = RedisServer::start().unwrap();
    let url = server.url();
    let out = Command::new(BIN)
        .args([
            "run",
            "--redis",
            &url,
            "-q",
            "emails",
            "--interval-ms",
            "0",
            "--once",
        ])
        .output()
        .expect("binary runs");
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("--interval-ms"));
}

/// `n` dead letters `d0`…, then one entry `bad` (newest) whose job key is
/// a string (corrupt data), through one pipeline.
fn seed_dead_with_a_corrupt_entry(url: &str, n: usize) {
    rt().block_on(async {
        let queue = Queue::connect(url).await.unwrap();
        let k = queue_core::QueueKeys::new("emails");
        let mut pipe = redis::pipe();
        for i in 0..n {
            let id = format!("d{i}");
            pipe.cmd("HSET")
                .arg(k.job(&id))
                .arg(&["id", &id, "state", "dead", "type", "send"])
                .arg(&["dead_reason", "SMTP timeout", "dead_at", "1796000000000"])
                .arg(&["payload", "x"])
                .ignore();
            pipe.cmd("LPUSH").arg(&k.dead).arg(&id).ignore();
        }
        pipe.cmd("SET").arg(k.job("bad")).arg("x").ignore();
        // In the middle of the list: the chunks before and after it go on.
        pipe.cmd("LINSERT")
            .arg(&k.dead)
            .arg("BEFORE")
            .arg(format!("d{}", n / 2))
            .arg("bad")
            .ignore();
        let () = pipe.query_async(&mut queue.connection()).await.unwrap();
    });
}

/// `dead list` over a dead entry whose job key holds another type: the
/// listing shows it with the reason instead of failing whole (WRONGTYPE,
/// nothing listed), with and without a filter.
#[test]
fn dead_list_shows_an_unreadable_entry_instead_of_failing() {
    let server = RedisServer::start().unwrap();
    let url = server.url();
    seed_dead_with_a_corrupt_entry(&url, 4);
    let (ok, stdout, stderr) = run(&["dead", "list", "--redis", &url, "-q", "emails"]);
    assert!(ok, "{stderr}");
    assert_eq!(
        stdout.lines().filter(|l| l.starts_with('d')).count(),
        4,
        "{stdout}"
    );
    let bad = stdout
        .lines()
        .find(|l| l.starts_with("bad\t"))
        .unwrap_or_else(|| panic!("{stdout}"));
    assert!(bad.contains("WRONGTYPE"), "{bad}");
    let (ok, stdout, stderr) = run(&[
        "dead", "list", "--redis", &url, "-q", "emails", "--filter", "smtp",
    ]);
    assert!(ok, "{stderr}");
    assert_eq!(
        stdout.lines().filter(|l| l.starts_with('d')).count(),
        4,
        "{stdout}"
    );
    // Filtered, the unreadable entry is still shown (replay and purge with
    // the same filter report it too).
    assert!(stdout.lines().any(|l| l.starts_with("bad\t")), "{stdout}");
}

/// A dead entry whose job key holds another type (corrupt data) among
/// 2,500 good ones: `replay --all` and `purge --all` handle every good one,
/// chunk by chunk, and report the bad one (exit 1). Before, the selection
/// read every job with its payload first (HGETALL), and the corrupt one
/// failed it with WRONGTYPE: nothing was replayed or purged.
#[test]
fn replay_and_purge_all_skip_and_report_an_unreadable_dead_entry() {
    let server = RedisServer::start().unwrap();
    let url = server.url();
    let k = queue_core::QueueKeys::new("emails");
    seed_dead_with_a_corrupt_entry(&url, 2_500);
    let (ok, stdout, stderr) = run(&[
        "dead", "replay", "--redis", &url, "-q", "emails", "--all", "--json",
    ]);
    assert!(!ok, "an entry was skipped: exit 1");
    assert!(!stdout.trim().is_empty(), "the run was aborted: {stderr}");
    let v: Value = serde_json::from_str(stdout.trim()).unwrap();
    assert_eq!(v["replayed"].as_array().unwrap().len(), 2_500, "{stderr}");
    assert_eq!(v["unreadable"], serde_json::json!(["bad"]));
    assert!(
        stderr.contains("skipped bad: corrupt job key: holds a string"),
        "{stderr}"
    );
    assert_eq!(lrange(&server, &k.dead).trim_end(), "*1\r\n$3\r\nbad");
    assert!(server
        .command(&["LLEN", &k.main])
        .unwrap()
        .contains(":2500"));

    // Dead again (a purge picks dead jobs), then purged.
    server.command(&["DEL", &k.main, &k.dead]).unwrap();
    seed_dead_with_a_corrupt_entry(&url, 2_500);
    let (ok, stdout, stderr) = run(&[
        "dead", "purge", "--redis", &url, "-q", "emails", "--all", "--yes", "--json",
    ]);
    assert!(!ok, "an entry was skipped: exit 1");
    assert!(!stdout.trim().is_empty(), "the run was aborted: {stderr}");
    let v: Value = serde_json::from_str(stdout.trim()).unwrap();
    assert_eq!(v["purged"].as_array().unwrap().len(), 2_500, "{stderr}");
    assert_eq!(v["unreadable"], serde_json::json!(["bad"]));
    assert_eq!(lrange(&server, &k.dead).trim_end(), "*1\r\n$3\r\nbad");
    assert!(server
        .command(&["EXISTS", &k.job("d7")])
        .unwrap()
        .contains(":0"));
}

/// A dead job whose type is not UTF-8 (the worker dead-letters such a job
/// on purpose: its claim row does not decode) next to a normal one:
/// `dead replay --all` replays both (exit 0), `dead list` shows the type
/// lossily. Before, the selection's scan decoded the rows as strings and
/// failed whole: nothing was replayed (exit 2).
#[test]
fn replay_all_takes_a_dead_job_whose_type_is_not_utf8() {
    let server = RedisServer::start().unwrap();
    let url = server.url();
    let k = queue_core::QueueKeys::new("emails");
    seed_dead(&server, "plain", "send", "refused");
    seed_dead(&server, "odd", "send", "claim-row-unreadable");
    let mut c = redis::Client::open(url.as_str())
        .unwrap()
        .get_connection()
        .unwrap();
    let () = redis::cmd("HSET")
        .arg(k.job("odd"))
        .arg("type")
        .arg(b"\xff\xfe".as_slice())
        .query(&mut c)
        .unwrap();
    let (ok, stdout, stderr) = run(&["dead", "list", "--redis", &url, "-q", "emails"]);
    assert!(ok, "{stderr}");
    assert!(stdout.contains("odd\ttype=\u{FFFD}\u{FFFD}"), "{stdout}");

    let (ok, stdout, stderr) = run(&[
        "dead", "replay", "--redis", &url, "-q", "emails", "--all", "--json",
    ]);
    assert!(ok, "{stderr}");
    let v: Value = serde_json::from_str(stdout.trim()).unwrap();
    assert_eq!(v["replayed"], serde_json::json!(["odd", "plain"]), "{v}");
    assert_eq!(v["unreadable"], serde_json::json!([]));
    let main = lrange(&server, &k.main);
    assert!(main.contains("odd") && main.contains("plain"), "{main}");
    assert!(server.command(&["LLEN", &k.dead]).unwrap().contains(":0"));
}

/// One lifetime counter that is not a number (`HSET q:{emails}:stats dead
/// x`): `stats` still shows every queue (exit 0), the bad counter left out
/// (`check` reports it). Before, the snapshot failed whole, and `stats`
/// failed for all queues.
#[test]
fn stats_leaves_out_a_counter_that_is_not_a_number() {
    let server = RedisServer::start().unwrap();
    let url = server.url();
    let k = queue_core::QueueKeys::new("emails");
    seed_job(
        &server,
        "emails",
        "w1",
        &[("state", "queued"), ("type", "ping")],
    );
    server.command(&["LPUSH", &k.main, "w1"]).unwrap();
    server
        .command(&["HSET", &k.stats, "enqueued", "1", "dead", "x"])
        .unwrap();
    let (ok, stdout, stderr) = run(&["stats", "--redis", &url]);
    assert!(ok, "{stderr}");
    assert!(
        stdout.lines().nth(1).unwrap().starts_with("emails"),
        "{stdout}"
    );
    let (ok, stdout, stderr) = run(&["stats", "--redis", &url, "-q", "emails", "--json"]);
    assert!(ok, "{stderr}");
    let v: Value = serde_json::from_str(stdout.trim()).unwrap();
    assert_eq!(v[0]["main"], 1);
    assert_eq!(v[0]["counters"], serde_json::json!({"enqueued": 1}));
}

/// A dead reason (an error message, often carrying user input) with an ESC
/// sequence and a newline: `dead list` prints them as escapes, so they can
/// neither rewrite the operator's terminal nor split the job's line.
#[test]
fn dead_list_escapes_control_characters_of_a_reason() {
    let server = RedisServer::start().unwrap();
    let url = server.url();
    let k = queue_core::QueueKeys::new("emails");
    let mut c = redis::Client::open(url.as_str())
        .unwrap()
        .get_connection()
        .unwrap();
    let () = redis::cmd("HSET")
        .arg(k.job("esc"))
        .arg(&["id", "esc", "state", "dead", "type", "send\u{7}"])
        .arg(&[
            "dead_reason",
            "bad input \u{1b}[2J\u{1b}[H\nfake line",
            "dead_at",
            "1796000000000",
        ])
        .query(&mut c)
        .unwrap();
    let () = redis::cmd("LPUSH")
        .arg(&k.dead)
        .arg("esc")
        .query(&mut c)
        .unwrap();
    let (ok, stdout, stderr) = run(&["dead", "list", "--redis", &url, "-q", "emails"]);
    assert!(ok, "{stderr}");
    assert!(
        !stdout.contains('\u{1b}') && !stdout.contains('\u{7}'),
        "{stdout:?}"
    );
    let line = stdout
        .lines()
        .find(|l| l.starts_with("esc\t"))
        .unwrap_or_else(|| panic!("{stdout}"));
    assert!(line.contains("type=send\\u{7}"), "{line}");
    assert!(
        line.contains("bad input \\u{1b}[2J\\u{1b}[H\\nfake line"),
        "{line}"
    );
}

/// A job id (enqueue accepts it: it has no control character) and a reason
/// with a bidi override, an isolate and a line separator: `dead list`
/// prints them as escapes, so they cannot reorder the operator's line
/// ("Trojan Source") or split it. Before, only control characters were
/// escaped, and the id not at all.
#[test]
fn dead_list_escapes_bidi_and_separator_characters_of_an_id_and_a_reason() {
    let server = RedisServer::start().unwrap();
    let url = server.url();
    let k = queue_core::QueueKeys::new("emails");
    let id = "a\u{202e}b";
    let rt = rt();
    rt.block_on(async {
        let queue = queue_core::Queue::connect(&url).await.unwrap();
        queue
            .enqueue_raw(
                "emails",
                "send",
                1,
                3,
                queue_core::EnqueueOptions::new().id(id),
                b"\x80",
            )
            .await
            .unwrap();
    });
    let mut c = redis::Client::open(url.as_str())
        .unwrap()
        .get_connection()
        .unwrap();
    let () = redis::cmd("HSET")
        .arg(k.job(id))
        .arg(&["state", "dead", "dead_at", "1796000000000"])
        .arg(&["dead_reason", "user \u{2066}input\u{2069}\u{2028}fake line"])
        .query(&mut c)
        .unwrap();
    let () = redis::cmd("LPUSH")
        .arg(&k.dead)
        .arg(id)
        .query(&mut c)
        .unwrap();
    let (ok, stdout, stderr) = run(&["dead", "list", "--redis", &url, "-q", "emails"]);
    assert!(ok, "{stderr}");
    assert!(
        !stdout.contains(['\u{202e}', '\u{2066}', '\u{2069}', '\u{2028}']),
        "{stdout:?}"
    );
    let line = stdout
        .lines()
        .find(|l| l.starts_with("a\\u{202e}b\t"))
        .unwrap_or_else(|| panic!("{stdout:?}"));
    assert!(
        line.contains("user \\u{2066}input\\u{2069}\\u{2028}fake line"),
        "{line}"
    );
    // The replay and purge previews and their outcomes print the id (and
    // the preview the reason) escaped too.
    let raw = ['\u{202e}', '\u{2066}', '\u{2069}', '\u{2028}'];
    for cmd in [
        &["dead", "replay", "--dry-run", "--all"][..],
        &["dead", "purge", "--dry-run", "--all"][..],
        &["dead", "replay", "--all"][..],
    ] {
        let mut args = cmd.to_vec();
        args.extend(["--redis", url.as_str(), "-q", "emails"]);
        let (ok, stdout, stderr) = run(&args);
        assert!(ok, "{cmd:?}: {stderr}");
        assert!(
            !stdout.contains(raw) && !stderr.contains(raw),
            "{cmd:?}: {stdout:?} {stderr:?}"
        );
        assert!(stdout.contains("a\\u{202e}b"), "{cmd:?}: {stdout:?}");
    }
}

/// A `--queue` an enqueue would refuse (`"emails "`, `{emails}`) is refused
/// by every command that takes one: exit 2, the reason on stderr, nothing
/// written. Before, `run -q "emails "` watched keys no enqueue creates (the
/// jobs of dead workers on `emails` were never returned) and `queue pause`
/// paused a queue nobody uses.
#[test]
fn a_queue_name_enqueues_refuse_is_refused_by_every_command() {
    let server = RedisServer::start().unwrap();
    let url = server.url();
    for bad in ["emails ", "{emails}"] {
        for cmd in [
            &["run", "--once", "-q", "emails", "-q", bad][..],
            &["stats", "-q", bad],
            &["dead", "list", "-q", bad],
            &["queue", "pause", "-q", bad],
            &["jobs", "show", "-q", bad, "j1"],
        ] {
            let out = Command::new(BIN)
                .args(cmd)
                .args(["--redis", &url])
                .output()
                .expect("binary runs");
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(2), "{cmd:?}: {stderr}");
            assert!(
                stderr.contains(&format!("{bad:?} is not a queue name")),
                "{cmd:?}: {stderr}"
            );
        }
    }
    assert_eq!(server.command(&["DBSIZE"]).unwrap().trim(), ":0");
}

/// `events --last 3 --follow` when the 3 newest entries of the stream are
/// another writer's (no `event`/`id` field: nothing decodes) after 8 real
/// events: it prints nothing old, then the next new event. Before, "no
/// decoded entry among the last 3" was read as "empty stream" and it
/// followed from the start: the 8 old events were printed again.
#[test]
fn events_follow_after_foreign_newest_entries_prints_nothing_old() {
    use std::io::{BufRead, BufReader};
    use std::process::Stdio;

    let server = RedisServer::start().unwrap();
    let url = server.url();
    let events = queue_core::QueueKeys::new("emails").events();
    let rt = rt();
    let queue = rt.block_on(Queue::connect(&url)).unwrap();
    let enqueue = |id: &str| {
        rt.block_on(queue.enqueue_raw(
            "emails",
            "send",
            1,
            3,
            EnqueueOptions::new().id(id),
            b"\x80",
        ))
        .unwrap();
    };
    rt.block_on(queue.set_events("emails", true)).unwrap();
    let old: Vec<String> = (0..8).map(|i| format!("old-{i}")).collect();
    for id in &old {
        enqueue(id);
    }
    for i in 0..3 {
        server
            .command(&["XADD", &events, "*", "other", &i.to_string()])
            .unwrap();
    }
    let mut child = Command::new(BIN)
        .args(["events", "--redis", &url, "-q", "emails", "--last", "3"])
        .arg("--follow")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let (tx, lines) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    // Once the follow blocks in XREAD (it has read what it was going to
    // read), a new event: the sign that it reached the end of the stream.
    let deadline = Instant::now() + Duration::from_secs(30);
    while !server
        .command(&["CLIENT", "LIST"])
        .unwrap()
        .contains("cmd=xread")
    {
        if Instant::now() >= deadline {
            let _ = child.kill();
            panic!("the follow never blocked in XREAD");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    enqueue("new-1");
    let mut printed = Vec::new();
    while !printed.iter().any(|l: &String| l.contains("new-1")) {
        let left = deadline.saturating_duration_since(Instant::now());
        match lines.recv_timeout(left) {
            Ok(line) => printed.push(line),
            Err(_) => {
                let _ = child.kill();
                panic!("no event for new-1 within 30 s; printed: {printed:?}");
            }
        }
    }
    let _ = child.kill();
    let _ = child.wait();
    for id in &old {
        assert!(
            !printed.iter().any(|l| l.contains(id.as_str())),
            "{id} printed again: {printed:?}"
        );
    }
}

/// `run` refuses the backoffs a worker refuses at build (queue-core's
/// `Backoff::validate`: a base above the max, a max beyond 30 days), with
/// exit 2 naming the flags, before any pass. Before, they ran: a base above
/// the max made every return wait the max, and a max near `u64`
/// milliseconds parked returned jobs for decades. A zero base and a
/// 30-day max, as the worker, are fine.
#[test]
fn run_refuses_a_backoff_the_worker_refuses() {
    let server = RedisServer::start().unwrap();
    let url = server.url();
    let keys = queue_core::QueueKeys::new("emails");
    expired_delivery(&server, "lost", 1, 5);
    let run_with = |base: &str, max: &str| {
        Command::new(BIN)
            .args(["run", "--redis", &url, "-q", "emails", "--once"])
            .args(["--backoff-base-ms", base, "--backoff-max-ms", max])
            .output()
            .expect("binary runs")
    };
    let month_ms = (30u64 * 24 * 3600 * 1000).to_string();
    let past_month_ms = (30u64 * 24 * 3600 * 1000 + 1).to_string();
    for (base, max, says) in [
        ("2000", "1000", "must be at most its max"),
        ("1", past_month_ms.as_str(), "must be at most 30 days"),
        ("1", &u64::MAX.to_string(), "must be at most 30 days"),
    ] {
        let out = run_with(base, max);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{base}/{max}: {stderr}");
        for needle in ["--backoff-base-ms", "--backoff-max-ms", says] {
            assert!(stderr.contains(needle), "{needle:?} not in {stderr}");
        }
        assert!(
            server
                .command(&["LRANGE", &keys.processing, "0", "-1"])
                .unwrap()
                .contains("lost"),
            "{base}/{max}: no pass ran"
        );
    }
    let out = run_with("0", &month_ms);
    assert!(out.status.success(), "{out:?}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("reclaimed=1"), "{stdout}");
}

/// A pass that drops stale entries (a lease whose job hash is gone, the
/// processing entry of a dead job) counts them: `run --once` prints
/// `dropped=2`, the pass's log line carries it, and `--metrics-listen`
/// exports `queue_reclaim_dropped_total`. Before, `ReclaimReport` had no
/// such count: a pass that only dropped entries reported nothing at all
/// (`reclaimed=0 … `), and its log line was not even written.
#[test]
fn run_reports_and_exports_the_stale_entries_a_pass_dropped() {
    let server = RedisServer::start().unwrap();
    let url = server.url();
    let keys = queue_core::QueueKeys::new("emails");
    let seed_stale = |n: u32| {
        // A lease of a job whose hash is gone (no processing entry).
        let ghost = format!("ghost-{n}");
        server
            .command(&["ZADD", &keys.leases, "1", &ghost])
            .unwrap();
        // A dead job's stale processing entry (with an expired lease).
        let dead = format!("dead-{n}");
        let job = keys.job(&dead);
        server
            .command(&["HSET", &job, "state", "dead", "type", "send", "v", "1"])
            .unwrap();
        server.command(&["LPUSH", &keys.dead, &dead]).unwrap();
        server.command(&["LPUSH", &keys.processing, &dead]).unwrap();
        server.command(&["ZADD", &keys.leases, "1", &dead]).unwrap();
    };
    seed_stale(1);
    let out = Command::new(BIN)
        .args(["run", "--redis", &url, "-q", "emails", "--once"])
        .env("RUST_LOG", "info")
        .env("NO_COLOR", "1")
        .output()
        .expect("binary runs");
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(out.status.success(), "{stderr}");
    assert!(
        stdout.contains("reclaimed=0 dead_lettered=0") && stdout.contains(" dropped=2 "),
        "{stdout}"
    );
    let pass = stderr
        .lines()
        .find(|l| l.contains("watchdog pass"))
        .unwrap_or_else(|| panic!("no pass line in {stderr}"));
    assert!(pass.contains("dropped=2"), "{pass}");
    assert_eq!(
        server.command(&["ZCARD", &keys.leases]).unwrap().trim(),
        ":0"
    );

    seed_stale(2);
    let watchdog = metrics_run::run_with_metrics(&[
        "run",
        "--redis",
        &url,
        "-q",
        "emails",
        "--interval-ms",
        "100",
    ]);
    watchdog.wait_for(
        "queue_reclaim_dropped_total{queue=\"emails\"} 2",
        Duration::from_secs(20),
    );
}

/// A `dead purge --json` stopped by an error part-way (here the third
/// purge's request is held: the connection's response timeout) still
/// prints what it purged before the error, with the error, and exits with an
/// error. Before, stdout was empty: the
/// purges done (irreversible) were reported nowhere (stop 46 review).
#[test]
fn a_purge_stopped_by_an_error_says_what_it_purged() {
    let server = RedisServer::start().unwrap();
    for id in ["p1", "p2", "p3"] {
        seed_dead(&server, id, "send", "invalid-address");
    }
    // The dead list is p3 p2 p1, purged in that order: the third call,
    // p1's, is the only request naming p1's step results.
    let keys = queue_core::QueueKeys::new("emails");
    let gate = queue_testkit::proxy::CommandGate::start(server.port(), &keys.steps("p1")).unwrap();
    let url = gate.url();
    let (ok, stdout, stderr) = run(&[
        "dead", "purge", "--redis", &url, "-q", "emails", "--all", "--yes", "--json",
    ]);
    // The held request is still held: p1 was not purged.
    assert!(lrange(&server, &keys.dead).contains("p1"));
    gate.open();
    assert!(!ok, "{stderr}");
    let v: Value = serde_json::from_str(stdout.trim()).expect(&stdout);
    assert_eq!(v["purged"], serde_json::json!(["p3", "p2"]), "{v}");
    // p1's call is the one that got no reply: it may run yet (it does, below,
    // when the gate opens).
    assert_eq!(v["in_doubt"], serde_json::json!(["p1"]), "{v}");
    assert!(v["error"].as_str().is_some_and(|e| !e.is_empty()), "{v}");
    assert!(
        stderr.contains("stopped by an error after it purged 2 job(s); p1 in doubt"),
        "{stderr}"
    );
}
