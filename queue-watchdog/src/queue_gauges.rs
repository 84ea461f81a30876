//! The per-queue series `queue-watchdog run --metrics-listen` reads from Redis
//! every interval and exports: depth and ages (`QueueStats::publish_gauges`),
//! lost deliveries still in processing and due delayed jobs not yet promoted
//! (`Admin::health`), the Redis time of the last good read, and a counter
//! mirror of the queue's lifetime counters (`q:{Q}:stats`). Those counters
//! are written by the scripts of every worker and watchdog, so one scrape of
//! one watchdog gives the whole queue's rates (docs/OPERATIONS.md, "Alerts
//! and dashboard").

use std::collections::HashMap;
use std::sync::{LazyLock, Mutex};
use std::time::Duration;

use queue_core::admin::{Admin, QueueHealth};
use tokio::task::JoinHandle;

/// Lost deliveries: processing entries whose lease expired and that no
/// watchdog has returned yet.
pub const EXPIRED_LEASES: &str = "queue_expired_leases";
/// Delayed jobs whose run time has come but that are not promoted yet.
pub const DELAYED_DUE: &str = "queue_delayed_due";
/// Redis time (seconds) of the last successful read of the queue.
pub const LAST_SAMPLE: &str = "queue_watchdog_last_sample_timestamp_seconds";
/// The mirror of `q:{Q}:stats`, label `counter`.
pub const STATS_TOTAL: &str = "queue_stats_total";

/// Counters always exported (0 until a script first increments them), so a
/// rule over them has a series from the start.
pub const MIRRORED: &[&str] = &[
    "enqueued",
    "completed",
    "failed",
    "retried",
    "dead",
    "reclaimed",
    "adopted",
    "skipped_done",
    "replayed",
    "purged",
];

/// Other counter names found in the stats hash are exported too (counters a
/// newer queue-core adds), at most this many per queue and only names that
/// look like counters, so the label stays bounded.
const MAX_EXTRA: usize = 16;

/// Reads every queue each `every` until the runtime stops. A failed read is
/// logged and leaves the last values (and the timestamp, which then ages).
/// No group list is read (no series carries the grouped count): the read
/// costs Redis the same however many groups a queue has (docs/GROUPS.md).
pub fn spawn(admin: Admin, queues: Vec<String>, every: Duration) -> JoinHandle<()> {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            for queue in &queues {
                match admin.health_with_group_limit(queue, 0).await {
                    Ok(h) => publish(&h),
                    Err(e) => tracing::warn!(queue, error = %e, "reading queue metrics failed"),
                }
            }
        }
    })
}

/// Sets the queue's series from one health snapshot.
pub fn publish(h: &QueueHealth) {
    let queue = h.stats.queue.clone();
    h.stats.publish_gauges();
    metrics::gauge!(EXPIRED_LEASES, "queue" => queue.clone()).set(h.expired_leases as f64);
    metrics::gauge!(DELAYED_DUE, "queue" => queue.clone()).set(h.delayed_due as f64);
    metrics::gauge!(LAST_SAMPLE, "queue" => queue.clone()).set(h.now_ms as f64 / 1000.0);
    let extra = h
        .stats
        .counters
        .keys()
        .filter(|name| !MIRRORED.contains(&name.as_str()) && counter_like(name))
        .take(MAX_EXTRA)
        .map(String::as_str);
    let mut last = LAST_SEEN.lock().unwrap_or_else(|e| e.into_inner());
    for name in MIRRORED.iter().copied().chain(extra) {
        let value = h.stats.counter(name).max(0) as u64;
        let key = (queue.clone(), name.to_string());
        let seen = last.get(&key).copied();
        last.insert(key, kept(seen, value));
        // Registered even when the step is 0, so a rule has a series from the start.
        metrics::counter!(STATS_TOTAL, "queue" => queue.clone(), "counter" => name.to_string())
            .increment(increment(seen, value));
    }
}

/// The value the exported counter stands for per (queue, counter name):
/// the last value read from Redis, or, while Redis reads lower by at most
/// half (a regression), the higher one read before it. The exported counter
/// moves by the difference with it: `Counter::absolute` is a fetch-max in
/// metrics 0.24, so after Redis lost its counters (a restart without
/// persistence, `DEL q:{Q}:stats`) the series stayed at the old value until
/// Redis climbed past it.
static LAST_SEEN: LazyLock<Mutex<HashMap<(String, String), u64>>> =
    LazyLock::new(|| Mutex::new(HashMap::new()));

/// Whether Redis reading `now` after `last` lost its counters (a reset),
/// rather than regressed a little. A drop to at least half of `last` is a
/// regression: a failover to a replica that lagged a few writes behind,
/// whose counters go on from there; the counts between it and `last` were
/// exported already, and Redis repeats them. A drop below half is a reset
/// (a restart without persistence, the stats key deleted). A heuristic:
/// a replica that lagged more than half the count is taken for a reset
/// (its value is counted again), and a reset that climbed back to half of
/// `last` before the next read is taken for a regression (the counts up to
/// `last` are not exported).
fn is_reset(last: u64, now: u64) -> bool {
    now < last.div_ceil(2)
}

/// How much the exported counter moves when Redis reads `now` after
/// `last`: the difference when Redis is higher; nothing on a regression
/// (until Redis passes `last` again, see [`kept`]); all of `now` on a
/// reset ([`is_reset`]), counted since that reset. The exported counter
/// never goes down.
fn increment(last: Option<u64>, now: u64) -> u64 {
    match last {
        Some(last) if now >= last => now - last,
        Some(last) if !is_reset(last, now) => 0,
        _ => now,
    }
}

/// The value [`LAST_SEEN`] keeps after Redis read `now` after `last`: the
/// old one on a regression, so only what Redis counts above it is exported.
fn kept(last: Option<u64>, now: u64) -> u64 {
    match last {
        Some(last) if now < last && !is_reset(last, now) => last,
        _ => now,
    }
}

/// `lower_snake_case`, 1 to 32 characters.
fn counter_like(name: &str) -> bool {
    (1..=32).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
}

#[cfg(test)]
mod tests {
    use super::{counter_like, increment, kept};

    /// Reads `values` in turn from a fresh mirror: (exported increments,
    /// value kept at the end).
    fn mirror(values: &[u64]) -> (Vec<u64>, u64) {
        let mut last = None;
        let steps = values
            .iter()
            .map(|&v| {
                let step = increment(last, v);
                last = Some(kept(last, v));
                step
            })
            .collect();
        (steps, last.unwrap())
    }

    #[test]
    fn a_counter_far_below_last_read_is_a_reset_and_adds_its_value() {
        assert_eq!(increment(None, 5), 5, "first read: the whole value");
        assert_eq!(increment(Some(5), 5), 0);
        assert_eq!(increment(Some(5), 8), 3);
        assert_eq!(increment(Some(5), 1), 1, "reset: counted since the reset");
        assert_eq!(increment(Some(5), 0), 0);
        assert_eq!(increment(Some(1000), 3), 3, "below half: a reset");
        assert_eq!(increment(Some(1000), 499), 499);
        assert_eq!(mirror(&[1000, 3, 10]), (vec![1000, 3, 7], 10));
    }

    /// A failover to a replica 10 counts behind: nothing exported until Redis
    /// passes the old value, then only what is above it. Before, 990 was
    /// added (a counter of 10 M jumped by 10 M; the `increase > 0` and rate
    /// alerts fired after every failover).
    #[test]
    fn a_counter_a_little_below_last_read_is_a_regression_and_adds_nothing() {
        assert_eq!(increment(Some(1000), 990), 0);
        assert_eq!(kept(Some(1000), 990), 1000, "the old value is kept");
        assert_eq!(increment(Some(1000), 1005), 5);
        assert_eq!(
            mirror(&[1000, 990, 995, 1000, 1005]),
            (vec![1000, 0, 0, 0, 5], 1005)
        );
        assert_eq!(increment(Some(1000), 500), 0, "exactly half: a regression");
        assert_eq!(increment(Some(5), 3), 0);
        assert_eq!(increment(Some(1), 0), 0);
        assert_eq!(kept(Some(1), 0), 0, "1 → 0 is a reset");
        assert_eq!(increment(Some(u64::MAX), u64::MAX / 2 + 1), 0);
        assert_eq!(increment(Some(u64::MAX), u64::MAX / 2), u64::MAX / 2);
    }

    #[test]
    fn only_counter_like_names_become_labels() {
        assert!(counter_like("lease_lost") && counter_like("dead"));
        assert!(!counter_like("") && !counter_like("Dead") && !counter_like("a b"));
        assert!(!counter_like(&"x".repeat(33)));
    }
}
