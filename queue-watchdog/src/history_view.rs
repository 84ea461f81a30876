//! A job's history of deliveries ([`HistoryEntry`], docs/EVENTS.md) and a
//! queue's events ([`QueueEvent`]) as words, for `jobs show`, `events` and
//! the dashboard's job page (which escapes them), and as JSON.

use queue_core::admin::HistoryEntry;
use queue_core::{EventKind, QueueEvent};
use serde_json::{json, Value};

use crate::format::{fmt_dur, fmt_ts, printable};

/// What an entry is, in a word or two.
pub fn entry_name(e: &HistoryEntry) -> &'static str {
    match &e.kind {
        EventKind::Enqueued => "enqueued",
        EventKind::Started => "running",
        EventKind::Completed => "completed",
        EventKind::Retried => "failed, retry",
        EventKind::Reclaimed => "lease returned",
        EventKind::Deferred => "deferred",
        EventKind::DeadLettered => "dead-lettered",
        EventKind::Replayed => "replayed",
        EventKind::CancelRequested => "cancel asked",
        EventKind::Cancelled => "cancelled",
        EventKind::Other(_) => "other",
    }
}

/// The delivery an entry ends or is: `attempt 2 on w1, 1.2s (started ...)`;
/// empty when it is not about a delivery.
pub fn entry_delivery(e: &HistoryEntry) -> String {
    let Some(start) = e.started_at else {
        return e
            .attempt
            .map(|a| format!("attempt {a}"))
            .unwrap_or_default();
    };
    let mut s = e
        .attempt
        .map(|a| format!("attempt {a}"))
        .unwrap_or_default();
    if let Some(w) = &e.worker {
        s.push_str(&format!(" on {}", printable(w)));
    }
    if e.running() {
        s.push_str(&format!(", started {}", fmt_ts(start)));
    } else {
        s.push_str(&format!(
            ", {} (started {})",
            fmt_dur(e.at.saturating_sub(start).max(0) as u64),
            fmt_ts(start)
        ));
    }
    s.trim_start().to_string()
}

/// One history entry as JSON (`jobs show --json`, key `journal`).
pub fn entry_json(e: &HistoryEntry) -> Value {
    json!({"at": e.at, "at_text": fmt_ts(e.at), "event": e.kind.as_str(),
           "attempt": e.attempt, "worker": e.worker, "started_at": e.started_at,
           "detail": e.detail})
}

/// One event as a line: `time  kind  id  attempt/worker  detail`.
pub fn event_line(e: &QueueEvent) -> String {
    let mut s = format!(
        "{}  {:<16} {}",
        fmt_ts(e.at_ms),
        printable(e.kind.as_str()),
        printable(e.job_id.as_str())
    );
    if let Some(a) = e.attempt {
        s.push_str(&format!("  attempt={a}"));
    }
    if let Some(w) = &e.worker {
        s.push_str(&format!("  worker={}", printable(w)));
    }
    if let Some(t) = &e.job_type {
        s.push_str(&format!("  type={}", printable(t)));
    }
    if let Some(d) = &e.detail {
        s.push_str(&format!("  {}", printable(d)));
    }
    s
}

/// One event as JSON (`events --json`).
pub fn event_json(e: &QueueEvent) -> Value {
    json!({"stream_id": e.stream_id, "event": e.kind.as_str(), "id": e.job_id.as_str(),
           "at": e.at_ms, "attempt": e.attempt, "worker": e.worker, "type": e.job_type,
           "detail": e.detail})
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Ids, event kinds and worker names written by producers in other
    /// languages reach the operator's terminal as escapes.
    #[test]
    fn control_characters_of_ids_kinds_and_workers_are_escaped() {
        let event = QueueEvent {
            stream_id: "1-0".into(),
            kind: EventKind::Other("odd\u{1b}[2J".into()),
            job_id: "job\u{1b}]0;pwned\u{7}".into(),
            at_ms: 0,
            attempt: None,
            worker: None,
            job_type: None,
            detail: None,
        };
        let line = event_line(&event);
        assert!(!line.chars().any(char::is_control), "{line:?}");
        assert!(line.contains("odd\\u{1b}[2J"), "{line}");
        assert!(line.contains("job\\u{1b}]0;pwned\\u{7}"), "{line}");

        let entry = HistoryEntry {
            at: 2_000,
            kind: EventKind::Completed,
            attempt: Some(1),
            worker: Some("w1\n\u{1b}[31mfake".into()),
            started_at: Some(1_000),
            detail: None,
        };
        let delivery = entry_delivery(&entry);
        assert!(!delivery.chars().any(char::is_control), "{delivery:?}");
        assert!(
            delivery.starts_with("attempt 1 on w1\\n\\u{1b}[31mfake, "),
            "{delivery}"
        );
    }
}
