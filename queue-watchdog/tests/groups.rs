//! Fair queuing from the operator's side (docs/GROUPS.md):
//! `queue pause|resume -q Q --group G`, and `check` reading the group lists.

use queue_testkit::RedisServer;

#[path = "support/cli_run.rs"]
mod cli_run;
use cli_run::run;

#[test]
fn group_pause_resume_and_check_of_grouped_jobs() {
    let server = RedisServer::start().unwrap();
    let url = server.url();
    let (ok, out, err) = run(&url, &["queue", "pause", "-q", "emails", "--group", "acme"]);
    assert!(
        ok && out.contains("queue emails group acme paused"),
        "{out}{err}"
    );
    let since = server
        .command(&["HGET", "q:{emails}:gpaused", "acme"])
        .unwrap();
    assert!(!since.trim().is_empty(), "{since:?}");
    assert!(
        server
            .command(&["EXISTS", "q:{emails}:paused"])
            .unwrap()
            .contains('0'),
        "the queue itself is not paused"
    );
    let (ok, out, _) = run(
        &url,
        &[
            "queue", "pause", "-q", "emails", "--group", "acme", "--json",
        ],
    );
    assert!(ok && out.contains(r#""was_paused":true"#), "{out}");
    let (ok, out, _) = run(
        &url,
        &["queue", "resume", "-q", "emails", "--group", "acme"],
    );
    assert!(
        ok && out.contains("queue emails group acme resumed"),
        "{out}"
    );

    // A grouped job waits in its group's list, not in main: check is clean.
    server
        .command(&[
            "HSET",
            "q:{emails}:job:g1",
            "id",
            "g1",
            "state",
            "queued",
            "attempts",
            "0",
            "max_attempts",
            "3",
            "group",
            "acme",
        ])
        .unwrap();
    server
        .command(&["LPUSH", "q:{emails}:g:acme", "g1"])
        .unwrap();
    server
        .command(&["RPUSH", "q:{emails}:groups", "", "acme"])
        .unwrap();
    let (ok, out, err) = run(&url, &["check", "--queue", "emails"]);
    assert!(ok, "{out}{err}");
    let (_, out, _) = run(&url, &["stats", "-q", "emails"]);
    assert!(out.contains("1 job(s) waiting in group lists"), "{out}");
}

/// A group of the ring whose list key holds a string (corrupt data) made
/// `stats` fail with WRONGTYPE (exit 2). It answers, counts the other
/// groups, and names the unreadable one.
#[test]
fn stats_answers_when_a_group_list_is_corrupt() {
    let server = RedisServer::start().unwrap();
    let url = server.url();
    let k = queue_core::QueueKeys::new("emails");
    server
        .command(&[
            "HSET",
            &k.job("g1"),
            "id",
            "g1",
            "state",
            "queued",
            "enqueued_at",
            "1",
            "group",
            "acme",
        ])
        .unwrap();
    server.command(&["LPUSH", &k.group("acme"), "g1"]).unwrap();
    server.command(&["SET", &k.group("bad"), "x"]).unwrap();
    server
        .command(&["RPUSH", &k.groups(), "", "bad", "acme"])
        .unwrap();
    let (ok, out, err) = run(&url, &["stats", "-q", "emails"]);
    assert!(ok, "{out}{err}");
    assert!(out.contains("1 job(s) waiting in group lists"), "{out}");
    assert!(out.contains("1 group key(s) UNREADABLE"), "{out}");
    let (ok, out, err) = run(&url, &["stats", "-q", "emails", "--json"]);
    assert!(ok, "{out}{err}");
    let v: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(v[0]["grouped"], 1, "{v}");
    assert_eq!(v[0]["grouped_unreadable"], 1, "{v}");
    assert_eq!(v[0]["grouped_partial"], false, "{v}");
}
