//! `batches show` / `batches list`: one batch's (or flow's, or DAG step's)
//! state, counts, expiry, callbacks and members; a queue's batches newest
//! first — as text or JSON (docs/WORKFLOWS.md, "Operating batches"). `show`
//! exits 1 when the batch is unknown.

use std::process::ExitCode;

use queue_core::admin::{Admin, BatchDetail, BatchRow, Page};
use serde_json::json;

use crate::error::Result;
use crate::format::{fmt_dur, fmt_rel, fmt_ts, printable};

/// "in 2d 3h" / "expired" for an open batch, "" otherwise.
pub fn expiry(row: &BatchRow, now_ms: i64) -> String {
    match row.expires_at_ms {
        Some(at) if row.state == "open" => fmt_rel(at, now_ms),
        _ => String::new(),
    }
}

pub async fn show(url: &str, queue: &str, id: &str, json: bool) -> Result<ExitCode> {
    let admin = Admin::connect(url).await?;
    let Some(b) = admin.batch_detail(queue, id).await? else {
        if json {
            println!("{}", json!({"id": id, "queue": queue, "found": false}));
        } else {
            eprintln!(
                "no batch {id:?} on queue {queue} (never created, expired 7 days after it \
                 fired, or never sealed and past its open TTL)"
            );
        }
        return Ok(ExitCode::from(1));
    };
    if json {
        let mut v = serde_json::to_value(&b).unwrap_or_default();
        v["found"] = json!(true);
        v["finished"] = json!(b.row.finished());
        println!("{v}");
        return Ok(ExitCode::SUCCESS);
    }
    print_detail(&b);
    Ok(ExitCode::SUCCESS)
}

fn print_detail(b: &BatchDetail) {
    let r = &b.row;
    println!("batch {} (queue {})", printable(&r.id), b.queue);
    println!("  state      {}", printable(&r.state));
    println!("  members    {} finished of {}", r.finished(), r.total);
    println!(
        "  succeeded  {}   dead {}   cancelled {}   failed (fail-parent) {}",
        r.succeeded, r.dead, r.cancelled, r.failed
    );
    println!("  created    {}", fmt_ts(r.created_at_ms));
    if let Some(at) = r.sealed_at_ms {
        println!("  sealed     {}", fmt_ts(at));
    }
    if let Some(at) = r.fired_at_ms {
        println!("  fired      {}", fmt_ts(at));
    }
    if let (Some(at), "open") = (r.expires_at_ms, r.state.as_str()) {
        println!(
            "  expires    {} ({}) unless sealed: never sealed, it is dropped",
            fmt_ts(at),
            fmt_rel(at, b.now_ms)
        );
    } else if let (Some(ttl), "fired") = (b.ttl_ms, r.state.as_str()) {
        println!("  kept for   {}", fmt_dur(ttl.max(0) as u64));
    }
    if let Some(first) = &b.failed_child {
        println!("  failed     {}", printable(&first.to_string()));
    }
    for line in b.errors.iter().flat_map(|e| e.lines()) {
        println!("  error      {}", printable(line));
    }
    for cb in &b.callbacks {
        println!(
            "  {:<10} {} ({})",
            cb.role,
            printable(&cb.id),
            printable(&cb.job_type)
        );
    }
    for (q, id) in &b.parent_feeds {
        println!(
            "  feeds      batch {} (queue {})",
            printable(id),
            printable(q)
        );
    }
    if let Some(dag) = &r.dag {
        println!("  dag        {}", printable(dag));
        if b.dag_steps_total > b.dag_steps.len() {
            println!(
                "    ({} steps in all; a DAG of more than 256 steps keeps only each step's own line on its batch)",
                b.dag_steps_total
            );
        }
        for s in &b.dag_steps {
            if s.after.is_empty() {
                println!("    step {}", printable(&s.name));
            } else {
                println!(
                    "    step {} after {}",
                    printable(&s.name),
                    printable(&s.after.join(", "))
                );
            }
        }
    }
    println!(
        "  members ({} registered{}):",
        b.members_total,
        if b.members_sample {
            format!(", a sample of {} shown", b.members.len())
        } else {
            String::new()
        }
    );
    for m in &b.members {
        let reason = m
            .reason
            .as_deref()
            .map(|r| format!(": {}", printable(r)))
            .unwrap_or_default();
        let counted = if m.counted { "counted" } else { "pending" };
        let place = m
            .queue
            .as_deref()
            .map(|q| format!(" (queue {})", printable(q)))
            .unwrap_or_default();
        println!(
            "    {:<32} {:<8} {}{}{}",
            printable(&m.id),
            counted,
            printable(&m.outcome),
            place,
            reason
        );
    }
}

pub async fn list(url: &str, queue: &str, offset: u64, limit: u64, json: bool) -> Result<ExitCode> {
    let admin = Admin::connect(url).await?;
    let page = admin.batches(queue, Page::new(offset, limit)).await?;
    if json {
        println!("{}", serde_json::to_value(&page).unwrap_or_default());
        return Ok(ExitCode::SUCCESS);
    }
    println!(
        "batches of queue {queue}: {} indexed, newest first (from {offset})",
        page.indexed
    );
    println!(
        "{:<32} {:<7} {:>9} {:>5} {:>9} {:<20} {:<12} DAG",
        "ID", "STATE", "FINISHED", "DEAD", "CANCELLED", "CREATED", "EXPIRES"
    );
    for r in &page.batches {
        println!(
            "{:<32} {:<7} {:>9} {:>5} {:>9} {:<20} {:<12} {}",
            printable(&r.id),
            printable(&r.state),
            format!("{}/{}", r.finished(), r.total),
            r.dead,
            r.cancelled,
            fmt_ts(r.created_at_ms),
            expiry(r, page.now_ms),
            printable(r.dag.as_deref().unwrap_or(""))
        );
    }
    if page.expired > 0 {
        println!("({} expired entries not yet swept)", page.expired);
    }
    if let Some(next) = page.next_offset {
        println!("next page: --offset {next}");
    }
    Ok(ExitCode::SUCCESS)
}
