//! Prometheus exposition of the metrics queue-core records through the
//! `metrics` facade (see `queue_core`'s metrics module for the names).

use std::net::SocketAddr;

use metrics_exporter_prometheus::{Matcher, PrometheusBuilder};

use crate::error::{CliError, Result};

/// Buckets of `queue_job_duration_seconds` (5 ms … 10 min).
pub const DURATION_BUCKETS: &[f64] = &[
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0,
];

fn builder() -> Result<PrometheusBuilder> {
    PrometheusBuilder::new()
        .set_buckets_for_metric(
            Matcher::Full("queue_job_duration_seconds".into()),
            DURATION_BUCKETS,
        )
        .map_err(|e| CliError::Other(format!("metrics buckets: {e}")))
}

/// Installs the global recorder and serves `GET /metrics` on `addr`
/// (must run inside the Tokio runtime).
pub fn serve(addr: SocketAddr) -> Result<()> {
    builder()?
        .with_http_listener(addr)
        .install()
        .map_err(|e| CliError::Other(format!("cannot serve metrics on {addr}: {e}")))?;
    describe();
    Ok(())
}

/// Installs the global recorder without a listener; render with the handle
/// (the dashboard serves it at its own `/metrics`).
#[cfg(feature = "dashboard")]
pub fn recorder() -> Result<metrics_exporter_prometheus::PrometheusHandle> {
    let handle = builder()?
        .install_recorder()
        .map_err(|e| CliError::Other(format!("metrics recorder: {e}")))?;
    describe();
    Ok(handle)
}

/// HELP text for the metrics queue-core records.
fn describe() {
    use metrics::{describe_counter, describe_gauge, describe_histogram, Unit};
    describe_counter!(
        "queue_jobs_enqueued_total",
        "Jobs written to the queue (new ids only)"
    );
    describe_counter!(
        "queue_jobs_started_total",
        "Deliveries a handler started running"
    );
    describe_counter!(
        "queue_jobs_completed_total",
        "Deliveries that succeeded and were acked"
    );
    describe_counter!(
        "queue_jobs_failed_total",
        "Deliveries that failed (retried or dead-lettered)"
    );
    describe_counter!(
        "queue_jobs_retried_total",
        "Failed deliveries scheduled for a retry"
    );
    describe_counter!(
        "queue_jobs_dead_lettered_total",
        "Jobs moved to the dead-letter list"
    );
    describe_counter!(
        "queue_jobs_reclaimed_total",
        "Expired leases returned by the watchdog (worker died or stalled)"
    );
    describe_counter!(
        "queue_reclaim_dropped_total",
        "Stale processing entries or leases the watchdog dropped without returning a job (the job was not running: dead, delayed or completed); run `queue-watchdog check`"
    );
    describe_histogram!(
        "queue_job_duration_seconds",
        Unit::Seconds,
        "Handler run time per delivery"
    );
    describe_gauge!(
        "queue_depth",
        "Jobs per list: main, processing, delayed, dead"
    );
    describe_gauge!(
        "queue_oldest_job_age_seconds",
        Unit::Seconds,
        "Age of the oldest job waiting in main"
    );
    describe_gauge!(
        "queue_completed_last_minute",
        "Completions in the last 60 seconds"
    );
    use crate::queue_gauges::{DELAYED_DUE, EXPIRED_LEASES, LAST_SAMPLE, STATS_TOTAL};
    describe_gauge!(
        EXPIRED_LEASES,
        "Processing entries whose lease expired and that no watchdog returned yet (lost deliveries)"
    );
    describe_gauge!(
        DELAYED_DUE,
        "Delayed jobs whose run time has come that are not promoted to main yet"
    );
    describe_gauge!(
        LAST_SAMPLE,
        Unit::Seconds,
        "Redis time of this watchdog's last successful read of the queue"
    );
    describe_counter!(
        STATS_TOTAL,
        "The queue's lifetime counters kept in Redis (q:{Q}:stats), written by every worker and watchdog"
    );
}
