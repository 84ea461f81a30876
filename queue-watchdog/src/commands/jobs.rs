//! `jobs show`: one job's location, history, fields, payload, completion
//! record and steps, as text or JSON. Exit 1 when the id is unknown.

use std::process::ExitCode;

use queue_core::admin::{Admin, JobDetail};
use serde_json::json;

use crate::error::Result;
use crate::format::{display_field, fmt_rel, fmt_ts, payload_json, printable};
use crate::history_view::{entry_delivery, entry_name};
use crate::views::{describe_where, event_detail, event_name, job_detail_json};

pub async fn show(url: &str, id: &str, named: &[String], json: bool) -> Result<ExitCode> {
    let admin = Admin::connect(url).await?;
    let queues = admin.queues_or_discover(named).await?;
    let found = admin.find_job(&queues, id).await?;
    if json {
        let v = match found.as_slice() {
            [] => json!({"id": id, "found": false, "queues_searched": queues}),
            [one] => job_detail_json(one),
            many => serde_json::Value::Array(many.iter().map(job_detail_json).collect()),
        };
        println!("{v}");
    } else if found.is_empty() {
        eprintln!(
            "no job {id:?} in {} (never enqueued, purged, or completed longer ago than the retention)",
            if queues.is_empty() {
                "any queue".to_string()
            } else {
                format!("queue(s) {}", queues.join(", "))
            }
        );
    } else {
        for d in &found {
            print!("{}", render(d));
        }
    }
    Ok(if found.is_empty() {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    })
}

fn render(d: &JobDetail) -> String {
    // Text a producer or worker wrote (possibly in another language): made
    // printable, so no control character reaches the terminal.
    let f = |k: &str| printable(d.field(k).unwrap_or("?"));
    let job = d.job.as_ref().filter(|j| !j.fields.is_empty());
    let mut s = format!("job {} (queue {})\n", printable(d.id.as_str()), d.queue);
    s.push_str(&format!("  where     {}\n", describe_where(d)));
    if job.is_some() {
        s.push_str(&format!("  state     {}\n", f("state")));
        s.push_str(&format!("  type      {} (v{})\n", f("type"), f("v")));
        s.push_str(&format!(
            "  attempts  {} of {}\n",
            f("attempts"),
            f("max_attempts")
        ));
        if let Some(progress) = crate::format::progress_line(|k| d.field(k)) {
            s.push_str(&format!("  progress  {progress}\n"));
        }
        if let Some(worker) = d.field("worker").filter(|w| !w.is_empty()) {
            // Written by the claim of the current (or, once it ended, the last) delivery.
            s.push_str(&format!("  worker    {}\n", printable(worker)));
        }
    }
    s.push_str("history (the hash keeps the latest time of each kind of event)\n");
    for e in &d.history {
        s.push_str(&format!(
            "  {}  {:<12} {:<14} {}\n",
            fmt_ts(e.at),
            format!("({})", fmt_rel(e.at, d.now_ms)),
            event_name(&e.kind),
            printable(&event_detail(&e.kind))
        ));
    }
    s.push_str("deliveries (each attempt and what ended it)\n");
    for e in &d.journal {
        s.push_str(&format!(
            "  {}  {:<12} {:<14} {}  {}\n",
            fmt_ts(e.at),
            format!("({})", fmt_rel(e.at, d.now_ms)),
            entry_name(e),
            entry_delivery(e),
            printable(e.detail.as_deref().unwrap_or(""))
        ));
    }
    if let Some(job) = job {
        s.push_str("fields\n");
        let w = job.fields.keys().map(String::len).max().unwrap_or(0);
        for (k, v) in &job.fields {
            s.push_str(&format!("  {k:<w$}  {}\n", display_field(k, v)));
        }
        s.push_str(&format!(
            "payload ({} bytes of MessagePack)\n  {}\n",
            job.payload.len(),
            payload_json(&job.payload)
        ));
    }
    match &d.completion {
        Some(c) => {
            s.push_str("completion record\n");
            for (k, v) in c {
                s.push_str(&format!("  {k:<12}  {}\n", display_field(k, v)));
            }
        }
        None => s.push_str("completion record: none\n"),
    }
    if d.steps.is_empty() {
        s.push_str("steps: none\n");
    } else {
        s.push_str(&format!("steps: {}\n", printable(&d.steps.join(", "))));
    }
    s
}
