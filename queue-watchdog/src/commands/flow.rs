//! `queue pause|resume` and `jobs cancel`: the flow-control actions
//! (docs/FLOW-CONTROL.md), as text or JSON.

use std::process::ExitCode;

use queue_core::admin::Admin;
use queue_core::CancelOutcome;
use serde_json::json;

use crate::cli::QueueFlowArgs;
use crate::error::{CliError, Result};
use crate::format::fmt_ts;

/// Pauses (`pause` true) or resumes the queue.
pub async fn pause(url: &str, args: QueueFlowArgs, pause: bool) -> Result<ExitCode> {
    let admin = Admin::connect(url).await?;
    let change = match (&args.group, pause) {
        (Some(g), true) => admin.pause_group(&args.queue, g).await?,
        (Some(g), false) => admin.resume_group(&args.queue, g).await?,
        (None, true) => admin.pause(&args.queue).await?,
        (None, false) => admin.resume(&args.queue).await?,
    };
    if args.json {
        println!("{}", super::to_json(&change)?);
        return Ok(ExitCode::SUCCESS);
    }
    let since = change.paused_since_ms.map(fmt_ts).unwrap_or_default();
    let q = &match &args.group {
        Some(g) => format!("{} group {g}", args.queue),
        None => args.queue.clone(),
    };
    match (pause, change.was_paused) {
        (true, false) => println!("queue {q} paused (since {since})"),
        (true, true) => println!("queue {q} was already paused (since {since})"),
        (false, true) => println!("queue {q} resumed (it was paused since {since})"),
        (false, false) => println!("queue {q} was not paused"),
    }
    Ok(ExitCode::SUCCESS)
}

/// Cancels job `id` in the named queue, or in the one queue that knows it.
pub async fn cancel(url: &str, id: &str, named: &[String], json: bool) -> Result<ExitCode> {
    let admin = Admin::connect(url).await?;
    let queue = match named {
        [one] => Some(one.clone()),
        _ => {
            let queues = admin.queues_or_discover(named).await?;
            let found = admin.find_job(&queues, id).await?;
            match found.as_slice() {
                [] => None,
                [one] => Some(one.queue.clone()),
                many => {
                    let names: Vec<_> = many.iter().map(|d| d.queue.as_str()).collect();
                    return Err(CliError::Other(format!(
                        "job {id:?} exists in several queues ({}): name one with -q",
                        names.join(", ")
                    )));
                }
            }
        }
    };
    let outcome = match &queue {
        Some(q) => admin.cancel(q, id).await?,
        None => CancelOutcome::NotFound,
    };
    let ok = matches!(
        outcome,
        CancelOutcome::Cancelled { .. } | CancelOutcome::Requested { .. }
    );
    if json {
        println!(
            "{}",
            json!({"id": id, "queue": queue, "outcome": outcome, "ok": ok})
        );
    } else {
        let q = queue.as_deref().unwrap_or("?");
        println!("job {id} (queue {q}): {}", describe(&outcome));
    }
    Ok(if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

/// One line of plain words per outcome.
pub fn describe(outcome: &CancelOutcome) -> String {
    match outcome {
        CancelOutcome::Cancelled { from } => {
            format!("cancelled (it was {from}); its completion record says cancelled")
        }
        CancelOutcome::Requested { first: true } => {
            "running: cancel requested; the handler sees it at its next heartbeat".into()
        }
        CancelOutcome::Requested { first: false } => {
            "running: a cancel was already requested".into()
        }
        CancelOutcome::AlreadyFinished { status } => {
            format!("already finished (status {status}): nothing to cancel")
        }
        CancelOutcome::Dead => "dead-lettered: replay or purge it instead".into(),
        CancelOutcome::NotFound => "not found (never enqueued, or its record expired)".into(),
        other => format!("not cancelled: {other:?}"),
    }
}
