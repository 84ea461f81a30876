//! `stats`: per queue lengths, ages, lost jobs, throughput and counters, as
//! a table with plain-words notes, or JSON.

use std::process::ExitCode;

use queue_core::admin::{Admin, QueueHealth};

use crate::cli::StatsArgs;
use crate::error::{CliError, Result};
use crate::format::fmt_dur;

pub async fn stats(url: &str, args: StatsArgs) -> Result<ExitCode> {
    let admin = Admin::connect(url).await?;
    let mut all = Vec::new();
    let mut limits = Vec::new();
    for q in admin.queues_or_discover(&args.selection.queues).await? {
        all.push(admin.health(&q).await?);
        limits.push(admin.queue().limits(&q).await?);
    }
    if args.json {
        let mut rows = serde_json::to_value(&all).map_err(|e| CliError::Other(e.to_string()))?;
        super::limits::add_to_json(&mut rows, &limits);
        println!("{}", super::to_json(&rows)?);
    } else if all.is_empty() {
        eprintln!("no queue found (nothing enqueued yet?); name queues with --queue");
    } else {
        print!("{}", table(&all));
        for l in &limits {
            if let Some(note) = super::limits::note(l) {
                println!("{}: {note}", l.queue);
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// The table, then the notes of each queue.
fn table(all: &[QueueHealth]) -> String {
    let width = all
        .iter()
        .map(|h| h.stats.queue.len())
        .max()
        .unwrap_or(5)
        .max(5);
    let mut out = format!(
        "{:<width$} {:>8} {:>9} {:>10} {:>5} {:>8} {:>6} {:>8} {:>8} {:>13} {:>8} {:>9}\n",
        "queue",
        "waiting",
        "oldest",
        "processing",
        "lost",
        "delayed",
        "dead",
        "done/min",
        "retried",
        "dead-lettered",
        "failed",
        "reclaimed"
    );
    for h in all {
        let s = &h.stats;
        out.push_str(&format!(
            "{:<width$} {:>8} {:>9} {:>10} {:>5} {:>8} {:>6} {:>8} {:>8} {:>13} {:>8} {:>9}\n",
            s.queue,
            s.main,
            s.oldest_waiting_ms
                .map(fmt_dur)
                .unwrap_or_else(|| "-".into()),
            s.processing,
            h.expired_leases,
            s.delayed,
            s.dead,
            s.completed_last_minute,
            s.counter("retried"),
            s.counter("dead"),
            s.counter("failed"),
            s.counter("reclaimed")
        ));
    }
    for h in all {
        for line in diagnose(h) {
            out.push_str(&format!("{}: {line}\n", h.stats.queue));
        }
    }
    out
}

/// Plain-words notes on lost and slow jobs.
fn diagnose(h: &QueueHealth) -> Vec<String> {
    let s = &h.stats;
    let mut out = Vec::new();
    if let Some(since) = s.paused_since_ms {
        out.push(format!(
            "PAUSED since {}: workers start none of its jobs (enqueue still works). Resume with `queue-watchdog queue resume -q {}`.",
            crate::format::fmt_ts(since),
            s.queue
        ));
    }
    if s.grouped > 0 || s.grouped_partial {
        let at_least = if s.grouped_partial {
            format!(
                "at least {} (only the first {} groups read)",
                s.grouped,
                queue_core::admin::STATS_GROUP_LIMIT
            )
        } else {
            s.grouped.to_string()
        };
        out.push(format!(
            "{at_least} job(s) waiting in group lists (fair queuing, not counted in main): `queue pause|resume -q {} --group G` per group.",
            s.queue
        ));
    }
    if s.grouped_unreadable > 0 {
        out.push(format!(
            "{} group key(s) UNREADABLE: a group's list, the group ring or the group pause hash holds another type (corrupt data); the jobs of the groups it lists are not counted (a group list: fetches skip it; the ring: fetches serve main only; the pause hash: read as no group paused). `queue-watchdog check -q {}` names them; see also the Redis log (`stats: group key ...`).",
            s.grouped_unreadable, s.queue
        ));
    }
    if h.expired_leases > 0 {
        out.push(format!(
            "{} job(s) LOST in processing: lease expired (worker died or stalled). A running watchdog returns them within one pass; if this number stays, start `queue-watchdog run -q {}`.",
            h.expired_leases, s.queue
        ));
    }
    if h.unleased > 0 {
        out.push(format!(
            "{} job(s) in processing without a lease (taken, not claimed yet): the watchdog adopts and returns them after the orphan grace.",
            h.unleased
        ));
    }
    if let Some(ms) = h.next_delayed_in_ms.filter(|ms| *ms < -10_000) {
        out.push(format!(
            "{} delayed job(s) overdue by up to {}: no worker or watchdog is promoting them.",
            h.delayed_due,
            fmt_dur(ms.unsigned_abs())
        ));
    }
    if let Some(age) = s.oldest_waiting_ms.filter(|ms| *ms >= 60_000) {
        out.push(format!(
            "SLOW: the oldest waiting job has waited {} ({} waiting, {} done in the last minute): add workers or concurrency.",
            fmt_dur(age),
            s.main,
            s.completed_last_minute
        ));
    }
    out
}
