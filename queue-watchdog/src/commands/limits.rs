//! `queue limit`: shows, sets or clears a queue's rate limit and concurrency
//! cap (docs/LIMITS.md), as text or JSON, or releases its deferred jobs; and
//! the limits line of `stats`.

use std::process::ExitCode;

use queue_core::admin::Admin;
use queue_core::{LimitKind, LimitScope, QueueLimits};

use crate::cli::QueueLimitArgs;
use crate::error::Result;

/// `queue limit --json`: the limits, with `released` (the jobs made due)
/// after a `--release`. Before, the count was printed in text mode only.
#[derive(serde::Serialize)]
struct LimitsJson<'a> {
    #[serde(flatten)]
    limits: &'a QueueLimits,
    #[serde(skip_serializing_if = "Option::is_none")]
    released: Option<u64>,
}

/// Applies the requested change, then prints the queue's limits.
pub async fn limit(url: &str, args: QueueLimitArgs) -> Result<ExitCode> {
    let admin = Admin::connect(url).await?;
    let queue = admin.queue();
    let q = args.queue.as_str();
    let scope = match (&args.key, args.every_key) {
        (Some(k), _) => Some(LimitScope::Key(k.clone())),
        (None, true) => Some(LimitScope::EveryKey),
        (None, false) => None,
    };
    if args.clear {
        match scope.clone() {
            None => queue.clear_limits(q).await?,
            Some(scope) => {
                for kind in [LimitKind::Rate, LimitKind::Concurrency] {
                    queue.clear_limit(q, scope.clone(), kind).await?;
                }
            }
        }
    }
    let mut released = None;
    if args.release {
        let n = queue.release_deferred(q, args.key.as_deref()).await?;
        if !args.json {
            println!("queue {q}: {n} deferred jobs made due");
        }
        released = Some(n);
    }
    let scope = scope.unwrap_or(LimitScope::Queue);
    if let Some(rate) = args.rate {
        queue.set_rate_limit(q, scope.clone(), rate).await?;
    }
    if let Some(n) = args.concurrency {
        queue.set_concurrency_limit(q, scope, n).await?;
    }
    let limits = queue.limits(q).await?;
    if args.json {
        println!(
            "{}",
            super::to_json(&LimitsJson {
                limits: &limits,
                released
            })?
        );
    } else {
        println!("queue {q} limits: {limits}");
    }
    Ok(ExitCode::SUCCESS)
}

/// The `stats` note of a queue with limits (none without).
pub fn note(limits: &QueueLimits) -> Option<String> {
    (!limits.is_empty()).then(|| format!("LIMITED: {limits}"))
}

/// Adds each queue's limits (`"limits"`, with current use) to its object of
/// the `stats --json` array.
pub fn add_to_json(rows: &mut serde_json::Value, limits: &[QueueLimits]) {
    let Some(rows) = rows.as_array_mut() else {
        return;
    };
    for (row, l) in rows.iter_mut().zip(limits) {
        if let (Some(obj), Ok(v)) = (row.as_object_mut(), serde_json::to_value(l)) {
            obj.insert("limits".to_string(), v);
        }
    }
}
