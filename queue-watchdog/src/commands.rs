//! What each subcommand does.

use std::process::ExitCode;
use std::time::Duration;

use queue_core::{Backoff, JobInfo, Queue, QueueError, Watchdog, WatchdogConfig};
use serde_json::json;

use crate::cli::{Cli, Command, DeadCommand, RunArgs};

pub async fn dispatch(cli: Cli) -> Result<ExitCode, QueueError> {
    match cli.command {
        Command::Run(args) => run(&cli.redis, args).await,
        Command::Stats(args) => {
            let queue = Queue::connect(&cli.redis).await?;
            let mut all = Vec::new();
            for q in &args.queues {
                all.push(queue.stats(q).await?);
            }
            if args.json {
                let rows: Vec<_> = all
                    .iter()
                    .map(|s| {
                        json!({"queue": s.queue, "main": s.main, "processing": s.processing,
                               "delayed": s.delayed, "dead": s.dead, "counters": s.counters})
                    })
                    .collect();
                println!("{}", serde_json::Value::Array(rows));
            } else {
                println!(
                    "{:<20} {:>8} {:>10} {:>8} {:>6} {:>10} {:>10} {:>8} {:>9}",
                    "queue", "main", "processing", "delayed", "dead", "enqueued", "completed", "retried", "reclaimed"
                );
                for s in &all {
                    println!(
                        "{:<20} {:>8} {:>10} {:>8} {:>6} {:>10} {:>10} {:>8} {:>9}",
                        s.queue,
                        s.main,
                        s.processing,
                        s.delayed,
                        s.dead,
                        s.counter("enqueued"),
                        s.counter("completed"),
                        s.counter("retried"),
                        s.counter("reclaimed")
                    );
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Dead(cmd) => dead(&cli.redis, cmd).await,
    }
}

async fn run(url: &str, args: RunArgs) -> Result<ExitCode, QueueError> {
    let config = WatchdogConfig {
        interval: Duration::from_millis(args.interval_ms),
        orphan_grace: Duration::from_millis(args.orphan_grace_ms),
        batch: args.batch,
        backoff: Backoff {
            base: Duration::from_millis(args.backoff_base_ms),
            max: Duration::from_millis(args.backoff_max_ms),
        },
        ..WatchdogConfig::default()
    };
    let watchdog = Watchdog::connect(url, &args.queues, config).await?;
    if args.once {
        let r = watchdog.run_once().await?;
        println!(
            "reclaimed={} dead_lettered={} adopted={} promoted={}",
            r.reclaimed, r.dead_lettered, r.adopted, r.promoted
        );
        return Ok(ExitCode::SUCCESS);
    }
    watchdog.run_until(termination()).await;
    Ok(ExitCode::SUCCESS)
}

async fn termination() {
    use tokio::signal::unix::{signal, SignalKind};
    match signal(SignalKind::terminate()) {
        Ok(mut term) => {
            tokio::select! {
                _ = term.recv() => {}
                _ = tokio::signal::ctrl_c() => {}
            }
        }
        Err(_) => {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}

fn job_json(j: &JobInfo) -> serde_json::Value {
    json!({"id": j.id.as_str(), "fields": j.fields, "payload_bytes": j.payload.len()})
}

async fn dead(url: &str, cmd: DeadCommand) -> Result<ExitCode, QueueError> {
    let queue = Queue::connect(url).await?;
    match cmd {
        DeadCommand::List { queue: q, limit, json } => {
            let jobs = queue.dead_letters(&q, 0, limit).await?;
            if json {
                println!("{}", serde_json::Value::Array(jobs.iter().map(job_json).collect()));
            } else {
                for j in &jobs {
                    println!(
                        "{}\ttype={}\tattempts={}\treason={}",
                        j.id,
                        j.field("type").unwrap_or("?"),
                        j.attempts(),
                        j.field("dead_reason").unwrap_or("?")
                    );
                }
                eprintln!("{} dead-lettered job(s) shown", jobs.len());
            }
            Ok(ExitCode::SUCCESS)
        }
        DeadCommand::Replay { queue: q, ids, all, reset_attempts, dry_run } => {
            let ids: Vec<String> = if all {
                let total = queue.stats(&q).await?.dead;
                queue.dead_letters(&q, 0, total).await?.into_iter().map(|j| j.id.to_string()).collect()
            } else {
                ids
            };
            let (mut replayed, mut missing) = (0u64, 0u64);
            for id in &ids {
                if dry_run {
                    println!("would replay {id}");
                    continue;
                }
                if queue.replay_dead(&q, id.as_str(), reset_attempts).await? {
                    println!("replayed {id}");
                    replayed += 1;
                } else {
                    eprintln!("not in the dead-letter list: {id}");
                    missing += 1;
                }
            }
            eprintln!(
                "{} {} job(s){}",
                if dry_run { "would replay" } else { "replayed" },
                if dry_run { ids.len() as u64 } else { replayed },
                if missing > 0 { format!(", {missing} not found") } else { String::new() }
            );
            Ok(if missing > 0 { ExitCode::from(1) } else { ExitCode::SUCCESS })
        }
    }
}
