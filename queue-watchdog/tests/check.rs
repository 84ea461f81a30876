//! `queue-watchdog check` as an operator runs it: exit codes, `--repair`, `--json`.

use std::process::{Command, Output};

use queue_testkit::RedisServer;

const BIN: &str = env!("CARGO_BIN_EXE_queue-watchdog");

fn check(url: &str, extra: &[&str]) -> Output {
    Command::new(BIN)
        .args(["check", "--redis", url, "--queue", "emails"])
        .args(extra)
        .output()
        .expect("binary runs")
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn enqueue(server: &RedisServer, id: &str) {
    let key = format!("q:{{emails}}:job:{id}");
    server
        .command(&[
            "HSET",
            &key,
            "id",
            id,
            "state",
            "queued",
            "attempts",
            "0",
            "max_attempts",
            "3",
        ])
        .unwrap();
    server.command(&["LPUSH", "q:{emails}:main", id]).unwrap();
}

#[test]
fn a_clean_queue_exits_0_and_a_broken_one_1_until_repaired() {
    let server = RedisServer::start().unwrap();
    let url = server.url();
    enqueue(&server, "a");
    let out = check(&url, &[]);
    assert_eq!(out.status.code(), Some(0), "{}", stdout(&out));
    assert!(
        stdout(&out).contains("emails: 0 violation(s)"),
        "{}",
        stdout(&out)
    );

    // The id fell out of main: its hash is listed nowhere.
    server
        .command(&["LREM", "q:{emails}:main", "1", "a"])
        .unwrap();
    let out = check(&url, &[]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stdout(&out).contains("orphan_hash: job a"),
        "{}",
        stdout(&out)
    );

    let out = check(&url, &["--repair"]);
    assert_eq!(out.status.code(), Some(1), "found, then repaired");
    assert!(
        stdout(&out).contains("repaired a: RequeuedToMain"),
        "{}",
        stdout(&out)
    );
    assert_eq!(
        server
            .command(&["LRANGE", "q:{emails}:main", "0", "-1"])
            .unwrap(),
        "*1\r\n$1\r\na\r\n"
    );
    let out = check(&url, &[]);
    assert_eq!(out.status.code(), Some(0), "{}", stdout(&out));
}

#[test]
fn json_lists_each_violation_with_its_kind() {
    let server = RedisServer::start().unwrap();
    let url = server.url();
    server
        .command(&["ZADD", "q:{emails}:leases", "1", "ghost"])
        .unwrap();
    server
        .command(&["HSET", "q:{emails}:stats", "dead", "x"])
        .unwrap();
    let out = check(&url, &["--json"]);
    assert_eq!(out.status.code(), Some(1));
    let json = stdout(&out);
    assert!(json.starts_with("[{\"queue\":\"emails\""), "{json}");
    assert!(
        json.contains(r#"{"kind":"stray_lease","id":"ghost"}"#),
        "{json}"
    );
    assert!(
        json.contains(r#"{"kind":"bad_counter","field":"dead","value":"x"}"#),
        "{json}"
    );
    let out = check(&url, &["--json", "--repair"]);
    assert!(
        stdout(&out).contains(r#""repairs":[{"id":"ghost","action":"lease_dropped"}]"#),
        "{}",
        stdout(&out)
    );
}

#[test]
fn unreachable_redis_exits_2() {
    let server = RedisServer::start().unwrap();
    let url = server.url();
    drop(server);
    let out = check(&url, &[]);
    assert_eq!(
        out.status.code(),
        Some(2),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Without `--queue` the queues are discovered. On a server (or database)
/// holding none, e.g. a wrong URL in a CI gate, nothing is checked: that is
/// not "clean", so the exit is 1 with the reason. Named, an empty queue is
/// checked and clean.
#[test]
fn finding_no_queue_to_check_is_not_clean() {
    let server = RedisServer::start().unwrap();
    let url = server.url();
    let out = Command::new(BIN)
        .args(["check", "--redis", &url])
        .output()
        .expect("binary runs");
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("nothing checked"));
    let named = check(&url, &[]);
    assert_eq!(named.status.code(), Some(0), "{named:?}");
}

/// A group list of another type (corrupt data) made `check` exit with a bare
/// WRONGTYPE before any queue was reported. It is a finding (queue, group,
/// key type; exit 1) and the other queues are still checked.
#[test]
fn a_corrupt_group_list_is_a_finding_and_the_other_queues_are_checked() {
    let server = RedisServer::start().unwrap();
    let url = server.url();
    let k = queue_core::QueueKeys::new("emails");
    server.command(&["SET", &k.group("bad"), "x"]).unwrap();
    server.command(&["RPUSH", &k.groups(), "", "bad"]).unwrap();
    let sms = queue_core::QueueKeys::new("sms");
    server
        .command(&["ZADD", &sms.leases, "1", "ghost"])
        .unwrap();
    let out = Command::new(BIN)
        .args([
            "check", "--redis", &url, "--queue", "emails", "--queue", "sms",
        ])
        .output()
        .expect("binary runs");
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let text = stdout(&out);
    let bad = k.group("bad");
    assert!(
        text.contains(&format!(
            "emails: corrupt_group_list: group bad: its waiting list {bad} holds a string"
        )),
        "{text}"
    );
    assert!(text.contains("sms: stray_lease: job ghost"), "{text}");

    let out = check(&url, &["--json"]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(
        stdout(&out).contains(&format!(
            r#"{{"kind":"corrupt_group_list","group":"bad","key":"{bad}","found":"string"}}"#
        )),
        "{}",
        stdout(&out)
    );
}

/// A job id with a bidi override (U+202E) and a corrupt field whose value
/// carries an ESC sequence are printed as escapes: the violation line can
/// neither rewrite the operator's terminal nor reorder itself. Before,
/// `check` printed each violation raw.
#[test]
fn violations_print_ids_and_values_escaped() {
    let server = RedisServer::start().unwrap();
    let url = server.url();
    let id = "ev\u{202e}il";
    enqueue(&server, id);
    let key = format!("q:{{emails}}:job:{id}");
    server
        .command(&["HSET", &key, "attempts", "\u{1b}[2J"])
        .unwrap();
    let out = check(&url, &[]);
    assert_eq!(out.status.code(), Some(1), "{}", stdout(&out));
    let text = stdout(&out);
    assert!(
        text.contains("corrupt_field: job ev\\u{202e}il: field attempts is corrupt: \\u{1b}[2J"),
        "{text}"
    );
    assert!(
        !text.contains('\u{1b}') && !text.contains('\u{202e}'),
        "{text}"
    );
}
