//! `dashboard`: a small web UI over the queues, served by the watchdog binary.
//!
//! Server-rendered HTML plus one vanilla JS file (no build step):
//! - `/` queues with depths and ages, a live throughput chart (the page polls
//!   `/api/overview`), the doctor's verdict;
//! - `/queues/{q}` processing jobs with lease time left (polled from
//!   `/api/queues/{q}/processing`), dead letters with their reason and a
//!   replay button, waiting and delayed jobs;
//! - `/queues/{q}/jobs/{id}` one job: location, history, fields, payload;
//! - `/doctor` the doctor's findings.
//!
//! The only mutating endpoint, `POST /api/queues/{q}/dead/{id}/replay`,
//! requires the `X-Queue-Dashboard` header that the page's script sends (a
//! cross-site form cannot set it, and a cross-site script cannot send it
//! without a CORS preflight that is never granted), rejects a foreign
//! `Origin` or `Sec-Fetch-Site`, and every request must carry a loopback
//! `Host` (or one allowed with `--allow-host`) against DNS rebinding.

mod pages;

use std::collections::{BTreeMap, VecDeque};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::{Path, Query, Request, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{Html, IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use metrics_exporter_prometheus::PrometheusHandle;
use queue_core::Queue;
use serde::{Deserialize, Serialize};
use tracing::{info, warn};

use crate::cli::DashboardArgs;
use crate::doctor;
use crate::error::{CliError, Result};
use crate::inspect::{self, QueueHealth};

/// The header the dashboard's own script sends with every mutating request.
pub const CSRF_HEADER: &str = "x-queue-dashboard";

const APP_JS: &str = include_str!("assets/app.js");
const STYLE_CSS: &str = include_str!("assets/style.css");

/// One sample of a queue's lifetime counters, for the throughput chart.
#[derive(Debug, Clone, Copy)]
struct Sample {
    t: i64,
    completed: i64,
    enqueued: i64,
    failed: i64,
}

/// The doctor's latest verdict, refreshed every minute.
#[derive(Debug, Clone, Serialize)]
pub struct DoctorSummary {
    pub safe: bool,
    pub critical: usize,
    pub warnings: usize,
    pub error: Option<String>,
}

pub struct AppState {
    queue: Queue,
    url: String,
    named: Vec<String>,
    known: Mutex<Vec<String>>,
    samples: Mutex<BTreeMap<String, VecDeque<Sample>>>,
    capacity: usize,
    doctor: Mutex<Option<DoctorSummary>>,
    metrics: Option<PrometheusHandle>,
    allowed_hosts: Vec<String>,
    refresh_ms: u64,
}

type Shared = Arc<AppState>;

/// Serves the dashboard until SIGTERM / ctrl-c.
pub async fn serve(url: &str, args: DashboardArgs) -> Result<()> {
    let queue = Queue::connect(url).await?;
    let metrics = if args.metrics {
        Some(crate::metrics_export::recorder()?)
    } else {
        None
    };
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .map_err(|e| CliError::Other(format!("cannot listen on {}: {e}", args.listen)))?;
    let local = listener
        .local_addr()
        .map_err(|e| CliError::Other(e.to_string()))?;
    if !local.ip().is_loopback() {
        warn!(
            listen = %local,
            "the dashboard listens beyond loopback: anyone who reaches it can replay jobs; put an authenticating proxy in front"
        );
    }
    let sample_ms = args.sample_ms.max(100);
    let state = Arc::new(AppState {
        queue,
        url: url.to_string(),
        named: args.selection.queues.clone(),
        known: Mutex::new(args.selection.queues.clone()),
        samples: Mutex::new(BTreeMap::new()),
        capacity: (600_000 / sample_ms).clamp(30, 3600) as usize,
        doctor: Mutex::new(None),
        metrics,
        allowed_hosts: allowed_hosts(local, &args.allow_host),
        refresh_ms: sample_ms,
    });
    tokio::spawn(sampler(state.clone(), Duration::from_millis(sample_ms)));
    let app = router(state);
    info!(listen = %local, "dashboard listening on http://{local}/");
    // A line on stdout for scripts and tests that wait for the address.
    println!("dashboard listening on http://{local}/");
    axum::serve(listener, app)
        .with_graceful_shutdown(crate::commands::termination())
        .await
        .map_err(|e| CliError::Other(format!("dashboard server: {e}")))?;
    Ok(())
}

fn allowed_hosts(local: SocketAddr, extra: &[String]) -> Vec<String> {
    let mut hosts = vec![
        "localhost".to_string(),
        "127.0.0.1".to_string(),
        "[::1]".to_string(),
    ];
    let ip = match local.ip() {
        std::net::IpAddr::V6(v6) => format!("[{v6}]"),
        v4 => v4.to_string(),
    };
    if !local.ip().is_unspecified() {
        hosts.push(ip);
    }
    hosts.extend(extra.iter().map(|h| h.to_ascii_lowercase()));
    hosts
}

fn router(state: Shared) -> Router {
    Router::new()
        .route("/", get(overview))
        .route("/queues/{queue}", get(queue_page))
        .route("/queues/{queue}/jobs/{id}", get(job_page))
        .route("/doctor", get(doctor_page))
        .route("/api/overview", get(api_overview))
        .route("/api/queues/{queue}/processing", get(api_processing))
        .route("/api/queues/{queue}/dead/{id}/replay", post(api_replay))
        .route("/assets/app.js", get(app_js))
        .route("/assets/style.css", get(style_css))
        .route("/metrics", get(metrics))
        .route("/healthz", get(|| async { "ok" }))
        .layer(axum::middleware::from_fn_with_state(state.clone(), guard))
        .with_state(state)
}

/// Host check (DNS rebinding) on every request, and security headers on every response.
async fn guard(State(state): State<Shared>, req: Request, next: Next) -> Response {
    let host = req
        .headers()
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .unwrap_or("")
        .to_ascii_lowercase();
    let name = strip_port(&host);
    if !state.allowed_hosts.iter().any(|h| h == name) {
        return (
            StatusCode::MISDIRECTED_REQUEST,
            format!("host {host:?} is not allowed (use --allow-host)"),
        )
            .into_response();
    }
    let mut resp = next.run(req).await;
    let h = resp.headers_mut();
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(
            "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; \
             connect-src 'self'; form-action 'none'; frame-ancestors 'none'; base-uri 'none'",
        ),
    );
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    h.entry(header::CACHE_CONTROL)
        .or_insert(HeaderValue::from_static("no-store"));
    resp
}

/// `host:port` → `host` (`[::1]:9090` → `[::1]`).
fn strip_port(host: &str) -> &str {
    if host.starts_with('[') {
        return host.split_inclusive(']').next().unwrap_or(host);
    }
    host.split(':').next().unwrap_or(host)
}

/// Cross-site protection for mutating requests.
pub fn check_same_origin(headers: &HeaderMap) -> std::result::Result<(), &'static str> {
    if headers.get(CSRF_HEADER).is_none() {
        return Err("missing X-Queue-Dashboard header: mutating requests come from the dashboard's own page");
    }
    if let Some(site) = headers.get("sec-fetch-site").and_then(|v| v.to_str().ok()) {
        if site != "same-origin" && site != "none" {
            return Err("cross-site request refused (Sec-Fetch-Site)");
        }
    }
    if let Some(origin) = headers.get(header::ORIGIN).and_then(|v| v.to_str().ok()) {
        let host = headers
            .get(header::HOST)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("");
        let expected = [format!("http://{host}"), format!("https://{host}")];
        if !expected.iter().any(|e| e.eq_ignore_ascii_case(origin)) {
            return Err("cross-origin request refused (Origin)");
        }
    }
    Ok(())
}

/// Samples every queue's counters for the chart; refreshes the queue list
/// and the doctor's verdict now and then.
async fn sampler(state: Shared, every: Duration) {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let mut n: u64 = 0;
    let rediscover = (10_000 / every.as_millis().max(1) as u64).max(1);
    let redoctor = (60_000 / every.as_millis().max(1) as u64).max(1);
    loop {
        tick.tick().await;
        if state.named.is_empty() && n.is_multiple_of(rediscover) {
            match inspect::discover_queues(&state.queue.connection()).await {
                Ok(q) => *state.known.lock().unwrap() = q,
                Err(e) => warn!(error = %e, "queue discovery failed"),
            }
        }
        if n.is_multiple_of(redoctor) {
            let summary = match doctor::gather(&state.url, 10_000).await {
                Ok(facts) => {
                    let f = doctor::analyze(
                        &facts,
                        doctor::Options {
                            strict: false,
                            max_lag_secs: 10,
                        },
                    );
                    DoctorSummary {
                        safe: doctor::is_safe(&f),
                        critical: f
                            .iter()
                            .filter(|x| x.severity == doctor::Severity::Critical)
                            .count(),
                        warnings: f
                            .iter()
                            .filter(|x| x.severity == doctor::Severity::Warning)
                            .count(),
                        error: None,
                    }
                }
                Err(e) => DoctorSummary {
                    safe: false,
                    critical: 0,
                    warnings: 0,
                    error: Some(e.to_string()),
                },
            };
            *state.doctor.lock().unwrap() = Some(summary);
        }
        n += 1;
        let queues = state.known.lock().unwrap().clone();
        for q in queues {
            match inspect::health(&state.queue, &q).await {
                Ok(h) => {
                    if state.metrics.is_some() {
                        publish_gauges(&h);
                    }
                    let mut samples = state.samples.lock().unwrap();
                    let v = samples.entry(q).or_default();
                    v.push_back(Sample {
                        t: h.now_ms,
                        completed: h.counter("completed"),
                        enqueued: h.counter("enqueued"),
                        failed: h.counter("failed"),
                    });
                    while v.len() > state.capacity {
                        v.pop_front();
                    }
                }
                Err(e) => warn!(queue = %q, error = %e, "sampling failed"),
            }
        }
    }
}

fn publish_gauges(h: &QueueHealth) {
    for (list, n) in [
        ("main", h.main),
        ("processing", h.processing),
        ("delayed", h.delayed),
        ("dead", h.dead),
    ] {
        metrics::gauge!("queue_depth", "queue" => h.queue.clone(), "list" => list).set(n as f64);
    }
    metrics::gauge!("queue_oldest_job_age_seconds", "queue" => h.queue.clone())
        .set(h.oldest_waiting_ms.unwrap_or(0) as f64 / 1000.0);
    metrics::gauge!("queue_completed_last_minute", "queue" => h.queue.clone())
        .set(h.completed_last_minute as f64);
}

/// An error page or JSON error.
pub struct AppError(StatusCode, String);

impl From<CliError> for AppError {
    fn from(e: CliError) -> Self {
        AppError(StatusCode::BAD_GATEWAY, e.to_string())
    }
}

impl From<queue_core::QueueError> for AppError {
    fn from(e: queue_core::QueueError) -> Self {
        AppError(StatusCode::BAD_GATEWAY, e.to_string())
    }
}

impl IntoResponse for AppError {
    fn into_response(self) -> Response {
        let body = pages::layout(
            "Error",
            &format!(
                "<h1>{}</h1><p class=\"error\">{}</p>",
                self.0,
                crate::util::html(&self.1)
            ),
        );
        (self.0, Html(body)).into_response()
    }
}

type Page = std::result::Result<Html<String>, AppError>;

async fn queues(state: &AppState) -> Vec<String> {
    let known = state.known.lock().unwrap().clone();
    if !known.is_empty() || !state.named.is_empty() {
        return known;
    }
    inspect::discover_queues(&state.queue.connection())
        .await
        .unwrap_or_default()
}

async fn all_health(state: &AppState) -> std::result::Result<Vec<QueueHealth>, AppError> {
    let mut out = Vec::new();
    for q in queues(state).await {
        out.push(inspect::health(&state.queue, &q).await?);
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
    )))
}

async fn queue_page(State(state): State<Shared>, Path(queue): Path<String>) -> Page {
    let health = inspect::health(&state.queue, &queue).await?;
    let (now, _, processing) = inspect::processing(&state.queue, &queue, 100).await?;
    let (_, main, delayed) = inspect::waiting(&state.queue, &queue, 20).await?;
    let (dead_total, dead) = inspect::dead_letters(&state.queue, &queue, None, 0, 50).await?;
    Ok(Html(pages::queue(pages::QueueView {
        health: &health,
        now,
        processing: &processing,
        main: &main,
        delayed: &delayed,
        dead: &dead,
        dead_total,
    })))
}

async fn job_page(State(state): State<Shared>, Path((queue, id)): Path<(String, String)>) -> Page {
    match inspect::job_detail(&state.queue, &queue, &id).await? {
        Some(d) => Ok(Html(pages::job(&d))),
        None => Err(AppError(
            StatusCode::NOT_FOUND,
            format!("no job {id:?} in queue {queue:?} (never enqueued, or completed longer ago than the retention)"),
        )),
    }
}

async fn doctor_page(State(state): State<Shared>) -> Page {
    let facts = doctor::gather(&state.url, 10_000).await?;
    let findings = doctor::analyze(
        &facts,
        doctor::Options {
            strict: false,
            max_lag_secs: 10,
        },
    );
    Ok(Html(pages::doctor(&findings, doctor::is_safe(&findings))))
}

#[derive(Serialize)]
struct Overview {
    queues: Vec<QueueHealth>,
    /// Per queue: `[t_ms, completed/s, enqueued/s, failed/s]` points.
    series: BTreeMap<String, Vec<[f64; 4]>>,
    doctor: Option<DoctorSummary>,
}

async fn api_overview(
    State(state): State<Shared>,
) -> std::result::Result<Json<Overview>, AppError> {
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
    }))
}

#[derive(Serialize)]
struct ProcessingReply {
    now_ms: i64,
    total: u64,
    jobs: Vec<inspect::ProcessingJob>,
}

async fn api_processing(
    State(state): State<Shared>,
    Path(queue): Path<String>,
) -> std::result::Result<Json<ProcessingReply>, AppError> {
    let (now_ms, total, jobs) = inspect::processing(&state.queue, &queue, 100).await?;
    Ok(Json(ProcessingReply {
        now_ms,
        total,
        jobs,
    }))
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
        .queue
        .replay_dead(&queue, id.as_str(), q.reset_attempts)
        .await
    {
        Ok(true) => {
            info!(queue = %queue, job_id = %id, reset_attempts = q.reset_attempts, "replayed from the dashboard");
            Json(serde_json::json!({"replayed": true, "id": id})).into_response()
        }
        Ok(false) => (
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

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(*k, HeaderValue::from_str(v).unwrap());
        }
        h
    }

    #[test]
    fn same_origin_rules() {
        assert!(check_same_origin(&headers(&[("host", "127.0.0.1:9090")])).is_err());
        assert!(
            check_same_origin(&headers(&[("host", "127.0.0.1:9090"), (CSRF_HEADER, "1")])).is_ok()
        );
        assert!(check_same_origin(&headers(&[
            ("host", "127.0.0.1:9090"),
            (CSRF_HEADER, "1"),
            ("origin", "http://127.0.0.1:9090"),
            ("sec-fetch-site", "same-origin"),
        ]))
        .is_ok());
        assert!(check_same_origin(&headers(&[
            ("host", "127.0.0.1:9090"),
            (CSRF_HEADER, "1"),
            ("origin", "http://evil.example"),
        ]))
        .is_err());
        assert!(check_same_origin(&headers(&[
            ("host", "127.0.0.1:9090"),
            (CSRF_HEADER, "1"),
            ("sec-fetch-site", "cross-site"),
        ]))
        .is_err());
    }

    #[test]
    fn host_names() {
        assert_eq!(strip_port("127.0.0.1:9090"), "127.0.0.1");
        assert_eq!(strip_port("[::1]:9090"), "[::1]");
        assert_eq!(strip_port("localhost"), "localhost");
        let hosts = allowed_hosts("127.0.0.2:1".parse().unwrap(), &["Queue.Example".into()]);
        assert!(hosts.contains(&"127.0.0.2".to_string()));
        assert!(hosts.contains(&"queue.example".to_string()));
    }
}
