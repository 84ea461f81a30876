//! `check`: the invariant checker (`Admin::check`) per queue, as text or
//! JSON; `--repair` mends what can be mended. Exit 1 when anything was found,
//! and when no queue was found: a wrong URL or database checks nothing, and
//! a gate in CI or cron must not read that as clean (name the queues with
//! `--queue` to check queues that hold nothing yet).

use std::process::ExitCode;

use queue_core::admin::{Admin, CheckReport};

use crate::cli::CheckArgs;
use crate::error::Result;
use crate::format::printable;

pub async fn check(url: &str, args: CheckArgs) -> Result<ExitCode> {
    let admin = Admin::connect(url).await?;
    let mut reports = Vec::new();
    for q in admin.queues_or_discover(&args.selection.queues).await? {
        reports.push(admin.check(&q, args.repair).await?);
    }
    if args.json {
        println!("{}", super::to_json(&reports)?);
    } else if reports.is_empty() {
        eprintln!(
            "no queue found, nothing checked (wrong URL or database? nothing enqueued yet?); \
             name queues with --queue"
        );
    } else {
        print!("{}", text(&reports));
    }
    Ok(
        if !reports.is_empty() && reports.iter().all(CheckReport::is_clean) {
            ExitCode::SUCCESS
        } else {
            ExitCode::from(1)
        },
    )
}

/// One block per queue: a summary line, each violation, each repair.
fn text(reports: &[CheckReport]) -> String {
    let mut out = String::new();
    for r in reports {
        let s = &r.scanned;
        out.push_str(&format!(
            "{}: {} violation(s); read main={} processing={} delayed={} dead={} leases={} job_keys={} probed={}{}\n",
            r.queue,
            r.violations.len(),
            s.main,
            s.processing,
            s.delayed,
            s.dead,
            s.leases,
            s.job_keys,
            s.probed,
            if r.truncated { " (truncated: too many suspicious ids, run again)" } else { "" }
        ));
        for v in &r.violations {
            // Job ids, groups and corrupt values are data: escaped.
            out.push_str(&format!(
                "{}: {}: {}\n",
                r.queue,
                v.kind(),
                printable(&v.to_string())
            ));
        }
        if r.relay_dead_notices > 0 {
            out.push_str(&format!(
                "{}: relay_dead: {} cross-queue batch notice(s) could not be applied (q:{{{}}}:relay:dead; list: queue-watchdog relay dead -q {}; once repaired: relay retry-dead; docs/WORKFLOWS.md, \"Relay\")\n",
                r.queue, r.relay_dead_notices, r.queue, r.queue
            ));
        }
        for rep in &r.repairs {
            let what = match (&rep.id, &rep.group) {
                (Some(id), _) => printable(id.as_str()).into_owned(),
                (None, Some(group)) => format!("group {}", printable(group)),
                (None, None) => String::new(),
            };
            match &rep.detail {
                Some(why) => out.push_str(&format!(
                    "{}: repair of {what} refused: {}\n",
                    r.queue,
                    printable(why)
                )),
                None => out.push_str(&format!("{}: repaired {what}: {:?}\n", r.queue, rep.action)),
            }
        }
    }
    out
}
