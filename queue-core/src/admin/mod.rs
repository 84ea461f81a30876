//! The operator API: read-only inspection of queues and jobs, and the
//! dead-letter actions (replay, purge). The `queue-watchdog` binary's CLI and
//! dashboard are views over this module; your own tools can use it the same way.
//!
//! [`Admin`] is the entry point. Reads that must agree with each other are one
//! read-only script each (a consistent snapshot, Redis clock); writes are one
//! script each (DESIGN rule 1). Each script sits beside its Rust wrapper in
//! this folder and gets the shared prelude (`lua/prelude.lua`).
//!
//! | file | owns |
//! |---|---|
//! | `stats.rs` | [`QueueStats`]: lengths and lifetime counters ([`Queue::stats`]) |
//! | `health.rs` | [`QueueHealth`]: stats plus lease and delay health |
//! | `listings.rs` | paged listings of processing, waiting and delayed jobs |
//! | `locate.rs` | [`Location`]: where one id is now |
//! | `jobs.rs` | [`JobInfo`] (the raw hash), [`JobDetail`] (everything about one job) |
//! | `history.rs` | [`JobEvent`]: a job's life from the timestamps its hash keeps |
//! | `dead.rs` | dead letters: list with a filter, select, replay, purge |
//! | `check.rs` | [`Admin::check`]: the invariant checker (`check.lua`), [`CheckReport`] |
//! | `check_rules.rs` | [`Violation`]: the invariants, and the rules that judge what the checker read |
//! | `repair.rs` | [`Admin::repair`]: mending a violation without losing a job (`repair_*.lua`) |
//! | `flow.rs` | pause / resume a queue, cancel a job ([`Queue::pause`], [`Queue::cancel`]) |
//! | `discovery.rs` | finding queue names from their keys |
//! | `error.rs` | [`AdminError`] |
//! | `dead_scan.rs` | [`Admin::scan_dead`]: a long dead-letter list in chunks, filtered in Redis (`dead_scan.lua`) |
//! //! | `batches.rs` | a queue's batches (the index, newest first) and one batch's detail ([`Admin::batches`], [`Admin::batch_detail`]) |
//! | `journal.rs` | [`HistoryEntry`]: each delivery of a job and what ended it (docs/EVENTS.md) |

mod batches;
mod check;
mod check_rules;
mod dead;
mod dead_scan;
mod discovery;
mod error;
mod flow;
mod health;
mod history;
mod jobs;
mod journal;
mod listings;
mod locate;
mod repair;
mod stats;
#[cfg(test)]
mod tests;

use crate::queue::Queue;

pub use batches::{
    batch_links, BatchCallback, BatchDetail, BatchLink, BatchListing, BatchMember, BatchRow,
    DagStepInfo, BATCH_MEMBER_CAP, OUTCOME_ELSEWHERE,
};
pub use check::{CheckReport, Scanned, MAX_PROBES, PAGE};
pub use check_rules::{Place, Violation};
pub use dead::{
    DeadCandidate, DeadChunk, DeadLetters, DeadSelection, PurgeOutcome, ReplayOutcome,
    SELECTED_TEXT_CHARS,
};
pub use dead_scan::{DeadReasons, DeadRow, DeadScan, DeadScanQuery, DEAD_SCAN_CHUNK};
pub use discovery::queue_of_key;
pub use error::{AdminError, Result};
pub use health::QueueHealth;
pub use history::{JobEvent, JobEventKind};
pub use jobs::{JobDetail, JobInfo};
pub use journal::HistoryEntry;
pub use listings::{LeaseStatus, Listing, Page, ProcessingJob, WaitingJob};
pub use locate::{Location, LOCATE_SEARCH};
pub use repair::{Repair, RepairAction, MISSING_HASH_REASON};
pub use stats::{QueueStats, STATS_GROUP_LIMIT};

/// The name of this version's Redis function library, `queue_core_<hash>`:
/// every queue script runs as one of its functions (docs/OPERATIONS.md, "The
/// scripts on the server"). Operator tools use it to tell this version's
/// library from those other versions left on the server.
///
/// ```
/// let name = queue_core::admin::function_library();
/// assert!(name.starts_with("queue_core_"));
/// assert_eq!(name.len(), "queue_core_".len() + 12);
/// ```
pub fn function_library() -> String {
    crate::scripts::library::library_name()
}

/// Shebang flags of the read-only admin scripts: they run on replicas and
/// when Redis is at `maxmemory` (an operator looks most when things go wrong).
const READ_ONLY: Option<&str> = Some("no-writes,allow-oom");

/// Declares a script of this folder, built with the shared prelude.
macro_rules! admin_script {
    ($name:ident, $file:literal, $flags:expr) => {
        static $name: std::sync::LazyLock<redis::Script> =
            std::sync::LazyLock::new(|| crate::scripts::with_prelude($flags, include_str!($file)));
    };
}
pub(crate) use admin_script;

/// Operator access to queues: inspection, dead-letter replay and purge,
/// queue discovery. Cheap to clone (it holds a [`Queue`]).
///
/// ```
/// # #[tokio::main] async fn main() -> Result<(), queue_core::admin::AdminError> {
/// # let server = queue_testkit::RedisServer::start().unwrap();
/// use queue_core::admin::{Admin, Page};
///
/// let admin = Admin::connect(&server.url()).await?;
/// admin.queue().enqueue_raw("emails", "send", 1, 3, Default::default(), b"\x80").await?;
///
/// assert_eq!(admin.discover_queues().await?, ["emails"]);
/// let health = admin.health("emails").await?;
/// assert_eq!((health.stats.main, health.expired_leases), (1, 0));
/// let waiting = admin.waiting("emails", Page::first(20)).await?;
/// assert_eq!(waiting.jobs[0].job_type.as_deref(), Some("send"));
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Admin {
    queue: Queue,
}

impl Admin {
    /// Operator access through an existing [`Queue`] handle.
    pub fn new(queue: Queue) -> Self {
        Admin { queue }
    }

    /// Connects to Redis (`redis://`, `redis-cluster://`, `redis-sentinel://`).
    pub async fn connect(url: &str) -> Result<Self> {
        Ok(Admin::new(Queue::connect(url).await?))
    }

    /// The queue handle underneath (enqueue, raw reads).
    pub fn queue(&self) -> &Queue {
        &self.queue
    }

    /// The Redis server clock in milliseconds (the clock every timestamp of a
    /// job hash is taken from).
    pub async fn server_time_ms(&self) -> Result<i64> {
        let (s, us): (i64, i64) = redis::cmd("TIME")
            .query_async(&mut self.queue.connection())
            .await
            .map_err(AdminError::server("TIME"))?;
        Ok(s * 1000 + us / 1000)
    }
}

/// The URL without its password, for reports and logs
/// (`redis://:secret@host:6379/` → `redis://***@host:6379/`).
///
/// ```
/// assert_eq!(queue_core::admin::redact_url("redis://u:pw@h:1/0"), "redis://***@h:1/0");
/// assert_eq!(queue_core::admin::redact_url("redis://h:1/0"), "redis://h:1/0");
/// ```
pub fn redact_url(url: &str) -> String {
    crate::conn::redact(url)
}

/// A millisecond timestamp as a job hash or completion record stores it
/// (`enqueued_at`, `dead_at`, ...); `""`, `0` or garbage: none.
///
/// ```
/// assert_eq!(queue_core::admin::parse_ms("1733144701123"), Some(1_733_144_701_123));
/// assert_eq!(queue_core::admin::parse_ms(""), None);
/// ```
pub fn parse_ms(s: &str) -> Option<i64> {
    let v = s.trim().parse::<f64>().ok()?;
    (v > 0.0).then_some(v as i64)
}
