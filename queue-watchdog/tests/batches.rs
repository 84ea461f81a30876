//! `queue-watchdog batches show` (docs/WORKFLOWS.md) against a real
//! redis-server: a sealed batch's counts as text and JSON; exit 1 for an
//! unknown batch.

use std::process::Command;

use queue_core::{Batch, JobSpec, Queue};
use queue_testkit::RedisServer;

#[path = "support/abandoned.rs"]
mod abandoned;

const BIN: &str = env!("CARGO_BIN_EXE_queue-watchdog");

fn run(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(BIN).args(args).output().expect("binary runs");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn batches_show_prints_state_and_counts() {
    let server = RedisServer::start().unwrap();
    let url = server.url();
    tokio::runtime::Runtime::new().unwrap().block_on(async {
        let queue = Queue::connect(&url).await.unwrap();
        let member = |id: &str| JobSpec::raw("imports", "row", 1, 3, vec![0xc0]).id(id);
        Batch::new(&queue)
            .id("import-9")
            .on_complete(JobSpec::raw("imports", "report", 1, 3, vec![0xc0]))
            .add(member("row-1"))
            .add(member("row-2"))
            .enqueue()
            .await
            .unwrap();
    });
    let (ok, out, err) = run(&[
        "batches", "show", "import-9", "--redis", &url, "-q", "imports",
    ]);
    assert!(ok, "{out}{err}");
    assert!(out.contains("batch import-9 (queue imports)"), "{out}");
    assert!(out.contains("state      sealed"), "{out}");
    assert!(out.contains("0 finished of 2"), "{out}");
    let (ok, out, _) = run(&[
        "batches", "show", "import-9", "--redis", &url, "-q", "imports", "--json",
    ]);
    assert!(ok);
    assert!(
        out.contains("\"total\":2") && out.contains("\"state\":\"sealed\""),
        "{out}"
    );
    let (ok, _, err) = run(&["batches", "show", "nope", "--redis", &url, "-q", "imports"]);
    assert!(!ok && err.contains("no batch"), "{err}");
}

/// `batches list`: the queue's batches newest first, paged (the index
/// written by `batch_open.lua`); `batches show` of a DAG step: its
/// dependencies as members, the step as `on_complete`, the DAG's steps;
/// an open batch (its producer died before the seal) shows its expiry.
#[test]
fn batches_list_pages_newest_first_and_show_names_the_dag() {
    use queue_core::Dag;
    let server = RedisServer::start().unwrap();
    let url = server.url();
    tokio::runtime::Runtime::new().unwrap().block_on(async {
        let queue = Queue::connect(&url).await.unwrap();
        let job = || JobSpec::raw("orders", "step", 1, 3, vec![0xc0]);
        for n in 0..3 {
            Batch::new(&queue)
                .id(format!("b{n}"))
                .add(job())
                .enqueue()
                .await
                .unwrap();
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
        Dag::new("o7")
            .step("charge", job())
            .step("invoice", job())
            .after(["charge"])
            .step("close", job())
            .after(["invoice"])
            .enqueue(&queue)
            .await
            .unwrap();
        let o8 = Dag::new("o8")
            .step("charge", job())
            .step("close", job())
            .after(["charge"]);
        abandoned::abandon_dag(&url, &queue, "orders", o8).await;
    });
    let (ok, out, err) = run(&["batches", "list", "--redis", &url, "-q", "orders"]);
    assert!(ok, "{out}{err}");
    assert!(out.contains("6 indexed"), "{out}");
    let ids: Vec<&str> = out
        .lines()
        .skip(2)
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    assert_eq!(
        ids,
        ["o8:close", "o7:invoice", "o7:close", "b2", "b1", "b0"],
        "{out}"
    );
    assert!(
        out.lines().nth(2).unwrap().contains("open") && out.contains("in 2d"),
        "{out}"
    );
    let (ok, out, _) = run(&[
        "batches", "list", "--redis", &url, "-q", "orders", "--limit", "2", "--offset", "2",
        "--json",
    ]);
    assert!(ok);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["batches"][0]["id"], "o7:close", "{out}");
    assert_eq!(v["next_offset"], 4, "{out}");
    let (ok, out, err) = run(&[
        "batches", "show", "o7:close", "--redis", &url, "-q", "orders",
    ]);
    assert!(ok, "{out}{err}");
    assert!(out.contains("on_complete o7:close (step)"), "{out}");
    assert!(out.contains("dag        o7"), "{out}");
    assert!(out.contains("step close after invoice"), "{out}");
    assert!(
        out.contains("o7:invoice") && out.contains("pending"),
        "{out}"
    );
    let (ok, out, _) = run(&[
        "batches", "show", "o8:close", "--redis", &url, "-q", "orders",
    ]);
    assert!(ok);
    assert!(
        out.contains("state      open") && out.contains("unless sealed"),
        "{out}"
    );
}

/// `relay dead` / `relay retry-dead`: a cancelled member on `emails` of a
/// batch on `orders` whose `cancelled` count is corrupt: its notice is set
/// aside (listed by `relay dead`); `retry-dead` before the repair sets it
/// aside again (exit 1); after the repair it is applied, the batch fires
/// and its callback waits in `orders`' main. Before, nothing moved a dead
/// notice back.
#[test]
fn relay_retry_dead_applies_a_set_aside_notice_once_its_batch_is_repaired() {
    use queue_core::QueueKeys;
    let server = RedisServer::start().unwrap();
    let url = server.url();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let batch_key = QueueKeys::new("orders").batch("b-r");
    rt.block_on(async {
        let queue = Queue::connect(&url).await.unwrap();
        Batch::new(&queue)
            .id("b-r")
            .on_complete(JobSpec::raw("orders", "close", 1, 3, vec![0xc0]).id("b-r-done"))
            .add(JobSpec::raw("emails", "send", 1, 3, vec![0xc0]).id("m-r"))
            .enqueue()
            .await
            .unwrap();
        server
            .command(&["HSET", &batch_key, "cancelled", "x"])
            .unwrap();
        queue.cancel("emails", "m-r").await.unwrap();
        assert_eq!(queue.relay("emails").await.unwrap().dead, 1);
    });
    let (ok, out, err) = run(&["relay", "dead", "--redis", &url, "-q", "emails"]);
    assert!(ok, "{out}{err}");
    assert!(
        out.contains("m-r\tq:{orders}:batch:b-r\tfinished\tthe batch is corrupt"),
        "{out}"
    );
    let (ok, out, _) = run(&["relay", "retry-dead", "--redis", &url, "-q", "emails"]);
    assert!(!ok, "set aside again: exit 1\n{out}");
    assert!(
        out.contains("moved 1") && out.contains("set aside again 1"),
        "{out}"
    );
    server
        .command(&["HSET", &batch_key, "cancelled", "0"])
        .unwrap();
    let (ok, out, err) = run(&[
        "relay",
        "retry-dead",
        "--redis",
        &url,
        "-q",
        "emails",
        "--json",
    ]);
    assert!(ok, "{out}{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(
        (v["moved"].as_u64(), v["applied"].as_u64()),
        (Some(1), Some(1)),
        "{out}"
    );
    let main = QueueKeys::new("orders").main;
    assert!(
        server
            .command(&["LRANGE", &main, "0", "-1"])
            .unwrap()
            .contains("b-r-done"),
        "the callback"
    );
    let (ok, out, _) = run(&["relay", "dead", "--redis", &url, "-q", "emails", "--json"]);
    assert!(ok && out.contains("\"notices\":[]"), "{out}");
}

/// `batches show` of a batch on `orders` whose members are on `emails`
/// (one waiting, one dead-lettered whose notice the relay has not applied
/// yet): each is shown with its state on `emails`, naming that queue, in
/// text and JSON. Before, both were looked up on `orders` and shown as
/// "not enqueued".
#[test]
fn batches_show_reads_members_on_other_queues_there() {
    use queue_core::QueueKeys;
    let server = RedisServer::start().unwrap();
    let url = server.url();
    tokio::runtime::Runtime::new().unwrap().block_on(async {
        let queue = Queue::connect(&url).await.unwrap();
        Batch::new(&queue)
            .id("b-x")
            .on_complete(JobSpec::raw("orders", "close", 1, 3, vec![0xc0]).id("b-x-done"))
            .add(JobSpec::raw("emails", "send", 1, 3, vec![0xc0]).id("m-wait"))
            .add(JobSpec::raw("emails", "send", 1, 3, vec![0xc0]).id("m-dead"))
            .enqueue()
            .await
            .unwrap();
    });
    // m-dead as a dead-letter leaves it (the notice not relayed yet).
    let k = QueueKeys::new("emails");
    server.command(&["LREM", &k.main, "0", "m-dead"]).unwrap();
    server.command(&["LPUSH", &k.dead, "m-dead"]).unwrap();
    server
        .command(&[
            "HSET",
            &k.job("m-dead"),
            "state",
            "dead",
            "dead_reason",
            "smtp-down",
        ])
        .unwrap();
    let (ok, out, err) = run(&["batches", "show", "b-x", "--redis", &url, "-q", "orders"]);
    assert!(ok, "{out}{err}");
    let line = |id: &str| {
        out.lines()
            .find(|l| l.trim_start().starts_with(id))
            .unwrap_or_else(|| panic!("no line for {id}: {out}"))
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ")
    };
    assert_eq!(
        line("m-wait"),
        "m-wait pending queued (queue emails)",
        "{out}"
    );
    assert_eq!(
        line("m-dead"),
        "m-dead pending dead (queue emails)",
        "{out}"
    );
    let (ok, out, _) = run(&[
        "batches", "show", "b-x", "--redis", &url, "-q", "orders", "--json",
    ]);
    assert!(ok);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let members = v["members"].as_array().unwrap();
    let shown: Vec<(&str, &str, &str)> = members
        .iter()
        .map(|m| {
            (
                m["id"].as_str().unwrap(),
                m["outcome"].as_str().unwrap(),
                m["queue"].as_str().unwrap_or(""),
            )
        })
        .collect();
    assert_eq!(
        shown,
        [("m-dead", "dead", "emails"), ("m-wait", "queued", "emails")],
        "{out}"
    );
}

/// A DAG whose name carries a bidi override (U+202E, which a producer may
/// put in an id: only control characters are refused): `batches list` and
/// `batches show` print the batch id, the DAG and the member ids as
/// escapes. Before, `show`'s member lines and DAG line and `list`'s id and
/// DAG columns printed them raw: the rest of the line showed reordered.
#[test]
fn batches_list_and_show_escape_ids_and_the_dag() {
    use queue_core::Dag;
    let server = RedisServer::start().unwrap();
    let url = server.url();
    tokio::runtime::Runtime::new().unwrap().block_on(async {
        let queue = Queue::connect(&url).await.unwrap();
        let job = || JobSpec::raw("orders", "step", 1, 3, vec![0xc0]);
        Dag::new("o\u{202e}9")
            .step("charge", job())
            .step("close", job())
            .after(["charge"])
            .enqueue(&queue)
            .await
            .unwrap();
    });
    let (ok, out, err) = run(&["batches", "list", "--redis", &url, "-q", "orders"]);
    assert!(ok, "{out}{err}");
    let row = out.lines().nth(2).unwrap_or_default();
    assert!(
        row.starts_with("o\\u{202e}9:close") && row.ends_with(" o\\u{202e}9"),
        "{out}"
    );
    assert!(!out.contains('\u{202e}'), "{out}");
    let (ok, out, err) = run(&[
        "batches",
        "show",
        "o\u{202e}9:close",
        "--redis",
        &url,
        "-q",
        "orders",
    ]);
    assert!(ok, "{out}{err}");
    assert!(out.contains("dag        o\\u{202e}9"), "{out}");
    assert!(out.contains("    o\\u{202e}9:charge"), "{out}");
    assert!(!out.contains('\u{202e}'), "{out}");
}
