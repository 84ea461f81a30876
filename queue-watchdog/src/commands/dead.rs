//! `dead list | replay | purge`: one function per subcommand. Each fetches
//! or acts through `queue_core::admin` and hands what it got to a formatting
//! function; replay and purge report each job as it is done (an interrupted
//! run has still said what it changed). A replay by filter or `--all` reads
//! and acts on the dead-letter list one chunk at a time
//! (`Admin::select_dead_chunk`, no payloads), each entry replayed only while
//! it is the dead-lettering the chunk read (its `dead_at`: a job replayed and
//! dead-lettered again since is left alone and reported, as a purge leaves
//! it); an entry whose job key cannot be read is skipped and reported, never
//! the end of the run.

use std::io::{BufRead, IsTerminal, Write};
use std::process::ExitCode;

use std::collections::HashSet;

use queue_core::admin::{
    Admin, DeadCandidate, DeadLetters, DeadSelection, Page, PurgeOutcome, ReplayOutcome,
};
use serde_json::json;

use crate::cli::{DeadCommand, DeadListArgs, DeadPurgeArgs, DeadReplayArgs};
use crate::error::{CliError, Result};
use crate::format::{fmt_rel, fmt_ts, printable};
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
            printable(j.id.as_str()),
            printable(j.field("type").unwrap_or("?")),
            j.attempts(),
            died,
            printable(
                j.field("dead_reason")
                    .or(j.field("unreadable"))
                    .unwrap_or("?")
            )
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
    /// Entries whose job key cannot be read (corrupt data): skipped.
    unreadable: Vec<String>,
    /// The job whose replay or purge call is on its way: in doubt when that
    /// call fails (its reply lost, it may have run).
    current: Option<String>,
}

impl Tally {
    /// Nothing was left over (not found, changed meanwhile, unreadable).
    fn clean(&self) -> bool {
        self.missing.is_empty() && self.changed.is_empty() && self.unreadable.is_empty()
    }
}

fn describe(p: &DeadCandidate) -> String {
    format!(
        "type={} reason={}",
        printable(p.job_type.as_deref().unwrap_or("?")),
        printable(p.reason.as_deref().unwrap_or("?"))
    )
}

fn not_dead(tally: &mut Tally, p: &DeadCandidate) {
    eprintln!("not in the dead-letter list: {}", printable(p.id.as_str()));
    tally.missing.push(p.id.to_string());
}

/// A job replayed and dead-lettered again since it was listed: left alone.
fn changed(tally: &mut Tally, p: &DeadCandidate) {
    eprintln!(
        "left alone {}: replayed and dead-lettered again since it was listed",
        printable(p.id.as_str())
    );
    tally.changed.push(p.id.to_string());
}

/// An entry whose job key cannot be read: skipped, said why.
fn unreadable(tally: &mut Tally, p: &DeadCandidate, why: &str) {
    eprintln!("skipped {}: {}", printable(p.id.as_str()), printable(why));
    tally.unreadable.push(p.id.to_string());
}

/// What a replay did (or would do) with one picked job.
#[derive(Clone, PartialEq, Eq)]
enum ReplayStep {
    WouldReplay,
    Replayed,
    NotDead,
    /// Replayed and dead-lettered again since the chunk read it: left alone.
    Changed,
    /// Its job key cannot be read: skipped.
    Unreadable(String),
}

async fn replay(admin: &Admin, args: DeadReplayArgs) -> Result<ExitCode> {
    let mut tally = Tally::default();
    match replay_all(admin, &args, &mut tally).await {
        Ok(()) => Ok(replay_done(&args, &tally)),
        Err(e) => Err(stopped(
            &args.queue,
            "replayed",
            args.dry_run,
            args.json,
            &tally,
            e,
        )),
    }
}

/// A replay run, each job reported as it is done (`tally`).
async fn replay_all(admin: &Admin, args: &DeadReplayArgs, tally: &mut Tally) -> Result<()> {
    let filter = match args.target.selection() {
        DeadSelection::Ids(ids) => {
            let picked = admin
                .select_dead(&args.queue, &DeadSelection::Ids(ids))
                .await?;
            for p in &picked {
                replay_one(admin, args, tally, p, None).await?;
            }
            return Ok(());
        }
        DeadSelection::Matching(text) => Some(text),
        DeadSelection::All => None,
    };
    // One chunk of the list at a time: its entries replayed (each leaves
    // the list) before the next chunk is read, from where the chunk ended
    // less what left. An id seen twice (the list shifted under the run) is
    // taken once. Each is replayed only while it is the dead-lettering the
    // chunk read (its `dead_at`), not one that came after it.
    let (mut from, mut seen) = (0u64, HashSet::new());
    loop {
        let chunk = admin
            .select_dead_chunk(&args.queue, filter.as_deref(), from)
            .await?;
        let mut left = 0;
        for p in &chunk.candidates {
            if seen.insert(p.id.to_string())
                && replay_one(admin, args, tally, p, p.dead_at.as_deref()).await?
                    == ReplayStep::Replayed
            {
                left += 1;
            }
        }
        from = (from + chunk.read).saturating_sub(left);
        if chunk.read == 0 || from >= chunk.total.saturating_sub(left) {
            return Ok(());
        }
    }
}

/// Replays (or with `--dry-run` names) one picked job and reports it; with
/// `expected_dead_at`, only while it is still that dead-lettering.
async fn replay_one(
    admin: &Admin,
    args: &DeadReplayArgs,
    tally: &mut Tally,
    p: &DeadCandidate,
    expected_dead_at: Option<&str>,
) -> Result<ReplayStep> {
    let step = if let Some(why) = &p.unreadable {
        ReplayStep::Unreadable(why.clone())
    } else if !p.is_dead {
        ReplayStep::NotDead
    } else if args.dry_run {
        ReplayStep::WouldReplay
    } else {
        tally.current = Some(p.id.to_string());
        let outcome = admin
            .replay_dead_if_unchanged(&args.queue, &p.id, args.reset_attempts, expected_dead_at)
            .await?;
        tally.current = None;
        match outcome {
            ReplayOutcome::Replayed => ReplayStep::Replayed,
            ReplayOutcome::NotDead => ReplayStep::NotDead,
            ReplayOutcome::Changed => ReplayStep::Changed,
        }
    };
    report_replay(tally, p, step.clone(), args.json);
    Ok(step)
}

/// The summary of a replay run and its exit code.
fn replay_done(args: &DeadReplayArgs, tally: &Tally) -> ExitCode {
    if args.json {
        println!(
            "{}",
            json!({"queue": args.queue, "dry_run": args.dry_run, "replayed": tally.done,
                   "changed": tally.changed, "not_found": tally.missing,
                   "unreadable": tally.unreadable})
        );
    }
    eprintln!("{}", replay_summary(tally, args.dry_run));
    exit_code(tally.clean())
}

fn report_replay(tally: &mut Tally, p: &DeadCandidate, step: ReplayStep, json: bool) {
    let line = match step {
        ReplayStep::NotDead => return not_dead(tally, p),
        ReplayStep::Changed => return changed(tally, p),
        ReplayStep::Unreadable(why) => return unreadable(tally, p, &why),
        ReplayStep::WouldReplay => {
            format!(
                "would replay {} ({})",
                printable(p.id.as_str()),
                describe(p)
            )
        }
        ReplayStep::Replayed => format!("replayed {}", printable(p.id.as_str())),
    };
    if !json {
        println!("{line}");
    }
    tally.done.push(p.id.to_string());
}

fn replay_summary(tally: &Tally, dry_run: bool) -> String {
    format!(
        "{} {} job(s){}{}{}",
        if dry_run { "would replay" } else { "replayed" },
        tally.done.len(),
        if tally.changed.is_empty() {
            String::new()
        } else {
            format!(
                ", {} left alone (dead-lettered again since listed)",
                tally.changed.len()
            )
        },
        if tally.missing.is_empty() {
            String::new()
        } else {
            format!(", {} not found", tally.missing.len())
        },
        unreadable_note(tally)
    )
}

fn unreadable_note(tally: &Tally) -> String {
    if tally.unreadable.is_empty() {
        String::new()
    } else {
        format!(
            ", {} skipped (job key unreadable: see `check`)",
            tally.unreadable.len()
        )
    }
}

/// A replay or purge (`verb`: "replayed", "purged"; a replay's dry run
/// names only) stopped by `e` (Redis unreachable, a failover) part-way: what
/// it did is said before the error is returned, as the JSON summary with
/// `"error"` (`--json`: nothing else was printed) or a line on stderr (each
/// job's line was printed as it was done), with the job whose call was on
/// its way when it failed as `in_doubt` (its reply lost: it may have run).
/// Before, `--json` printed nothing at all: 25,000 purges done before a
/// failover were reported nowhere.
fn stopped(
    queue: &str,
    verb: &str,
    dry_run: bool,
    json: bool,
    tally: &Tally,
    e: CliError,
) -> CliError {
    if json {
        let mut summary = tally_json(queue, verb, dry_run, tally);
        let in_doubt: Vec<&String> = tally.current.iter().collect();
        summary["in_doubt"] = json!(in_doubt);
        summary["error"] = json!(e.to_string());
        println!("{summary}");
    }
    let doubt = match &tally.current {
        Some(id) => format!(
            "; {} in doubt (its call may have run: look it up with `jobs show`)",
            printable(id)
        ),
        None => String::new(),
    };
    let did = match dry_run {
        true => format!("named {} job(s) it would replay", tally.done.len()),
        false => format!("{verb} {} job(s)", tally.done.len()),
    };
    eprintln!(
        "stopped by an error after it {did}{}{doubt}",
        unreadable_note(tally)
    );
    e
}

/// The JSON summary of a replay or purge run (`verb`: its key for the jobs
/// done): what `dead purge --json` prints, and what a stopped run prints
/// before its error.
fn tally_json(queue: &str, verb: &str, dry_run: bool, tally: &Tally) -> serde_json::Value {
    json!({"queue": queue, "dry_run": dry_run, verb: tally.done,
           "changed": tally.changed, "not_found": tally.missing,
           "unreadable": tally.unreadable})
}

// ---- purge ----

async fn purge(admin: &Admin, args: DeadPurgeArgs) -> Result<ExitCode> {
    let picked = admin
        .select_dead(&args.queue, &args.target.selection())
        .await?;
    let mut tally = Tally::default();
    let mut todo = Vec::new();
    for p in &picked {
        if let Some(why) = &p.unreadable {
            unreadable(&mut tally, p, why);
        } else if p.is_dead {
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
        tally.current = Some(p.id.to_string());
        let outcome = match admin
            .purge_dead(&args.queue, &p.id, p.dead_at.as_deref())
            .await
        {
            Ok(outcome) => outcome,
            Err(e) => {
                return Err(stopped(
                    &args.queue,
                    "purged",
                    false,
                    args.json,
                    &tally,
                    e.into(),
                ))
            }
        };
        tally.current = None;
        report_purge(&mut tally, p, outcome, args.json);
    }
    if args.json {
        println!("{}", tally_json(&args.queue, "purged", false, &tally));
    }
    eprintln!(
        "purged {} job(s){}",
        tally.done.len(),
        unreadable_note(&tally)
    );
    Ok(exit_code(tally.clean()))
}

/// `--dry-run` (or nothing to purge): what would be purged.
fn purge_preview(args: &DeadPurgeArgs, todo: &[&DeadCandidate], tally: &Tally) -> ExitCode {
    if args.json {
        let ids: Vec<String> = todo.iter().map(|p| p.id.to_string()).collect();
        println!(
            "{}",
            json!({"queue": args.queue, "dry_run": true, "purged": ids, "not_found": tally.missing,
                   "unreadable": tally.unreadable})
        );
    } else {
        for p in todo {
            println!("would purge {} ({})", printable(p.id.as_str()), describe(p));
        }
    }
    eprintln!(
        "would purge {} job(s){}",
        todo.len(),
        unreadable_note(tally)
    );
    exit_code(tally.clean())
}

fn report_purge(tally: &mut Tally, p: &DeadCandidate, outcome: PurgeOutcome, json: bool) {
    let id = p.id.to_string();
    let shown = printable(&id);
    match outcome {
        PurgeOutcome::Purged => {
            if !json {
                println!("purged {shown}");
            }
            tally.done.push(id);
        }
        PurgeOutcome::Changed => changed(tally, p),
        PurgeOutcome::NotDead => {
            eprintln!("not in the dead-letter list any more: {shown}");
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

#[cfg(test)]
mod tests {
    use queue_testkit::RedisServer;

    use super::*;
    use crate::cli::DeadTarget;

    const SENT: (&str, &str) = ("send", "SMTP timeout");

    async fn dead_letter(admin: &Admin, id: &str, dead_at: &str) {
        crate::test_dead::dead_letter(admin, "emails", id, dead_at, SENT).await;
    }

    /// `dead replay --all` reads a chunk holding `x` (dead at 100); before
    /// its turn, someone replays `x`, which runs and is dead-lettered again
    /// (dead at 200). The run leaves `x` alone and reports it as changed
    /// (exit 1, as a purge does), not replayed. Before, the replay took no
    /// `dead_at`: the new dead-lettering, which the run never read, was
    /// replayed.
    #[tokio::test]
    async fn a_replay_by_filter_leaves_a_job_dead_lettered_again_since_its_chunk_was_read() {
        let server = RedisServer::start().unwrap();
        let admin = Admin::connect(&server.url()).await.unwrap();
        dead_letter(&admin, "x", "100").await;
        let chunk = admin.select_dead_chunk("emails", None, 0).await.unwrap();
        let [picked] = chunk.candidates.as_slice() else {
            panic!("{chunk:?}")
        };

        // Someone else's replay of `x`; it runs and dies again.
        crate::test_dead::replayed_and_dead_again(&admin, "emails", "x", "200", SENT).await;

        let args = DeadReplayArgs {
            queue: "emails".into(),
            target: DeadTarget {
                ids: Vec::new(),
                filter: None,
                all: true,
            },
            reset_attempts: false,
            dry_run: false,
            json: true,
        };
        let mut tally = Tally::default();
        let step = replay_one(&admin, &args, &mut tally, picked, picked.dead_at.as_deref())
            .await
            .unwrap();
        assert!(step == ReplayStep::Changed, "not left alone");
        assert_eq!(
            (tally.done.len(), tally.changed.as_slice()),
            (0, ["x".to_string()].as_slice())
        );
        assert!(!tally.clean(), "exit 1: something was left over");
        let job = admin.job("emails", "x").await.unwrap().unwrap();
        assert_eq!(
            (job.state(), job.field("dead_at")),
            (Some("dead"), Some("200"))
        );
    }
}
