//! The dashboard's background task: samples every queue's counters for the
//! throughput chart (publishing the gauges when metrics are on), refreshes
//! the discovered queue list (every 10 s, spaced further when a discovery is
//! slow: [`discovery_spacing`]) and the doctor's verdict every minute.

use std::time::Duration;

use tokio::time::Instant;

use serde::Serialize;
use tracing::warn;

use super::{AppState, Discovery, Shared};
use crate::doctor;

/// One sample of a queue's lifetime counters, for the throughput chart.
#[derive(Debug, Clone, Copy)]
pub struct Sample {
    pub t: i64,
    pub completed: i64,
    pub enqueued: i64,
    pub failed: i64,
}

/// The doctor's latest verdict, refreshed every minute.
#[derive(Debug, Clone, Serialize)]
pub struct DoctorSummary {
    pub safe: bool,
    pub critical: usize,
    pub warnings: usize,
    pub error: Option<String>,
}

/// Runs the doctor with the dashboard's defaults (not strict).
pub async fn run_doctor(url: &str) -> crate::error::Result<Vec<doctor::Finding>> {
    let facts = doctor::gather(url, 10_000).await?;
    Ok(doctor::analyze(
        &facts,
        doctor::Options {
            strict: false,
            max_lag_secs: 10,
        },
    ))
}

async fn doctor_summary(url: &str) -> DoctorSummary {
    match run_doctor(url).await {
        Ok(f) => DoctorSummary {
            safe: doctor::is_safe(&f),
            critical: doctor::count(&f, doctor::Severity::Critical),
            warnings: doctor::count(&f, doctor::Severity::Warning),
            error: None,
        },
        Err(e) => DoctorSummary {
            safe: false,
            critical: 0,
            warnings: 0,
            error: Some(e.to_string()),
        },
    }
}

/// How often the queue list is rediscovered when the discovery is quick.
const REDISCOVER: Duration = Duration::from_secs(10);

/// The wait before the next discovery, after one that took `took`: at least
/// [`REDISCOVER`], and 60 times the discovery's duration, so that its SCANs
/// of the whole keyspace cost Redis at most about 1/60 of its time (5.8 s
/// on 2M keys: the next one 5.8 minutes later instead of 10 s). At most an
/// hour, so a new queue still shows up.
pub fn discovery_spacing(took: Duration) -> Duration {
    const MOST: Duration = Duration::from_secs(3600);
    REDISCOVER.max(took.saturating_mul(60)).min(MOST)
}

pub async fn sampler(state: Shared, every: Duration) {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let mut n: u64 = 0;
    let redoctor = (60_000 / every.as_millis().max(1) as u64).max(1);
    let mut next_discovery = Instant::now();
    loop {
        tick.tick().await;
        if state.named.is_empty() && Instant::now() >= next_discovery {
            let started = Instant::now();
            let found = state.admin.discover_queues().await;
            let took = started.elapsed();
            let wait = discovery_spacing(took);
            if wait > REDISCOVER {
                warn!(
                    took_ms = took.as_millis() as u64,
                    next_in_s = wait.as_secs(),
                    "queue discovery is slow (a SCAN of the whole keyspace): rediscovering less often; name the queues with --queue to skip it"
                );
            }
            next_discovery = Instant::now() + wait;
            match found {
                Ok(q) => {
                    *state.known.lock().unwrap() = q;
                    *state.discovery.lock().unwrap() = Discovery::Done;
                }
                Err(e) => {
                    warn!(error = %e, "queue discovery failed");
                    // Before the first success the pages say why the list is
                    // still empty; after it they keep the last list found.
                    let mut d = state.discovery.lock().unwrap();
                    if let Discovery::InProgress { error } = &mut *d {
                        *error = Some(e.to_string());
                    }
                }
            }
        }
        if n.is_multiple_of(redoctor) {
            let summary = doctor_summary(&state.url).await;
            *state.doctor.lock().unwrap() = Some(summary);
        }
        n += 1;
        sample_queues(&state).await;
    }
}

async fn sample_queues(state: &AppState) {
    let queues = state.known.lock().unwrap().clone();
    for q in queues {
        // No group list read: nothing sampled here uses the grouped count,
        // and reading it costs one call per group every interval (GROUPS.md).
        match state.admin.health_with_group_limit(&q, 0).await {
            Ok(h) => {
                if state.metrics.is_some() {
                    crate::queue_gauges::publish(&h);
                }
                let mut samples = state.samples.lock().unwrap();
                let v = samples.entry(q).or_default();
                v.push_back(Sample {
                    t: h.now_ms,
                    completed: h.stats.counter("completed"),
                    enqueued: h.stats.counter("enqueued"),
                    failed: h.stats.counter("failed"),
                });
                while v.len() > state.capacity {
                    v.pop_front();
                }
            }
            Err(e) => warn!(queue = %q, error = %e, "sampling failed"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_slow_discovery_spaces_the_next_one() {
        assert_eq!(discovery_spacing(Duration::ZERO), REDISCOVER);
        assert_eq!(discovery_spacing(Duration::from_millis(100)), REDISCOVER);
        assert_eq!(
            discovery_spacing(Duration::from_millis(5_800)),
            Duration::from_secs(348)
        );
        assert_eq!(discovery_spacing(Duration::MAX), Duration::from_secs(3600));
    }
}
