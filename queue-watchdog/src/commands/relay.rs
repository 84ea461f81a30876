//! `relay dead` / `relay retry-dead`: the cross-queue relay notices of a
//! queue that could not be applied (`Queue::relay_dead`), and moving them
//! back to be applied once their cause is repaired
//! (`Queue::relay_retry_dead`, then `Queue::relay`); docs/WORKFLOWS.md,
//! "Relay". `retry-dead` exits 1 when a notice is set aside again.

use std::process::ExitCode;

use queue_core::admin::Admin;
use serde_json::json;

use crate::error::Result;
use crate::format::printable;

pub async fn dead(url: &str, queue: &str, json: bool) -> Result<ExitCode> {
    let admin = Admin::connect(url).await?;
    let notices = admin.queue().relay_dead(queue).await?;
    if json {
        let rows: Vec<_> = notices
            .iter()
            .map(|n| {
                json!({"reason": n.reason, "batch": n.batch, "member": n.member, "kind": n.kind})
            })
            .collect();
        println!("{}", json!({"queue": queue, "notices": rows}));
        return Ok(ExitCode::SUCCESS);
    }
    println!(
        "relay notices of queue {queue} that could not be applied: {}, newest first",
        notices.len()
    );
    for n in &notices {
        println!(
            "{}\t{}\t{}\t{}",
            printable(&n.member),
            printable(&n.batch),
            n.kind,
            printable(&n.reason)
        );
    }
    if !notices.is_empty() {
        println!("once the cause is repaired: queue-watchdog relay retry-dead -q {queue}");
    }
    Ok(ExitCode::SUCCESS)
}

pub async fn retry_dead(url: &str, queue: &str, json: bool) -> Result<ExitCode> {
    let admin = Admin::connect(url).await?;
    let moved = admin.queue().relay_retry_dead(queue).await?;
    let relayed = admin.queue().relay(queue).await?;
    if json {
        println!(
            "{}",
            json!({
                "queue": queue,
                "moved": moved.moved,
                "kept": moved.kept,
                "left": moved.left,
                "applied": relayed.applied,
                "already": relayed.already,
                "dead": relayed.dead,
                "dropped": relayed.dropped,
            })
        );
    } else {
        println!(
            "{queue}: moved {} dead notice(s) back to the relay list (kept {} unreadable, {} newer not examined)",
            moved.moved, moved.kept, moved.left
        );
        println!(
            "{queue}: relayed: applied {}, already applied {}, set aside again {}, dropped (batch gone) {}",
            relayed.applied, relayed.already, relayed.dead, relayed.dropped
        );
        if relayed.dead > 0 {
            println!("see why: queue-watchdog relay dead -q {queue}");
        }
    }
    Ok(if relayed.dead > 0 {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    })
}
