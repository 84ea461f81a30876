//! Metric names and the calls that record them, through the `metrics`
//! facade: install any recorder (e.g. `metrics-exporter-prometheus`, as the
//! `queue-watchdog` binary and the example worker do) to export them. Without
//! a recorder every call is a no-op.
//!
//! | metric | type | labels |
//! |---|---|---|
//! | `queue_jobs_enqueued_total` | counter | queue, job_type |
//! | `queue_jobs_started_total` | counter | queue, job_type |
//! | `queue_jobs_completed_total` | counter | queue, job_type |
//! | `queue_jobs_failed_total` | counter | queue, job_type (every failed attempt) |
//! | `queue_jobs_retried_total` | counter | queue, job_type |
//! | `queue_jobs_dead_lettered_total` | counter | queue, job_type (`unknown` when recorded by the watchdog) |
//! | `queue_jobs_reclaimed_total` | counter | queue |
//! | `queue_job_duration_seconds` | histogram | queue, job_type |
//! | `queue_depth` | gauge | queue, list = main, processing, delayed, dead |
//! | `queue_oldest_job_age_seconds` | gauge | queue (oldest job waiting in main) |
//! | `queue_completed_last_minute` | gauge | queue |

use std::time::Duration;

use crate::admin::QueueStats;

pub(crate) fn enqueued(queue: &str, job_type: &str, n: u64) {
    metrics::counter!("queue_jobs_enqueued_total", "queue" => queue.to_string(), "job_type" => job_type.to_string())
        .increment(n);
}

pub(crate) fn started(queue: &str, job_type: &str) {
    metrics::counter!("queue_jobs_started_total", "queue" => queue.to_string(), "job_type" => job_type.to_string())
        .increment(1);
}

pub(crate) fn finished(
    queue: &str,
    job_type: &str,
    outcome: &'static str,
    elapsed: Option<Duration>,
) {
    if outcome == "cancelled" {
        // Ended by an operator's cancel (docs/FLOW-CONTROL.md): not a failure.
        metrics::counter!("queue_jobs_cancelled_total", "queue" => queue.to_string(), "job_type" => job_type.to_string())
            .increment(1);
        return;
    }
    let Some(elapsed) = elapsed else {
        // Never started (undecodable payload, unknown type or version).
        dead_lettered(queue, job_type, 1);
        return;
    };
    let labels = [
        ("queue", queue.to_string()),
        ("job_type", job_type.to_string()),
    ];
    metrics::histogram!("queue_job_duration_seconds", &labels).record(elapsed.as_secs_f64());
    if outcome != "completed" {
        metrics::counter!("queue_jobs_failed_total", &labels).increment(1);
    }
    let name = match outcome {
        "completed" => "queue_jobs_completed_total",
        "retried" => "queue_jobs_retried_total",
        _ => "queue_jobs_dead_lettered_total",
    };
    metrics::counter!(name, &labels).increment(1);
}

pub(crate) fn dead_lettered(queue: &str, job_type: &str, n: u64) {
    metrics::counter!("queue_jobs_dead_lettered_total", "queue" => queue.to_string(), "job_type" => job_type.to_string())
        .increment(n);
}

pub(crate) fn reclaimed(queue: &str, reclaimed: u64, dead: u64) {
    metrics::counter!("queue_jobs_reclaimed_total", "queue" => queue.to_string())
        .increment(reclaimed);
    if dead > 0 {
        dead_lettered(queue, "unknown", dead);
    }
}

pub(crate) fn depth(stats: &QueueStats) {
    let q = stats.queue.clone();
    for (list, n) in [
        ("main", stats.main),
        ("processing", stats.processing),
        ("delayed", stats.delayed),
        ("dead", stats.dead),
    ] {
        metrics::gauge!("queue_depth", "queue" => q.clone(), "list" => list).set(n as f64);
    }
    metrics::gauge!("queue_oldest_job_age_seconds", "queue" => q.clone())
        .set(stats.oldest_waiting_ms.unwrap_or(0) as f64 / 1000.0);
    metrics::gauge!("queue_completed_last_minute", "queue" => q)
        .set(stats.completed_last_minute as f64);
}
