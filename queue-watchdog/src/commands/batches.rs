//! `batches show`: one batch's (or flow's) state and counts, as text or
//! JSON (docs/WORKFLOWS.md). Exit 1 when the batch is unknown.

use std::process::ExitCode;

use queue_core::Queue;
use serde_json::json;

use crate::error::Result;
use crate::format::fmt_ts;

pub async fn show(url: &str, queue: &str, id: &str, json: bool) -> Result<ExitCode> {
    let q = Queue::connect(url).await?;
    let Some(b) = q.batch(queue, id).await? else {
        if json {
            println!("{}", json!({"id": id, "queue": queue, "found": false}));
        } else {
            eprintln!("no batch {id:?} on queue {queue} (never created, or expired 7 days after it fired)");
        }
        return Ok(ExitCode::from(1));
    };
    if json {
        let v = json!({
            "id": b.id, "queue": b.queue, "found": true, "state": b.state,
            "total": b.total, "succeeded": b.succeeded, "dead": b.dead,
            "cancelled": b.cancelled, "failed": b.failed, "finished": b.finished(),
            "created_at_ms": b.created_at_ms, "fired_at_ms": b.fired_at_ms,
        });
        println!("{v}");
        return Ok(ExitCode::SUCCESS);
    }
    println!("batch {} (queue {})", b.id, b.queue);
    println!("  state      {}", b.state);
    println!("  members    {} finished of {}", b.finished(), b.total);
    println!(
        "  succeeded  {}   dead {}   cancelled {}   failed (fail-parent) {}",
        b.succeeded, b.dead, b.cancelled, b.failed
    );
    println!("  created    {}", fmt_ts(b.created_at_ms));
    if let Some(at) = b.fired_at_ms {
        println!("  fired      {}", fmt_ts(at));
    }
    Ok(ExitCode::SUCCESS)
}
