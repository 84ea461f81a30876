//! Periodic jobs: each worker that registers a job with a cron schedule
//! enqueues it at each due time, under the id `cron:<job>:<unix seconds>` with
//! a once-marker, so a firing runs once however many workers try.

use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio::sync::watch;
use tracing::{debug, info, warn};

use crate::conn::RedisConnection;
use crate::error::{QueueError, Result};
use crate::queue::{EnqueueOptions, EnqueueOutcome, Queue};
use crate::registry::Registration;

/// A missed firing is still enqueued if a scheduler sees it within this long.
pub(crate) const CATCH_UP: Duration = Duration::from_secs(60);
/// How long a firing's id is refused after it was enqueued.
const ONCE_FOR: Duration = Duration::from_secs(600);

pub(crate) struct Periodic {
    reg: Registration,
    schedule: cron::Schedule,
    payload: Vec<u8>,
}

/// Parses the cron schedules of the registrations that have one.
pub(crate) fn parse(regs: &[Registration]) -> Result<Vec<Periodic>> {
    regs.iter()
        .filter_map(|reg| reg.cron.map(|c| (reg, c)))
        .map(|(reg, (expr, payload))| {
            let schedule = cron::Schedule::from_str(expr).map_err(|e| {
                QueueError::Config(format!(
                    "job type `{}` on queue `{}`: invalid cron expression {expr:?} (6 fields, with seconds): {e}",
                    reg.name, reg.queue
                ))
            })?;
            Ok(Periodic {
                reg: reg.clone(),
                schedule,
                payload: payload(),
            })
        })
        .collect()
}

/// The latest firing at or before `now`, if within the catch-up window.
fn due(schedule: &cron::Schedule, now: DateTime<Utc>) -> Option<DateTime<Utc>> {
    let from = now - chrono::Duration::from_std(CATCH_UP).ok()?;
    schedule.after(&from).take_while(|t| *t <= now).last()
}

async fn redis_now(conn: &mut RedisConnection) -> redis::RedisResult<DateTime<Utc>> {
    let (secs, micros): (i64, i64) = redis::cmd("TIME").query_async(conn).await?;
    Ok(DateTime::from_timestamp(secs, (micros * 1000) as u32).unwrap_or_default())
}

/// Fires due periodic jobs until `stop`.
pub(crate) async fn run(
    conn: RedisConnection,
    jobs: Arc<Vec<Periodic>>,
    mut stop: watch::Receiver<bool>,
) {
    if jobs.is_empty() {
        return;
    }
    let queue = Queue::from_connection(conn.clone());
    let mut conn = conn;
    let mut fired: Vec<Option<i64>> = vec![None; jobs.len()];
    loop {
        if *stop.borrow() {
            return;
        }
        match redis_now(&mut conn).await {
            Ok(now) => {
                for (i, job) in jobs.iter().enumerate() {
                    let Some(at) = due(&job.schedule, now) else {
                        continue;
                    };
                    if fired[i] == Some(at.timestamp()) {
                        continue;
                    }
                    let id = format!("cron:{}:{}", job.reg.name, at.timestamp());
                    let opts = EnqueueOptions::new().id(id.as_str()).once_for(ONCE_FOR);
                    match queue
                        .enqueue_raw(
                            job.reg.queue,
                            job.reg.name,
                            job.reg.version,
                            job.reg.max_attempts,
                            opts,
                            &job.payload,
                        )
                        .await
                    {
                        Ok(e) => {
                            fired[i] = Some(at.timestamp());
                            if e.outcome == EnqueueOutcome::Created {
                                info!(queue = job.reg.queue, job_id = %id, job_type = job.reg.name, "periodic job fired");
                            } else {
                                debug!(queue = job.reg.queue, job_id = %id, "periodic firing already enqueued by another worker");
                            }
                        }
                        Err(e) => {
                            warn!(queue = job.reg.queue, job_id = %id, error = %e, "periodic job not enqueued; retrying")
                        }
                    }
                }
            }
            Err(e) => warn!(error = %e, "scheduler cannot read the Redis clock; retrying"),
        }
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_millis(500)) => {}
            _ = stop.changed() => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn due_picks_the_latest_firing_within_the_window() {
        let s = cron::Schedule::from_str("0 */5 * * * *").unwrap();
        let now = DateTime::parse_from_rfc3339("2026-01-01T10:05:30Z")
            .unwrap()
            .with_timezone(&Utc);
        assert_eq!(
            due(&s, now).unwrap().to_rfc3339(),
            "2026-01-01T10:05:00+00:00"
        );
        let later = DateTime::parse_from_rfc3339("2026-01-01T10:07:00Z")
            .unwrap()
            .with_timezone(&Utc);
        assert_eq!(due(&s, later), None, "older than the catch-up window");
    }
}
