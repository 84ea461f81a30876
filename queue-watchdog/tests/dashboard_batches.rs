//! The dashboard's batch views (docs/WORKFLOWS.md, "Operating batches")
//! over HTTP and in headless Chromium: the queue page links to its batches
//! page (newest first, state and counts, an open batch's expiry), a batch's
//! page shows its counts, members with their outcomes, its callback / parent
//! and the DAG's steps, and a member job's page links to its batches. The
//! browser test takes docs/images/dashboard-batch.png.

use std::time::Duration;

use queue_core::{
    BoxFuture, ChildPolicy, Dag, Job, JobContext, JobError, JobSpec, Queue, Worker, WorkerConfig,
};
use queue_testkit::RedisServer;
use serde_json::json;

#[path = "support/abandoned.rs"]
mod abandoned;
#[path = "support/browser.rs"]
mod browser;
#[path = "support/mod.rs"]
mod support;
use browser::{chromium_or_skip, http, start_dashboard, Browser};

/// A DAG step: `email` fails, every other step succeeds.
struct Step;
impl Job for Step {
    type Args = String;
    const NAME: &'static str = "step";
    const QUEUE: &'static str = "orders";
    const MAX_ATTEMPTS: u32 = 1;
    fn run(_: JobContext, step: String) -> BoxFuture<'static, Result<(), JobError>> {
        Box::pin(async move {
            if step == "email" {
                return Err(JobError::permanent("smtp refused"));
            }
            Ok(())
        })
    }
}

/// Order o7 ran (`close` after `invoice` and `email`, `email` under
/// Continue, dead); order o8's producer died before the seal (open).
fn seed(url: &str) {
    tokio::runtime::Runtime::new().unwrap().block_on(async {
        let queue = Queue::connect(url).await.unwrap();
        let step = |s: &str| JobSpec::new::<Step>(&s.to_string()).unwrap();
        Dag::new("o7")
            .step("charge", step("charge"))
            .step("invoice", step("invoice"))
            .after(["charge"])
            .step("email", step("email"))
            .after(["charge"])
            .step("close", step("close"))
            .after(["invoice"])
            .after_with(ChildPolicy::Continue, ["email"])
            .enqueue(&queue)
            .await
            .unwrap();
        let worker = Worker::builder(url)
            .register(queue_core::Registration::of::<Step>())
            .config(WorkerConfig {
                block_timeout: Duration::from_millis(100),
                ..WorkerConfig::default()
            })
            .build()
            .await
            .unwrap();
        support::run_worker_until(worker, queue.clone(), "orders", |s| {
            s.counter("completed") >= 3
        })
        .await;
        let o8 = Dag::new("o8")
            .step("charge", step("charge"))
            .step("close", step("close"))
            .after(["charge"]);
        abandoned::abandon_dag(url, &queue, "orders", o8).await;
    });
}

#[test]
fn batch_pages_over_http() {
    let server = RedisServer::start().unwrap();
    let url = server.url();
    seed(&url);
    let (_dash, port) = start_dashboard(&url, &["--queue", "orders"]);
    let (status, body) = http(port, "GET", "/queues/orders", &[]);
    assert_eq!(status, 200);
    assert!(body.contains(r#"href="/queues/orders/batches""#), "{body}");
    let (status, body) = http(port, "GET", "/queues/orders/batches", &[]);
    assert_eq!(status, 200, "{body}");
    let o8 = body.find("o8:close").expect("o8 listed");
    let o7 = body.find("o7:close").expect("o7 listed");
    assert!(o8 < o7, "newest first");
    assert!(body.contains("in 2d"), "the open batch's expiry: {body}");
    let (status, body) = http(port, "GET", "/queues/orders/batches/o7:close", &[]);
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("2 finished of 2"), "{body}");
    assert!(
        body.contains(r#"class="state good">fired"#) || body.contains(">fired<"),
        "{body}"
    );
    assert!(
        body.contains("smtp refused"),
        "email's failure recorded: {body}"
    );
    assert!(
        body.contains(r#"id="dag""#) && body.contains("invoice, email=continue"),
        "{body}"
    );
    let (_, body) = http(port, "GET", "/queues/orders/batches/o8:close", &[]);
    assert!(body.contains(r#"id="expires""#), "{body}");
    // The dead member's page links to the batches it counts in.
    let (status, body) = http(port, "GET", "/queues/orders/jobs/o7:email", &[]);
    assert_eq!(status, 200, "{body}");
    assert!(
        body.contains(r#"href="/queues/orders/batches/o7%3Aclose""#),
        "{body}"
    );
    assert!(body.contains("spawned by"), "{body}");
    let (status, _) = http(port, "GET", "/queues/orders/batches/nope", &[]);
    assert_eq!(status, 404);
}

#[test]
fn batch_pages_in_chromium() {
    let Some(chromium) = chromium_or_skip("dashboard batches browser test") else {
        return;
    };
    let server = RedisServer::start().unwrap();
    let url = server.url();
    seed(&url);
    let (_dash, port) = start_dashboard(&url, &["--queue", "orders"]);
    let base = format!("http://127.0.0.1:{port}");
    let mut b = Browser::launch(&chromium);
    b.goto(&format!("{base}/queues/orders"));
    b.click("#batches-link");
    b.wait_for(
        "the batches page",
        "document.readyState === 'complete' && !!document.getElementById('batches')",
    );
    let rows = b.eval("document.querySelectorAll('#batches tbody tr').length");
    assert_eq!(
        rows,
        json!(4),
        "o7: invoice, email, close; o8: close (open)"
    );
    b.eval("document.querySelector('#batches a[href$=\"o7%3Aclose\"]').click()");
    b.wait_for(
        "the batch page",
        "document.readyState === 'complete' && !!document.getElementById('batch-id')",
    );
    assert_eq!(b.text("#batch-id"), "o7:close");
    assert!(b.text("#counts").starts_with("2 finished of 2"));
    assert_eq!(
        b.eval("document.querySelectorAll('#dag tbody tr').length"),
        json!(4)
    );
    b.screenshot("dashboard-batch.png");
    // From a member to its job page and back to the batch.
    b.eval("document.querySelector('#members a[href$=\"o7%3Aemail\"]').click()");
    b.wait_for(
        "the member's page",
        "document.readyState === 'complete' && !!document.getElementById('job-id')",
    );
    assert!(b.text("#batches").contains("batch o7:close"));
}
