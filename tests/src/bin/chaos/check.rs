//! The invariant check at the end of a run: `Admin::check` on the chaos
//! queue, read-only; each violation counts against the run (`violations`
//! must be 0) and the first few are listed among the problems.

use queue_core::{admin::Admin, Queue};

use crate::job::QUEUE;
use crate::report::Report;

/// Violations listed in the report's problems at most.
const SHOWN: usize = 10;

/// Runs the checker and records its result in `report`.
pub async fn after_run(queue: &Queue, report: &mut Report) {
    match Admin::new(queue.clone()).check(QUEUE, false).await {
        Ok(check) => {
            report.violations = check.violations.len() as u64 + u64::from(check.truncated);
            report.problems.extend(
                check
                    .violations
                    .iter()
                    .take(SHOWN)
                    .map(|v| format!("invariant check: {v}")),
            );
        }
        Err(e) => {
            report.violations += 1;
            report.problems.push(format!("invariant check failed: {e}"));
        }
    }
}
