//! The dashboard's pages and JSON endpoints: thin views over
//! `queue_core::admin` (reads, replay) and the doctor.

use std::collections::BTreeMap;

use axum::extract::{Path, Query, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Extension, Json, Router};
use queue_core::admin::{
    AdminError, Listing, Page as Paging, ProcessingJob, QueueHealth, ReplayOutcome,
};
use serde::{Deserialize, Serialize};
use tracing::info;

use super::audit::Entry;
use super::auth::Who;
use super::sampler::{run_doctor, DoctorSummary};
use super::security::check_same_origin;
use super::{pages, AppState, Discovery, Shared};
use crate::error::CliError;

/// Every route, behind the Host check and security headers.
pub fn router(state: Shared) -> Router {
    Router::new()
        .route("/", get(overview))
        .route("/queues/{queue}", get(queue_page))
        .route("/queues/{queue}/jobs/{id}", get(job_page))
        .route("/doctor", get(doctor_page))
        .route("/api/overview", get(api_overview))
        .route("/api/queues/{queue}/processing", get(api_processing))
        .route("/api/queues/{queue}/dead/{id}/replay", post(api_replay))
        .route("/api/queues/{queue}/pause", post(super::flow::api_pause))
        .route("/api/queues/{queue}/resume", post(super::flow::api_resume))
        .route(
            "/api/queues/{queue}/jobs/{id}/cancel",
            post(super::flow::api_cancel),
        )
        .route("/search", get(super::search::page))
        .route("/queues/{queue}/batches", get(super::batches_page::list))
        .route(
            "/queues/{queue}/batches/{id}",
            get(super::batches_page::show),
        )
        .route("/queues/{queue}/dead", get(super::dead_page::page))
        .route(
            "/api/queues/{queue}/bulk-dead/preview",
            post(super::bulk::preview),
        )
        .route(
            "/api/queues/{queue}/bulk-dead/{action}",
            post(super::bulk::act),
        )
        .route(
            "/login",
            get(super::auth::login_page).post(super::auth::login),
        )
        .route("/assets/oncall.js", get(oncall_js))
        .route("/assets/app.js", get(app_js))
        .route("/assets/style.css", get(style_css))
        .route("/metrics", get(metrics))
        .route("/healthz", get(|| async { "ok" }))
        .route_layer(axum::middleware::from_fn(valid_queue))
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            super::auth::require,
        ))
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            super::security::guard,
        ))
        .with_state(state)
}

/// Refuses a request whose `{queue}` is not a queue name (docs/PROTOCOL.md:
/// no `{`, `}`, control characters…) with 400, before any handler reads or
/// writes a key built from it: `a}:job:x` named another queue's job key
/// (a pause wrote `q:{a}:job:x}:paused`, a job hash of queue `a`).
async fn valid_queue(
    params: axum::extract::RawPathParams,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    for (name, value) in &params {
        if name == "queue" {
            if let Err(why) = queue_core::validate_queue_name(value) {
                return (
                    StatusCode::BAD_REQUEST,
                    format!("not a queue name: {value:?}: {why}"),
                )
                    .into_response();
            }
        }
    }
    next.run(req).await
}

const APP_JS: &str = include_str!("assets/app.js");
const STYLE_CSS: &str = include_str!("assets/style.css");
const ONCALL_JS: &str = include_str!("assets/oncall.js");

/// An error page or JSON error.
pub struct AppError(StatusCode, String);

impl AppError {
    /// An error page with this status.
    pub fn new(status: StatusCode, message: String) -> Self {
        AppError(status, message)
    }
}

impl From<CliError> for AppError {
    fn from(e: CliError) -> Self {
        AppError(StatusCode::BAD_GATEWAY, e.to_string())
    }
}

impl From<AdminError> for AppError {
    fn from(e: AdminError) -> Self {
        CliError::from(e).into()
    }
}

impl IntoResponse for AppError {
    fn into_response(self) -> Response {
        let body = pages::layout(
            "Error",
            &format!(
                "<h1>{}</h1><p class=\"error\">{}</p>",
                self.0,
                super::escape::html(&self.1)
            ),
        );
        (self.0, Html(body)).into_response()
    }
}

type Page = std::result::Result<Html<String>, AppError>;

/// The queues the dashboard shows: the named ones, or those the sampler's
/// last discovery found. Never a discovery of its own: a request that
/// scanned the keyspace while none was found (a full SCAN per request and
/// per open tab, seconds of Redis CPU on millions of keys) is what the
/// sampler's spacing exists to avoid.
pub(super) async fn queues(state: &AppState) -> Vec<String> {
    state.known.lock().unwrap().clone()
}

/// Where the queue list stands: before the sampler's first discovery an
/// empty list means "not known yet", and the pages say so.
pub(super) fn discovery(state: &AppState) -> Discovery {
    state.discovery.lock().unwrap().clone()
}

/// The overview's numbers of every queue. No group list is read (group
/// limit 0): nothing on the overview shows `grouped`, and reading it cost
/// up to 10,000 `LLEN`s per queue at every poll of every open tab.
async fn all_health(state: &AppState) -> std::result::Result<Vec<QueueHealth>, AppError> {
    let mut out = Vec::new();
    for q in queues(state).await {
        out.push(state.admin.health_with_group_limit(&q, 0).await?);
    }
    Ok(out)
}

async fn overview(State(state): State<Shared>) -> Page {
    let health = all_health(&state).await?;
    let doctor = state.doctor.lock().unwrap().clone();
    Ok(Html(pages::overview(
        &health,
        doctor.as_ref(),
        state.refresh_ms,
        &discovery(&state),
    )))
}

async fn queue_page(State(state): State<Shared>, Path(queue): Path<String>) -> Page {
    let admin = &state.admin;
    let health = admin.health(&queue).await?;
    let processing = admin.processing(&queue, Paging::first(100)).await?;
    let main = admin.waiting(&queue, Paging::first(20)).await?;
    let delayed = admin.delayed(&queue, Paging::first(20)).await?;
    let dead = admin.dead_letters(&queue, None, Paging::first(50)).await?;
    Ok(Html(pages::queue(pages::QueueView {
        health: &health,
        now: processing.now_ms,
        processing: &processing.jobs,
        main: &main.jobs,
        delayed: &delayed.jobs,
        dead: &dead.jobs,
        dead_total: dead.total,
    })))
}

async fn job_page(State(state): State<Shared>, Path((queue, id)): Path<(String, String)>) -> Page {
    match state.admin.job_detail(&queue, id.as_str()).await? {
        Some(d) => {
            let batches = super::batches_page::job_links(&state.admin, &d).await;
            Ok(Html(pages::job(&d, &batches)))
        }
        None => Err(AppError(
            StatusCode::NOT_FOUND,
            format!("no job {id:?} in queue {queue:?} (never enqueued, or completed longer ago than the retention)"),
        )),
    }
}

async fn doctor_page(State(state): State<Shared>) -> Page {
    let findings = run_doctor(&state.url).await?;
    Ok(Html(pages::doctor(
        &findings,
        crate::doctor::is_safe(&findings),
    )))
}

#[derive(Serialize)]
struct Overview {
    queues: Vec<QueueHealth>,
    /// Per queue: `[t_ms, completed/s, enqueued/s, failed/s]` points.
    series: BTreeMap<String, Vec<[f64; 4]>>,
    doctor: Option<DoctorSummary>,
    /// `named`, `in_progress` (with `error` when the last attempt failed:
    /// `queues` is empty because no discovery finished yet, not because
    /// there is no queue) or `done`.
    discovery: Discovery,
}

async fn api_overview(
    State(state): State<Shared>,
) -> std::result::Result<Json<Overview>, AppError> {
    // Read before the list: a discovery that ends in between shows its
    // queues under "in progress" (the next poll says done), never an empty
    // list under "done".
    let discovery = discovery(&state);
    let queues = all_health(&state).await?;
    let series = state
        .samples
        .lock()
        .unwrap()
        .iter()
        .map(|(q, v)| {
            let pts = v
                .iter()
                .zip(v.iter().skip(1))
                .filter(|(a, b)| b.t > a.t)
                .map(|(a, b)| {
                    let dt = (b.t - a.t) as f64 / 1000.0;
                    let rate = |x: i64, y: i64| ((y - x).max(0)) as f64 / dt;
                    [
                        b.t as f64,
                        rate(a.completed, b.completed),
                        rate(a.enqueued, b.enqueued),
                        rate(a.failed, b.failed),
                    ]
                })
                .collect();
            (q.clone(), pts)
        })
        .collect();
    let doctor = state.doctor.lock().unwrap().clone();
    Ok(Json(Overview {
        queues,
        series,
        doctor,
        discovery,
    }))
}

/// The processing list's first 100 entries (`{now_ms, total, jobs}`), polled by the queue page.
async fn api_processing(
    State(state): State<Shared>,
    Path(queue): Path<String>,
) -> std::result::Result<Json<Listing<ProcessingJob>>, AppError> {
    Ok(Json(
        state.admin.processing(&queue, Paging::first(100)).await?,
    ))
}

#[derive(Deserialize)]
struct ReplayQuery {
    #[serde(default)]
    reset_attempts: bool,
}

async fn api_replay(
    State(state): State<Shared>,
    Path((queue, id)): Path<(String, String)>,
    Query(q): Query<ReplayQuery>,
    Extension(who): Extension<Who>,
    headers: HeaderMap,
) -> Response {
    if let Err(why) = check_same_origin(&headers) {
        return (
            StatusCode::FORBIDDEN,
            Json(serde_json::json!({"error": why})),
        )
            .into_response();
    }
    match state
        .admin
        .replay_dead(&queue, id.as_str(), q.reset_attempts)
        .await
    {
        Ok(ReplayOutcome::Replayed) => {
            info!(queue = %queue, job_id = %id, reset_attempts = q.reset_attempts, "replayed from the dashboard");
            state.audit.record(Entry {
                who: &who.0,
                action: "replay",
                queue: &queue,
                what: &id,
                count: 1,
            });
            Json(serde_json::json!({"replayed": true, "id": id})).into_response()
        }
        // `Changed` answers only a replay that names a `dead_at`; this one
        // replays whichever dead-lettering the job is.
        Ok(ReplayOutcome::NotDead | ReplayOutcome::Changed) => (
            StatusCode::CONFLICT,
            Json(serde_json::json!({"replayed": false, "id": id,
                "error": "not in the dead-letter list (already replayed or purged?)"})),
        )
            .into_response(),
        Err(e) => (
            StatusCode::BAD_GATEWAY,
            Json(serde_json::json!({"replayed": false, "id": id, "error": e.to_string()})),
        )
            .into_response(),
    }
}

async fn app_js() -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, "text/javascript; charset=utf-8")],
        APP_JS,
    )
}

async fn oncall_js() -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, "text/javascript; charset=utf-8")],
        ONCALL_JS,
    )
}

async fn style_css() -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, "text/css; charset=utf-8")],
        STYLE_CSS,
    )
}

async fn metrics(State(state): State<Shared>) -> Response {
    match &state.metrics {
        Some(h) => (
            [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
            h.render(),
        )
            .into_response(),
        None => (
            StatusCode::NOT_FOUND,
            "metrics are off: start the dashboard with --metrics",
        )
            .into_response(),
    }
}
