//! The audit log: one line per dashboard action (replay, bulk replay, purge,
//! pause, resume, cancel) saying who did what to how many jobs. Always a
//! `tracing` event with target `audit`; with `--audit-log FILE` also a JSON
//! line appended to that file.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::Path;
use std::sync::Mutex;

use serde_json::json;
use tracing::{info, warn};

use crate::error::CliError;

/// Where audit lines go besides the `audit` tracing target.
pub struct Audit {
    file: Option<Mutex<File>>,
}

/// One action: `who` did `action` on `queue` (`what`: the job id or the
/// filter), touching `count` jobs.
pub struct Entry<'a> {
    /// [`super::auth::Who`]: how they authenticated and from where.
    pub who: &'a str,
    /// `replay`, `bulk_replay`, `bulk_purge`, `pause`, `resume`, `cancel`.
    pub action: &'a str,
    /// The queue.
    pub queue: &'a str,
    /// The job id, or the filter of a bulk action.
    pub what: &'a str,
    /// How many jobs the action changed.
    pub count: u64,
}

impl Audit {
    /// Opens `path` for appending (created when missing).
    pub fn open(path: Option<&Path>) -> Result<Audit, CliError> {
        let file = match path {
            None => None,
            Some(p) => Some(Mutex::new(
                OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(p)
                    .map_err(|e| {
                        CliError::Other(format!("cannot open --audit-log {}: {e}", p.display()))
                    })?,
            )),
        };
        Ok(Audit { file })
    }

    /// Records one action.
    pub fn record(&self, e: Entry<'_>) {
        info!(target: "audit", who = e.who, action = e.action, queue = e.queue, what = e.what, count = e.count, "dashboard action");
        let Some(file) = &self.file else { return };
        let line = json!({
            "ts": chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
            "who": e.who,
            "action": e.action,
            "queue": e.queue,
            "what": e.what,
            "count": e.count,
        });
        let mut f = file.lock().unwrap();
        if let Err(err) = writeln!(f, "{line}").and_then(|_| f.flush()) {
            warn!(target: "audit", error = %err, "cannot write the audit log file");
        }
    }
}
