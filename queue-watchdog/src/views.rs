//! How the CLI and the dashboard put queue-core's admin types into words
//! and JSON: a job's location, history events, the JSON
//! shapes of a job and of a job's details.

use queue_core::admin::{JobDetail, JobEvent, JobEventKind, JobInfo, LeaseStatus, Location};
use serde_json::{json, Value};

use crate::format::{fmt_dur, fmt_ts, payload_json};

/// Where a job is, in a sentence.
/// Where a job is, saying `cancelled` for a completion record of status
/// `cancelled` (docs/FLOW-CONTROL.md) instead of `completed`.
pub fn describe_where(d: &queue_core::admin::JobDetail) -> String {
    let status = d.completion.as_ref().and_then(|c| c.get("status"));
    match (&d.location, status.map(String::as_str)) {
        (Location::Completed, Some("cancelled")) => {
            "cancelled (by an operator; its completion record is kept)".to_string()
        }
        (location, _) => describe_location(location),
    }
}

pub fn describe_location(location: &Location) -> String {
    match location {
        Location::Main {
            ahead,
            at_least: false,
        } => format!("main (waiting; {ahead} job(s) ahead of it)"),
        Location::Main {
            ahead,
            at_least: true,
        } => format!("main (waiting; at least {ahead} job(s) ahead of it: not among the next {ahead} to run, not searched further)"),
        Location::Processing {
            lease_left_ms,
            status,
            unconfirmed,
            ..
        } => {
            let how = match (status, lease_left_ms) {
                (LeaseStatus::Running, Some(ms)) => {
                    format!("processing (running; lease {} left)", fmt_dur(*ms as u64))
                }
                (LeaseStatus::Expired, Some(ms)) => format!(
                    "processing (LOST: lease expired {} ago; the watchdog returns it on its next pass)",
                    fmt_dur(ms.unsigned_abs())
                ),
                _ => "processing (taken but not claimed: no lease yet)".to_string(),
            };
            if *unconfirmed {
                format!(
                    "{how}; its entry is not among the {} entries of the processing list searched (not searched further)",
                    queue_core::admin::LOCATE_SEARCH
                )
            } else {
                how
            }
        }
        Location::Delayed { .. } => "delayed (retry or scheduled run)".to_string(),
        Location::Dead {
            position,
            at_least: false,
        } => format!("dead-letter list (position {position})"),
        Location::Dead {
            position,
            at_least: true,
        } => format!("dead-letter list (beyond the {position} newest entries)"),
        Location::Completed => "completed".to_string(),
        Location::Nowhere => {
            "in no list (hash without a list entry: inspect before acting)".to_string()
        }
    }
}

/// The event's name (`enqueued`, `dead-lettered`, ...).
pub fn event_name(kind: &JobEventKind) -> &'static str {
    match kind {
        JobEventKind::Enqueued { .. } => "enqueued",
        JobEventKind::Delivered { .. } => "delivered",
        JobEventKind::Failed { .. } => "failed",
        JobEventKind::DeadLettered { .. } => "dead-lettered",
        JobEventKind::Replayed { .. } => "replayed",
        JobEventKind::Scheduled => "scheduled",
        JobEventKind::Completed { .. } => "completed",
    }
}

fn or_empty<T: ToString>(v: &Option<T>) -> String {
    v.as_ref().map(T::to_string).unwrap_or_default()
}

fn or_unknown<T: ToString>(v: &Option<T>) -> String {
    v.as_ref()
        .map(T::to_string)
        .unwrap_or_else(|| "?".to_string())
}

/// The event's details in words.
pub fn event_detail(kind: &JobEventKind) -> String {
    match kind {
        JobEventKind::Enqueued {
            job_type,
            version,
            max_attempts,
        } => format!(
            "type {} v{}, max {} attempt(s)",
            or_empty(job_type),
            or_empty(version),
            or_empty(max_attempts)
        ),
        JobEventKind::Delivered { attempt } => {
            format!("attempt {} (latest delivery)", or_empty(attempt))
        }
        JobEventKind::Failed { error } => or_empty(error),
        JobEventKind::DeadLettered { reason } => or_empty(reason),
        JobEventKind::Replayed { previous_reason } => match previous_reason {
            None => "back to main from the dead-letter list".to_string(),
            Some(r) => format!("back to main; it had died with: {r}"),
        },
        JobEventKind::Scheduled => "due to run (delayed set)".to_string(),
        JobEventKind::Completed { status, attempts } => format!(
            "status {} after {} attempt(s)",
            or_unknown(status),
            or_unknown(attempts)
        ),
    }
}

fn event_json(e: &JobEvent) -> Value {
    json!({"at": e.at, "at_text": fmt_ts(e.at), "event": event_name(&e.kind),
           "detail": event_detail(&e.kind)})
}

/// A job hash as JSON: id, fields, the payload decoded to JSON, its size.
pub fn job_json(j: &JobInfo) -> Value {
    json!({"id": j.id.as_str(), "fields": j.fields, "payload": payload_json(&j.payload),
           "payload_bytes": j.payload.len()})
}

/// Everything about a job as JSON (`jobs show --json`).
pub fn job_detail_json(d: &JobDetail) -> Value {
    let (fields, payload, bytes) = match &d.job {
        Some(j) => (json!(j.fields), payload_json(&j.payload), j.payload.len()),
        None => (json!({}), Value::Null, 0),
    };
    json!({
        "queue": d.queue, "id": d.id.as_str(), "now_ms": d.now_ms, "location": d.location,
        "fields": fields, "payload": payload, "payload_bytes": bytes,
        "completion": d.completion, "steps": d.steps,
        "history": d.history.iter().map(event_json).collect::<Vec<_>>(),
        "journal": d.journal.iter().map(crate::history_view::entry_json).collect::<Vec<_>>(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_read_as_before() {
        let failed = JobEventKind::Failed {
            error: Some("boom".into()),
        };
        assert_eq!(
            (event_name(&failed), event_detail(&failed)),
            ("failed", "boom".into())
        );
        let enqueued = JobEventKind::Enqueued {
            job_type: Some("send".into()),
            version: Some(1),
            max_attempts: Some(5),
        };
        assert_eq!(event_detail(&enqueued), "type send v1, max 5 attempt(s)");
        let done = JobEventKind::Completed {
            status: Some("done".into()),
            attempts: None,
        };
        assert_eq!(event_detail(&done), "status done after ? attempt(s)");
        assert_eq!(
            describe_location(&Location::Main {
                ahead: 2,
                at_least: false
            }),
            "main (waiting; 2 job(s) ahead of it)"
        );
        assert_eq!(
            describe_location(&Location::Main {
                ahead: 100_000,
                at_least: true
            }),
            "main (waiting; at least 100000 job(s) ahead of it: not among the next 100000 to run, not searched further)"
        );
    }
}
