//! The inbox's metric, through the `metrics` facade (as `queue-core`'s):
//! install any recorder to export it; without one the call is a no-op.
//!
//! | metric | type | labels |
//! |---|---|---|
//! | `queue_inbox_already_done_total` | counter | queue: redeliveries acked because the inbox row was done |

pub(crate) fn already_done(queue: &str) {
    metrics::counter!("queue_inbox_already_done_total", "queue" => queue.to_string()).increment(1);
}
