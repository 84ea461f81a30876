//! Producers in other languages (docs/PROTOCOL.md): `queue-watchdog enqueue`,
//! the Python snippet (redis-py + msgpack) and the Node snippet (ioredis +
//! msgpackr) each enqueue a nested payload that a real `#[job]` worker
//! decodes and compares with the value the test meant; each reports
//! duplicates and completed ids the way the Rust `Queue` does; the CLI reads
//! stdin, schedules by `--run-at` and passes the schema version on; and the
//! script SHA that docs/PROTOCOL.md gives is the one Rust loads.
//!
//! The Python and Node libraries are installed by
//! `examples/producers/setup.sh`; when that fails the test fails (it never skips).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Mutex, OnceLock};

use queue_core::{job, JobContext, JobError, JobState, Queue, QueueKeys, Worker};
use queue_testkit::RedisServer;
use serde::{Deserialize, Serialize};

mod support;

const BIN: &str = env!("CARGO_BIN_EXE_queue-watchdog");
const QUEUE: &str = "orders";

// ------------------------------------------------------------------------
// The payload: a struct with nested structs, every kind of enum variant,
// options, lists, a float, a bool and an integer above 2^32.

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Order {
    order_no: u64,
    customer: Customer,
    lines: Vec<Line>,
    total: f64,
    paid: bool,
    note: Option<String>,
    coupon: Option<String>,
    status: Vec<Status>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Customer {
    name: String,
    balance_cents: i64,
    tags: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Line {
    sku: String,
    qty: u32,
    unit_price: f64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
enum Status {
    Pending,
    Held(String),
    Shipped { carrier: String, parcels: u8 },
    Moved(i32, i32),
}

fn expected_order() -> Order {
    Order {
        order_no: 1 << 40,
        customer: Customer {
            name: "Zoë".into(),
            balance_cents: -(1 << 35),
            tags: vec!["vip".into(), "eu".into()],
        },
        lines: vec![
            Line {
                sku: "A-1".into(),
                qty: 3,
                unit_price: 19.99,
            },
            Line {
                sku: "B-2".into(),
                qty: 1,
                unit_price: 0.5,
            },
        ],
        total: 60.47,
        paid: true,
        note: Some("leave at the door".into()),
        coupon: None,
        status: vec![
            Status::Pending,
            Status::Held("fraud check".into()),
            Status::Shipped {
                carrier: "DHL".into(),
                parcels: 2,
            },
            Status::Moved(-4, 7),
        ],
    }
}

/// What the worker decoded, by job id.
static RECEIVED: Mutex<Vec<(String, Order)>> = Mutex::new(Vec::new());

#[job(queue = "orders", max_attempts = 1)]
async fn record_order(ctx: JobContext, args: Order) -> Result<(), JobError> {
    RECEIVED
        .lock()
        .unwrap()
        .push((ctx.job_id().to_string(), args));
    Ok(())
}

// ------------------------------------------------------------------------
// The three producers, run as an operator or a web tier would.

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

fn producers_dir() -> PathBuf {
    repo_root().join("examples/producers")
}

/// Installs the Python and Node libraries (a no-op when present), once per
/// test binary (the tests run in parallel and share the folders). Panics
/// with the installer's output when that fails: no silent skip.
fn setup_producers() {
    static SETUP: OnceLock<Result<(), String>> = OnceLock::new();
    let result = SETUP.get_or_init(|| {
        let out = Command::new("bash")
            .arg(producers_dir().join("setup.sh"))
            .output()
            .map_err(|e| format!("bash does not run: {e}"))?;
        if out.status.success() {
            return Ok(());
        }
        Err(format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ))
    });
    if let Err(output) = result {
        panic!(
            "examples/producers/setup.sh failed: the Python/Node producer tests need python3 (venv), \
             node and npm and the package registries (scripts/ensure-services.sh installs the tools)\n{output}"
        );
    }
}

#[derive(Debug, Clone, Copy)]
enum Producer {
    Cli,
    Python,
    Node,
}

const PRODUCERS: [Producer; 3] = [Producer::Cli, Producer::Python, Producer::Node];

impl Producer {
    fn name(self) -> &'static str {
        match self {
            Producer::Cli => "cli",
            Producer::Python => "python",
            Producer::Node => "node",
        }
    }

    /// The producer's command with its `--redis`, queue, type, JSON and id.
    fn command(self, url: &str, id: &str, json: &str) -> Command {
        let mut cmd = match self {
            Producer::Cli => {
                let mut c = Command::new(BIN);
                c.arg("enqueue");
                c
            }
            Producer::Python => {
                let mut c = Command::new(producers_dir().join("python/.venv/bin/python"));
                c.arg(producers_dir().join("python/enqueue.py"));
                c
            }
            Producer::Node => {
                let mut c = Command::new("node");
                c.arg(producers_dir().join("node/enqueue.mjs"));
                c
            }
        };
        cmd.args([
            "--redis",
            url,
            "-q",
            QUEUE,
            "--type",
            record_order::NAME,
            "--json",
            json,
            "--id",
            id,
        ]);
        cmd
    }

    /// Enqueues and returns the one line the producer printed.
    fn enqueue(self, url: &str, id: &str, json: &str, extra: &[&str]) -> String {
        let out = self
            .command(url, id, json)
            .args(extra)
            .output()
            .unwrap_or_else(|e| panic!("{} producer does not start: {e}", self.name()));
        let stdout = String::from_utf8_lossy(&out.stdout).trim().to_string();
        assert!(
            out.status.success(),
            "{} producer failed: {stdout}\n{}",
            self.name(),
            String::from_utf8_lossy(&out.stderr)
        );
        stdout
    }

    /// Arguments that delay the job by an hour.
    fn delay_an_hour(self) -> &'static [&'static str] {
        match self {
            Producer::Cli => &["--delay", "1h"],
            Producer::Python | Producer::Node => &["--delay-ms", "3600000"],
        }
    }

    /// The SHA1 of the enqueue script the snippet sends (None for the CLI,
    /// which is Rust).
    fn script_sha(self) -> Option<String> {
        let mut cmd = match self {
            Producer::Cli => return None,
            _ => self.command("redis://127.0.0.1:1/", "x", "null"),
        };
        let out = cmd.arg("--print-sha").output().unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        Some(String::from_utf8_lossy(&out.stdout).trim().to_string())
    }
}

/// A runtime for the Rust side (worker, stats, the SHA check).
fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Runtime::new().unwrap()
}

/// Runs a worker until `n` jobs completed or were dead-lettered (bounded wait).
fn run_worker_until_finished(url: &str, n: i64) {
    rt().block_on(async {
        let queue = Queue::connect(url).await.unwrap();
        let worker = Worker::builder(url)
            .register(record_order::handler())
            // A newer schema version is dead-lettered at once (no wait for
            // an upgraded worker), so a `--schema-version` job finishes.
            .newer_version_wait(std::time::Duration::ZERO)
            .build()
            .await
            .unwrap();
        support::run_worker_until(worker, queue, QUEUE, move |s| {
            s.counter("completed") + s.counter("dead") >= n
        })
        .await;
    });
}

/// `queue-watchdog dead list` of the queue (the reasons, for a failure message).
fn dead_list(url: &str) -> String {
    let out = Command::new(BIN)
        .args(["dead", "list", "--redis", url, "-q", QUEUE])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The text of a RESP bulk-string reply (`$6\r\nqueued\r\n`), empty for nil.
fn bulk(reply: &str) -> String {
    reply.lines().nth(1).unwrap_or("").to_string()
}

/// A field of the job's hash, empty when missing.
fn job_field(server: &RedisServer, id: &str, field: &str) -> String {
    bulk(
        &server
            .command(&["HGET", &QueueKeys::new(QUEUE).job(id), field])
            .unwrap(),
    )
}

// ------------------------------------------------------------------------

#[test]
fn every_producer_enqueues_a_nested_payload_a_rust_worker_decodes() {
    setup_producers();
    let server = RedisServer::start().unwrap();
    let url = server.url();
    let expected = expected_order();
    let json = serde_json::to_string(&expected).unwrap();

    let mut ids = Vec::new();
    for p in PRODUCERS {
        let id = format!("{}-order", p.name());
        assert_eq!(p.enqueue(&url, &id, &json, &[]), format!("created {id}"));
        assert_eq!(job_field(&server, &id, "state"), "queued", "{id}");
        assert_eq!(job_field(&server, &id, "type"), "record_order", "{id}");
        assert_eq!(job_field(&server, &id, "v"), "1", "{id}");
        ids.push(id);
    }
    run_worker_until_finished(&url, ids.len() as i64);

    let received = RECEIVED.lock().unwrap().clone();
    for id in &ids {
        let got: Vec<_> = received.iter().filter(|(r, _)| r == id).collect();
        assert_eq!(
            got.len(),
            1,
            "{id} handled once; dead letters:\n{}",
            dead_list(&url)
        );
        assert_eq!(got[0].1, expected, "{id}: the worker decoded another value");
    }
    let stats = rt().block_on(async { Queue::connect(&url).await?.stats(QUEUE).await });
    let stats = stats.unwrap();
    assert_eq!(
        (stats.counter("completed"), stats.dead),
        (3, 0),
        "{stats:?}"
    );

    // The same ids again: each producer says the job already completed.
    for (p, id) in PRODUCERS.iter().zip(&ids) {
        assert_eq!(
            p.enqueue(&url, id, &json, &[]),
            format!("already-completed {id}")
        );
    }
}

#[test]
fn every_producer_reports_a_duplicate_with_the_existing_jobs_state() {
    setup_producers();
    let server = RedisServer::start().unwrap();
    let url = server.url();
    let json = serde_json::to_string(&expected_order()).unwrap();
    for p in PRODUCERS {
        let id = format!("{}-later", p.name());
        assert_eq!(
            p.enqueue(&url, &id, &json, p.delay_an_hour()),
            format!("created {id}")
        );
        assert_eq!(job_field(&server, &id, "state"), "delayed");
        // A second enqueue of the id (even with another payload) writes nothing.
        assert_eq!(
            p.enqueue(&url, &id, "{}", &[]),
            format!("duplicate {id} state={}", JobState::Delayed)
        );
        let score = server
            .command(&["ZSCORE", &QueueKeys::new(QUEUE).delayed, &id])
            .unwrap();
        assert!(!bulk(&score).is_empty(), "{id} stays delayed: {score:?}");
    }
    let stats = rt().block_on(async { Queue::connect(&url).await?.stats(QUEUE).await });
    assert_eq!(stats.unwrap().counter("enqueued"), 3);
}

/// The SHA1 written in docs/PROTOCOL.md after `<script> script SHA1:`.
fn documented_sha(script: &str) -> String {
    let doc = std::fs::read_to_string(repo_root().join("docs/PROTOCOL.md")).unwrap();
    let marker = format!("{script} script SHA1: `");
    let at = doc
        .find(&marker)
        .unwrap_or_else(|| panic!("docs/PROTOCOL.md gives the {script} script SHA1"))
        + marker.len();
    doc[at..at + 40].to_string()
}

/// Rust's `Queue` sends the multi-job script (`enqueue_many`, docs/PROTOCOL.md
/// section 3a) as a function of the queue-core library; the documented SHA of
/// its `EVALSHA` form is that of the files (prelude, `\n`, script), which is
/// what a producer in another language loads; the snippets send the one-job
/// script, whose documented SHA queue-core's own test
/// (`scripts/enqueue_many_tests.rs`) checks against the script it builds.
#[test]
fn the_documented_script_sha_is_the_one_rust_loads_and_the_snippets_send() {
    setup_producers();
    let sha = documented_sha("enqueue");
    let many_sha = documented_sha("enqueue_many");
    let scripts = repo_root().join("queue-core/src/scripts");
    let file = |name: &str| std::fs::read_to_string(scripts.join(name)).unwrap();
    let many_text = format!("{}\n{}", file("prelude.lua"), file("enqueue_many.lua"));
    assert_eq!(
        redis::Script::new(&many_text).get_hash(),
        many_sha,
        "docs/PROTOCOL.md gives enqueue_many SHA1 {many_sha}, but the files hash to another: \
         update the SHA (and the ARGV table) in docs/PROTOCOL.md"
    );
    // A fresh server that only a Rust producer has talked to: it loaded the
    // library whose `enqueue_many` function runs that same text.
    let server = RedisServer::start().unwrap();
    rt().block_on(async {
        let queue = Queue::connect(&server.url()).await.unwrap();
        queue.enqueue::<record_order::Job>(&expected_order()).await
    })
    .unwrap();
    let libraries = server
        .command(&["FUNCTION", "LIST", "LIBRARYNAME", "queue_core_*"])
        .unwrap();
    assert!(
        libraries.contains("_enqueue_many"),
        "Rust did not load the queue-core function library: {libraries}"
    );
    for p in [Producer::Python, Producer::Node] {
        assert_eq!(p.script_sha().as_deref(), Some(sha.as_str()), "{p:?}");
    }
}

/// The Redis clock in ms (`TIME`).
fn redis_now_ms(server: &RedisServer) -> i64 {
    let reply = server.command(&["TIME"]).unwrap();
    let secs: i64 = reply.lines().nth(2).unwrap().trim().parse().unwrap();
    secs * 1000
}

#[test]
fn the_cli_reads_stdin_schedules_by_run_at_and_a_wrong_schema_version_is_dead_lettered() {
    let server = RedisServer::start().unwrap();
    let url = server.url();
    let json = serde_json::to_string(&expected_order()).unwrap();

    // `--json -` reads the arguments from stdin; `--run-at` in Unix ms, an
    // hour ahead on the Redis clock, leaves the job delayed until then.
    let run_at = redis_now_ms(&server) + 3_600_000;
    let mut child = Producer::Cli
        .command(&url, "cli-stdin", "-")
        .args(["--run-at", &run_at.to_string()])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(json.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "created cli-stdin"
    );
    assert_eq!(job_field(&server, "cli-stdin", "state"), "delayed");
    assert_eq!(
        job_field(&server, "cli-stdin", "run_at"),
        run_at.to_string()
    );

    // An RFC 3339 time in the past runs now.
    let at = ["--run-at", "2001-02-03T04:05:06Z"];
    assert_eq!(
        Producer::Cli.enqueue(&url, "cli-past", &json, &at),
        "created cli-past"
    );
    assert_eq!(job_field(&server, "cli-past", "state"), "queued");

    // A schema version the handler does not know is dead-lettered, never run
    // (a newer one once no worker announces it; this worker waits zero).
    let v2 = ["--schema-version", "2"];
    assert_eq!(
        Producer::Cli.enqueue(&url, "cli-v2", &json, &v2),
        "created cli-v2"
    );
    run_worker_until_finished(&url, 2);
    let dead = dead_list(&url);
    let reason = job_field(&server, "cli-v2", "dead_reason");
    assert!(
        dead.contains("cli-v2")
            && reason.contains(":2 is newer than this worker's handler (version 1)"),
        "{dead} {reason}"
    );
    let received = RECEIVED.lock().unwrap().clone();
    assert!(received
        .iter()
        .any(|(id, o)| id == "cli-past" && *o == expected_order()));
    assert!(!received
        .iter()
        .any(|(id, _)| id == "cli-v2" || id == "cli-stdin"));
}
