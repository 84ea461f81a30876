//! What each subcommand does.

use std::io::{BufRead, IsTerminal, Write};
use std::process::ExitCode;
use std::time::Duration;

use queue_core::{Backoff, JobInfo, Queue, Watchdog, WatchdogConfig};
use serde_json::json;

use crate::cli::{Cli, Command, DeadCommand, DoctorArgs, JobsCommand, RunArgs, StatsArgs};
use crate::deadletters::{self, Picked, PurgeOutcome};
use crate::error::{CliError, Result};
use crate::inspect::{self, display_field, JobDetail, QueueHealth};
use crate::util::{fmt_dur, fmt_rel, fmt_ts};

pub async fn dispatch(cli: Cli) -> Result<ExitCode> {
    match cli.command {
        Command::Run(args) => run(&cli.redis, args).await,
        Command::Stats(args) => stats(&cli.redis, args).await,
        Command::Jobs(JobsCommand::Show {
            id,
            selection,
            json,
        }) => show_job(&cli.redis, &id, &selection.queues, json).await,
        Command::Dead(cmd) => dead(&cli.redis, cmd).await,
        Command::Doctor(args) => doctor(&cli.redis, args).await,
        Command::Dashboard(args) => {
            crate::dashboard::serve(&cli.redis, args).await?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Outbox(cmd) => crate::outbox::dispatch(&cli.redis, cmd).await,
    }
}

async fn run(url: &str, args: RunArgs) -> Result<ExitCode> {
    if let Some(addr) = args.metrics_listen {
        crate::metrics_export::serve(addr)?;
        tracing::info!(%addr, "serving Prometheus metrics at http://{addr}/metrics");
    }
    let config = WatchdogConfig {
        interval: Duration::from_millis(args.interval_ms),
        orphan_grace: Duration::from_millis(args.orphan_grace_ms),
        batch: args.batch,
        backoff: Backoff {
            base: Duration::from_millis(args.backoff_base_ms),
            max: Duration::from_millis(args.backoff_max_ms),
        },
        // The gauges cost one stats script per queue and pass: only when exported.
        publish_gauges: args.metrics_listen.is_some(),
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

/// Completes on SIGTERM or ctrl-c.
pub async fn termination() {
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

async fn stats(url: &str, args: StatsArgs) -> Result<ExitCode> {
    let queue = Queue::connect(url).await?;
    let names = inspect::resolve_queues(&queue, &args.selection.queues).await?;
    let mut all = Vec::new();
    for q in &names {
        all.push(inspect::health(&queue, q).await?);
    }
    if args.json {
        println!(
            "{}",
            serde_json::to_string(&all).map_err(|e| CliError::Other(e.to_string()))?
        );
        return Ok(ExitCode::SUCCESS);
    }
    if all.is_empty() {
        eprintln!("no queue found (nothing enqueued yet?); name queues with --queue");
        return Ok(ExitCode::SUCCESS);
    }
    let width = all.iter().map(|s| s.queue.len()).max().unwrap_or(5).max(5);
    println!(
        "{:<width$} {:>8} {:>9} {:>10} {:>5} {:>8} {:>6} {:>8} {:>8} {:>13} {:>8} {:>9}",
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
    for s in &all {
        println!(
            "{:<width$} {:>8} {:>9} {:>10} {:>5} {:>8} {:>6} {:>8} {:>8} {:>13} {:>8} {:>9}",
            s.queue,
            s.main,
            s.oldest_waiting_ms
                .map(fmt_dur)
                .unwrap_or_else(|| "-".into()),
            s.processing,
            s.expired_leases,
            s.delayed,
            s.dead,
            s.completed_last_minute,
            s.counter("retried"),
            s.counter("dead"),
            s.counter("failed"),
            s.counter("reclaimed")
        );
    }
    for s in &all {
        for line in diagnose(s) {
            println!("{}: {line}", s.queue);
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// Plain-words notes on lost and slow jobs.
fn diagnose(s: &QueueHealth) -> Vec<String> {
    let mut out = Vec::new();
    if s.expired_leases > 0 {
        out.push(format!(
            "{} job(s) LOST in processing: lease expired (worker died or stalled). A running watchdog returns them within one pass; if this number stays, start `queue-watchdog run -q {}`.",
            s.expired_leases, s.queue
        ));
    }
    if s.unleased > 0 {
        out.push(format!(
            "{} job(s) in processing without a lease (taken, not claimed yet): the watchdog adopts and returns them after the orphan grace.",
            s.unleased
        ));
    }
    if let Some(ms) = s.next_delayed_in_ms.filter(|ms| *ms < -10_000) {
        out.push(format!(
            "{} delayed job(s) overdue by up to {}: no worker or watchdog is promoting them.",
            s.delayed_due,
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

async fn show_job(url: &str, id: &str, named: &[String], json: bool) -> Result<ExitCode> {
    let queue = Queue::connect(url).await?;
    let names = inspect::resolve_queues(&queue, named).await?;
    let mut found = Vec::new();
    for q in &names {
        if let Some(d) = inspect::job_detail(&queue, q, id).await? {
            found.push(d);
        }
    }
    if json {
        let v = match found.len() {
            0 => json!({"id": id, "found": false, "queues_searched": names}),
            1 => serde_json::to_value(&found[0]).map_err(|e| CliError::Other(e.to_string()))?,
            _ => serde_json::to_value(&found).map_err(|e| CliError::Other(e.to_string()))?,
        };
        println!("{v}");
    } else if found.is_empty() {
        eprintln!(
            "no job {id:?} in {} (never enqueued, purged, or completed longer ago than the retention)",
            if names.is_empty() {
                "any queue".to_string()
            } else {
                format!("queue(s) {}", names.join(", "))
            }
        );
    } else {
        for d in &found {
            print!("{}", render_job(d));
        }
    }
    Ok(if found.is_empty() {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    })
}

fn render_job(d: &JobDetail) -> String {
    let f = |k: &str| d.fields.get(k).map(String::as_str).unwrap_or("?");
    let mut s = format!("job {} (queue {})\n", d.id, d.queue);
    s.push_str(&format!("  where     {}\n", d.location.describe()));
    if !d.fields.is_empty() {
        s.push_str(&format!("  state     {}\n", f("state")));
        s.push_str(&format!("  type      {} (v{})\n", f("type"), f("v")));
        s.push_str(&format!(
            "  attempts  {} of {}\n",
            f("attempts"),
            f("max_attempts")
        ));
    }
    s.push_str("history (the hash keeps the latest time of each kind of event)\n");
    for e in &d.history {
        s.push_str(&format!(
            "  {}  {:<12} {:<14} {}\n",
            e.at_text,
            format!("({})", fmt_rel(e.at, d.now_ms)),
            e.event,
            e.detail
        ));
    }
    if !d.fields.is_empty() {
        s.push_str("fields\n");
        let w = d.fields.keys().map(String::len).max().unwrap_or(0);
        for (k, v) in &d.fields {
            s.push_str(&format!("  {k:<w$}  {}\n", display_field(k, v)));
        }
        s.push_str(&format!(
            "payload ({} bytes of MessagePack)\n  {}\n",
            d.payload_bytes, d.payload
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
        s.push_str(&format!("steps: {}\n", d.steps.join(", ")));
    }
    s
}

fn job_json(j: &JobInfo) -> serde_json::Value {
    json!({"id": j.id.as_str(), "fields": j.fields, "payload": crate::util::payload_json(&j.payload),
           "payload_bytes": j.payload.len()})
}

fn describe_picked(p: &Picked) -> String {
    format!(
        "type={} reason={}",
        p.job_type.as_deref().unwrap_or("?"),
        p.reason.as_deref().unwrap_or("?")
    )
}

async fn dead(url: &str, cmd: DeadCommand) -> Result<ExitCode> {
    let queue = Queue::connect(url).await?;
    match cmd {
        DeadCommand::List {
            queue: q,
            limit,
            offset,
            filter,
            json,
        } => {
            let (total, jobs) =
                inspect::dead_letters(&queue, &q, filter.as_deref(), offset, limit).await?;
            if json {
                println!(
                    "{}",
                    serde_json::Value::Array(jobs.iter().map(job_json).collect())
                );
            } else {
                let now = server_now(&queue).await?;
                for j in &jobs {
                    let died = j
                        .field("dead_at")
                        .and_then(inspect::parse_ms)
                        .map(|t| format!("{} ({})", fmt_ts(t), fmt_rel(t, now)))
                        .unwrap_or_else(|| "?".into());
                    println!(
                        "{}\ttype={}\tattempts={}\tdied={}\treason={}",
                        j.id,
                        j.field("type").unwrap_or("?"),
                        j.attempts(),
                        died,
                        j.field("dead_reason").unwrap_or("?")
                    );
                }
                eprintln!(
                    "{} dead-lettered job(s) shown of {total}{}",
                    jobs.len(),
                    filter
                        .map(|f| format!(" (filter {f:?})"))
                        .unwrap_or_default()
                );
            }
            Ok(ExitCode::SUCCESS)
        }
        DeadCommand::Replay {
            queue: q,
            target,
            reset_attempts,
            dry_run,
            json,
        } => {
            let picked = deadletters::pick(&queue, &q, &target).await?;
            let (mut done, mut missing) = (Vec::new(), Vec::new());
            for p in &picked {
                if !p.dead {
                    eprintln!("not in the dead-letter list: {}", p.id);
                    missing.push(p.id.clone());
                    continue;
                }
                if dry_run {
                    if !json {
                        println!("would replay {} ({})", p.id, describe_picked(p));
                    }
                    done.push(p.id.clone());
                    continue;
                }
                if queue.replay_dead(&q, p.id.as_str(), reset_attempts).await? {
                    if !json {
                        println!("replayed {}", p.id);
                    }
                    done.push(p.id.clone());
                } else {
                    eprintln!("not in the dead-letter list: {}", p.id);
                    missing.push(p.id.clone());
                }
            }
            if json {
                println!(
                    "{}",
                    json!({"queue": q, "dry_run": dry_run, "replayed": done, "not_found": missing})
                );
            }
            eprintln!(
                "{} {} job(s){}",
                if dry_run { "would replay" } else { "replayed" },
                done.len(),
                if missing.is_empty() {
                    String::new()
                } else {
                    format!(", {} not found", missing.len())
                }
            );
            Ok(if missing.is_empty() {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(1)
            })
        }
        DeadCommand::Purge {
            queue: q,
            target,
            dry_run,
            yes,
            json,
        } => {
            let picked = deadletters::pick(&queue, &q, &target).await?;
            let mut missing: Vec<String> = Vec::new();
            let mut todo: Vec<&Picked> = Vec::new();
            for p in &picked {
                if p.dead {
                    todo.push(p);
                } else {
                    eprintln!("not in the dead-letter list: {}", p.id);
                    missing.push(p.id.clone());
                }
            }
            if dry_run || todo.is_empty() {
                for p in &todo {
                    if !json {
                        println!("would purge {} ({})", p.id, describe_picked(p));
                    }
                }
                if json {
                    println!(
                        "{}",
                        json!({"queue": q, "dry_run": true, "purged": todo.iter().map(|p| &p.id).collect::<Vec<_>>(), "not_found": missing})
                    );
                }
                eprintln!("would purge {} job(s)", todo.len());
                return Ok(if missing.is_empty() {
                    ExitCode::SUCCESS
                } else {
                    ExitCode::from(1)
                });
            }
            if !yes && !confirm(&q, todo.len())? {
                return Ok(ExitCode::from(1));
            }
            let (mut purged, mut changed) = (Vec::new(), Vec::new());
            for p in todo {
                match deadletters::purge(&queue, &q, &p.id, p.dead_at.as_deref()).await? {
                    PurgeOutcome::Purged => {
                        if !json {
                            println!("purged {}", p.id);
                        }
                        purged.push(p.id.clone());
                    }
                    PurgeOutcome::Changed => {
                        eprintln!(
                            "left alone {}: replayed and dead-lettered again since it was listed",
                            p.id
                        );
                        changed.push(p.id.clone());
                    }
                    PurgeOutcome::NotDead => {
                        eprintln!("not in the dead-letter list any more: {}", p.id);
                        missing.push(p.id.clone());
                    }
                }
            }
            if json {
                println!(
                    "{}",
                    json!({"queue": q, "dry_run": false, "purged": purged, "changed": changed, "not_found": missing})
                );
            }
            eprintln!("purged {} job(s)", purged.len());
            Ok(if missing.is_empty() && changed.is_empty() {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(1)
            })
        }
    }
}

/// Asks on the terminal; refuses when stdin is not one.
fn confirm(queue: &str, n: usize) -> Result<bool> {
    if !std::io::stdin().is_terminal() {
        eprintln!(
            "refusing to purge {n} job(s) without confirmation: stdin is not a terminal. Pass --yes (or --dry-run to see them)."
        );
        return Ok(false);
    }
    eprint!(
        "Purge {n} dead-lettered job(s) of queue {queue:?} for good? They cannot be replayed afterwards. Type 'yes' to continue: "
    );
    let _ = std::io::stderr().flush();
    let mut answer = String::new();
    std::io::stdin()
        .lock()
        .read_line(&mut answer)
        .map_err(|e| CliError::Other(format!("reading the answer: {e}")))?;
    let ok = matches!(answer.trim().to_ascii_lowercase().as_str(), "yes" | "y");
    if !ok {
        eprintln!("aborted: nothing purged");
    }
    Ok(ok)
}

async fn server_now(queue: &Queue) -> Result<i64> {
    let (s, us): (i64, i64) = redis::cmd("TIME")
        .query_async(&mut queue.connection())
        .await
        .map_err(CliError::redis("TIME"))?;
    Ok(s * 1000 + us / 1000)
}

async fn doctor(url: &str, args: DoctorArgs) -> Result<ExitCode> {
    let facts = crate::doctor::gather(url, args.scan_limit).await?;
    let findings = crate::doctor::analyze(
        &facts,
        crate::doctor::Options {
            strict: args.strict,
            max_lag_secs: args.max_lag_secs,
        },
    );
    let safe = crate::doctor::is_safe(&findings);
    if args.json {
        println!(
            "{}",
            json!({"safe": safe, "strict": args.strict, "redis_version": facts.info.get("redis_version"),
                   "role": facts.info.get("role"), "queue_keys_checked": facts.scanned,
                   "findings": findings})
        );
    } else {
        print!(
            "{}",
            crate::doctor::render(&findings, &facts, url, args.strict)
        );
    }
    Ok(if safe {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}
