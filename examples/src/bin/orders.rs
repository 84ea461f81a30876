//! Workflow example (docs/WORKFLOWS.md): an order pipeline
//! `charge -> (invoice, email) -> close`.
//!
//! ```text
//! cargo run -p queue-examples --bin orders              # starts its own redis-server
//! REDIS_URL=redis://127.0.0.1:6379/ cargo run -p queue-examples --bin orders
//! ```
//!
//! Each order is a [`Dag`]: `charge` first, then `invoice` and `email`
//! (each after `charge`, reading its result), then `close` after both,
//! reading theirs (`ctx.child_results`). Every job id derives from the order
//! (`order-<n>:<step>`), so enqueuing an order again (a producer retry after
//! a crash) creates nothing twice; the program does so for every order. A
//! failed email does not stop the order (`ChildPolicy::Continue`: `close`
//! sees the error). The program exits 1 unless every order closed exactly
//! once with both results.

use std::sync::OnceLock;
use std::time::{Duration, Instant};

use queue_core::{
    job, ChildPolicy, Dag, JobContext, JobError, JobSpec, Queue, Worker, WorkerConfig,
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

/// Orders closed, with what `close` read from its dependencies.
static CLOSED: OnceLock<std::sync::Mutex<Vec<String>>> = OnceLock::new();

/// The order's DAG: `charge -> (invoice, email) -> close`.
fn order_dag(order: &Order) -> Result<Dag, queue_core::QueueError> {
    Ok(Dag::new(format!("order-{}", order.number))
        .step("charge", JobSpec::new::<charge::Job>(order)?)
        .step("invoice", JobSpec::new::<invoice::Job>(order)?)
        .after(["charge"])
        .step("email", JobSpec::new::<email::Job>(order)?)
        .after(["charge"])
        .step("close", JobSpec::new::<close::Job>(order)?)
        .after(["invoice"])
        // A failed email does not stop the order: close sees the error.
        .after_with(ChildPolicy::Continue, ["email"]))
}

/// Charges the order; the payment id is the result `invoice` and `email` read.
#[job(queue = "orders", max_attempts = 5)]
pub async fn charge(ctx: JobContext, order: Order) -> Result<(), JobError> {
    tracing::info!(order = order.number, cents = order.cents, "charged");
    ctx.set_child_result(&format!("pay-{}", order.number))?;
    Ok(())
}

/// The payment id `charge` set (`invoice` and `email` run after it).
async fn payment(ctx: &JobContext) -> Result<String, JobError> {
    let charged = ctx.child_results::<String>().await?;
    match charged.first().map(|r| &r.outcome) {
        Some(Ok(Some(pay))) => Ok(pay.clone()),
        other => Err(JobError::permanent(format!("no payment: {other:?}"))),
    }
}

/// Issues the invoice; its number is the result `close` reads.
#[job(queue = "orders", max_attempts = 5)]
pub async fn invoice(ctx: JobContext, order: Order) -> Result<(), JobError> {
    let pay = payment(&ctx).await?;
    ctx.set_child_result(&format!("INV-{:05} ({pay})", order.number))?;
    Ok(())
}

/// Sends the confirmation email; its message id is the result `close` reads.
#[job(queue = "orders", max_attempts = 5)]
pub async fn email(ctx: JobContext, order: Order) -> Result<(), JobError> {
    let pay = payment(&ctx).await?;
    ctx.set_child_result(&format!("msg-{} ({pay})", order.number))?;
    Ok(())
}

/// Closes the order once invoice and email finished, reading their results.
#[job(queue = "orders", max_attempts = 5)]
pub async fn close(ctx: JobContext, order: Order) -> Result<(), JobError> {
    let results = ctx.child_results::<String>().await?;
    let parts: Vec<String> = results
        .iter()
        .map(|r| match &r.outcome {
            Ok(v) => format!(
                "{}={}",
                Dag::step_name(&r.id),
                v.clone().unwrap_or_default()
            ),
            Err(e) => format!("{}=FAILED({e})", Dag::step_name(&r.id)),
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
        order_dag(&order)?.enqueue(&queue).await?;
        // A producer retrying (it did not see the reply): nothing twice.
        order_dag(&order)?.enqueue(&queue).await?;
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
