//! Metric names and the calls that record them, through the `metrics`
//! facade: install any recorder (e.g. `metrics-exporter-prometheus`, as the
//! `queue-watchdog` binary and the example worker do) to export them. Without
//! a recorder every call is a no-op.
//!
//! On the worker side `job_type` is one of the registered types of the queue,
//! or `unknown` (a type read from Redis that no handler knows), so the label
//! set stays bounded; the labels are built once per worker ([`LabelCache`]).
//! On the producer side the queue and type are whatever the caller names
//! (`Queue::enqueue_raw`, e.g. a queue per tenant): the first
//! [`ENQUEUED_LABELS_MAX`] pairs a process enqueues to get their own labels,
//! later ones are counted as `queue="other", job_type="other"`.
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
//! | `queue_reclaim_dropped_total` | counter | queue (stale processing entries or leases the watchdog dropped, their jobs left where they are) |
//! | `queue_job_duration_seconds` | histogram | queue, job_type |
//! | `queue_depth` | gauge | queue, list = main, processing, delayed, dead |
//! | `queue_oldest_job_age_seconds` | gauge | queue (oldest job waiting in main) |
//! | `queue_completed_last_minute` | gauge | queue |

use std::collections::HashMap;
use std::sync::{Arc, LazyLock, PoisonError, RwLock};
use std::time::Duration;

use metrics::{Key, Label, Level, Metadata};

use crate::admin::QueueStats;

/// The most `(queue, job type)` label pairs of `queue_jobs_enqueued_total`
/// in one process; the counts of later pairs go to `other`/`other`.
pub(crate) const ENQUEUED_LABELS_MAX: usize = 1_024;

/// The `queue_jobs_enqueued_total` key of each pair seen, built once.
#[derive(Default)]
struct EnqueuedKeys {
    by_queue: Map<String, Map<String, Arc<Key>>>,
    pairs: usize,
}

static ENQUEUED: LazyLock<RwLock<EnqueuedKeys>> = LazyLock::new(Default::default);
static ENQUEUED_OTHER: LazyLock<Arc<Key>> =
    LazyLock::new(|| Arc::new(enqueued_key("other", "other")));

fn enqueued_key(queue: &str, job_type: &str) -> Key {
    let labels = vec![
        Label::new("queue", queue.to_string()),
        Label::new("job_type", job_type.to_string()),
    ];
    Key::from_parts("queue_jobs_enqueued_total", labels)
}

/// The key of `(queue, job_type)`: its own among the first
/// [`ENQUEUED_LABELS_MAX`] pairs, else `other`/`other`.
fn enqueued_labels(queue: &str, job_type: &str) -> Arc<Key> {
    let seen = |keys: &EnqueuedKeys| {
        keys.by_queue
            .get(queue)
            .and_then(|types| types.get(job_type))
            .cloned()
    };
    if let Some(key) = seen(&ENQUEUED.read().unwrap_or_else(PoisonError::into_inner)) {
        return key;
    }
    let mut keys = ENQUEUED.write().unwrap_or_else(PoisonError::into_inner);
    if let Some(key) = seen(&keys) {
        return key;
    }
    if keys.pairs >= ENQUEUED_LABELS_MAX {
        return ENQUEUED_OTHER.clone();
    }
    keys.pairs += 1;
    let key = Arc::new(enqueued_key(queue, job_type));
    keys.by_queue
        .entry(queue.to_string())
        .or_default()
        .insert(job_type.to_string(), key.clone());
    key
}

pub(crate) fn enqueued(queue: &str, job_type: &str, n: u64) {
    count(&enqueued_labels(queue, job_type), n);
}

/// The metric keys of one job type on one queue (name plus its `queue` and
/// `job_type` labels), built once per worker: recording a job's metrics
/// builds no label list and hashes no key (cloning copies one reference
/// count). The recorder is looked up on every call, as the `metrics` macros
/// do, so a recorder installed after the worker started still sees them.
#[derive(Debug, Clone)]
pub(crate) struct JobLabels(Arc<JobKeys>);

#[derive(Debug)]
struct JobKeys {
    started: Key,
    completed: Key,
    failed: Key,
    retried: Key,
    dead_lettered: Key,
    cancelled: Key,
    deferred: Key,
    duration: Key,
}

impl JobLabels {
    fn new(queue: &str, job_type: &str) -> Self {
        let labels = [
            Label::new("queue", Arc::<str>::from(queue)),
            Label::new("job_type", Arc::<str>::from(job_type)),
        ];
        let key = |name: &'static str| Key::from_parts(name, labels.to_vec());
        JobLabels(Arc::new(JobKeys {
            started: key("queue_jobs_started_total"),
            completed: key("queue_jobs_completed_total"),
            failed: key("queue_jobs_failed_total"),
            retried: key("queue_jobs_retried_total"),
            dead_lettered: key("queue_jobs_dead_lettered_total"),
            cancelled: key("queue_jobs_cancelled_total"),
            deferred: key("queue_jobs_deferred_total"),
            duration: key("queue_job_duration_seconds"),
        }))
    }
}

/// What the `metrics` macros give the recorder for a metric of this module.
static METADATA: Metadata<'static> =
    Metadata::new(module_path!(), Level::INFO, Some(module_path!()));

/// Adds `n` to the counter `key` of the current recorder.
fn count(key: &Key, n: u64) {
    metrics::with_recorder(|r| r.register_counter(key, &METADATA).increment(n));
}

/// The label sets of a worker: one per registered `(queue, job type)` and
/// one `unknown` per queue for any other type read from Redis, so the label
/// set stays bounded whatever the payloads say (issue #11, item 8).
#[derive(Debug, Default)]
pub(crate) struct LabelCache {
    by_queue: Map<String, (Map<String, JobLabels>, JobLabels)>,
}

/// foldhash instead of SipHash: two lookups per job (issue #12).
type Map<K, V> = HashMap<K, V, foldhash::fast::RandomState>;

impl LabelCache {
    /// Labels for the registered `(queue, job type)` pairs.
    pub(crate) fn new<'a>(registered: impl IntoIterator<Item = (&'a str, &'a str)>) -> Self {
        let mut cache = LabelCache::default();
        for (queue, job_type) in registered {
            let (types, _) = cache
                .by_queue
                .entry(queue.to_string())
                .or_insert_with(|| (Map::default(), JobLabels::new(queue, "unknown")));
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
    count(&labels.0.started, 1);
}

/// A delivery given back for a worker that knows its newer payload schema
/// version (rolling deploys): no attempt used.
pub(crate) fn deferred(labels: &JobLabels) {
    count(&labels.0.deferred, 1);
}

pub(crate) fn finished(labels: &JobLabels, outcome: &'static str, elapsed: Option<Duration>) {
    let keys = &labels.0;
    if outcome == "cancelled" {
        // Ended by an operator's cancel (docs/FLOW-CONTROL.md): not a failure.
        count(&keys.cancelled, 1);
        return;
    }
    let Some(elapsed) = elapsed else {
        // Never started (undecodable payload, unknown type or version).
        count(&keys.dead_lettered, 1);
        return;
    };
    metrics::with_recorder(|r| {
        r.register_histogram(&keys.duration, &METADATA)
            .record(elapsed.as_secs_f64())
    });
    if outcome != "completed" {
        count(&keys.failed, 1);
    }
    count(
        match outcome {
            "completed" => &keys.completed,
            "retried" => &keys.retried,
            _ => &keys.dead_lettered,
        },
        1,
    );
}

pub(crate) fn dead_lettered(queue: &str, job_type: &str, n: u64) {
    metrics::counter!("queue_jobs_dead_lettered_total", "queue" => queue.to_string(), "job_type" => job_type.to_string())
        .increment(n);
}

pub(crate) fn reclaimed(queue: &str, reclaimed: u64, dead: u64, dropped: u64) {
    metrics::counter!("queue_jobs_reclaimed_total", "queue" => queue.to_string())
        .increment(reclaimed);
    if dead > 0 {
        dead_lettered(queue, "unknown", dead);
    }
    if dropped > 0 {
        metrics::counter!("queue_reclaim_dropped_total", "queue" => queue.to_string())
            .increment(dropped);
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
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    use metrics::{
        Counter, CounterFn, Gauge, Histogram, HistogramFn, Key, KeyName, Metadata, Recorder,
        SharedString, Unit,
    };

    use super::LabelCache;

    /// A recorder that keeps every counter's total and every histogram's
    /// sample count, by name and labels.
    #[derive(Default)]
    struct Totals(Mutex<Vec<(String, Arc<Total>)>>);

    #[derive(Default)]
    struct Total(AtomicU64);

    impl CounterFn for Total {
        fn increment(&self, n: u64) {
            self.0.fetch_add(n, Ordering::Relaxed);
        }
        fn absolute(&self, n: u64) {
            self.0.store(n, Ordering::Relaxed);
        }
    }

    impl HistogramFn for Total {
        fn record(&self, _: f64) {
            self.0.fetch_add(1, Ordering::Relaxed);
        }
    }

    impl Totals {
        fn of(&self, key: &Key) -> Arc<Total> {
            let labels: Vec<String> = key
                .labels()
                .map(|l| format!("{}={}", l.key(), l.value()))
                .collect();
            let name = format!("{}{{{}}}", key.name(), labels.join(", "));
            let mut all = self.0.lock().unwrap();
            if let Some((_, t)) = all.iter().find(|(n, _)| *n == name) {
                return t.clone();
            }
            let t = Arc::new(Total::default());
            all.push((name, t.clone()));
            t
        }

        fn get(&self, name: &str) -> u64 {
            let all = self.0.lock().unwrap();
            all.iter()
                .filter(|(n, _)| n == name)
                .map(|(_, t)| t.0.load(Ordering::Relaxed))
                .sum()
        }
    }

    impl Recorder for Totals {
        fn describe_counter(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
        fn describe_gauge(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
        fn describe_histogram(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
        fn register_counter(&self, key: &Key, _: &Metadata<'_>) -> Counter {
            Counter::from_arc(self.of(key))
        }
        fn register_gauge(&self, _: &Key, _: &Metadata<'_>) -> Gauge {
            Gauge::noop()
        }
        fn register_histogram(&self, key: &Key, _: &Metadata<'_>) -> Histogram {
            Histogram::from_arc(self.of(key))
        }
    }

    /// The keys are built with the worker, before any recorder: a recorder
    /// installed later (here a local one) still gets every job's metrics,
    /// under the job's labels.
    #[test]
    fn metrics_reach_a_recorder_installed_after_the_labels_were_built() {
        let cache = LabelCache::new([("emails", "send")]);
        let labels = cache.get("emails", "send");
        let totals = Totals::default();
        metrics::with_local_recorder(&totals, || {
            super::started(&labels);
            super::finished(&labels, "completed", Some(Duration::from_millis(3)));
            super::started(&labels);
            super::finished(&labels, "retried", Some(Duration::from_millis(3)));
            super::finished(&labels, "cancelled", None);
        });
        let with = |name: &str| format!("{name}{{queue=emails, job_type=send}}");
        assert_eq!(totals.get(&with("queue_jobs_started_total")), 2);
        assert_eq!(totals.get(&with("queue_jobs_completed_total")), 1);
        assert_eq!(totals.get(&with("queue_jobs_retried_total")), 1);
        assert_eq!(totals.get(&with("queue_jobs_failed_total")), 1);
        assert_eq!(totals.get(&with("queue_jobs_cancelled_total")), 1);
        assert_eq!(totals.get(&with("queue_job_duration_seconds")), 2);
    }

    fn values(labels: &super::JobLabels) -> Vec<(String, String)> {
        labels
            .0
            .started
            .labels()
            .map(|l| (l.key().to_string(), l.value().to_string()))
            .collect()
    }

    /// Scenario: a producer enqueues to 2,000 queues (one per tenant). The
    /// enqueue counter keeps at most 1,024 label pairs and one `other`, and
    /// counts every job. Before, each queue got its own series: the label
    /// set grew without bound in a long-lived producer.
    #[test]
    fn enqueue_counts_of_many_queues_keep_a_bounded_label_set() {
        let totals = Totals::default();
        metrics::with_local_recorder(&totals, || {
            for i in 0..2_000 {
                super::enqueued(&format!("tenant-{i}"), "send", 1);
            }
        });
        let all = totals.0.lock().unwrap();
        let series: Vec<&String> = all
            .iter()
            .map(|(name, _)| name)
            .filter(|n| n.starts_with("queue_jobs_enqueued_total"))
            .collect();
        assert!(
            series.len() <= super::ENQUEUED_LABELS_MAX + 1,
            "{} series",
            series.len()
        );
        let counted: u64 = all.iter().map(|(_, t)| t.0.load(Ordering::Relaxed)).sum();
        assert_eq!(counted, 2_000, "every job counted");
        assert!(series
            .iter()
            .any(|n| *n == "queue_jobs_enqueued_total{queue=other, job_type=other}"));
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
