//! `queue-watchdog inbox migrate | prune | stats | reconcile`: the PostgreSQL
//! transactional inbox (cargo feature `inbox`).

use std::process::ExitCode;
use std::time::Duration;

use queue_inbox::{Inbox, InboxQueueStats, InboxReconcileOptions, InboxReconcileRow};
use queue_outbox::{connect_postgres, Outbox};
use serde_json::json;

use crate::cli_inbox::{InboxCommand, InboxReconcileArgs};
use crate::error::{CliError, Result};

pub async fn dispatch(cmd: InboxCommand) -> Result<ExitCode> {
    match cmd {
        InboxCommand::Migrate { target } => {
            let inbox = Inbox::with_table(&target.table)?;
            inbox
                .migrate(&connect_postgres(&target.database_url).await?)
                .await?;
            println!("inbox table `{}` is ready", inbox.table());
            Ok(ExitCode::SUCCESS)
        }
        InboxCommand::Prune { target, age } => {
            let age = age
                .checked(
                    "inbox rows",
                    "a job can come back after its row is gone (a redelivery within the \
                     completion retention, a replay of a dead-lettered job within the \
                     dead-letter retention) and its effect would apply again; keep \
                     --older-than-secs above both retentions",
                )
                .map_err(CliError::Other)?;
            let inbox = Inbox::with_table(&target.table)?;
            let client = connect_postgres(&target.database_url).await?;
            let n = inbox.prune(&client, age).await?;
            println!("deleted {n} done row(s) from `{}`", inbox.table());
            Ok(ExitCode::SUCCESS)
        }
        InboxCommand::Stats { target, json } => {
            let inbox = Inbox::with_table(&target.table)?;
            let stats = inbox
                .stats(&connect_postgres(&target.database_url).await?)
                .await?;
            if json {
                let out: Vec<_> = stats.iter().map(stats_json).collect();
                println!("{}", serde_json::Value::Array(out));
            } else {
                print!("{}", stats_table(&stats));
            }
            Ok(ExitCode::SUCCESS)
        }
        InboxCommand::Reconcile(args) => reconcile(args).await,
    }
}

fn secs(d: Option<Duration>) -> Option<u64> {
    d.map(|d| d.as_secs())
}

fn stats_json(s: &InboxQueueStats) -> serde_json::Value {
    json!({
        "queue": s.queue, "running": s.running, "done": s.done,
        "oldest_running_secs": secs(s.oldest_running),
        "last_done_secs_ago": secs(s.last_done_ago),
    })
}

fn stats_table(stats: &[InboxQueueStats]) -> String {
    let dash = |d: Option<Duration>| secs(d).map_or_else(|| "-".to_string(), |s| s.to_string());
    let mut out = format!(
        "{:<24} {:>10} {:>12} {:>18} {:>16}\n",
        "queue", "running", "done", "oldest running s", "last done s ago"
    );
    for s in stats {
        out.push_str(&format!(
            "{:<24} {:>10} {:>12} {:>18} {:>16}\n",
            s.queue,
            s.running,
            s.done,
            dash(s.oldest_running),
            dash(s.last_done_ago)
        ));
    }
    out
}

async fn reconcile(args: InboxReconcileArgs) -> Result<ExitCode> {
    let client = connect_postgres(&args.target.database_url).await?;
    let inbox = Inbox::with_table(&args.target.table)?;
    let outbox = Outbox::with_table(&args.outbox_table)?;
    let mut opts =
        InboxReconcileOptions::new(Duration::from_secs(args.older_than_secs)).limit(args.limit);
    if args.max_age_secs > 0 {
        opts = opts.max_age(Duration::from_secs(args.max_age_secs));
    }
    opts.queues = args.queues;
    let rows = inbox.reconcile(&client, &outbox, &opts).await?;
    if args.json {
        let out: Vec<_> = rows.iter().map(row_json).collect();
        println!("{}", serde_json::Value::Array(out));
    } else {
        print!("{}", rows_table(&rows));
        eprintln!("{} outbox row(s) without a done inbox row", rows.len());
        if !rows.is_empty() {
            eprintln!(
                "note: a row older than the inbox prune age may be listed because its done \
                 row was pruned; --max-age-secs (default 604800) bounds the rows listed"
            );
        }
    }
    Ok(if rows.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

fn row_json(r: &InboxReconcileRow) -> serde_json::Value {
    json!({
        "outbox_row_id": r.outbox_row_id, "queue": r.queue, "job_id": r.job_id.as_str(),
        "job_type": r.job_type, "age_secs": r.age.as_secs(), "published": r.published,
        "rejected": r.rejected, "inbox_running": r.inbox_running,
    })
}

fn rows_table(rows: &[InboxReconcileRow]) -> String {
    let mut out = format!(
        "{:>8} {:<16} {:<36} {:<16} {:>8} {:>9}  inbox\n",
        "row", "queue", "job id", "type", "age s", "published"
    );
    for r in rows {
        out.push_str(&format!(
            "{:>8} {:<16} {:<36} {:<16} {:>8} {:>9}  {}\n",
            r.outbox_row_id,
            r.queue,
            r.job_id.as_str(),
            r.job_type,
            r.age.as_secs(),
            match (r.published, r.rejected) {
                (true, _) => "yes",
                (false, true) => "rejected",
                (false, false) => "no",
            },
            if r.inbox_running { "running" } else { "none" }
        ));
    }
    out
}
