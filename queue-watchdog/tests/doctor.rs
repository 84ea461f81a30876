//! `queue-watchdog doctor` against real redis-servers started with unsafe
//! (and safe) settings: each finding, its fix, and the exit code
//! (0 safe for critical queues, 1 findings that can lose data, 2 no connection).

use std::process::Command;
use std::time::{Duration, Instant};

use queue_testkit::RedisServer;
use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_queue-watchdog");

/// Settings the doctor calls safe: AOF, fsync every second.
const SAFE: &[&str] = &["--appendonly", "yes", "--appendfsync", "everysec"];

fn doctor(url: &str, extra: &[&str]) -> (i32, String) {
    let out = Command::new(BIN)
        .args(["doctor", "--redis", url])
        .args(extra)
        .output()
        .expect("binary runs");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr),
    )
}

fn doctor_json(url: &str, extra: &[&str]) -> (i32, Value) {
    let mut args = vec!["--json"];
    args.extend_from_slice(extra);
    let (code, out) = doctor(url, &args);
    let line = out.lines().find(|l| l.starts_with('{')).unwrap_or("null");
    (
        code,
        serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {out}")),
    )
}

/// (severity, what) of the findings of `check`.
fn findings(v: &Value, check: &str) -> Vec<(String, String)> {
    v["findings"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f["check"] == check)
        .map(|f| {
            (
                f["severity"].as_str().unwrap().to_string(),
                f["what"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

fn severity(v: &Value, check: &str) -> String {
    findings(v, check)
        .first()
        .map(|(s, _)| s.clone())
        .unwrap_or_else(|| panic!("no {check} finding in {v:#}"))
}

#[test]
fn no_persistence_is_critical_with_the_fix() {
    // The testkit default: save "" and appendonly no.
    let server = RedisServer::start().unwrap();
    let (code, out) = doctor(&server.url(), &[]);
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains("CRITICAL  persistence  appendonly no and no RDB snapshots"),
        "{out}"
    );
    assert!(out.contains("fix: appendonly yes"), "{out}");
    assert!(out.contains("appendfsync everysec"), "{out}");
    assert!(
        out.contains("verdict: NOT SAFE for critical queues"),
        "{out}"
    );
}

#[test]
fn snapshots_only_lose_writes_since_the_last_save() {
    let server = RedisServer::start_with(&["--save", "3600 1"]).unwrap();
    let (code, v) = doctor_json(&server.url(), &[]);
    assert_eq!(code, 1);
    assert_eq!(v["safe"], false);
    let (sev, what) = findings(&v, "persistence").remove(0);
    assert_eq!(sev, "critical");
    assert!(
        what.contains("only RDB snapshots (save \"3600 1\")"),
        "{what}"
    );
}

#[test]
fn aof_everysec_is_safe_and_strict_wants_always() {
    let server = RedisServer::start_with(SAFE).unwrap();
    let (code, out) = doctor(&server.url(), &[]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("verdict: SAFE for critical queues"), "{out}");
    assert!(
        out.contains("OK        appendfsync  appendfsync everysec"),
        "{out}"
    );
    // No replica and no memory limit are warnings, not failures.
    assert!(
        out.contains("WARNING   replication  no replica connected"),
        "{out}"
    );
    assert!(
        out.contains("WARNING   maxmemory    no memory limit"),
        "{out}"
    );

    let (code, v) = doctor_json(&server.url(), &["--strict"]);
    assert_eq!(code, 1);
    assert_eq!(severity(&v, "appendfsync"), "critical");

    let always =
        RedisServer::start_with(&["--appendonly", "yes", "--appendfsync", "always"]).unwrap();
    let (code, v) = doctor_json(&always.url(), &["--strict"]);
    assert_eq!(code, 0, "{v:#}");
    assert_eq!(v["safe"], true);
}

#[test]
fn appendfsync_no_and_fsync_skipped_during_rewrites() {
    let server = RedisServer::start_with(&[
        "--appendonly",
        "yes",
        "--appendfsync",
        "no",
        "--no-appendfsync-on-rewrite",
        "yes",
    ])
    .unwrap();
    let (code, v) = doctor_json(&server.url(), &[]);
    assert_eq!(code, 1);
    assert_eq!(severity(&v, "appendfsync"), "critical");
    assert_eq!(severity(&v, "rewrite-fsync"), "warning");
    let fix = v["findings"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["check"] == "appendfsync")
        .unwrap()["fix"]
        .clone();
    assert_eq!(fix, "appendfsync everysec");
}

#[test]
fn evicting_maxmemory_policy_and_evicted_keys() {
    let mut args = SAFE.to_vec();
    args.extend(["--maxmemory", "4mb", "--maxmemory-policy", "allkeys-lru"]);
    let server = RedisServer::start_with(&args).unwrap();
    let (code, v) = doctor_json(&server.url(), &[]);
    assert_eq!(code, 1);
    let (sev, what) = findings(&v, "maxmemory").remove(0);
    assert_eq!(sev, "critical");
    assert!(what.contains("allkeys-lru"), "{what}");
    assert_eq!(severity(&v, "evictions"), "ok");

    // Fill it past the limit: Redis evicts, and the doctor says so.
    let client = redis::Client::open(server.url()).unwrap();
    let mut conn = client.get_connection().unwrap();
    let value = "x".repeat(4096);
    for chunk in 0..8 {
        let mut pipe = redis::pipe();
        for i in 0..256 {
            pipe.cmd("SET")
                .arg(format!("filler:{chunk}:{i}"))
                .arg(&value)
                .ignore();
        }
        pipe.query::<()>(&mut conn).unwrap();
    }
    let (code, v) = doctor_json(&server.url(), &[]);
    assert_eq!(code, 1);
    let (sev, what) = findings(&v, "evictions").remove(0);
    assert_eq!(sev, "critical");
    assert!(what.contains("evicted since Redis started"), "{what}");
}

/// A `volatile-*` policy evicts completion records (completed jobs run
/// again): CRITICAL like `allkeys-*` (issue #11 item 9).
#[test]
fn volatile_policy_is_critical_noeviction_is_ok() {
    let mut args = SAFE.to_vec();
    args.extend(["--maxmemory", "64mb", "--maxmemory-policy", "volatile-lru"]);
    let server = RedisServer::start_with(&args).unwrap();
    let (code, v) = doctor_json(&server.url(), &[]);
    assert_eq!(code, 1, "{v:#}");
    assert_eq!(severity(&v, "maxmemory"), "critical");

    let mut args = SAFE.to_vec();
    args.extend(["--maxmemory", "64mb", "--maxmemory-policy", "noeviction"]);
    let server = RedisServer::start_with(&args).unwrap();
    let (code, v) = doctor_json(&server.url(), &[]);
    assert_eq!(code, 0);
    let (sev, what) = findings(&v, "maxmemory").remove(0);
    assert_eq!(sev, "ok");
    assert!(what.contains("noeviction"), "{what}");
}

#[test]
fn ttl_on_queue_keys_is_found_but_completion_records_are_not() {
    let server = RedisServer::start_with(SAFE).unwrap();
    for cmd in [
        &["LPUSH", "q:{emails}:main", "a"][..],
        &["EXPIRE", "q:{emails}:main", "600"],
        &["HSET", "q:{emails}:job:a", "state", "queued"],
        &["PEXPIRE", "q:{emails}:job:a", "900000"],
        // These expire by design and must not be reported.
        &["HSET", "q:{emails}:done:b", "status", "done"],
        &["EXPIRE", "q:{emails}:done:b", "600"],
        &["HSET", "q:{emails}:steps:b", "charge", "x"],
        &["EXPIRE", "q:{emails}:steps:b", "600"],
        &["SET", "q:{emails}:tput:29000000", "3"],
        &["EXPIRE", "q:{emails}:tput:29000000", "180"],
        // Not a queue key.
        &["SET", "lock:{report}", "owner", "PX", "30000"],
    ] {
        server.command(cmd).unwrap();
    }
    let (code, out) = doctor(&server.url(), &[]);
    assert_eq!(code, 1, "{out}");
    let line = out
        .lines()
        .find(|l| l.starts_with("CRITICAL  ttl"))
        .unwrap_or_else(|| panic!("{out}"));
    assert!(line.contains("2 queue key(s) have a TTL"), "{line}");
    assert!(line.contains("q:{emails}:main (expires in"), "{line}");
    assert!(line.contains("q:{emails}:job:a"), "{line}");
    assert!(!out.contains("done:b") && !out.contains("steps:b") && !out.contains("tput:"));
    assert!(out.contains("PERSIST q:{emails}"), "{out}");

    server.command(&["PERSIST", "q:{emails}:main"]).unwrap();
    server.command(&["PERSIST", "q:{emails}:job:a"]).unwrap();
    let (code, out) = doctor(&server.url(), &[]);
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains("OK        ttl          no TTL on queue keys"),
        "{out}"
    );
}

/// The keys queue-core's scripts expire themselves: a retried job's history,
/// a periodic firing's once-marker, result wake-ups, a finished batch's keys
/// and the rate-limit logs. A deployment using retries, cron, results,
/// batches or rate limits has them all the time; they are not findings.
#[test]
fn ttls_the_scripts_set_themselves_are_not_findings() {
    let server = RedisServer::start_with(SAFE).unwrap();
    let k = queue_core::QueueKeys::new("emails");
    let limits = k.limits();
    let expiring: Vec<[String; 4]> = [
        ["RPUSH", &k.hist("a"), "{}"],
        ["SET", &k.once("tick-29000000"), "1"],
        ["RPUSH", &k.notify("a"), "1"],
        ["HSET", &k.batch("b1"), "total"],
        ["SADD", &format!("{}:done", k.batch("b1")), "a"],
        ["ZADD", &format!("{limits}:started"), "1"],
        ["ZADD", &format!("{limits}:started:acme"), "1"],
        ["SET", &format!("{limits}:next:acme"), "1"],
    ]
    .iter()
    .map(|[cmd, key, v]| [cmd.to_string(), key.to_string(), v.to_string(), "x".into()])
    .collect();
    for [cmd, key, v, member] in &expiring {
        let mut args = vec![cmd.as_str(), key.as_str(), v.as_str()];
        if cmd == "HSET" || cmd == "ZADD" {
            args.push(member);
        }
        server.command(&args).unwrap();
        server.command(&["PEXPIRE", key, "600000"]).unwrap();
    }
    let (code, out) = doctor(&server.url(), &[]);
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains("OK        ttl          no TTL on queue keys"),
        "{out}"
    );
    // The limits hash itself and a key's running set are never expired.
    server
        .command(&["HSET", &limits, "rate", "10/1000"])
        .unwrap();
    server.command(&["PEXPIRE", &limits, "600000"]).unwrap();
    let (code, out) = doctor(&server.url(), &[]);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("1 queue key(s) have a TTL"), "{out}");
    assert!(out.contains(&format!("PERSIST {limits}")), "{out}");
}

fn wait_for_replica(primary: &RedisServer) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let info = primary.command(&["INFO", "replication"]).unwrap();
        if info.contains("state=online") {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "replica never came online: {info}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn a_replica_url_is_critical_and_the_primary_reports_its_replica() {
    let primary = RedisServer::start_with(SAFE).unwrap();
    let port = primary.port().to_string();
    let mut args = SAFE.to_vec();
    args.extend(["--replicaof", "127.0.0.1", &port]);
    let replica = RedisServer::start_with(&args).unwrap();
    wait_for_replica(&primary);

    let (code, out) = doctor(&replica.url(), &[]);
    assert_eq!(code, 1, "{out}");
    let line = out
        .lines()
        .find(|l| l.starts_with("CRITICAL  replica-url"))
        .unwrap_or_else(|| panic!("{out}"));
    assert!(
        line.contains(&format!("a replica of 127.0.0.1:{port}")),
        "{line}"
    );
    assert!(
        out.contains(&format!(
            "point REDIS_URL at the primary (127.0.0.1:{port})"
        )),
        "{out}"
    );

    let (code, v) = doctor_json(&primary.url(), &[]);
    assert_eq!(code, 0, "{v:#}");
    let repl = findings(&v, "replication");
    assert!(
        repl.iter()
            .any(|(s, w)| s == "ok" && w.contains("online, lag")),
        "{repl:?}"
    );
    assert!(
        !repl.iter().any(|(_, w)| w.contains("no replica")),
        "{repl:?}"
    );
}

#[test]
fn a_writable_replica_is_called_out() {
    let primary = RedisServer::start_with(SAFE).unwrap();
    let port = primary.port().to_string();
    let mut args = SAFE.to_vec();
    args.extend([
        "--replicaof",
        "127.0.0.1",
        &port,
        "--replica-read-only",
        "no",
    ]);
    let replica = RedisServer::start_with(&args).unwrap();
    wait_for_replica(&primary);
    let (code, v) = doctor_json(&replica.url(), &[]);
    assert_eq!(code, 1);
    let (sev, what) = findings(&v, "replica-url").remove(0);
    assert_eq!(sev, "critical");
    assert!(
        what.contains("accepts writes (replica-read-only no)"),
        "{what}"
    );
}

#[test]
fn unreachable_redis_exits_2() {
    // Held for the whole test: refused, and no other test's server takes it.
    let nobody = queue_testkit::RefusingPort::bind().unwrap();
    let (code, out) = doctor(&nobody.redis_url(), &[]);
    assert_eq!(code, 2, "{out}");
    assert!(out.contains("cannot connect to redis"), "{out}");
}

/// queue-core's function libraries: this version's (not loaded until a
/// producer or worker of it ran, then OK) and one an older version left,
/// listed with the command that deletes it.
#[test]
fn function_libraries_of_this_and_other_versions_are_listed() {
    let server = RedisServer::start_with(SAFE).unwrap();
    let own = queue_core::admin::function_library();
    let (_, v) = doctor_json(&server.url(), &[]);
    assert_eq!(
        findings(&v, "functions"),
        [(
            "info".to_string(),
            format!("{own} (this version's scripts) is not loaded yet")
        )]
    );

    // A producer of this version loads it; an older version left its own.
    tokio::runtime::Runtime::new().unwrap().block_on(async {
        let queue = queue_core::Queue::connect(&server.url()).await.unwrap();
        queue
            .enqueue_raw("emails", "send", 1, 3, Default::default(), b"\x80")
            .await
            .unwrap();
    });
    let mut c = redis::Client::open(server.url())
        .unwrap()
        .get_connection()
        .unwrap();
    let old = "queue_core_0123456789ab";
    let _: String = redis::cmd("FUNCTION")
        .arg("LOAD")
        .arg(format!(
            "#!lua name={old}\nredis.register_function('qc_0123456789ab_x', function() return 1 end)"
        ))
        .query(&mut c)
        .unwrap();

    let (code, v) = doctor_json(&server.url(), &[]);
    assert_eq!(code, 0, "{v:#}");
    let found = findings(&v, "functions");
    let ok = (
        "ok".to_string(),
        format!("{own} loaded (this version's scripts)"),
    );
    assert!(found.contains(&ok), "{found:?}");
    let other = (
        "info".to_string(),
        format!("1 library(ies) of other queue-core versions: {old}"),
    );
    assert!(found.contains(&other), "{found:?}");
    let fix = v["findings"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["check"] == "functions" && f["severity"] == "info")
        .unwrap()["fix"]
        .clone();
    assert_eq!(
        fix,
        format!("once no process of that version runs: FUNCTION DELETE {old}")
    );
}

/// Only the dead-letter list key of a queue (`QueueKeys::dead`) is read as
/// one: the job hash of an id ending in `}:dead` is not. A dead-letter key of
/// another type (corrupt data) is a CRITICAL finding naming it, with the
/// report; before, either one failed the pipelined `LLEN` and the doctor
/// exited 2 as if Redis could not be reached.
#[test]
fn a_job_id_ending_like_a_dead_key_and_a_wrong_typed_dead_key_are_not_exit_2() {
    let server = RedisServer::start_with(SAFE).unwrap();
    let (q, broken) = (
        queue_core::QueueKeys::new("orders"),
        queue_core::QueueKeys::new("billing"),
    );
    let id = "order-7}:dead";
    tokio::runtime::Runtime::new().unwrap().block_on(async {
        let queue = queue_core::Queue::connect(&server.url()).await.unwrap();
        queue
            .enqueue_raw(
                &q.queue,
                "send",
                1,
                3,
                queue_core::EnqueueOptions::new().id(id),
                b"\x80",
            )
            .await
            .unwrap();
    });
    assert!(q.job(id).ends_with("}:dead"), "{}", q.job(id));
    server
        .command(&["RPUSH", &q.dead, "old-1", "old-2"])
        .unwrap();

    let (code, v) = doctor_json(&server.url(), &[]);
    assert_eq!(code, 0, "{v:#}");
    assert_eq!(
        findings(&v, "dead-letters"),
        [(
            "ok".to_string(),
            "dead-letter lists at most 2 entries".to_string()
        )]
    );

    server
        .command(&["SET", &broken.dead, "not-a-list"])
        .unwrap();
    let (code, out) = doctor(&server.url(), &[]);
    assert_eq!(code, 1, "{out}");
    let line = out
        .lines()
        .find(|l| l.starts_with("CRITICAL  dead-letters"))
        .unwrap_or_else(|| panic!("{out}"));
    assert!(
        line.contains(&format!(
            "1 dead-letter key(s) of another type than list: {} (string)",
            broken.dead
        )),
        "{line}"
    );
    assert!(out.contains("verdict: NOT SAFE"), "{out}");
}

/// A doctor user whose ACL leaves out `LLEN` cannot read the dead-letter
/// lengths: a "could not read" warning, not the CRITICAL "dead-letter key(s)
/// of another type than list" telling the operator to rename a healthy list
/// (before, any `LLEN` error was taken for a wrong type: exit 1, NOT SAFE).
#[test]
fn a_doctor_user_without_llen_gets_no_wrong_type_finding() {
    let server = RedisServer::start_with(SAFE).unwrap();
    let q = queue_core::QueueKeys::new("orders");
    server
        .command(&["RPUSH", &q.dead, "old-1", "old-2"])
        .unwrap();
    let reply = server
        .command(&["ACL", "SETUSER", "doc", "on", ">pw", "~*", "+@all", "-llen"])
        .unwrap();
    assert!(reply.starts_with("+OK"), "{reply}");
    let url = format!("redis://doc:pw@127.0.0.1:{}/", server.port());

    let (code, v) = doctor_json(&url, &[]);
    let dead = findings(&v, "dead-letters");
    assert!(!dead.iter().any(|(sev, _)| sev == "critical"), "{dead:?}");
    let (sev, what) = dead
        .iter()
        .find(|(_, what)| what.starts_with("could not read the length of 1 dead-letter list(s)"))
        .unwrap_or_else(|| panic!("{dead:?}"));
    assert_eq!(sev, "warning");
    assert!(what.contains(&q.dead) && what.contains("llen"), "{what}");
    assert_eq!(code, 0, "{v:#}");
}

/// A `redis-cluster://` URL is refused with a message saying what to do
/// (each primary's `redis://` URL). Before, the client sent `INFO` to every
/// primary and the doctor failed decoding the map ("incompatible type"), an
/// error that read as "cannot reach Redis".
#[test]
fn a_cluster_url_is_refused_with_what_to_run_instead() {
    let cluster = queue_testkit::cluster::RedisCluster::start(3).unwrap();
    let (code, out) = doctor(&cluster.url(), &[]);
    assert_eq!(code, 2, "{out}");
    assert!(
        out.contains("each primary's redis:// URL"),
        "the message says what to run instead: {out}"
    );
}
