//! [`JobEvent`]: a job's life read back from the timestamps its hash and its
//! completion record keep. The hash keeps the latest time of each kind of
//! event, so an earlier failure overwritten by a later one is not listed.

use std::collections::BTreeMap;

use super::parse_ms;

/// One event in a job's life.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobEvent {
    /// When (Redis clock, ms since the epoch).
    pub at: i64,
    /// What happened.
    pub kind: JobEventKind,
}

/// What happened to a job, with the details its hash keeps.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JobEventKind {
    /// Written by an enqueue.
    Enqueued {
        /// Job type.
        job_type: Option<String>,
        /// Payload schema version.
        version: Option<u32>,
        /// Deliveries allowed.
        max_attempts: Option<u32>,
    },
    /// The latest delivery was claimed by a worker.
    Delivered {
        /// Its attempt number.
        attempt: Option<u32>,
    },
    /// The latest failed delivery.
    Failed {
        /// Its error.
        error: Option<String>,
    },
    /// Moved to the dead-letter list.
    DeadLettered {
        /// Why.
        reason: Option<String>,
    },
    /// Moved back to main from the dead-letter list.
    Replayed {
        /// Why it had died.
        previous_reason: Option<String>,
    },
    /// Due to run from the delayed set.
    Scheduled,
    /// Finished (from the completion record).
    Completed {
        /// The record's status (`done`).
        status: Option<String>,
        /// Deliveries it took.
        attempts: Option<u32>,
    },
}

/// The events of a job, oldest first, from its hash fields (payload aside)
/// and its completion record.
pub(super) fn history(
    fields: &BTreeMap<String, String>,
    completion: Option<&BTreeMap<String, String>>,
) -> Vec<JobEvent> {
    let text = |name: &str| fields.get(name).filter(|v| !v.is_empty()).cloned();
    let number = |name: &str| fields.get(name).and_then(|v| v.trim().parse().ok());
    let time = |name: &str| fields.get(name).and_then(|v| parse_ms(v));
    let done = |name: &str| completion.and_then(|c| c.get(name));
    let mut events = Vec::new();
    let mut push = |at: Option<i64>, kind: JobEventKind| {
        if let Some(at) = at {
            events.push(JobEvent { at, kind });
        }
    };
    push(
        time("enqueued_at").or_else(|| parse_ms(done("enqueued_at")?)),
        JobEventKind::Enqueued {
            job_type: text("type"),
            version: number("v"),
            max_attempts: number("max_attempts"),
        },
    );
    push(
        time("delivered_at"),
        JobEventKind::Delivered {
            attempt: number("attempts"),
        },
    );
    push(
        time("failed_at"),
        JobEventKind::Failed {
            error: text("last_error"),
        },
    );
    push(
        time("dead_at"),
        JobEventKind::DeadLettered {
            reason: text("dead_reason"),
        },
    );
    push(
        time("replayed_at"),
        JobEventKind::Replayed {
            previous_reason: text("previous_dead_reason"),
        },
    );
    push(time("run_at"), JobEventKind::Scheduled);
    if completion.is_some() {
        push(
            done("finished_at").and_then(|t| parse_ms(t)),
            JobEventKind::Completed {
                status: done("status").cloned(),
                attempts: done("attempts").and_then(|a| a.trim().parse().ok()),
            },
        );
    }
    events.sort_by_key(|e| e.at);
    events
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn history_is_sorted_by_time() {
        let fields: BTreeMap<String, String> = [
            ("enqueued_at", "1000"),
            ("delivered_at", "3000"),
            ("failed_at", "2000"),
            ("last_error", "boom"),
            ("attempts", "2"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        let h = history(&fields, None);
        let at: Vec<i64> = h.iter().map(|e| e.at).collect();
        assert_eq!(at, [1000, 2000, 3000]);
        assert_eq!(
            h[1].kind,
            JobEventKind::Failed {
                error: Some("boom".into())
            }
        );
        assert_eq!(h[2].kind, JobEventKind::Delivered { attempt: Some(2) });
    }

    #[test]
    fn a_completed_job_has_its_record_times() {
        let done: BTreeMap<String, String> = [
            ("enqueued_at", "500"),
            ("finished_at", "900"),
            ("status", "done"),
            ("attempts", "1"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        let h = history(&BTreeMap::new(), Some(&done));
        assert_eq!(h.len(), 2);
        assert_eq!(h[0].at, 500);
        assert_eq!(
            h[1].kind,
            JobEventKind::Completed {
                status: Some("done".into()),
                attempts: Some(1)
            }
        );
    }
}
