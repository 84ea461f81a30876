//! Workflow example (docs/WORKFLOWS.md): an order pipeline
//! `charge -> (invoice, email) -> close`.
//!
//! ```text
//! cargo run -p queue-examples --bin orders              # starts its own redis-server
//! REDIS_URL=redis://127.0.0.1:6379/ cargo run -p queue-examples --bin orders
//! ```
//!
//! Each order is a [`Flow`]: its parent `close` waits for its children
//! `invoice` and `email`, which wait for nothing; `charge` runs first and
//! enqueues the flow from its handler, with ids derived from the order, so a
//! re-run of `charge` (after a crash) enqueues nothing twice. `close` reads
//! its children's results (`ctx.child_results`). The program exits 1 unless
//! every order closed exactly once with both results.

use std::sync::OnceLock;
use std::time::{Duration, Instant};

use queue_core::{
    job, ChildPolicy, Flow, JobContext, JobError, JobSpec, Queue, Worker, WorkerConfig,
};
use serde::{Deserialize, Serialize};

/// One order.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Order {
    /// Order number.
    pub number: u32,
    /// Amount in cents.
    pub cents: u64,
}

/// The producer handle the `charge` handler enqueues the flow with.
static QUEUE: OnceLock<Queue> = OnceLock::new();
/// Orders closed, with what `close` read from its children.
static CLOSED: OnceLock<std::sync::Mutex<Vec<String>>> = OnceLock::new();

/// Charges the order, then enqueues its flow: `close` after `invoice` and `email`.
#[job(queue = "orders", max_attempts = 5)]
pub async fn charge(_ctx: JobContext, order: Order) -> Result<(), JobError> {
    tracing::info!(order = order.number, cents = order.cents, "charged");
    let queue = QUEUE.get().expect("queue set in main");
    let id = |step: &str| format!("order-{}:{step}", order.number);
    Flow::new(JobSpec::new::<close::Job>(&order)?.id(id("close")))
        .child(JobSpec::new::<invoice::Job>(&order)?.id(id("invoice")))
        // A failed email does not stop the order: close sees the error.
        .child_with(
            ChildPolicy::Continue,
            JobSpec::new::<email::Job>(&order)?.id(id("email")),
        )
        .enqueue(queue)
        .await?;
    Ok(())
}

/// Issues the invoice; its number is the result `close` reads.
#[job(queue = "orders", max_attempts = 5)]
pub async fn invoice(ctx: JobContext, order: Order) -> Result<(), JobError> {
    ctx.set_child_result(&format!("INV-{:05}", order.number))?;
    Ok(())
}

/// Sends the confirmation email; its message id is the result `close` reads.
#[job(queue = "orders", max_attempts = 5)]
pub async fn email(ctx: JobContext, order: Order) -> Result<(), JobError> {
    ctx.set_child_result(&format!("msg-{}", order.number))?;
    Ok(())
}

/// Closes the order once invoice and email finished, reading their results.
#[job(queue = "orders", max_attempts = 5)]
pub async fn close(ctx: JobContext, order: Order) -> Result<(), JobError> {
    let results = ctx.child_results::<String>().await?;
    let parts: Vec<String> = results
        .iter()
        .map(|r| match &r.outcome {
            Ok(v) => format!("{}={}", r.id, v.clone().unwrap_or_default()),
            Err(e) => format!("{}=FAILED({e})", r.id),
        })
        .collect();
    let line = format!("order {} closed: {}", order.number, parts.join(", "));
    println!("{line}");
    CLOSED
        .get_or_init(Default::default)
        .lock()
        .unwrap()
        .push(line);
    Ok(())
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .init();
    let (_server, url) = match std::env::var("REDIS_URL") {
        Ok(url) => (None, url),
        Err(_) => {
            let server = queue_testkit::RedisServer::start()?;
            let url = server.url();
            (Some(server), url)
        }
    };
    let queue = Queue::connect(&url).await?;
    let _ = QUEUE.set(queue.clone());
    let worker = Worker::builder(&url)
        .register(charge::handler())
        .register(invoice::handler())
        .register(email::handler())
        .register(close::handler())
        .config(WorkerConfig {
            concurrency: 8,
            ..WorkerConfig::default()
        })
        .build()
        .await?;
    let shutdown = worker.shutdown_handle();
    let running = tokio::spawn(worker.run());

    const ORDERS: u32 = 5;
    let run = std::process::id();
    for n in 0..ORDERS {
        let order = Order {
            number: run * 100 + n,
            cents: 1000 + u64::from(n),
        };
        charge::enqueue_with_id(&queue, format!("order-{}:charge", order.number), order).await?;
    }
    let start = Instant::now();
    let closed = || CLOSED.get_or_init(Default::default).lock().unwrap().clone();
    while closed().len() < ORDERS as usize && start.elapsed() < Duration::from_secs(30) {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    shutdown.shutdown();
    running.await??;
    let closed = closed();
    let ok = closed.len() == ORDERS as usize && closed.iter().all(|l| l.contains("INV-"));
    println!(
        "{} of {ORDERS} orders closed{}",
        closed.len(),
        if ok { "" } else { ": FAILED" }
    );
    std::process::exit(if ok { 0 } else { 1 });
}
