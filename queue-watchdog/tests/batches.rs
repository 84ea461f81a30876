//! `queue-watchdog batches show` (docs/WORKFLOWS.md) against a real
//! redis-server: a sealed batch's counts as text and JSON; exit 1 for an
//! unknown batch.

use std::process::Command;

use queue_core::{Batch, JobSpec, Queue};
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
