//! Command-line definition of `queue-watchdog inbox …` (the PostgreSQL
//! transactional inbox; implemented in `commands/inbox.rs` behind the cargo
//! feature `inbox`).

use clap::{Args, Subcommand};

/// The smallest `inbox prune` / `outbox prune --older-than-secs` accepted
/// without `--force`: the default completion retention. Below it a
/// redelivery of a completed job repeats its effect even without a replay
/// (inbox), and reconcile can no longer tell a completed job from a lost one
/// by its row (outbox).
pub const MIN_PRUNE_AGE_SECS: u64 = 24 * 3600;

/// How old the rows `inbox prune` and `outbox prune` delete must be.
#[derive(Debug, Args, Clone, Copy)]
pub struct PruneAge {
    /// Age of the rows to delete, in seconds (inbox: done rows by
    /// finished_at, not below the dead-letter retention; outbox: published
    /// rows by published_at). Default 7 days.
    #[arg(long, default_value_t = 7 * 24 * 3600)]
    pub older_than_secs: u64,
    /// Prune with an age below 24 h (MIN_PRUNE_AGE_SECS) anyway.
    #[arg(long)]
    pub force: bool,
}

impl PruneAge {
    /// The age to prune at, or the refusal of one below
    /// [`MIN_PRUNE_AGE_SECS`] without `--force`: `rows` names them (`inbox
    /// rows`), `risk` says what pruning them that young breaks.
    pub fn checked(&self, rows: &str, risk: &str) -> Result<std::time::Duration, String> {
        if self.older_than_secs < MIN_PRUNE_AGE_SECS && !self.force {
            return Err(format!(
                "refusing to prune {rows} younger than 24 h (--older-than-secs {} < \
                 {MIN_PRUNE_AGE_SECS}): {risk}; pass --force to prune anyway",
                self.older_than_secs
            ));
        }
        Ok(std::time::Duration::from_secs(self.older_than_secs))
    }
}

/// Where the inbox table lives.
#[derive(Debug, Args, Clone)]
pub struct InboxTarget {
    /// PostgreSQL URL (its value is never printed by --help).
    #[arg(long, env = "DATABASE_URL", hide_env_values = true)]
    pub database_url: String,
    /// Inbox table name.
    #[arg(long, default_value = "queue_inbox")]
    pub table: String,
}

#[derive(Debug, Subcommand)]
pub enum InboxCommand {
    /// Create the inbox table if it does not exist (safe from several processes).
    Migrate {
        #[command(flatten)]
        target: InboxTarget,
    },
    /// Delete done rows that finished longer ago than --older-than-secs. Keep
    /// them longer than any job can be delivered again: the completion
    /// retention (24 h by default), the outbox's re-send horizon, and the
    /// dead-letter retention (`run --dead-retention-hours`, 7 days by default,
    /// 0 = forever): a dead-lettered job whose effect committed can be
    /// replayed, and after its row was pruned the effect applies again.
    /// An age below 24 h is refused unless --force.
    Prune {
        #[command(flatten)]
        target: InboxTarget,
        #[command(flatten)]
        age: PruneAge,
    },
    /// Per queue: running and done rows, oldest running row, last completion.
    Stats {
        #[command(flatten)]
        target: InboxTarget,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// List outbox rows (same database) older than an age whose job has no
    /// done inbox row: events whose database effect never committed.
    /// Exit 1 when any is listed.
    Reconcile(InboxReconcileArgs),
}

#[derive(Debug, Args)]
pub struct InboxReconcileArgs {
    #[command(flatten)]
    pub target: InboxTarget,
    /// Outbox table name.
    #[arg(long, default_value = "queue_outbox")]
    pub outbox_table: String,
    /// Only outbox rows created at least this long ago (seconds).
    #[arg(long, default_value_t = 3600)]
    pub older_than_secs: u64,
    /// Ignore outbox rows created longer ago than this (seconds; 0 = no
    /// bound). Default 604800, the default `inbox prune` age: a pruned done
    /// row makes its healthy outbox row look unfinished. Keep it at or below
    /// your prune age.
    #[arg(long, default_value_t = 604_800)]
    pub max_age_secs: u64,
    /// Only this queue (repeat for several): the queues whose handlers use the inbox.
    #[arg(long = "queue", short = 'q', value_parser = crate::cli::queue_name)]
    pub queues: Vec<String>,
    /// At most this many rows.
    #[arg(long, default_value_t = 1000)]
    pub limit: usize,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}
