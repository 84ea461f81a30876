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
//! The mutating endpoints, `POST /api/queues/{q}/dead/{id}/replay` and the
//! flow-control ones (`/api/queues/{q}/pause`, `/resume`,
//! `/api/queues/{q}/jobs/{id}/cancel`) and the bulk ones
//! (`/api/queues/{q}/bulk-dead/…`), require the `X-Queue-Dashboard` header that the page's script sends (a
//! cross-site form cannot set it, and a cross-site script cannot send it
//! without a CORS preflight that is never granted), rejects a foreign
//! `Origin` or `Sec-Fetch-Site`, and every request must carry a loopback
//! `Host` (or one allowed with `--allow-host`) against DNS rebinding.
//!
//! With `--auth-token-file` every request needs the token (`auth.rs`); every
//! action is written to the audit log (`audit.rs`).
//!
//! Built with the cargo feature `dashboard` (on by default). Every queue read
//! and the replay go through `queue_core::admin`.
//!
//! | file | owns |
//! |---|---|
//! | `mod.rs` | the server: state, routes, serving until SIGTERM |
//! | `security.rs` | Host check, security headers, same-origin check of mutations |
//! | `sampler.rs` | background sampling for the chart, queue list and doctor verdict |
//! | `handlers.rs` | the pages and JSON endpoints |
//! | `flow.rs` | pause / resume a queue, cancel a job (POST, same-origin checked) |
//! | `pages.rs` | the HTML |
//! | `escape.rs` | HTML and URL escaping |
//! | `auth.rs` | optional access token (`--auth-token-file`), login form, who made a request |
//! | `audit.rs` | the audit log of every action (target `audit`, `--audit-log` file) |
//! | `search.rs` | `/search?id=`: a job by id in any known queue |
//! | `dead_scan.rs` | reading a long dead-letter list in bounded chunks, with a filter |
//! | `dead_page.rs` | `/queues/{q}/dead`: dead letters in pages (next / previous), filter |
//! | `bulk.rs` | bulk replay / purge of a filtered set, after a confirmed count |

mod audit;
mod auth;
mod batches_page;
mod bulk;
mod dead_page;
mod dead_scan;
mod escape;
mod flow;
mod handlers;
mod pages;
mod sampler;
mod search;
mod security;

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use metrics_exporter_prometheus::PrometheusHandle;
use queue_core::admin::Admin;
use serde::Serialize;
use tracing::{info, warn};

use crate::cli::DashboardArgs;
use crate::error::{CliError, Result};
use sampler::{DoctorSummary, Sample};

/// Where the dashboard's queue list stands, as the overview, the search page
/// and `/api/overview` (`"discovery": {"state": …}`) say: an empty list
/// before the first discovery is "not known yet", not "no queue".
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum Discovery {
    /// Named with `--queue`: nothing is discovered.
    Named,
    /// Without `--queue`, until the sampler's first discovery (a SCAN of the
    /// whole keyspace) succeeds; `error`: why the last attempt failed.
    InProgress { error: Option<String> },
    /// Found by the sampler's discovery (refreshed in the background).
    Done,
}

pub struct AppState {
    admin: Admin,
    url: String,
    named: Vec<String>,
    known: Mutex<Vec<String>>,
    discovery: Mutex<Discovery>,
    samples: Mutex<BTreeMap<String, VecDeque<Sample>>>,
    capacity: usize,
    doctor: Mutex<Option<DoctorSummary>>,
    metrics: Option<PrometheusHandle>,
    allowed_hosts: Vec<String>,
    refresh_ms: u64,
    auth: Option<auth::Auth>,
    audit: audit::Audit,
}

type Shared = Arc<AppState>;

#[cfg(test)]
impl AppState {
    /// A state over `admin` for unit tests: no auth, audit file, metrics
    /// or sampler.
    fn for_tests(admin: Admin) -> Shared {
        Arc::new(AppState {
            admin,
            url: String::new(),
            named: Vec::new(),
            known: Mutex::new(Vec::new()),
            discovery: Mutex::new(Discovery::InProgress { error: None }),
            samples: Mutex::new(BTreeMap::new()),
            capacity: 30,
            doctor: Mutex::new(None),
            metrics: None,
            allowed_hosts: Vec::new(),
            refresh_ms: 1000,
            auth: None,
            audit: audit::Audit::open(None).expect("no file to open"),
        })
    }
}

/// Serves the dashboard until SIGTERM / ctrl-c.
pub async fn serve(url: &str, args: DashboardArgs) -> Result<()> {
    let admin = Admin::connect(url).await?;
    if admin.queue().connection().is_cluster() && args.selection.queues.is_empty() {
        // Discovery scans one server; on a cluster it found nothing and the
        // dashboard showed no queue, with no reason given.
        return Err(CliError::Other(
            "on a cluster the dashboard needs its queues named with --queue (queue discovery needs a single Redis)"
                .into(),
        ));
    }
    let metrics = if args.metrics {
        Some(crate::metrics_export::recorder()?)
    } else {
        None
    };
    let auth = args
        .auth_token_file
        .as_deref()
        .map(|f| auth::Auth::from_file(f, Duration::from_secs(args.session_max_age_secs)))
        .transpose()?;
    if auth.is_none() && !args.listen.ip().is_loopback() {
        return Err(CliError::Other(format!(
            "refusing to listen on {} without --auth-token-file: beyond loopback anyone who reaches the dashboard could replay, purge and cancel jobs (give a token file, or listen on 127.0.0.1)",
            args.listen
        )));
    }
    let audit = audit::Audit::open(args.audit_log.as_deref())?;
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .map_err(|e| CliError::Other(format!("cannot listen on {}: {e}", args.listen)))?;
    let local = listener
        .local_addr()
        .map_err(|e| CliError::Other(e.to_string()))?;
    if !local.ip().is_loopback() {
        warn!(
            listen = %local,
            "the dashboard listens beyond loopback (access token required); serve it over TLS (a proxy) so the token is not sent in clear"
        );
    }
    let sample_ms = args.sample_ms.max(100);
    let state = Arc::new(AppState {
        admin,
        url: url.to_string(),
        named: args.selection.queues.clone(),
        known: Mutex::new(args.selection.queues.clone()),
        discovery: Mutex::new(if args.selection.queues.is_empty() {
            Discovery::InProgress { error: None }
        } else {
            Discovery::Named
        }),
        samples: Mutex::new(BTreeMap::new()),
        capacity: (600_000 / sample_ms).clamp(30, 3600) as usize,
        doctor: Mutex::new(None),
        metrics,
        allowed_hosts: security::allowed_hosts(local, &args.allow_host),
        refresh_ms: sample_ms,
        auth,
        audit,
    });
    tokio::spawn(sampler::sampler(
        state.clone(),
        Duration::from_millis(sample_ms),
    ));
    let app = handlers::router(state);
    info!(listen = %local, "dashboard listening on http://{local}/");
    // A line on stdout for scripts and tests that wait for the address.
    println!("dashboard listening on http://{local}/");
    let app = app.into_make_service_with_connect_info::<std::net::SocketAddr>();
    axum::serve(listener, app)
        .with_graceful_shutdown(crate::commands::termination())
        .await
        .map_err(|e| CliError::Other(format!("dashboard server: {e}")))?;
    Ok(())
}
