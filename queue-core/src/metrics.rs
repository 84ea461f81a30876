//! Metric names and the calls that record them, through the `metrics`
//! facade: install any recorder (e.g. `metrics-exporter-prometheus`, as the
//! `queue-watchdog` binary and the example worker do) to export them. Without
//! a recorder every call is a no-op.
//!
//! On the worker side `job_type` is one of the registered types of the queue,
//! or `unknown` (a type read from Redis that no handler knows), so the label
//! set stays bounded; the labels are built once per worker ([`LabelCache`]).
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

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use metrics::Label;

use crate::admin::QueueStats;

pub(crate) fn enqueued(queue: &str, job_type: &str, n: u64) {
    metrics::counter!("queue_jobs_enqueued_total", "queue" => queue.to_string(), "job_type" => job_type.to_string())
        .increment(n);
}

/// The `queue` and `job_type` labels of one job type, built once per worker
/// (cloning them copies two reference counts, no string).
#[derive(Debug, Clone)]
pub(crate) struct JobLabels(Arc<[Label; 2]>);

impl JobLabels {
    fn new(queue: &str, job_type: &str) -> Self {
        JobLabels(Arc::new([
            Label::new("queue", Arc::<str>::from(queue)),
            Label::new("job_type", Arc::<str>::from(job_type)),
        ]))
    }
}

/// The label sets of a worker: one per registered `(queue, job type)` and
/// one `unknown` per queue for any other type read from Redis, so the label
/// set stays bounded whatever the payloads say (issue #11, item 8).
#[derive(Debug, Default)]
pub(crate) struct LabelCache {
    by_queue: HashMap<String, (HashMap<String, JobLabels>, JobLabels)>,
}

impl LabelCache {
    /// Labels for the registered `(queue, job type)` pairs.
    pub(crate) fn new<'a>(registered: impl IntoIterator<Item = (&'a str, &'a str)>) -> Self {
        let mut cache = LabelCache::default();
        for (queue, job_type) in registered {
            let (types, _) = cache
                .by_queue
                .entry(queue.to_string())
                .or_insert_with(|| (HashMap::new(), JobLabels::new(queue, "unknown")));
            types.insert(job_type.to_string(), JobLabels::new(queue, job_type));
        }
        cache
    }

    /// The labels of `job_type` on `queue`; `unknown` for an unregistered type.
    pub(crate) fn get(&self, queue: &str, job_type: &str) -> JobLabels {
        match self.by_queue.get(queue) {
            Some((types, unknown)) => types.get(job_type).unwrap_or(unknown).clone(),
            None => JobLabels::new(queue, "unknown"),
        }
    }
}

pub(crate) fn started(labels: &JobLabels) {
    metrics::counter!("queue_jobs_started_total", labels.0.iter()).increment(1);
}

/// A delivery given back for a worker that knows its newer payload schema
/// version (rolling deploys): no attempt used.
pub(crate) fn deferred(labels: &JobLabels) {
    metrics::counter!("queue_jobs_deferred_total", labels.0.iter()).increment(1);
}

pub(crate) fn finished(labels: &JobLabels, outcome: &'static str, elapsed: Option<Duration>) {
    if outcome == "cancelled" {
        // Ended by an operator's cancel (docs/FLOW-CONTROL.md): not a failure.
        metrics::counter!("queue_jobs_cancelled_total", labels.0.iter()).increment(1);
        return;
    }
    let labels = labels.0.iter();
    let Some(elapsed) = elapsed else {
        // Never started (undecodable payload, unknown type or version).
        metrics::counter!("queue_jobs_dead_lettered_total", labels).increment(1);
        return;
    };
    metrics::histogram!("queue_job_duration_seconds", labels.clone()).record(elapsed.as_secs_f64());
    if outcome != "completed" {
        metrics::counter!("queue_jobs_failed_total", labels.clone()).increment(1);
    }
    let name = match outcome {
        "completed" => "queue_jobs_completed_total",
        "retried" => "queue_jobs_retried_total",
        _ => "queue_jobs_dead_lettered_total",
    };
    metrics::counter!(name, labels).increment(1);
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

#[cfg(test)]
mod tests {
    use super::LabelCache;

    fn values(labels: &super::JobLabels) -> Vec<(String, String)> {
        labels
            .0
            .iter()
            .map(|l| (l.key().to_string(), l.value().to_string()))
            .collect()
    }

    /// A job type read from Redis that no handler registered is labelled
    /// `unknown`: payload data cannot grow the label set.
    #[test]
    fn unregistered_job_types_share_the_unknown_label() {
        let cache = LabelCache::new([("emails", "send"), ("emails", "bounce")]);
        let pair =
            |q: &str, t: &str| vec![("queue".into(), q.into()), ("job_type".into(), t.into())];
        assert_eq!(values(&cache.get("emails", "send")), pair("emails", "send"));
        assert_eq!(
            values(&cache.get("emails", "x-1")),
            pair("emails", "unknown")
        );
        assert_eq!(
            values(&cache.get("other", "send")),
            pair("other", "unknown")
        );
    }
}
