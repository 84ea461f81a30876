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
        let seen = last.insert((queue.clone(), name.to_string()), value);
        // Registered even when the step is 0, so a rule has a series from the start.
        metrics::counter!(STATS_TOTAL, "queue" => queue.clone(), "counter" => name.to_string())
            .increment(increment(seen, value));
    }
}

/// The last value read from Redis per (queue, counter name). The exported
/// counter moves by the difference with it: `Counter::absolute` is a
/// fetch-max in metrics 0.24, so after Redis lost its counters (a restart
/// without persistence, a failover to a lagging replica, `DEL q:{Q}:stats`)
/// the series stayed at the old value until Redis climbed past it.
static LAST_SEEN: LazyLock<Mutex<HashMap<(String, String), u64>>> =
    LazyLock::new(|| Mutex::new(HashMap::new()));

/// How much the exported counter moves when Redis reads `now` after
/// `last`: the difference, or (Redis lower: its counters were reset) all of
/// `now`, counted since that reset. The exported counter never goes down.
fn increment(last: Option<u64>, now: u64) -> u64 {
    match last {
        Some(last) if now >= last => now - last,
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
    use super::{counter_like, increment};

    #[test]
    fn a_counter_lower_than_last_read_is_a_reset_and_adds_its_value() {
        assert_eq!(increment(None, 5), 5, "first read: the whole value");
        assert_eq!(increment(Some(5), 5), 0);
        assert_eq!(increment(Some(5), 8), 3);
        assert_eq!(increment(Some(5), 1), 1, "reset: counted since the reset");
        assert_eq!(increment(Some(5), 0), 0);
    }

    #[test]
    fn only_counter_like_names_become_labels() {
        assert!(counter_like("lease_lost") && counter_like("dead"));
        assert!(!counter_like("") && !counter_like("Dead") && !counter_like("a b"));
        assert!(!counter_like(&"x".repeat(33)));
    }
}
