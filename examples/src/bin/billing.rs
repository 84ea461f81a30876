//! Billing example: a worker charges a fake payment API and books each charge
//! in a PostgreSQL ledger, is SIGKILLed after the ledger commit and before
//! the ack, and the redelivery neither charges nor books again.
//!
//! ```text
//! cargo run -p queue-examples --bin billing            # starts its own redis-server
//! REDIS_URL=redis://127.0.0.1:6379/ DATABASE_URL=postgres://postgres@127.0.0.1:5432/test \
//!     cargo run -p queue-examples --bin billing
//! ```
//!
//! How it stays at one charge per invoice: the handler runs the charge as a
//! step (`ctx.step("charge", ..)`, stored in Redis, skipped on a retry) and
//! passes `ctx.step_key("charge")` as the payment API's `Idempotency-Key`, so
//! even a crash between the API call and storing the step cannot charge twice.
//!
//! How it stays at one ledger entry per invoice: the entry is written in a
//! PostgreSQL transaction together with the invoice's inbox row
//! (`queue-inbox`: `ctx.inbox(&tx).already_done()` … `complete(..)`), so the
//! redelivery after the kill finds the row done, logs "already done" and is
//! acked without booking. The program exits 1 if any invoice was charged or
//! booked twice or not at all. PostgreSQL: `DATABASE_URL`, default
//! `postgres://postgres@127.0.0.1:5432/test` (tables `billing_example_ledger`
//! and `queue_inbox`; this run's rows are deleted at the end).

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
use queue_inbox::tokio_postgres::{self, NoTls};
use queue_inbox::{Inbox, InboxError, InboxExt};
use serde::{Deserialize, Serialize};
use serde_json::json;

/// The job's payload.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Invoice {
    /// Invoice number.
    pub number: u32,
    /// Amount in cents.
    pub cents: u64,
    /// This run of the example (ledger rows are tagged with it).
    #[serde(default)]
    pub run: String,
}

const DEFAULT_DATABASE_URL: &str = "postgres://postgres@127.0.0.1:5432/test";
const LEDGER_DDL: &str = "CREATE TABLE IF NOT EXISTS billing_example_ledger (
    id bigserial PRIMARY KEY, run text NOT NULL, invoice int NOT NULL,
    cents bigint NOT NULL, charge_id text NOT NULL, booked_at timestamptz NOT NULL DEFAULT now())";

fn database_url() -> String {
    std::env::var("DATABASE_URL").unwrap_or_else(|_| DEFAULT_DATABASE_URL.to_string())
}

async fn postgres() -> Result<tokio_postgres::Client, tokio_postgres::Error> {
    let (client, conn) = tokio_postgres::connect(&database_url(), NoTls).await?;
    tokio::spawn(conn);
    Ok(client)
}

/// Where `url` points, without its password, for the "needs PostgreSQL"
/// message: `postgres://user@host:port/db`, rebuilt from the parsed URL.
fn database_display(url: &str) -> String {
    let Ok(cfg) = url.parse::<tokio_postgres::Config>() else {
        return "an unparsable DATABASE_URL".into();
    };
    let hosts: Vec<String> = cfg
        .get_hosts()
        .iter()
        .enumerate()
        .map(|(i, host)| {
            let host = match host {
                tokio_postgres::config::Host::Tcp(h) => h.clone(),
                tokio_postgres::config::Host::Unix(p) => p.display().to_string(),
            };
            match cfg.get_ports().get(i).or(cfg.get_ports().first()) {
                Some(port) => format!("{host}:{port}"),
                None => host,
            }
        })
        .collect();
    format!(
        "postgres://{}@{}/{}",
        cfg.get_user().unwrap_or(""),
        hosts.join(","),
        cfg.get_dbname().unwrap_or("")
    )
}

/// The charge id of the payment API's reply. A reply without one is a
/// retryable error: the step's result is stored and reused by every retry,
/// so storing an empty id (as `unwrap_or_default` did) recorded it for good.
fn charge_id(reply: &serde_json::Value) -> Result<String, JobError> {
    reply["charge_id"]
        .as_str()
        .filter(|id| !id.is_empty())
        .map(str::to_string)
        .ok_or_else(|| JobError::retryable("payment API reply has no charge_id"))
}

/// Books the charge in the ledger, once per invoice: the entry and the
/// invoice's inbox row commit together, the row keeping the entry's
/// reference (`ledger-<id>`, its `result_ref`, printed at the end).
async fn book(ctx: &JobContext, invoice: &Invoice, charge_id: &str) -> Result<(), JobError> {
    let mut db = postgres().await?;
    let tx = db.transaction().await?;
    if ctx
        .inbox(&tx)
        .already_done()
        .await
        .map_err(InboxError::into_job_error)?
    {
        return Ok(()); // booked by an earlier delivery (logged by the inbox)
    }
    let row = tx
        .query_one(
            "INSERT INTO billing_example_ledger (run, invoice, cents, charge_id) \
             VALUES ($1, $2, $3, $4) RETURNING id",
            &[
                &invoice.run,
                &(invoice.number as i32),
                &(invoice.cents as i64),
                &charge_id,
            ],
        )
        .await?;
    let entry: i64 = row.get(0);
    ctx.inbox(&tx)
        .complete(format!("ledger-{entry}"))
        .await
        .map_err(InboxError::into_job_error)?;
    tx.commit().await?;
    tracing::info!(invoice = invoice.number, entry, "booked in the ledger");
    Ok(())
}

/// Charges one invoice and books it, then (on the first attempt) dawdles
/// long enough to be killed: committed, not acked.
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
            charge_id(&reply.body)
        })
        .await?;
    tracing::info!(
        invoice = invoice.number,
        charge_id,
        attempt = ctx.attempt(),
        "charged"
    );
    book(&ctx, &invoice, &charge_id).await?;
    if ctx.attempt() == 1 {
        // The crash window: charged and booked, not yet acked.
        tokio::time::sleep(Duration::from_millis(1500)).await;
    }
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

/// The payment API on a free loopback port.
async fn start_payment_api() -> Result<(Api, SocketAddr), Box<dyn std::error::Error>> {
    let api: Api = Arc::default();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let api_addr = listener.local_addr()?;
    let app = Router::new()
        .route("/charges", post(create_charge))
        .route("/charges", get(list_charges))
        .with_state(api.clone());
    tokio::spawn(async move { axum::serve(listener, app).await });
    Ok((api, api_addr))
}

/// This run's id: job ids and ledger rows carry it, so runs against the same
/// Redis and database do not see each other's work.
fn run_id() -> Result<String, std::time::SystemTimeError> {
    Ok(format!(
        "{:x}",
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)?
            .as_micros()
            ^ u128::from(std::process::id())
    ))
}

/// A watchdog and a second worker until all `invoices` are completed;
/// returns how many deliveries the watchdog reclaimed.
async fn recover(
    url: &str,
    queue: &Queue,
    invoices: usize,
    spawn_worker: &dyn Fn() -> std::io::Result<std::process::Child>,
) -> Result<u64, Box<dyn std::error::Error>> {
    let watchdog = Watchdog::connect(
        url,
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
    while queue.stats("billing").await?.counter("completed") < invoices as i64 {
        if t1.elapsed() > Duration::from_secs(60) {
            return Err("the invoices were not all completed in 60 s".into());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let _ = stop_tx.send(());
    let report = dog.await?;
    second.kill()?;
    second.wait()?;
    Ok(report.reclaimed)
}

/// Prints on which attempt each job was acked and booked; returns how many
/// redeliveries found the inbox row done.
async fn print_deliveries(
    queue: &Queue,
    db: &tokio_postgres::Client,
    ids: &[String],
) -> Result<usize, Box<dyn std::error::Error>> {
    let mut found_done = 0;
    for id in ids {
        let rec = queue
            .completion("billing", id.as_str())
            .await?
            .unwrap_or_default();
        let acked_on: u32 = rec
            .get("attempts")
            .and_then(|a| a.parse().ok())
            .unwrap_or(0);
        let row = Inbox::new().record(db, "billing", id).await?;
        let booked_on = row.as_ref().map_or(0, |r| r.attempts);
        if row.is_some() && acked_on > booked_on {
            found_done += 1;
        }
        println!(
            "  {id}: acked on attempt {acked_on}, booked once on attempt {booked_on} ({})",
            row.and_then(|r| r.result_ref).unwrap_or_default()
        );
    }
    Ok(found_done)
}

/// Deletes this run's ledger entries and inbox rows.
async fn clean_up(
    db: &tokio_postgres::Client,
    run: &str,
    ids: &[String],
) -> Result<(), tokio_postgres::Error> {
    db.execute("DELETE FROM billing_example_ledger WHERE run = $1", &[&run])
        .await?;
    for id in ids {
        db.execute(
            "DELETE FROM queue_inbox WHERE queue = 'billing' AND key = $1",
            &[id],
        )
        .await?;
    }
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

    // PostgreSQL first: without it nothing can be booked, and the bare
    // driver error ("Connection refused") did not say what was wanted.
    let db = postgres().await.map_err(|e| {
        format!(
            "billing needs PostgreSQL at {} (set DATABASE_URL): {e}",
            database_display(&database_url())
        )
    })?;

    // Redis: REDIS_URL or a throwaway server.
    let (_server, url) = match std::env::var("REDIS_URL") {
        Ok(url) => (None, url),
        Err(_) => {
            let server = queue_testkit::RedisServer::start()?;
            let url = server.url();
            (Some(server), url)
        }
    };
    let (api, api_addr) = start_payment_api().await?;

    // The ledger and the inbox. Job ids carry a run id, so runs against the
    // same Redis and database do not see each other's work.
    db.batch_execute(LEDGER_DDL).await?;
    Inbox::new().migrate(&db).await?;
    let run = run_id()?;
    let job_id = |inv: &Invoice| format!("invoice-{}-{run}", inv.number);
    let booked = || async {
        let row = db
            .query_one(
                "SELECT count(*) FROM billing_example_ledger WHERE run = $1",
                &[&run],
            )
            .await?;
        Ok::<i64, tokio_postgres::Error>(row.get(0))
    };

    let queue = Queue::connect(&url).await?;
    let invoices: Vec<Invoice> = (1..=5)
        .map(|n| Invoice {
            number: n,
            cents: 1000 * n as u64,
            run: run.clone(),
        })
        .collect();
    for inv in &invoices {
        charge_invoice::enqueue_with_id(&queue, job_id(inv), inv.clone()).await?;
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
    while booked().await? < invoices.len() as i64 {
        if t0.elapsed() > Duration::from_secs(30) {
            return Err("the first worker did not book every invoice in 30 s".into());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    first.kill()?; // SIGKILL: charged and booked (committed), not acked
    first.wait()?;
    let s = queue.stats("billing").await?;
    println!(
        "SIGKILLed the worker after {} charges and ledger commits; acked so far: {}",
        invoices.len(),
        s.counter("completed")
    );

    let reclaimed = recover(&url, &queue, invoices.len(), &spawn_worker).await?;

    let (calls, charges): (u32, usize) = {
        let ledger = api.lock().unwrap_or_else(|p| p.into_inner());
        (ledger.calls.values().sum(), ledger.charges.len())
    };
    println!("recovered by the watchdog: {reclaimed}");
    println!("payment API calls:         {calls}");
    println!(
        "charges made:              {} (one per invoice: {})",
        charges,
        invoices.len()
    );
    let entries = booked().await?;
    println!(
        "ledger entries booked:     {} (one per invoice: {})",
        entries,
        invoices.len()
    );
    let ids: Vec<String> = invoices.iter().map(job_id).collect();
    let found_done = print_deliveries(&queue, &db, &ids).await?;
    println!("redeliveries that found the inbox row done: {found_done}");
    clean_up(&db, &run, &ids).await?;
    if charges != invoices.len() {
        return Err(format!("expected {} charges, got {}", invoices.len(), charges).into());
    }
    if entries != invoices.len() as i64 {
        return Err(format!("expected {} ledger entries, got {entries}", invoices.len()).into());
    }
    println!("OK: no invoice was charged twice");
    println!("OK: no invoice was booked twice");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A reply without a charge id is retried, not stored as `""` for good.
    #[test]
    fn a_reply_without_a_charge_id_is_a_retryable_error() {
        assert_eq!(
            charge_id(&json!({"charge_id": "ch_0001"})).unwrap(),
            "ch_0001"
        );
        for reply in [json!({}), json!({"charge_id": ""}), json!({"charge_id": 7})] {
            let err = charge_id(&reply).unwrap_err();
            assert!(err.is_retryable(), "{reply}");
            assert_eq!(err.message(), "payment API reply has no charge_id");
        }
    }

    #[test]
    fn the_database_url_is_shown_without_its_password() {
        assert_eq!(
            database_display("postgres://billing:s3cret@db.internal:6432/ledger"),
            "postgres://billing@db.internal:6432/ledger"
        );
        assert_eq!(
            database_display("host=db user=billing password=s3cret dbname=ledger"),
            "postgres://billing@db/ledger"
        );
    }
}
