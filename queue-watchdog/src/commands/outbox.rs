//! `queue-watchdog outbox migrate | relay | reconcile | prune | stats`: the
//! PostgreSQL outbox relay, reconciliation and upkeep (cargo feature `outbox`).

use std::process::ExitCode;
use std::time::Duration;

use queue_core::Queue;
use queue_outbox::{
    connect_postgres, Outbox, ReconcileOptions, ReconcileRow, ReconcileStatus, Relay,
};
use serde_json::json;

use crate::cli::{OutboxCommand, OutboxTarget, ReconcileArgs, RelayArgs};
use crate::cli_inbox::PruneAge;
use crate::error::{CliError, Result};

pub async fn dispatch(redis_url: &str, cmd: OutboxCommand) -> Result<ExitCode> {
    match cmd {
        OutboxCommand::Migrate { target } => migrate(&target).await,
        OutboxCommand::Relay(args) => relay(redis_url, args).await,
        OutboxCommand::Reconcile(args) => reconcile(redis_url, args).await,
        OutboxCommand::Prune { target, age } => prune(&target, age).await,
        OutboxCommand::Stats { target, json } => stats(&target, json).await,
    }
}

async fn prune(target: &OutboxTarget, age: PruneAge) -> Result<ExitCode> {
    let age = age
        .checked(
            "outbox rows published",
            "until the completion retention has passed, reconcile still tells a completed \
             job from a lost one by its row",
        )
        .map_err(CliError::Other)?;
    let outbox = Outbox::with_table(&target.table)?;
    let client = connect_postgres(&target.database_url).await?;
    let n = outbox.prune(&client, age).await?;
    println!("deleted {n} published row(s) from `{}`", outbox.table());
    Ok(ExitCode::SUCCESS)
}

async fn stats(target: &OutboxTarget, json: bool) -> Result<ExitCode> {
    let outbox = Outbox::with_table(&target.table)?;
    let s = outbox
        .stats(&connect_postgres(&target.database_url).await?)
        .await?;
    let lag = s.oldest_unpublished.map(|d| d.as_secs());
    if json {
        println!(
            "{}",
            json!({
                "table": outbox.table(), "unpublished": s.unpublished, "rejected": s.rejected,
                "published": s.published, "oldest_unpublished_secs": lag,
            })
        );
    } else {
        println!(
            "table={} unpublished={} rejected={} published={} oldest_unpublished_secs={}",
            outbox.table(),
            s.unpublished,
            s.rejected,
            s.published,
            lag.map_or_else(|| "-".to_string(), |l| l.to_string())
        );
        if s.rejected > 0 {
            eprintln!(
                "note: {} rejected row(s) will never be published; `outbox reconcile` lists \
                 them with the reason (their last_error)",
                s.rejected
            );
        }
    }
    Ok(if s.rejected > 0 {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    })
}

async fn migrate(target: &OutboxTarget) -> Result<ExitCode> {
    let outbox = Outbox::with_table(&target.table)?;
    outbox
        .migrate(&connect_postgres(&target.database_url).await?)
        .await?;
    println!("outbox table `{}` is ready", outbox.table());
    Ok(ExitCode::SUCCESS)
}

async fn relay(redis_url: &str, args: RelayArgs) -> Result<ExitCode> {
    let target = &args.target;
    let outbox = Outbox::with_table(&target.table)?;
    let mut queue = Queue::connect(redis_url).await?;
    if let Some(bytes) = args.max_arg_len {
        queue = queue.with_max_arg_len(bytes);
    }
    if args.migrate {
        outbox
            .migrate(&connect_postgres(&target.database_url).await?)
            .await?;
    }
    let mut relay = Relay::connect(outbox, &target.database_url, queue)
        .await?
        .batch_size(args.batch);
    if let Some(n) = args.wait_replicas {
        relay = relay.wait_for_replicas(n, Duration::from_millis(args.wait_timeout_ms));
    }
    if args.once {
        let r = relay.publish_batch(args.batch).await?;
        println!(
            "selected={} published={} duplicates={} failed={} rejected={}",
            r.selected, r.published, r.duplicates, r.failed, r.rejected
        );
        if let Some(e) = &r.error {
            eprintln!("error: {e}");
        }
        // A rejected row is never published: it needs an operator as much
        // as a failed one (before, `--once` exited 0 and a script running it
        // never noticed).
        return Ok(if r.failed > 0 || r.rejected > 0 {
            ExitCode::from(1)
        } else {
            ExitCode::SUCCESS
        });
    }
    let s = relay
        .run_until(
            super::termination(),
            Duration::from_millis(args.interval_ms),
        )
        .await?;
    println!(
        "batches={} published={} duplicates={} failed={} rejected={} stopped={} errors={}",
        s.batches, s.published, s.duplicates, s.failed, s.rejected, s.stopped, s.errors
    );
    Ok(ExitCode::SUCCESS)
}

async fn reconcile(redis_url: &str, args: ReconcileArgs) -> Result<ExitCode> {
    let client = connect_postgres(&args.target.database_url).await?;
    let queue = Queue::connect(redis_url).await?;
    let mut opts =
        ReconcileOptions::new(Duration::from_secs(args.older_than_secs)).limit(args.limit);
    if args.max_age_secs > 0 {
        opts = opts.max_age(Duration::from_secs(args.max_age_secs));
    }
    let rows = Outbox::with_table(&args.target.table)?
        .reconcile_with(&client, &queue, &opts)
        .await?;
    if args.json {
        let out: Vec<_> = rows.iter().map(row_json).collect();
        println!("{}", serde_json::Value::Array(out));
    } else {
        print!("{}", table(&rows));
        eprintln!("{} outbox row(s) without a completed job", rows.len());
        if rows.iter().any(|r| r.status == ReconcileStatus::Missing) {
            eprintln!(
                "note: `missing` may mean expired: a row older than the completion retention \
                 (24 h by default) whose job completed has no record left; --max-age-secs \
                 (default 86400) bounds the rows listed"
            );
        }
    }
    Ok(if rows.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

fn row_json(r: &ReconcileRow) -> serde_json::Value {
    json!({
        "row_id": r.row_id, "queue": r.queue, "job_id": r.job_id.as_str(),
        "job_type": r.job_type, "status": r.status.as_str(),
        "age_secs": r.age.as_secs(), "published": r.published_at.is_some(),
        "publish_attempts": r.publish_attempts, "publish_error": r.publish_error,
        "publish_retry_in_secs": r.publish_retry_in.map(|d| d.as_secs()),
        "job_attempts": r.job_attempts, "job_error": r.job_error,
    })
}

fn table(rows: &[ReconcileRow]) -> String {
    let mut out = format!(
        "{:>8} {:<16} {:<36} {:<12} {:>8} {:>9} {:>8}  error\n",
        "row", "queue", "job id", "status", "age s", "publishes", "attempts"
    );
    for r in rows {
        out.push_str(&format!(
            "{:>8} {:<16} {:<36} {:<12} {:>8} {:>9} {:>8}  {}\n",
            r.row_id,
            r.queue,
            r.job_id.as_str(),
            r.status.as_str(),
            r.age.as_secs(),
            r.publish_attempts,
            r.job_attempts
                .map(|a| a.to_string())
                .unwrap_or_else(|| "-".into()),
            r.publish_error
                .as_deref()
                .or(r.job_error.as_deref())
                .unwrap_or("")
        ));
    }
    out
}
