//! The end-of-run report: a table for people, `--json` for machines.

use std::collections::BTreeMap;
use std::fmt::Write as _;

/// Rows of the table: (label, value).
type Rows = Vec<(String, String)>;

/// Everything the run measured. Field names are the JSON keys.
#[derive(Debug, Clone, Default)]
pub struct Report {
    pub seed: u64,
    pub jobs: u64,
    pub workers: u64,
    pub concurrency: u64,
    pub lease_ms: u64,
    pub watchdogs: u64,
    pub appendonly: bool,
    /// Jobs whose enqueue returned Ok (each retried with its stable id until Ok).
    pub enqueued: u64,
    /// Of those, poison jobs (corrupt bytes or an unknown schema version).
    pub poison: u64,
    /// Enqueue calls that returned an error (and were retried with the same id).
    pub enqueue_errors: u64,
    /// Second enqueues of an existing stable id.
    pub duplicate_enqueues: u64,
    /// Of those, the ones that created a job (must be 0).
    pub duplicate_enqueues_created: u64,
    pub completed: u64,
    pub dead_lettered: u64,
    /// Good jobs that were dead-lettered (e.g. attempts exhausted by kills).
    pub dead_unexpected: u64,
    /// Poison jobs that completed, or whose dead-letter reason is wrong (must be 0).
    pub poison_mishandled: u64,
    /// Jobs with no completion record, not dead-lettered and not pending (must be 0).
    pub lost: u64,
    /// Jobs still queued, delayed or active when the run ended (must be 0).
    pub pending: u64,
    /// Side effects the external API made (one per job is the goal).
    pub logical_effects: u64,
    /// Jobs whose side effect was made more than once (must be 0).
    pub duplicates: u64,
    /// Completed jobs with no side effect (must be 0).
    pub completed_without_effect: u64,
    /// Completed jobs whose recorded result is not their side effect's id (must be 0).
    pub result_mismatches: u64,
    /// Acks beyond one per job (the `completed` counter minus completed jobs; must be 0).
    pub double_acks: u64,
    /// Handler executions (raw; more than one per job is at-least-once at work).
    pub handler_runs: u64,
    pub jobs_run_more_than_once: u64,
    /// Calls of the external API (raw; repeats were absorbed by the idempotency key).
    pub effect_calls: u64,
    pub jobs_called_more_than_once: u64,
    /// Deliveries acked without running because a completion record existed.
    pub skipped_done: u64,
    pub kills: u64,
    pub failpoint_crashes: BTreeMap<String, u64>,
    pub stalls: u64,
    pub other_exits: u64,
    pub worker_starts: u64,
    pub redis_restarts: u64,
    pub reclaimed: u64,
    pub adopted: u64,
    pub watchdog_dead_lettered: u64,
    pub retried: u64,
    /// Invariant violations `Admin::check` found after the run (must be 0).
    pub violations: u64,
    pub wall_time_s: f64,
    pub timed_out: bool,
    /// Examples of what went wrong, for the log.
    pub problems: Vec<String>,
}

impl Report {
    /// Whether the run kept the promise: nothing lost, no duplicate side effect.
    pub fn passed(&self) -> bool {
        self.lost == 0
            && self.pending == 0
            && self.duplicates == 0
            && self.completed_without_effect == 0
            && self.result_mismatches == 0
            && self.double_acks == 0
            && self.duplicate_enqueues_created == 0
            && self.poison_mishandled == 0
            && self.violations == 0
            && !self.timed_out
            && self.enqueued == self.jobs
            && self.completed + self.dead_lettered + self.pending + self.lost == self.enqueued
    }

    fn crashes_total(&self) -> u64 {
        self.failpoint_crashes.values().sum()
    }

    /// The human-readable table.
    pub fn table(&self) -> String {
        let mut rows = Rows::new();
        self.setup_rows(&mut rows);
        self.outcome_rows(&mut rows);
        self.chaos_rows(&mut rows);
        self.verdict_rows(&mut rows);
        let width = rows.iter().map(|(k, _)| k.len()).max().unwrap_or(0);
        let mut out = String::from("chaos report\n");
        for (k, v) in &rows {
            let _ = writeln!(out, "  {k:<width$}  {v}");
        }
        for p in &self.problems {
            let _ = writeln!(out, "  ! {p}");
        }
        out
    }

    /// The harness settings.
    fn setup_rows(&self, rows: &mut Rows) {
        let mut row = |k: &str, v: String| rows.push((k.to_string(), v));
        row(
            "setup",
            format!(
                "seed {}, {} workers x {} concurrency, lease {} ms, {} watchdogs, redis {}",
                self.seed,
                self.workers,
                self.concurrency,
                self.lease_ms,
                self.watchdogs,
                if self.appendonly {
                    "appendonly yes / appendfsync always"
                } else {
                    "no persistence"
                }
            ),
        );
    }

    /// What happened to the jobs: enqueued, completed, dead, lost, duplicated, the raw counts and the checks.
    fn outcome_rows(&self, rows: &mut Rows) {
        let mut row = |k: &str, v: String| rows.push((k.to_string(), v));
        row(
            "enqueued (Ok)",
            format!(
                "{} of {} (poison: {})",
                self.enqueued, self.jobs, self.poison
            ),
        );
        row(
            "enqueue errors",
            format!(
                "{} (each retried with the same stable id)",
                self.enqueue_errors
            ),
        );
        row(
            "duplicate enqueues",
            format!(
                "{} (created a job: {})",
                self.duplicate_enqueues, self.duplicate_enqueues_created
            ),
        );
        row("completed", self.completed.to_string());
        row(
            "dead-lettered",
            format!(
                "{} (poison: {}, other: {})",
                self.dead_lettered,
                self.dead_lettered - self.dead_unexpected,
                self.dead_unexpected
            ),
        );
        row("lost", self.lost.to_string());
        row("pending at exit", self.pending.to_string());
        row(
            "duplicates",
            format!("{} (jobs whose side effect ran twice)", self.duplicates),
        );
        row("logical side effects", self.logical_effects.to_string());
        row(
            "raw handler runs",
            format!(
                "{} ({} jobs ran more than once)",
                self.handler_runs, self.jobs_run_more_than_once
            ),
        );
        row(
            "raw external calls",
            format!(
                "{} ({} jobs called twice or more, deduplicated by the step key)",
                self.effect_calls, self.jobs_called_more_than_once
            ),
        );
        row(
            "result/ack checks",
            format!(
                "completed without effect {}, result mismatches {}, double acks {}, poison mishandled {}",
                self.completed_without_effect, self.result_mismatches, self.double_acks, self.poison_mishandled
            ),
        );
    }

    /// What the chaos did, and what the queue did to recover.
    fn chaos_rows(&self, rows: &mut Rows) {
        let mut row = |k: &str, v: String| rows.push((k.to_string(), v));
        row("SIGKILLs", self.kills.to_string());
        let fp: Vec<String> = self
            .failpoint_crashes
            .iter()
            .map(|(k, v)| format!("{k} {v}"))
            .collect();
        row(
            "failpoint crashes",
            format!("{} ({})", self.crashes_total(), fp.join(", ")),
        );
        row(
            "SIGSTOP stalls",
            format!("{} (each past the lease, then SIGCONT)", self.stalls),
        );
        row("other worker exits", self.other_exits.to_string());
        row("worker starts", self.worker_starts.to_string());
        row("redis restarts", self.redis_restarts.to_string());
        row(
            "recovered by watchdog",
            format!(
                "{} returned to the queue + {} dead-lettered (expired leases and orphans past their grace)",
                self.reclaimed, self.watchdog_dead_lettered
            ),
        );
        row(
            "unleased ids adopted",
            format!(
                "{} (seen in processing without a lease: crashed between BLMOVE and claim, or claimed a moment later)",
                self.adopted
            ),
        );
        row("handler retries", self.retried.to_string());
        row("skipped (already done)", self.skipped_done.to_string());
    }

    /// Wall time and PASS / FAIL.
    fn verdict_rows(&self, rows: &mut Rows) {
        let mut row = |k: &str, v: String| rows.push((k.to_string(), v));
        row(
            "invariant violations",
            format!(
                "{} (queue-watchdog check after the run; must be 0)",
                self.violations
            ),
        );
        row(
            "wall time",
            format!(
                "{:.1} s{}",
                self.wall_time_s,
                if self.timed_out { " (TIMED OUT)" } else { "" }
            ),
        );
        row(
            "result",
            if self.passed() {
                "PASS".into()
            } else {
                "FAIL".into()
            },
        );
    }

    /// One JSON object (hand-written: the fields are numbers, bools and plain strings).
    pub fn json(&self) -> String {
        let mut f: Vec<(String, String)> = Vec::new();
        let mut num = |k: &str, v: u64| f.push((k.to_string(), v.to_string()));
        num("seed", self.seed);
        num("jobs", self.jobs);
        num("workers", self.workers);
        num("concurrency", self.concurrency);
        num("lease_ms", self.lease_ms);
        num("watchdogs", self.watchdogs);
        num("enqueued", self.enqueued);
        num("poison", self.poison);
        num("enqueue_errors", self.enqueue_errors);
        num("duplicate_enqueues", self.duplicate_enqueues);
        num(
            "duplicate_enqueues_created",
            self.duplicate_enqueues_created,
        );
        num("completed", self.completed);
        num("dead_lettered", self.dead_lettered);
        num("dead_unexpected", self.dead_unexpected);
        num("poison_mishandled", self.poison_mishandled);
        num("lost", self.lost);
        num("pending", self.pending);
        num("logical_effects", self.logical_effects);
        num("duplicates", self.duplicates);
        num("completed_without_effect", self.completed_without_effect);
        num("result_mismatches", self.result_mismatches);
        num("double_acks", self.double_acks);
        num("handler_runs", self.handler_runs);
        num("jobs_run_more_than_once", self.jobs_run_more_than_once);
        num("effect_calls", self.effect_calls);
        num(
            "jobs_called_more_than_once",
            self.jobs_called_more_than_once,
        );
        num("skipped_done", self.skipped_done);
        num("kills", self.kills);
        num("failpoint_crashes_total", self.crashes_total());
        num("stalls", self.stalls);
        num("other_exits", self.other_exits);
        num("worker_starts", self.worker_starts);
        num("redis_restarts", self.redis_restarts);
        num("reclaimed", self.reclaimed);
        num("adopted", self.adopted);
        num("watchdog_dead_lettered", self.watchdog_dead_lettered);
        num("retried", self.retried);
        num("violations", self.violations);
        f.push(("appendonly".into(), self.appendonly.to_string()));
        f.push(("wall_time_s".into(), format!("{:.3}", self.wall_time_s)));
        f.push(("timed_out".into(), self.timed_out.to_string()));
        f.push(("passed".into(), self.passed().to_string()));
        let fp: Vec<String> = self
            .failpoint_crashes
            .iter()
            .map(|(k, v)| format!("{}:{v}", quote(k)))
            .collect();
        f.push(("failpoint_crashes".into(), format!("{{{}}}", fp.join(","))));
        let problems: Vec<String> = self.problems.iter().map(|p| quote(p)).collect();
        f.push(("problems".into(), format!("[{}]", problems.join(","))));
        let body: Vec<String> = f.iter().map(|(k, v)| format!("{}:{v}", quote(k))).collect();
        format!("{{{}}}", body.join(","))
    }
}

/// A JSON string literal.
fn quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}
