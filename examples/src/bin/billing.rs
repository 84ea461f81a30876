//! Billing example: a worker charges a fake payment API, is SIGKILLed after
//! the charge and before the ack, and the redelivery does not charge again.
//!
//! ```text
//! cargo run -p queue-examples --bin billing            # starts its own redis-server
//! REDIS_URL=redis://127.0.0.1:6379/ cargo run -p queue-examples --bin billing
//! ```
//!
//! How it stays at one charge per invoice: the handler runs the charge as a
//! step (`ctx.step("charge", ..)`, stored in Redis, skipped on a retry) and
//! passes `ctx.step_key("charge")` as the payment API's `Idempotency-Key`, so
//! even a crash between the API call and storing the step cannot charge twice.
//! The program exits 1 if any invoice was charged twice or not at all.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::{get, post};
use axum::{Json, Router};
use queue_core::{
    job, JobContext, JobError, Queue, Watchdog, WatchdogConfig, Worker, WorkerConfig,
};
use queue_examples::http::Client;
use serde::{Deserialize, Serialize};
use serde_json::json;

/// The job's payload.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Invoice {
    /// Invoice number.
    pub number: u32,
    /// Amount in cents.
    pub cents: u64,
}

/// Charges one invoice, then (on the first attempt) dawdles long enough to be killed.
#[job(queue = "billing", max_attempts = 5, timeout = "30s")]
async fn charge_invoice(ctx: JobContext, invoice: Invoice) -> Result<(), JobError> {
    let api: SocketAddr = std::env::var("PAYMENT_API")
        .map_err(|_| JobError::permanent("PAYMENT_API not set"))?
        .parse()
        .map_err(JobError::permanent)?;
    let key = ctx.step_key("charge");
    let charge_id: String = ctx
        .step("charge", || async {
            let reply = Client::new(api)
                .post_json("/charges", Some(&key), &json!({"cents": invoice.cents}))
                .await
                .map_err(JobError::retryable)?;
            if reply.status >= 300 {
                return Err(JobError::retryable(format!(
                    "payment API answered {}",
                    reply.status
                )));
            }
            Ok(reply.body["charge_id"]
                .as_str()
                .unwrap_or_default()
                .to_string())
        })
        .await?;
    tracing::info!(
        invoice = invoice.number,
        charge_id,
        attempt = ctx.attempt(),
        "charged"
    );
    if ctx.attempt() == 1 {
        // The crash window: charged, not yet acked.
        tokio::time::sleep(Duration::from_millis(1500)).await;
    }
    ctx.set_result_ref(charge_id);
    Ok(())
}

/// The fake payment provider: deduplicates by `Idempotency-Key`, like real ones.
#[derive(Default)]
struct Ledger {
    /// key -> charge id
    charges: HashMap<String, String>,
    /// calls per key (including deduplicated retries)
    calls: HashMap<String, u32>,
}

type Api = Arc<Mutex<Ledger>>;

async fn create_charge(
    State(api): State<Api>,
    headers: HeaderMap,
) -> (StatusCode, Json<serde_json::Value>) {
    let Some(key) = headers.get("idempotency-key").and_then(|v| v.to_str().ok()) else {
        return (
            StatusCode::BAD_REQUEST,
            Json(json!({"error": "Idempotency-Key required"})),
        );
    };
    let mut ledger = api.lock().unwrap_or_else(|p| p.into_inner());
    *ledger.calls.entry(key.to_string()).or_default() += 1;
    let n = ledger.charges.len();
    let id = ledger
        .charges
        .entry(key.to_string())
        .or_insert_with(|| format!("ch_{n:04}"))
        .clone();
    (StatusCode::OK, Json(json!({"charge_id": id})))
}

async fn list_charges(State(api): State<Api>) -> Json<serde_json::Value> {
    let ledger = api.lock().unwrap_or_else(|p| p.into_inner());
    Json(json!({"charges": ledger.charges.len(), "calls": ledger.calls.values().sum::<u32>()}))
}

async fn worker_main(url: String) -> Result<(), Box<dyn std::error::Error>> {
    let config = WorkerConfig {
        lease: Duration::from_secs(1),
        ..WorkerConfig::default()
    };
    Worker::builder(&url)
        .register(charge_invoice::handler())
        .config(config)
        .build()
        .await?
        .run()
        .await?;
    Ok(())
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    queue_examples::init_tracing("info");
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("worker") {
        let url = args
            .get(2)
            .cloned()
            .ok_or("usage: billing worker <redis-url>")?;
        return worker_main(url).await;
    }

    // Redis: REDIS_URL or a throwaway server.
    let (_server, url) = match std::env::var("REDIS_URL") {
        Ok(url) => (None, url),
        Err(_) => {
            let server = queue_testkit::RedisServer::start()?;
            let url = server.url();
            (Some(server), url)
        }
    };
    // The payment API on a free loopback port.
    let api: Api = Arc::default();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let api_addr = listener.local_addr()?;
    let app = Router::new()
        .route("/charges", post(create_charge))
        .route("/charges", get(list_charges))
        .with_state(api.clone());
    tokio::spawn(async move { axum::serve(listener, app).await });

    let queue = Queue::connect(&url).await?;
    let invoices: Vec<Invoice> = (1..=5)
        .map(|n| Invoice {
            number: n,
            cents: 1000 * n as u64,
        })
        .collect();
    for inv in &invoices {
        charge_invoice::enqueue_with_id(&queue, format!("invoice-{}", inv.number), inv.clone())
            .await?;
    }
    println!("enqueued {} invoices on {url}", invoices.len());

    let spawn_worker = || {
        std::process::Command::new(std::env::current_exe()?)
            .args(["worker", &url])
            .env("PAYMENT_API", api_addr.to_string())
            .spawn()
    };
    let mut first = spawn_worker()?;
    let t0 = Instant::now();
    while api.lock().unwrap_or_else(|p| p.into_inner()).charges.len() < invoices.len() {
        if t0.elapsed() > Duration::from_secs(30) {
            return Err("the first worker did not charge every invoice in 30 s".into());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    first.kill()?; // SIGKILL: charged, not acked
    first.wait()?;
    let s = queue.stats("billing").await?;
    println!(
        "SIGKILLed the worker after {} charges; acked so far: {}",
        invoices.len(),
        s.counter("completed")
    );

    let watchdog = Watchdog::connect(
        &url,
        ["billing"],
        WatchdogConfig {
            interval: Duration::from_millis(200),
            ..WatchdogConfig::default()
        },
    )
    .await?;
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let dog = tokio::spawn(async move {
        watchdog
            .run_until(async {
                let _ = stop_rx.await;
            })
            .await
    });
    let mut second = spawn_worker()?;
    let t1 = Instant::now();
    while queue.stats("billing").await?.counter("completed") < invoices.len() as i64 {
        if t1.elapsed() > Duration::from_secs(60) {
            return Err("the invoices were not all completed in 60 s".into());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let _ = stop_tx.send(());
    let report = dog.await?;
    second.kill()?;
    second.wait()?;

    let (calls, charges): (u32, usize) = {
        let ledger = api.lock().unwrap_or_else(|p| p.into_inner());
        (ledger.calls.values().sum(), ledger.charges.len())
    };
    println!("recovered by the watchdog: {}", report.reclaimed);
    println!("payment API calls:         {calls}");
    println!(
        "charges made:              {} (one per invoice: {})",
        charges,
        invoices.len()
    );
    for inv in &invoices {
        let id = format!("invoice-{}", inv.number);
        let rec = queue
            .completion("billing", id.as_str())
            .await?
            .unwrap_or_default();
        println!(
            "  {id}: completed after {} attempt(s), charge {}",
            rec.get("attempts").map_or("?", |s| s),
            rec.get("result").map_or("?", |s| s)
        );
    }
    if charges != invoices.len() {
        return Err(format!("expected {} charges, got {}", invoices.len(), charges).into());
    }
    println!("OK: no invoice was charged twice");
    Ok(())
}
