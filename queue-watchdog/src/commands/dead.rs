//! `dead list | replay | purge`: one function per subcommand. Each fetches
//! or acts through `queue_core::admin` and hands what it got to a formatting
//! function; replay and purge report each job as it is done (an interrupted
//! run has still said what it changed).

use std::io::{BufRead, IsTerminal, Write};
use std::process::ExitCode;

use queue_core::admin::{Admin, DeadCandidate, DeadLetters, Page, PurgeOutcome, ReplayOutcome};
use serde_json::json;

use crate::cli::{DeadCommand, DeadListArgs, DeadPurgeArgs, DeadReplayArgs};
use crate::error::{CliError, Result};
use crate::format::{fmt_rel, fmt_ts};
use crate::views::job_json;

pub async fn dead(url: &str, cmd: DeadCommand) -> Result<ExitCode> {
    let admin = Admin::connect(url).await?;
    match cmd {
        DeadCommand::List(args) => list(&admin, args).await,
        DeadCommand::Replay(args) => replay(&admin, args).await,
        DeadCommand::Purge(args) => purge(&admin, args).await,
    }
}

/// Exit 0 when nothing was left over, else 1.
fn exit_code(clean: bool) -> ExitCode {
    if clean {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}

// ---- list ----

async fn list(admin: &Admin, args: DeadListArgs) -> Result<ExitCode> {
    let page = Page::new(args.offset, args.limit);
    let dead = admin
        .dead_letters(&args.queue, args.filter.as_deref(), page)
        .await?;
    if args.json {
        let jobs: Vec<_> = dead.jobs.iter().map(job_json).collect();
        println!("{}", serde_json::Value::Array(jobs));
    } else {
        let now = admin.server_time_ms().await?;
        print!("{}", list_lines(&dead, now));
        eprintln!("{}", list_summary(&dead, args.filter.as_deref()));
    }
    Ok(ExitCode::SUCCESS)
}

fn list_lines(dead: &DeadLetters, now: i64) -> String {
    let mut out = String::new();
    for j in &dead.jobs {
        let died = j
            .field("dead_at")
            .and_then(queue_core::admin::parse_ms)
            .map(|t| format!("{} ({})", fmt_ts(t), fmt_rel(t, now)))
            .unwrap_or_else(|| "?".into());
        out.push_str(&format!(
            "{}\ttype={}\tattempts={}\tdied={}\treason={}\n",
            j.id,
            j.field("type").unwrap_or("?"),
            j.attempts(),
            died,
            j.field("dead_reason").unwrap_or("?")
        ));
    }
    out
}

fn list_summary(dead: &DeadLetters, filter: Option<&str>) -> String {
    format!(
        "{} dead-lettered job(s) shown of {}{}",
        dead.jobs.len(),
        dead.total,
        filter
            .map(|f| format!(" (filter {f:?})"))
            .unwrap_or_default()
    )
}

// ---- replay ----

/// Ids a replay or purge acted on, by result.
#[derive(Default)]
struct Tally {
    done: Vec<String>,
    changed: Vec<String>,
    missing: Vec<String>,
}

fn describe(p: &DeadCandidate) -> String {
    format!(
        "type={} reason={}",
        p.job_type.as_deref().unwrap_or("?"),
        p.reason.as_deref().unwrap_or("?")
    )
}

fn not_dead(tally: &mut Tally, p: &DeadCandidate) {
    eprintln!("not in the dead-letter list: {}", p.id);
    tally.missing.push(p.id.to_string());
}

/// What a replay did (or would do) with one picked job.
enum ReplayStep {
    WouldReplay,
    Replayed,
    NotDead,
}

async fn replay(admin: &Admin, args: DeadReplayArgs) -> Result<ExitCode> {
    let picked = admin
        .select_dead(&args.queue, &args.target.selection())
        .await?;
    let mut tally = Tally::default();
    for p in &picked {
        let step = if !p.is_dead {
            ReplayStep::NotDead
        } else if args.dry_run {
            ReplayStep::WouldReplay
        } else {
            match admin
                .replay_dead(&args.queue, &p.id, args.reset_attempts)
                .await?
            {
                ReplayOutcome::Replayed => ReplayStep::Replayed,
                ReplayOutcome::NotDead => ReplayStep::NotDead,
            }
        };
        report_replay(&mut tally, p, step, args.json);
    }
    if args.json {
        println!(
            "{}",
            json!({"queue": args.queue, "dry_run": args.dry_run, "replayed": tally.done,
                   "not_found": tally.missing})
        );
    }
    eprintln!("{}", replay_summary(&tally, args.dry_run));
    Ok(exit_code(tally.missing.is_empty()))
}

fn report_replay(tally: &mut Tally, p: &DeadCandidate, step: ReplayStep, json: bool) {
    let line = match step {
        ReplayStep::NotDead => return not_dead(tally, p),
        ReplayStep::WouldReplay => format!("would replay {} ({})", p.id, describe(p)),
        ReplayStep::Replayed => format!("replayed {}", p.id),
    };
    if !json {
        println!("{line}");
    }
    tally.done.push(p.id.to_string());
}

fn replay_summary(tally: &Tally, dry_run: bool) -> String {
    format!(
        "{} {} job(s){}",
        if dry_run { "would replay" } else { "replayed" },
        tally.done.len(),
        if tally.missing.is_empty() {
            String::new()
        } else {
            format!(", {} not found", tally.missing.len())
        }
    )
}

// ---- purge ----

async fn purge(admin: &Admin, args: DeadPurgeArgs) -> Result<ExitCode> {
    let picked = admin
        .select_dead(&args.queue, &args.target.selection())
        .await?;
    let mut tally = Tally::default();
    let mut todo = Vec::new();
    for p in &picked {
        if p.is_dead {
            todo.push(p);
        } else {
            not_dead(&mut tally, p);
        }
    }
    if args.dry_run || todo.is_empty() {
        return Ok(purge_preview(&args, &todo, &tally));
    }
    if !args.yes && !confirm(&args.queue, todo.len())? {
        return Ok(ExitCode::from(1));
    }
    for p in todo {
        let outcome = admin
            .purge_dead(&args.queue, &p.id, p.dead_at.as_deref())
            .await?;
        report_purge(&mut tally, p, outcome, args.json);
    }
    if args.json {
        println!(
            "{}",
            json!({"queue": args.queue, "dry_run": false, "purged": tally.done,
                   "changed": tally.changed, "not_found": tally.missing})
        );
    }
    eprintln!("purged {} job(s)", tally.done.len());
    Ok(exit_code(
        tally.missing.is_empty() && tally.changed.is_empty(),
    ))
}

/// `--dry-run` (or nothing to purge): what would be purged.
fn purge_preview(args: &DeadPurgeArgs, todo: &[&DeadCandidate], tally: &Tally) -> ExitCode {
    if args.json {
        let ids: Vec<String> = todo.iter().map(|p| p.id.to_string()).collect();
        println!(
            "{}",
            json!({"queue": args.queue, "dry_run": true, "purged": ids, "not_found": tally.missing})
        );
    } else {
        for p in todo {
            println!("would purge {} ({})", p.id, describe(p));
        }
    }
    eprintln!("would purge {} job(s)", todo.len());
    exit_code(tally.missing.is_empty())
}

fn report_purge(tally: &mut Tally, p: &DeadCandidate, outcome: PurgeOutcome, json: bool) {
    let id = p.id.to_string();
    match outcome {
        PurgeOutcome::Purged => {
            if !json {
                println!("purged {id}");
            }
            tally.done.push(id);
        }
        PurgeOutcome::Changed => {
            eprintln!("left alone {id}: replayed and dead-lettered again since it was listed");
            tally.changed.push(id);
        }
        PurgeOutcome::NotDead => {
            eprintln!("not in the dead-letter list any more: {id}");
            tally.missing.push(id);
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
