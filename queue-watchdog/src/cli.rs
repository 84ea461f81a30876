//! Command-line interface definition.

use std::net::SocketAddr;

use clap::{Args, Parser, Subcommand};
use queue_core::admin::DeadSelection;
use queue_core::JobId;

/// Operator tool for queue-core queues: the reclaim loop, stats, job
/// inspection, dead-letter replay and purge, a Redis durability check and a
/// web dashboard.
///
/// Exit codes: 0 success; 1 the command ran but found a problem (unknown job
/// id, doctor findings that can lose data, purge refused); 2 Redis could not
/// be reached or answered an error, or the command line is wrong.
#[derive(Debug, Parser)]
#[command(name = "queue-watchdog", version, about, long_about)]
pub struct Cli {
    /// Redis URL (`redis://[:password@]host:port/db`, or
    /// `redis-cluster://host1:port1,host2:port2`).
    #[arg(
        long,
        global = true,
        env = "REDIS_URL",
        default_value = "redis://127.0.0.1:6379/"
    )]
    pub redis: String,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the reclaim loop until SIGTERM / ctrl-c: return jobs whose lease
    /// expired, dead-letter exhausted ones, promote due delayed jobs.
    /// Several copies may run at once.
    Run(RunArgs),
    /// Per queue: lengths of main, processing, delayed and dead; oldest
    /// waiting job; expired leases (lost jobs); throughput over the last
    /// minute; retry and dead-letter counters.
    Stats(StatsArgs),
    /// Inspect or cancel one job.
    #[command(subcommand)]
    Jobs(JobsCommand),
    /// Pause or resume a queue (workers start none of its jobs while paused;
    /// enqueue still works, running jobs finish, the watchdog still reclaims).
    #[command(subcommand)]
    Queue(QueueCommand),
    /// List, replay or purge dead-lettered jobs.
    #[command(subcommand)]
    Dead(DeadCommand),
    /// Check the Redis settings that can lose queue data and print each
    /// finding with its fix. Exit 0: safe for critical queues; 1: findings
    /// that can lose data; 2: cannot connect.
    Doctor(DoctorArgs),
    /// Verify the queue invariants (every id listed once, in the structure
    /// its state names; no job hash listed nowhere; no entry without a hash;
    /// claimed jobs leased; no stray lease; sane fields, key types and
    /// counters). Read-only unless --repair. Exit 0: clean; 1: violations
    /// found (even if repaired); 2: Redis unreachable.
    Check(CheckArgs),
    /// Serve the web dashboard (queues, live throughput, processing jobs with
    /// their lease, dead letters with replay, job details).
    #[cfg_attr(
        not(feature = "dashboard"),
        command(about = "Web dashboard: NOT COMPILED IN (build with --features dashboard)")
    )]
    Dashboard(DashboardArgs),
    /// Transactional outbox on PostgreSQL: publish staged jobs to Redis,
    /// list rows whose job never completed.
    #[cfg_attr(
        not(feature = "outbox"),
        command(about = "PostgreSQL outbox: NOT COMPILED IN (build with --features outbox)")
    )]
    #[command(subcommand)]
    Outbox(OutboxCommand),
    /// Transactional inbox on PostgreSQL: create, prune and count inbox rows,
    /// list outbox events whose effect never committed.
    #[cfg_attr(
        not(feature = "inbox"),
        command(about = "PostgreSQL inbox: NOT COMPILED IN (build with --features inbox)")
    )]
    #[command(subcommand)]
    Inbox(crate::cli_inbox::InboxCommand),
    /// Enqueue one job from JSON (converted to the MessagePack a Rust
    /// handler's serde type decodes). Prints `created <id>`,
    /// `duplicate <id> state=<state>` or `already-completed <id>` (exit 0 for
    /// each: a known id is a no-op, not an error). See docs/PROTOCOL.md.
    Enqueue(EnqueueArgs),
    /// Batches and flows (docs/WORKFLOWS.md): state and counts.
    #[command(subcommand)]
    Batches(BatchesCommand),
    /// Cross-queue batch relay notices (docs/WORKFLOWS.md, "Relay"): list
    /// the ones that could not be applied, move them back to be applied
    /// once their cause is repaired.
    #[command(subcommand)]
    Relay(RelayCommand),
    /// Print a queue's events (enqueued, started, completed, retried,
    /// dead-lettered, cancelled, ...), one line each: the last `--last`, then
    /// with `--follow` each new one as it happens. Turn them on first with
    /// `queue events on -q Q` (off by default; docs/EVENTS.md).
    Events(EventsArgs),
}

#[derive(Debug, Subcommand)]
pub enum BatchesCommand {
    /// A batch's (or flow's: its parent's id) state, member counts
    /// (succeeded, dead, cancelled) and times. Exit 1 when it is unknown.
    Show {
        /// Batch id (a flow's: its parent job's id).
        id: String,
        /// The queue the batch lives on.
        #[arg(long = "queue", short = 'q', value_parser = crate::cli::queue_name)]
        queue: String,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// A queue's batches (flows and DAG steps too), newest first, with
    /// their state and counts; an open batch shows when it expires.
    List {
        /// The queue the batches live on.
        #[arg(long = "queue", short = 'q', value_parser = crate::cli::queue_name)]
        queue: String,
        /// Batches to skip (the previous page's `next offset`).
        #[arg(long, default_value_t = 0)]
        offset: u64,
        /// Batches per page.
        #[arg(long, default_value_t = 50)]
        limit: u64,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Debug, Subcommand)]
pub enum RelayCommand {
    /// The relay notices of a queue's batch members that could not be
    /// applied to their batch (on another queue: gone, or corrupt), newest
    /// first, with the reason (`q:{Q}:relay:dead`; `check` counts them).
    Dead {
        /// The members' queue (the one whose relay list held the notices).
        #[arg(long = "queue", short = 'q', value_parser = crate::cli::queue_name)]
        queue: String,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Moves the queue's dead relay notices back to its relay list (without
    /// their reason line) and relays the queue now. Run it once the cause is
    /// repaired, e.g. a batch count that is not an integer (`batches show`
    /// prints the batch's `count_error`). Applying a notice again counts
    /// nothing twice. Exit 1 when a notice could not be applied again (it is
    /// set aside again, with its reason).
    RetryDead {
        /// The members' queue (the one whose relay list held the notices).
        #[arg(long = "queue", short = 'q', value_parser = crate::cli::queue_name)]
        queue: String,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Debug, Args)]
pub struct EventsArgs {
    /// Queue.
    #[arg(long = "queue", short = 'q', value_parser = crate::cli::queue_name)]
    pub queue: String,
    /// How many of the latest events to print first.
    #[arg(long, default_value_t = 20)]
    pub last: usize,
    /// Keep printing new events until SIGTERM / ctrl-c.
    #[arg(long, short = 'f')]
    pub follow: bool,
    /// One JSON object a line.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct EnqueueArgs {
    /// Queue.
    #[arg(long, short = 'q', value_parser = crate::cli::queue_name)]
    pub queue: String,
    /// Job type (the handler's name, `Job::NAME`).
    #[arg(long = "type", value_name = "TYPE")]
    pub job_type: String,
    /// The job's arguments as JSON, shaped like the handler's serde type
    /// (enums externally tagged: `"Unit"`, `{"Variant": value}`); `-` reads stdin.
    #[arg(long, value_name = "JSON|-")]
    pub json: String,
    /// Stable job id (business key); a random UUID without it.
    #[arg(long)]
    pub id: Option<String>,
    /// Run no earlier than this long from now: `500ms`, `30s`, `5m`, `2h`, `1d`.
    #[arg(long, value_parser = crate::commands::parse_delay, conflicts_with = "run_at")]
    pub delay: Option<std::time::Duration>,
    /// Run no earlier than this time: RFC 3339 (`2030-01-02T03:04:05Z`), or
    /// Unix time with its unit (`1900000000s`, `1900000000000ms`). A bare
    /// number is Unix milliseconds; one that looks like seconds (before
    /// 1973 as milliseconds) or microseconds is refused. Compared with the
    /// Redis clock; the past runs now.
    #[arg(long, value_parser = crate::commands::parse_run_at)]
    pub run_at: Option<std::time::SystemTime>,
    /// Deliveries before the job is dead-lettered (default: `Job::MAX_ATTEMPTS`'s default).
    #[arg(long, default_value_t = 25)]
    pub max_attempts: u32,
    /// Payload schema version; must equal the handler's `SCHEMA_VERSION`.
    #[arg(long, default_value_t = 1)]
    pub schema_version: u32,
}

/// Where the outbox table lives.
#[derive(Debug, Args, Clone)]
pub struct OutboxTarget {
    /// PostgreSQL URL (its value is never printed by --help).
    #[arg(long, env = "DATABASE_URL", hide_env_values = true)]
    pub database_url: String,
    /// Outbox table name.
    #[arg(long, default_value = "queue_outbox")]
    pub table: String,
}

#[derive(Debug, Subcommand)]
pub enum OutboxCommand {
    /// Create the outbox table if it does not exist.
    Migrate {
        #[command(flatten)]
        target: OutboxTarget,
    },
    /// Publish unpublished rows to Redis under their stable job ids and mark
    /// them published; safe to crash at any point and to run as several copies.
    Relay(RelayArgs),
    /// List rows older than an age whose job has not completed (unpublished,
    /// rejected, still queued/active/dead, or missing). Exit 1 when any is listed.
    Reconcile(ReconcileArgs),
    /// Delete published rows older than an age (by published_at; the table
    /// grows without it). Below 24 h, the default completion retention, is
    /// refused unless --force: a re-send of a row still in flight is deduped
    /// by the row itself.
    Prune {
        #[command(flatten)]
        target: OutboxTarget,
        #[command(flatten)]
        age: crate::cli_inbox::PruneAge,
    },
    /// Row counts (unpublished, rejected, published) and the age of the
    /// oldest unpublished row: the relay's lag. Exit 1 when a row is rejected.
    Stats {
        #[command(flatten)]
        target: OutboxTarget,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Debug, Args)]
pub struct RelayArgs {
    #[command(flatten)]
    pub target: OutboxTarget,
    /// Rows per batch (one PostgreSQL transaction).
    #[arg(long, default_value_t = 100)]
    pub batch: usize,
    /// Milliseconds between batches when the outbox is drained.
    #[arg(long, default_value_t = 500)]
    pub interval_ms: u64,
    /// Publish one batch, print its report and exit (1 when a row failed, or
    /// was rejected for good: it will never be published).
    #[arg(long)]
    pub once: bool,
    /// Create the table first if it does not exist (and add the columns a
    /// newer version needs to an existing one).
    #[arg(long)]
    pub migrate: bool,
    /// Mark a row published only once this many replicas confirmed its job.
    #[arg(long)]
    pub wait_replicas: Option<u32>,
    /// Replica wait timeout (ms).
    #[arg(long, default_value_t = 1000)]
    pub wait_timeout_ms: u64,
    /// The longest payload (or extra field) sent to Redis, in bytes
    /// (`Queue::with_max_arg_len`; default 512 MiB, Redis' default
    /// `proto-max-bulk-len`). Set it to the server's `proto-max-bulk-len`
    /// when that is lower: a longer row is then rejected with its reason
    /// instead of being sent, which would make Redis close the connection
    /// and stop every batch at that row.
    #[arg(long)]
    pub max_arg_len: Option<usize>,
}

#[derive(Debug, Args)]
pub struct ReconcileArgs {
    #[command(flatten)]
    pub target: OutboxTarget,
    /// Only rows created at least this long ago (seconds).
    #[arg(long, default_value_t = 3600)]
    pub older_than_secs: u64,
    /// Ignore rows created longer ago than this (seconds; 0 = no bound).
    /// Default 86400, the workers' default completion retention: after it the
    /// completion record of every finished job has expired, so an older row
    /// would be listed as `missing` however healthy it is. Set it to your
    /// `completion_retention`.
    #[arg(long, default_value_t = 86_400)]
    pub max_age_secs: u64,
    /// At most this many rows.
    #[arg(long, default_value_t = 1000)]
    pub limit: usize,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

/// Which queues a read command looks at.
#[derive(Debug, Args, Clone, Default)]
pub struct QueueSelection {
    /// Queue (repeat for several). Without it, queues are discovered by
    /// scanning for `q:{*}:*` keys (not on a Redis Cluster).
    #[arg(long = "queue", short = 'q', value_parser = crate::cli::queue_name)]
    pub queues: Vec<String>,
}

#[derive(Debug, Args)]
pub struct RunArgs {
    /// Queue to watch (repeat for several).
    #[arg(long = "queue", short = 'q', required = true, value_parser = crate::cli::queue_name)]
    pub queues: Vec<String>,
    /// Milliseconds between passes (at least 10: 0 would run passes back to
    /// back).
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u64).range(10..))]
    pub interval_ms: u64,
    /// Grace (ms) for ids found in processing without a lease (a worker died
    /// between BLMOVE and claim) before they are returned.
    #[arg(long, default_value_t = 30_000)]
    pub orphan_grace_ms: u64,
    /// Base backoff (ms) before a reclaimed job runs again; doubles per attempt, jittered.
    #[arg(long, default_value_t = 1000)]
    pub backoff_base_ms: u64,
    /// Maximum backoff (ms).
    #[arg(long, default_value_t = 60_000)]
    pub backoff_max_ms: u64,
    /// Expired leases handled per script call.
    #[arg(long, default_value_t = 500)]
    pub batch: usize,
    /// Each pass deletes the oldest dead letters beyond this many per queue
    /// (with their job hashes and step results); 0: no limit.
    #[arg(long, default_value_t = 10_000)]
    pub dead_max_len: usize,
    /// Each pass deletes dead letters older than this many hours; 0: keep.
    #[arg(long, default_value_t = 168)]
    pub dead_retention_hours: u64,
    /// Run a single pass, print its report and exit.
    #[arg(long)]
    pub once: bool,
    /// Serve Prometheus metrics on this address (`GET /metrics`), e.g.
    /// 127.0.0.1:9464. Also publishes per-queue depth and age gauges each pass.
    #[arg(long, value_name = "ADDR")]
    pub metrics_listen: Option<SocketAddr>,
}

#[derive(Debug, Args)]
pub struct StatsArgs {
    #[command(flatten)]
    pub selection: QueueSelection,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct CheckArgs {
    #[command(flatten)]
    pub selection: QueueSelection,
    /// Mend what can be mended without losing a job: a hash listed nowhere
    /// goes back to main (or dead), an entry whose hash is gone is
    /// dead-lettered (or dropped when the job completed), a stray lease is
    /// dropped. Each repair re-checks atomically first.
    #[arg(long)]
    pub repair: bool,
    /// Print JSON (one report per queue) instead of text.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Subcommand)]
pub enum JobsCommand {
    /// A job's hash (timestamps readable), where it is now (main, processing
    /// with lease time left, delayed, dead), its history, completion record
    /// and step names. Exit 1 when the id is unknown.
    Show {
        /// Job id.
        id: String,
        #[command(flatten)]
        selection: QueueSelection,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Cancel a job: a waiting or delayed job is removed (its completion
    /// record says cancelled); a running one is asked to stop at its next
    /// heartbeat. Exit 1 when the job is unknown, dead or already finished.
    Cancel {
        /// Job id.
        id: String,
        #[command(flatten)]
        selection: QueueSelection,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Debug, Subcommand)]
pub enum QueueCommand {
    /// Pause a queue: no worker starts a job of it until `resume`.
    Pause(QueueFlowArgs),
    /// Resume a paused queue.
    Resume(QueueFlowArgs),
    /// Show or set a queue's rate limit and concurrency cap, for the whole
    /// queue, every rate key, or one key (docs/LIMITS.md). With neither
    /// --rate, --concurrency nor --clear: prints the limits.
    Limit(QueueLimitArgs),
    /// Turn the queue's event stream on or off (docs/EVENTS.md), or show
    /// whether it is on (no argument).
    Events(QueueEventsArgs),
}

/// `queue limit`: which limits to set or clear.
#[derive(Debug, Args)]
pub struct QueueLimitArgs {
    /// Queue name.
    #[arg(long = "queue", short = 'q', value_parser = crate::cli::queue_name)]
    pub queue: String,
    /// At most N starts per window: `100/1s`, `5/250ms`, `600/1m` (N at
    /// least 1: to hold the jobs, `queue pause`).
    #[arg(long)]
    pub rate: Option<queue_core::RateLimit>,
    /// At most N jobs running at once across all workers (at least 1: to
    /// hold the jobs, `queue pause`).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    pub concurrency: Option<u32>,
    /// Apply to this rate key only (an override of the every-key default).
    #[arg(long, conflicts_with = "every_key")]
    pub key: Option<String>,
    /// Apply to every rate key (each key on its own).
    #[arg(long)]
    pub every_key: bool,
    /// Clear the scope's limits (without --key / --every-key: every limit of the queue).
    #[arg(long, conflicts_with_all = ["rate", "concurrency"])]
    pub clear: bool,
    /// Make the jobs deferred for their rate key (--key K: that key's only)
    /// due now, booked again under the limits as they are (a change of a
    /// key's limits does this already).
    #[arg(long, conflicts_with_all = ["rate", "concurrency", "clear"])]
    pub release: bool,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct QueueEventsArgs {
    /// Queue name.
    #[arg(long = "queue", short = 'q', value_parser = crate::cli::queue_name)]
    pub queue: String,
    /// `on` or `off`; without it, prints the current setting.
    #[arg(value_parser = ["on", "off"])]
    pub switch: Option<String>,
    /// The stream's cap when turning it on (about this many entries kept).
    #[arg(long, default_value_t = queue_core::DEFAULT_EVENTS_MAXLEN)]
    pub maxlen: u64,
}

#[derive(Debug, Args)]
pub struct QueueFlowArgs {
    /// Queue name.
    #[arg(long = "queue", short = 'q', value_parser = crate::cli::queue_name)]
    pub queue: String,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
    /// Pause or resume only this group of the queue (fair queuing,
    /// docs/GROUPS.md): its jobs wait, the other groups run.
    #[arg(long)]
    pub group: Option<String>,
}

/// Text that is not empty nor only spaces (a filter that would select all).
/// A `--queue` value: a name an enqueue accepts ([`queue_core::validate_queue_name`]).
/// Anything else (`"emails "`, `{emails}`) names keys no enqueue creates: a
/// `run` for it never returned the jobs of dead workers, and the other
/// commands found nothing. Refused by clap: exit 2 with the reason.
pub fn queue_name(s: &str) -> std::result::Result<String, String> {
    queue_core::validate_queue_name(s)
        .map(|()| s.to_string())
        .map_err(|reason| format!("{s:?} is not a queue name: a queue name {reason}"))
}

fn non_blank(s: &str) -> std::result::Result<String, String> {
    if s.trim().is_empty() {
        Err("blank text would match every dead-lettered job; use --all for that".into())
    } else {
        Ok(s.to_string())
    }
}

/// Which dead-lettered jobs a replay or purge acts on: ids, a filter, or all.
#[derive(Debug, Args, Clone)]
#[group(required = true, multiple = false)]
pub struct DeadTarget {
    /// Job ids.
    pub ids: Vec<String>,
    /// Every dead-lettered job whose reason or type contains this text
    /// (case-insensitive). Blank text is refused: it would match every job
    /// (say `--all` for that), as an unset shell variable would.
    #[arg(long, value_parser = non_blank)]
    pub filter: Option<String>,
    /// Every dead-lettered job of the queue.
    #[arg(long)]
    pub all: bool,
}

impl DeadTarget {
    /// The selection in queue-core's terms.
    pub fn selection(&self) -> DeadSelection {
        if !self.ids.is_empty() {
            DeadSelection::Ids(self.ids.iter().map(JobId::from).collect())
        } else if self.all {
            DeadSelection::All
        } else {
            match &self.filter {
                Some(text) => DeadSelection::Matching(text.clone()),
                None => DeadSelection::All,
            }
        }
    }
}

#[derive(Debug, Subcommand)]
pub enum DeadCommand {
    /// List dead-lettered jobs, newest first, with their reason.
    List(DeadListArgs),
    /// Move dead-lettered jobs back to the main list (by id, --filter or --all).
    /// Exit 1 when a given id was not in the dead-letter list.
    Replay(DeadReplayArgs),
    /// Delete dead-lettered jobs for good (by id, --filter or --all). Asks
    /// for confirmation on a terminal; without a terminal it refuses unless
    /// --yes is given.
    Purge(DeadPurgeArgs),
}

#[derive(Debug, Args)]
pub struct DeadListArgs {
    /// Queue.
    #[arg(long, short = 'q', value_parser = crate::cli::queue_name)]
    pub queue: String,
    /// How many to show.
    #[arg(long, default_value_t = 50)]
    pub limit: u64,
    /// Skip this many (of the matching jobs), newest first.
    #[arg(long, default_value_t = 0)]
    pub offset: u64,
    /// Only jobs whose reason or type contains this text (case-insensitive).
    #[arg(long)]
    pub filter: Option<String>,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct DeadReplayArgs {
    /// Queue.
    #[arg(long, short = 'q', value_parser = crate::cli::queue_name)]
    pub queue: String,
    #[command(flatten)]
    pub target: DeadTarget,
    /// Restart the attempt count at 0.
    #[arg(long)]
    pub reset_attempts: bool,
    /// Show what would be replayed without changing anything.
    #[arg(long)]
    pub dry_run: bool,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct DeadPurgeArgs {
    /// Queue.
    #[arg(long, short = 'q', value_parser = crate::cli::queue_name)]
    pub queue: String,
    #[command(flatten)]
    pub target: DeadTarget,
    /// Show what would be purged without changing anything.
    #[arg(long)]
    pub dry_run: bool,
    /// Do not ask for confirmation.
    #[arg(long, short = 'y')]
    pub yes: bool,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct DoctorArgs {
    /// Also require `appendfsync always` (no acknowledged write lost even on
    /// power loss). Without it, `appendfsync everysec` counts as safe.
    #[arg(long)]
    pub strict: bool,
    /// At most this many keys are scanned when looking for TTLs on queue keys.
    #[arg(long, default_value_t = 100_000)]
    pub scan_limit: u64,
    /// Replication lag (seconds) above which a replica is reported.
    #[arg(long, default_value_t = 10)]
    pub max_lag_secs: u64,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct DashboardArgs {
    /// Address to serve on. Keep it on loopback (the default); any other
    /// address needs `--auth-token-file`: the dashboard can replay and purge jobs.
    #[arg(long, default_value = "127.0.0.1:9090")]
    pub listen: SocketAddr,
    #[command(flatten)]
    pub selection: QueueSelection,
    /// How often (ms) the dashboard samples the queues for the throughput chart.
    #[arg(long, default_value_t = 2000)]
    pub sample_ms: u64,
    /// Also serve Prometheus metrics (queue depth and age gauges) at /metrics.
    #[arg(long)]
    pub metrics: bool,
    /// Accept requests for this host name too (repeat for several). By
    /// default only loopback names and the listen address are accepted, which
    /// blocks DNS-rebinding attacks from web pages.
    #[arg(long, value_name = "HOST")]
    pub allow_host: Vec<String>,
    /// Require this access token (the file's first line, at least 16
    /// characters): requests send `Authorization: Bearer <token>`, or log in
    /// once with a form that sets a session cookie. Required when `--listen`
    /// is not a loopback address.
    #[arg(long, value_name = "FILE")]
    pub auth_token_file: Option<std::path::PathBuf>,
    /// How long a login session lasts (seconds; default 12 hours). After it,
    /// the cookie is refused and the user logs in again: a stolen cookie
    /// does not stay valid until the next restart.
    #[arg(long, default_value_t = 12 * 3600, value_name = "SECS",
          value_parser = clap::value_parser!(u64).range(1..=30 * 24 * 3600))]
    pub session_max_age_secs: u64,
    /// Also append every action (replay, purge, pause, resume, cancel) as a
    /// JSON line to this file; it is always logged with tracing target `audit`.
    #[arg(long, value_name = "FILE")]
    pub audit_log: Option<std::path::PathBuf>,
}
