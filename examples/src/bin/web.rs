//! `web`: an axum server whose handler enqueues a job.
//!
//! ```text
//! cargo run -p queue-examples --bin web -- --listen 127.0.0.1:3000 --redis redis://127.0.0.1:6379/
//!
//! curl -i -X POST localhost:3000/welcome -H 'content-type: application/json' \
//!      -d '{"email":"ada@example.com","name":"Ada"}'
//!   202 {"job_id":"…","duplicate":false}
//! curl -i -X POST localhost:3000/welcome -H 'content-type: application/json' \
//!      -H 'Idempotency-Key: signup-42' -d '{"email":"ada@example.com","name":"Ada"}'
//!   202 the first time, then 200 {"job_id":"signup-42","duplicate":true,"state":"…"}
//!   and 422 when the same key comes with a different body
//! curl localhost:3000/jobs/<id>     # the job's state (queued, delayed, active, dead, completed)
//! curl localhost:3000/stats         # queue lengths and lifetime counters
//! ```
//!
//! An enqueue returns only once Redis stored the job; when it cannot, the
//! client gets `503 {"error": "…"}` and the job was not accepted.
//! Run `worker` to execute the jobs.
//!
//! The `Idempotency-Key` is the job id as is: this example has no notion of
//! a client, so a key is global to the `emails` queue and two clients that
//! pick the same key share one job. A service with authenticated clients
//! scopes it (job id `"<client id>:<key>"`). The SHA-256 of the body is
//! stored with the job (field `request_sha256`, then the completion record's
//! `result`), and a key sent again with a different body answers `422`
//! instead of `200 duplicate`, which would silently drop the second request
//! (as Stripe and the IETF Idempotency-Key draft do).

use std::process::ExitCode;

use axum::extract::rejection::JsonRejection;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use clap::Parser;
use queue_core::{EnqueueOptions, EnqueueOutcome, JobId, JobInfo, Queue, QueueError, QueueStats};
use queue_examples::{
    request_sha256, send_welcome, Welcome, REQUEST_HASH_FIELD, REQUEST_HASH_PREFIX, WELCOME_QUEUE,
};
use serde_json::{json, Value};
use tracing::{error, info, warn};

/// Web front end of the examples: POST /welcome enqueues a `send_welcome` job.
#[derive(Debug, Parser)]
#[command(name = "web", about)]
struct Args {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:3000")]
    listen: String,
    /// Redis URL.
    #[arg(long, env = "REDIS_URL", default_value = "redis://127.0.0.1:6379/")]
    redis: String,
}

#[tokio::main]
async fn main() -> ExitCode {
    queue_examples::init_tracing("info");
    match serve(Args::parse()).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            error!("web failed: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn serve(args: Args) -> Result<(), Box<dyn std::error::Error>> {
    let queue = Queue::connect(&args.redis).await?;
    let listener = tokio::net::TcpListener::bind(&args.listen)
        .await
        .map_err(|e| format!("cannot listen on {}: {e}", args.listen))?;
    info!(listen = %listener.local_addr()?, "web listening");
    axum::serve(listener, app(queue))
        .with_graceful_shutdown(shutdown_signal())
        .await?;
    info!("web stopped");
    Ok(())
}

fn app(queue: Queue) -> Router {
    Router::new()
        .route("/welcome", post(enqueue_welcome))
        .route("/jobs/{id}", get(job_state))
        .route("/stats", get(stats))
        .with_state(queue)
}

/// `POST /welcome`: enqueue, answer `202 {"job_id"}`; with an `Idempotency-Key`
/// header the key is the job id and a repeat answers `200 {"duplicate": true}`,
/// or `422` when its body differs from the one that created the job.
async fn enqueue_welcome(
    State(queue): State<Queue>,
    headers: HeaderMap,
    body: Result<Json<Welcome>, JsonRejection>,
) -> Response {
    let Json(welcome) = match body {
        Ok(b) => b,
        Err(rejection) => return error_response(rejection.status(), rejection.body_text()),
    };
    let key = match headers.get("idempotency-key").map(|v| v.to_str()) {
        None => None,
        Some(Ok(k)) => Some(k.to_string()),
        Some(Err(_)) => {
            return error_response(
                StatusCode::BAD_REQUEST,
                "Idempotency-Key must be visible ASCII",
            )
        }
    };
    let hash = request_sha256(&welcome);
    let result = match key {
        None => send_welcome::enqueue(&queue, welcome)
            .await
            .map(|id| (id, None)),
        Some(key) => {
            let opts = EnqueueOptions::new()
                .id(key)
                .extra_field(REQUEST_HASH_FIELD, hash.as_str());
            send_welcome::enqueue_with(&queue, opts, welcome)
                .await
                .map(|e| (e.id, duplicate_state(&e.outcome)))
        }
    };
    if let Ok((id, Some(_))) = &result {
        match stored_request_hash(&queue, id).await {
            Ok(Some(stored)) if stored != hash => {
                warn!(job_id = %id, "Idempotency-Key reused with a different body: refused");
                let body = json!({
                    "error": format!(
                        "Idempotency-Key {:?} was already used with a different request body; \
                         use a new key for a new request",
                        id.as_str()
                    ),
                    "job_id": id,
                });
                return (StatusCode::UNPROCESSABLE_ENTITY, Json(body)).into_response();
            }
            // The same body, or no hash to compare (a job enqueued without
            // one, or whose record expired meanwhile): a duplicate.
            Ok(_) => {}
            Err(e) => return queue_error_response("idempotency check failed", &e),
        }
    }
    match result {
        Ok((id, None)) => {
            info!(job_id = %id, "welcome job enqueued");
            (
                StatusCode::ACCEPTED,
                Json(json!({"job_id": id, "duplicate": false})),
            )
                .into_response()
        }
        Ok((id, Some(state))) => {
            info!(job_id = %id, state, "duplicate enqueue: nothing written");
            let body = json!({"job_id": id, "duplicate": true, "state": state});
            (StatusCode::OK, Json(body)).into_response()
        }
        Err(e) => queue_error_response("enqueue failed", &e),
    }
}

/// The body hash stored with job `id`: its `request_sha256` field while the
/// job exists (queued, delayed, active, dead), else from its completion
/// record. `None` when neither has one.
async fn stored_request_hash(queue: &Queue, id: &JobId) -> Result<Option<String>, QueueError> {
    if let Some(info) = queue.job(WELCOME_QUEUE, id).await? {
        return Ok(info.field(REQUEST_HASH_FIELD).map(str::to_owned));
    }
    let record = queue.completion(WELCOME_QUEUE, id).await?;
    Ok(record
        .as_ref()
        .and_then(|r| r.get("result"))
        .and_then(|r| r.strip_prefix(REQUEST_HASH_PREFIX))
        .map(str::to_owned))
}

/// `None` when the enqueue wrote the job, else the existing job's state.
fn duplicate_state(outcome: &EnqueueOutcome) -> Option<String> {
    match outcome {
        EnqueueOutcome::Created => None,
        EnqueueOutcome::Duplicate { state } => Some(state.to_string()),
        EnqueueOutcome::AlreadyCompleted => Some("completed".into()),
    }
}

/// `GET /jobs/{id}`: the job hash (payload left out) or its completion record.
async fn job_state(State(queue): State<Queue>, Path(id): Path<String>) -> Response {
    // Read the hash first: ack deletes it and writes the completion record in
    // one script, so a job missing here and completed meanwhile is found next.
    match queue.job(WELCOME_QUEUE, id.as_str()).await {
        Ok(Some(info)) => return Json(job_json(&info)).into_response(),
        Ok(None) => {}
        Err(e) => return queue_error_response("job lookup failed", &e),
    }
    match queue.completion(WELCOME_QUEUE, id.as_str()).await {
        Ok(Some(record)) => Json(json!({"job_id": id, "state": "completed", "completion": record}))
            .into_response(),
        Ok(None) => error_response(
            StatusCode::NOT_FOUND,
            format!("no job {id:?} on queue {WELCOME_QUEUE:?} (never enqueued, or its completion record expired)"),
        ),
        Err(e) => queue_error_response("job lookup failed", &e),
    }
}

fn job_json(info: &JobInfo) -> Value {
    json!({
        "job_id": info.id,
        "state": info.state(),
        "attempts": info.attempts(),
        "fields": info.fields,
    })
}

/// `GET /stats`: lengths and lifetime counters of the queue.
async fn stats(State(queue): State<Queue>) -> Response {
    match queue.stats(WELCOME_QUEUE).await {
        Ok(s) => Json(stats_json(&s)).into_response(),
        Err(e) => queue_error_response("stats failed", &e),
    }
}

fn stats_json(s: &QueueStats) -> Value {
    json!({
        "queue": s.queue,
        "main": s.main,
        "processing": s.processing,
        "delayed": s.delayed,
        "dead": s.dead,
        "counters": s.counters,
    })
}

/// Maps a queue error to a JSON error response, logging it (never swallowed).
fn queue_error_response(what: &str, e: &QueueError) -> Response {
    let status = match e {
        QueueError::InvalidJobId { .. } => StatusCode::BAD_REQUEST,
        _ => StatusCode::SERVICE_UNAVAILABLE,
    };
    if status.is_server_error() {
        error!(error = %e, "{what}");
    } else {
        warn!(error = %e, "{what}");
    }
    let mut body = json!({"error": format!("{what}: {e}")});
    if let Some(id) = e.job_id() {
        // After a Redis error the job may or may not have been stored: the
        // client can look it up, or retry with this id as Idempotency-Key.
        body["job_id"] = json!(id);
    }
    (status, Json(body)).into_response()
}

fn error_response(status: StatusCode, message: impl Into<String>) -> Response {
    (status, Json(json!({"error": message.into()}))).into_response()
}

async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = match signal(SignalKind::terminate()) {
        Ok(term) => term,
        Err(e) => {
            warn!(error = %e, "cannot listen for SIGTERM; only ctrl-c stops the server");
            let _ = tokio::signal::ctrl_c().await;
            return;
        }
    };
    tokio::select! {
        _ = term.recv() => info!("SIGTERM received"),
        _ = tokio::signal::ctrl_c() => info!("SIGINT received"),
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use queue_core::Worker;
    use queue_examples::http::Client;
    use serde_json::json;

    use super::*;

    /// Serves `app` on a free port of 127.0.0.1.
    async fn serve_app(queue: Queue) -> Client {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app(queue)).await });
        Client::new(addr)
    }

    /// An `Idempotency-Key` sent again with another body is refused with 422
    /// (the first job kept, nothing enqueued), while the same body is a
    /// duplicate; both before and after the job completed. Before, the
    /// second body answered 200 duplicate and was silently dropped.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_reused_idempotency_key_with_another_body_is_refused() {
        let server = queue_testkit::RedisServer::start().expect("redis-server");
        let queue = Queue::connect(&server.url()).await.unwrap();
        let client = serve_app(queue.clone()).await;
        let ada = json!({"email": "ada@example.com", "name": "Ada"});
        // The same request sent again.
        let ada_again = json!({"name": "Ada", "email": "ada@example.com"});
        let bob = json!({"email": "bob@example.com", "name": "Bob"});
        let post = move |key: &'static str, body: serde_json::Value| async move {
            client
                .post_json("/welcome", Some(key), &body)
                .await
                .unwrap()
        };

        let first = post("signup-42", ada.clone()).await;
        assert_eq!(first.status, 202, "{}", first.body);
        let again = post("signup-42", ada_again.clone()).await;
        assert_eq!(
            (again.status, &again.body["duplicate"]),
            (200, &json!(true)),
            "{}",
            again.body
        );
        let other = post("signup-42", bob.clone()).await;
        assert_eq!(other.status, 422, "{}", other.body);
        assert_eq!(other.body["job_id"], json!("signup-42"));
        let stats = queue.stats(WELCOME_QUEUE).await.unwrap();
        assert_eq!(stats.main, 1, "the second body enqueued nothing");

        // Once the job completed, its record still tells the bodies apart.
        let worker = Worker::builder(&server.url())
            .register(send_welcome::handler())
            .build()
            .await
            .unwrap();
        let q = queue.clone();
        worker
            .run_until(async move {
                for _ in 0..600 {
                    if q.stats(WELCOME_QUEUE).await.unwrap().counter("completed") == 1 {
                        return;
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            })
            .await
            .unwrap();
        assert!(queue
            .completion(WELCOME_QUEUE, "signup-42")
            .await
            .unwrap()
            .is_some());
        let other = post("signup-42", bob).await;
        assert_eq!(other.status, 422, "{}", other.body);
        let again = post("signup-42", ada_again).await;
        assert_eq!(
            (again.status, &again.body["state"]),
            (200, &json!("completed")),
            "{}",
            again.body
        );
    }
}
