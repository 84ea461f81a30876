//! `queue-watchdog outbox …`: the PostgreSQL outbox relay and reconciliation.

use std::process::ExitCode;
use std::time::Duration;

use queue_core::Queue;
use queue_outbox::{connect_postgres, Outbox, ReconcileOptions, Relay};
use serde_json::json;

use crate::cli::OutboxCommand;
use crate::error::Result;

pub async fn dispatch(redis_url: &str, cmd: OutboxCommand) -> Result<ExitCode> {
    match cmd {
        OutboxCommand::Migrate { target } => {
            let outbox = Outbox::with_table(&target.table)?;
            outbox
                .migrate(&connect_postgres(&target.database_url).await?)
                .await?;
            println!("outbox table `{}` is ready", outbox.table());
            Ok(ExitCode::SUCCESS)
        }
        OutboxCommand::Relay {
            target,
            batch,
            interval_ms,
            once,
            migrate,
            wait_replicas,
            wait_timeout_ms,
        } => {
            let outbox = Outbox::with_table(&target.table)?;
            let queue = Queue::connect(redis_url).await?;
            if migrate {
                outbox
                    .migrate(&connect_postgres(&target.database_url).await?)
                    .await?;
            }
            let mut relay = Relay::connect(outbox, &target.database_url, queue)
                .await?
                .batch_size(batch);
            if let Some(n) = wait_replicas {
                relay = relay.wait_for_replicas(n, Duration::from_millis(wait_timeout_ms));
            }
            if once {
                let r = relay.publish_batch(batch).await?;
                println!(
                    "selected={} published={} duplicates={} failed={} rejected={}",
                    r.selected, r.published, r.duplicates, r.failed, r.rejected
                );
                if let Some(e) = &r.error {
                    eprintln!("error: {e}");
                }
                return Ok(if r.failed > 0 {
                    ExitCode::from(1)
                } else {
                    ExitCode::SUCCESS
                });
            }
            let s = relay
                .run_until(
                    crate::commands::termination(),
                    Duration::from_millis(interval_ms),
                )
                .await?;
            println!(
                "batches={} published={} duplicates={} failed={} rejected={} errors={}",
                s.batches, s.published, s.duplicates, s.failed, s.rejected, s.errors
            );
            Ok(ExitCode::SUCCESS)
        }
        OutboxCommand::Reconcile {
            target,
            older_than_secs,
            max_age_secs,
            limit,
            json,
        } => {
            let client = connect_postgres(&target.database_url).await?;
            let queue = Queue::connect(redis_url).await?;
            let mut opts = ReconcileOptions::new(Duration::from_secs(older_than_secs)).limit(limit);
            if let Some(m) = max_age_secs {
                opts = opts.max_age(Duration::from_secs(m));
            }
            let rows = Outbox::with_table(&target.table)?
                .reconcile_with(&client, &queue, &opts)
                .await?;
            if json {
                let out: Vec<_> = rows
                    .iter()
                    .map(|r| {
                        json!({
                            "row_id": r.row_id, "queue": r.queue, "job_id": r.job_id.as_str(),
                            "job_type": r.job_type, "status": r.status.as_str(),
                            "age_secs": r.age.as_secs(), "published": r.published_at.is_some(),
                            "publish_attempts": r.publish_attempts, "publish_error": r.publish_error,
                            "job_attempts": r.job_attempts, "job_error": r.job_error,
                        })
                    })
                    .collect();
                println!("{}", serde_json::Value::Array(out));
            } else {
                println!(
                    "{:>8} {:<16} {:<36} {:<12} {:>8} {:>9} {:>8}  error",
                    "row", "queue", "job id", "status", "age s", "publishes", "attempts"
                );
                for r in &rows {
                    println!(
                        "{:>8} {:<16} {:<36} {:<12} {:>8} {:>9} {:>8}  {}",
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
                    );
                }
                eprintln!("{} outbox row(s) without a completed job", rows.len());
            }
            Ok(if rows.is_empty() {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(1)
            })
        }
    }
}
