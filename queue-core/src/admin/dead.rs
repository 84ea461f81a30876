//! Dead letters: listing (newest first, with a reason/type filter and
//! paging), selecting the jobs a replay or purge acts on, replay
//! (`replay.lua`, then the relay of a notice it wrote for a batch on another
//! queue) and purge (`purge.lua`), one script each (DESIGN rule 1).

use std::collections::HashSet;

use tracing::{debug, warn};

use super::dead_scan::{utf8_id, DeadRow, DEAD_SCAN_CHUNK, ID_NOT_UTF8};
use super::jobs::JobInfo;
use super::{admin_script, Admin, Page, Result};
use crate::error::QueueError;
use crate::job::JobId;
use crate::keys::QueueKeys;
use crate::queue::Queue;
use crate::scripts::replay::{Replay, ReplayReply};

admin_script!(PURGE, "purge.lua", None);

/// One page of dead letters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeadLetters {
    /// Length of the whole dead-letter list (filter or not).
    pub total: u64,
    /// The page's jobs, newest first (a job whose hash is gone has no fields).
    pub jobs: Vec<JobInfo>,
}

/// Which dead-lettered jobs a replay or purge acts on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeadSelection {
    /// These ids (each is looked up, and reported when it is not dead).
    Ids(Vec<JobId>),
    /// Every dead-lettered job whose reason or type contains this text
    /// (case-insensitive).
    Matching(String),
    /// Every dead-lettered job of the queue.
    All,
}

/// A job picked for a replay or purge.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeadCandidate {
    /// Job id.
    pub id: JobId,
    /// Job type (cut to [`SELECTED_TEXT_CHARS`] characters in a
    /// selection of the whole list).
    pub job_type: Option<String>,
    /// Why it was dead-lettered (cut to [`SELECTED_TEXT_CHARS`] characters,
    /// `…` marking the cut, in a selection of the whole list).
    pub reason: Option<String>,
    /// `dead_at` when it was picked: pass it to [`Admin::purge_dead`] (or
    /// [`Admin::replay_dead_if_unchanged`]) so the purge (or replay) only acts
    /// on that dead-lettering (not a replay that died again since).
    pub dead_at: Option<String>,
    /// False when an id given in [`DeadSelection::Ids`] is not dead-lettered.
    pub is_dead: bool,
    /// Why its job key cannot be read (corrupt data: a key of another type).
    /// Skip it and report it: a replay or purge of it would be refused.
    pub unreadable: Option<String>,
}

impl DeadCandidate {
    fn of(id: JobId, info: Option<&JobInfo>) -> Self {
        let field = |name| info.and_then(|i| i.field(name)).map(str::to_string);
        DeadCandidate {
            is_dead: info.and_then(JobInfo::state) == Some("dead"),
            job_type: field("type"),
            reason: field("dead_reason"),
            dead_at: field("dead_at"),
            id,
            unreadable: None,
        }
    }

    /// An entry of the dead-letter list as [`Admin::scan_dead`] read it.
    fn listed(row: DeadRow) -> Self {
        DeadCandidate {
            id: JobId::from(row.id),
            job_type: row.job_type,
            reason: row.reason,
            dead_at: row.dead_at,
            is_dead: true,
            unreadable: row.unreadable,
        }
    }

    /// This candidate as a whole-list selection keeps it: its reason and
    /// type cut to [`SELECTED_TEXT_CHARS`] characters.
    fn selected(self) -> Self {
        DeadCandidate {
            job_type: preview_text(self.job_type),
            reason: preview_text(self.reason),
            ..self
        }
    }
}

/// The characters of a dead letter's reason and type that a selection of
/// the whole list ([`Admin::select_dead`] with a filter or `All`) keeps:
/// enough for a preview line. The action needs only the id and `dead_at`;
/// an error text can be large (a stack trace, a response body), and a
/// selection holding each in full held gigabytes for a big list.
pub const SELECTED_TEXT_CHARS: usize = 200;

/// `text` cut to [`SELECTED_TEXT_CHARS`] characters, `…` marking a cut.
fn preview_text(text: Option<String>) -> Option<String> {
    let mut text = text?;
    if let Some((at, _)) = text.char_indices().nth(SELECTED_TEXT_CHARS) {
        text.truncate(at);
        text.push('…');
        text.shrink_to_fit();
    }
    Some(text)
}

/// One chunk of a selection over the dead-letter list
/// ([`Admin::select_dead_chunk`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeadChunk {
    /// The matching entries of the chunk, in list order (newest first),
    /// and every entry whose job key cannot be read
    /// ([`DeadCandidate::unreadable`]: its type and reason are unknown).
    pub candidates: Vec<DeadCandidate>,
    /// Entries read (continue at `from + read`, less the entries this chunk's
    /// caller removed from the list since).
    pub read: u64,
    /// Length of the dead-letter list when the chunk was read.
    pub total: u64,
}

/// What a replay of one id did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReplayOutcome {
    /// Moved back to main.
    Replayed,
    /// The id is not in the dead-letter list: nothing changed.
    NotDead,
    /// Replayed and dead-lettered again since it was picked (another
    /// `dead_at` than the one given to
    /// [`Admin::replay_dead_if_unchanged`]): left alone.
    Changed,
}

/// What a purge of one id did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PurgeOutcome {
    /// Deleted: dead-list entry, hash and step results.
    Purged,
    /// The id is not in the dead-letter list: nothing changed.
    NotDead,
    /// Replayed and dead-lettered again since it was picked: left alone.
    Changed,
}

/// Whether a dead letter with this reason and type matches `needle`
/// (lowercase; case-insensitive: either contains it). An entry whose job key
/// cannot be read always matches: nothing says it does not, and a replay or
/// purge with the same filter reports it. The one rule of `dead list
/// --filter` and of a replay or purge's selection.
fn matches(unreadable: bool, reason: Option<&str>, job_type: Option<&str>, needle: &str) -> bool {
    unreadable
        || [reason, job_type]
            .iter()
            .any(|v| v.is_some_and(|v| v.to_lowercase().contains(needle)))
}

/// A listed dead entry whose job cannot be read: no fields but `unreadable`.
fn unreadable_info(id: JobId, why: String) -> JobInfo {
    let mut info = JobInfo::empty(id);
    info.fields.insert("unreadable".into(), why);
    info
}

impl Queue {
    /// Dead-lettered jobs, newest first: `count` entries from `offset`. An
    /// entry whose job key holds another type (corrupt data) is listed with
    /// the error in its `unreadable` field.
    pub async fn dead_letters(
        &self,
        queue: &str,
        offset: u64,
        count: u64,
    ) -> crate::Result<Vec<JobInfo>> {
        let k = QueueKeys::new(queue);
        if count == 0 {
            return Ok(Vec::new());
        }
        let ids: Vec<Vec<u8>> = redis::cmd("LRANGE")
            .arg(&k.dead)
            .arg(offset)
            .arg(offset.saturating_add(count - 1).min(i64::MAX as u64))
            .query_async(&mut self.connection())
            .await
            .map_err(|e| QueueError::redis(queue, None, e))?;
        let mut out = Vec::with_capacity(ids.len());
        for id in ids {
            // An id that is not UTF-8 (no JobId names it) is listed under
            // its lossy form as unreadable, not a failed listing.
            out.push(match utf8_id(id) {
                Ok(id) => self.dead_info(queue, JobId::from(id)).await?,
                Err(shown) => unreadable_info(JobId::from(shown), ID_NOT_UTF8.into()),
            });
        }
        Ok(out)
    }

    /// Dead entry `id` as a listing shows it: its hash (empty when gone),
    /// or, for a job key of another type (corrupt data), the reason in its
    /// `unreadable` field instead of a failed listing.
    async fn dead_info(&self, queue: &str, id: JobId) -> crate::Result<JobInfo> {
        match self.job(queue, &id).await {
            Ok(info) => Ok(info.unwrap_or_else(|| JobInfo::empty(id))),
            Err(e) if e.is_data_error() => Ok(unreadable_info(id, e.to_string())),
            Err(e) => Err(e),
        }
    }

    /// Moves a dead-lettered job back to main. With `reset_attempts` its
    /// attempt count restarts at 0. Returns false when `id` is not dead-lettered.
    ///
    /// A member of a batch on another queue (a cross-queue flow's child)
    /// is counted as unfinished again through a relay notice the replay
    /// writes on `queue`: this call relays `queue` before it returns, so the
    /// batch stops counting the member as dead within the call, not at the
    /// next relay run (a watchdog pass). Before, a sibling finishing in
    /// between fired the batch with the member still dead (a `FailParent`
    /// parent was dead-lettered). A relay that fails is logged, not an
    /// error (the job is replayed; the next relay run applies the notice).
    pub async fn replay_dead(
        &self,
        queue: &str,
        id: impl Into<JobId>,
        reset_attempts: bool,
    ) -> crate::Result<bool> {
        let reply = self
            .replay_dead_at(queue, id.into(), reset_attempts, None)
            .await?;
        Ok(reply == ReplayReply::Replayed)
    }

    /// [`replay_dead`](Self::replay_dead), and with `expected_dead_at` only
    /// while the job is still that dead-lettering: [`ReplayReply::Changed`]
    /// (nothing done) when it was replayed and dead-lettered again since. A
    /// replay that wrote a relay notice answers [`ReplayReply::Replayed`],
    /// the notice relayed.
    async fn replay_dead_at(
        &self,
        queue: &str,
        id: JobId,
        reset_attempts: bool,
        expected_dead_at: Option<&str>,
    ) -> crate::Result<ReplayReply> {
        let keys = QueueKeys::new(queue);
        let replay = Replay {
            keys: &keys,
            id: &id,
            reset_attempts,
        };
        let mut conn = self.connection();
        match replay.run_expecting(&mut conn, expected_dead_at).await? {
            r @ (ReplayReply::NotDead | ReplayReply::Changed | ReplayReply::Replayed) => Ok(r),
            ReplayReply::ReplayedNoticed => {
                match crate::workflow::relay::relay_queue(&mut conn, queue).await {
                    Ok(r) => debug!(queue = %queue, job_id = %id, applied = r.applied,
                        "replayed a member of a batch on another queue: its notice relayed"),
                    Err(e) => warn!(queue = %queue, job_id = %id, error = %e,
                        "replayed a member of a batch on another queue, but relaying its notice \
                         failed: the batch counts it as dead until the next relay run (a worker \
                         of the queue, the watchdog's next pass)"),
                }
                Ok(ReplayReply::Replayed)
            }
        }
    }
}

impl Admin {
    /// Dead-lettered jobs of `queue`, newest first; with `filter`, only those
    /// whose reason or type contains it (case-insensitive), `page` counting
    /// matching jobs. A filter reads the list in chunks of
    /// [`DEAD_SCAN_CHUNK`] ([`select_dead_chunk`](Self::select_dead_chunk):
    /// one call each, no payloads) and reads whole only the jobs of the page.
    ///
    /// ```
    /// # #[tokio::main] async fn main() -> Result<(), queue_core::admin::AdminError> {
    /// # let server = queue_testkit::RedisServer::start().unwrap();
    /// use queue_core::admin::{Admin, Page, PurgeOutcome, ReplayOutcome};
    ///
    /// let admin = Admin::connect(&server.url()).await?;
    /// let dead = admin.dead_letters("emails", Some("smtp"), Page::first(50)).await?;
    /// for job in &dead.jobs {
    ///     println!("{} died: {}", job.id, job.field("dead_reason").unwrap_or("?"));
    /// }
    /// assert_eq!(dead.total, 0);
    /// assert_eq!(admin.replay_dead("emails", "nope", false).await?, ReplayOutcome::NotDead);
    /// assert_eq!(admin.purge_dead("emails", "nope", None).await?, PurgeOutcome::NotDead);
    /// # Ok(()) }
    /// ```
    pub async fn dead_letters(
        &self,
        queue: &str,
        filter: Option<&str>,
        page: Page,
    ) -> Result<DeadLetters> {
        let total: u64 = redis::cmd("LLEN")
            .arg(QueueKeys::new(queue).dead)
            .query_async(&mut self.queue.connection())
            .await
            .map_err(|e| QueueError::redis(queue, None, e))?;
        let Some(needle) = filter.map(str::to_lowercase) else {
            let count = page.limit.min(total.saturating_sub(page.offset));
            let jobs = self.queue.dead_letters(queue, page.offset, count).await?;
            return Ok(DeadLetters { total, jobs });
        };
        // The list is read in chunks by `dead_scan.lua` (type, reason,
        // `dead_at`: no payloads, one call per chunk) and judged here; only
        // the matching entries of the page are read whole. Before, every
        // entry was read whole (HGETALL, payload included), one round trip
        // each: a million for a long list and a rare filter.
        let (mut jobs, mut skipped, mut from) = (Vec::new(), 0u64, 0u64);
        let mut seen = HashSet::new();
        while from < total && (jobs.len() as u64) < page.limit {
            let chunk = self.select_dead_chunk(queue, Some(&needle), from).await?;
            from += chunk.read;
            for c in chunk.candidates {
                // Entries pushed at the head between two chunks shift the
                // list: the next chunk reads some again. Listed once.
                if !seen.insert((c.id.clone(), c.dead_at.clone())) {
                    continue;
                }
                if skipped < page.offset {
                    skipped += 1;
                } else if (jobs.len() as u64) < page.limit {
                    jobs.push(match c.unreadable {
                        Some(why) if why == ID_NOT_UTF8 => unreadable_info(c.id, why),
                        _ => self.queue.dead_info(queue, c.id).await?,
                    });
                }
            }
            if chunk.read == 0 {
                break;
            }
        }
        Ok(DeadLetters { total, jobs })
    }

    /// The jobs `selection` names. Ids are looked up one by one (an id that
    /// is not dead-lettered comes back with `is_dead: false`); a filter or
    /// `All` reads the dead-letter list in chunks ([`select_dead_chunk`](Self::select_dead_chunk):
    /// no payloads) and keeps of each selected entry's reason and type only
    /// the first [`SELECTED_TEXT_CHARS`] characters. An entry whose job key cannot be read comes back with
    /// [`unreadable`](DeadCandidate::unreadable) set instead of failing the
    /// selection.
    pub async fn select_dead(
        &self,
        queue: &str,
        selection: &DeadSelection,
    ) -> Result<Vec<DeadCandidate>> {
        let filter = match selection {
            DeadSelection::Ids(ids) => {
                let mut out = Vec::with_capacity(ids.len());
                for id in ids {
                    out.push(self.dead_candidate(queue, id).await?);
                }
                return Ok(out);
            }
            DeadSelection::Matching(text) => Some(text.as_str()),
            DeadSelection::All => None,
        };
        self.select_dead_chunks(queue, filter, async || {}).await
    }

    /// The chunked selection of [`select_dead`](Self::select_dead);
    /// `between` runs after each chunk but the last (a test moves the list
    /// there). Each dead-lettering (id and `dead_at`) is selected once: dead
    /// letters pushed at the head between two chunks shift the list, so the
    /// next chunk reads the previous one's last entries again. Before, they
    /// were selected twice: a purge reported its second try as not found
    /// and exited 1.
    pub(super) async fn select_dead_chunks(
        &self,
        queue: &str,
        filter: Option<&str>,
        mut between: impl AsyncFnMut(),
    ) -> Result<Vec<DeadCandidate>> {
        let (mut out, mut from) = (Vec::new(), 0);
        let mut seen = HashSet::new();
        loop {
            let chunk = self.select_dead_chunk(queue, filter, from).await?;
            from += chunk.read;
            out.extend(
                chunk
                    .candidates
                    .into_iter()
                    .filter(|c| seen.insert((c.id.clone(), c.dead_at.clone())))
                    .map(DeadCandidate::selected),
            );
            if chunk.read == 0 || from >= chunk.total {
                return Ok(out);
            }
            between().await;
        }
    }

    /// One chunk of at most [`DEAD_SCAN_CHUNK`] dead-letter entries from list
    /// position `from`, read by one read-only script ([`Admin::scan_dead`]:
    /// type, reason and `dead_at`, never payloads): the entries whose reason
    /// or type contains `filter` (case-insensitive; `None`: all), and every
    /// entry whose job key cannot be read. A caller that replays or purges
    /// the chunk's entries continues at `from + read - removed`.
    pub async fn select_dead_chunk(
        &self,
        queue: &str,
        filter: Option<&str>,
        from: u64,
    ) -> Result<DeadChunk> {
        let needle = filter.map(str::to_lowercase);
        let scan = self
            .scan_dead(queue, from, DEAD_SCAN_CHUNK, None, None, DEAD_SCAN_CHUNK)
            .await?;
        let keep = |r: &DeadRow| {
            needle.as_deref().is_none_or(|n| {
                let unreadable = r.unreadable.is_some();
                matches(unreadable, r.reason.as_deref(), r.job_type.as_deref(), n)
            })
        };
        Ok(DeadChunk {
            candidates: scan
                .rows
                .into_iter()
                .filter(keep)
                .map(DeadCandidate::listed)
                .collect(),
            read: scan.read,
            total: scan.total,
        })
    }

    /// Job `id` as a replay or purge by id picks it: a job key of another
    /// type is reported (`unreadable`), not an error.
    async fn dead_candidate(&self, queue: &str, id: &JobId) -> Result<DeadCandidate> {
        // The job's read refuses a key of another type; only then is its
        // type read, for the report (one round trip for a readable job).
        match self.queue.job(queue, id).await {
            Ok(info) => Ok(DeadCandidate::of(id.clone(), info.as_ref())),
            Err(e) if e.is_data_error() => {
                let kind: String = redis::cmd("TYPE")
                    .arg(QueueKeys::new(queue).job(id.as_str()))
                    .query_async(&mut self.queue.connection())
                    .await
                    .map_err(|e| QueueError::redis(queue, Some(id), e))?;
                Ok(DeadCandidate {
                    unreadable: Some(format!("corrupt job key: holds a {kind}, not a hash")),
                    ..DeadCandidate::of(id.clone(), None)
                })
            }
            Err(e) => Err(e.into()),
        }
    }

    /// Moves dead-lettered job `id` back to main (attempts restart at 0 with
    /// `reset_attempts`), in one script. Never answers
    /// [`ReplayOutcome::Changed`]: whichever dead-lettering the job is, it
    /// is replayed.
    pub async fn replay_dead(
        &self,
        queue: &str,
        id: impl Into<JobId>,
        reset_attempts: bool,
    ) -> Result<ReplayOutcome> {
        self.replay_dead_if_unchanged(queue, id, reset_attempts, None)
            .await
    }

    /// [`replay_dead`](Self::replay_dead), only while job `id` is still the
    /// dead-lettering that was selected: with `expected_dead_at` (from
    /// [`DeadCandidate::dead_at`]), a job replayed and dead-lettered again
    /// since (another `dead_at`) is left alone and answers
    /// [`ReplayOutcome::Changed`], as [`purge_dead`](Self::purge_dead)
    /// answers [`PurgeOutcome::Changed`]. A bulk replay confirms a selection,
    /// then replays it: without this, a later dead-lettering of a selected
    /// job, one the confirmation never showed, was replayed. `None`: as
    /// [`replay_dead`](Self::replay_dead).
    ///
    /// ```
    /// # #[tokio::main] async fn main() -> Result<(), queue_core::admin::AdminError> {
    /// # let server = queue_testkit::RedisServer::start().unwrap();
    /// use queue_core::admin::{Admin, DeadSelection, ReplayOutcome};
    ///
    /// let admin = Admin::connect(&server.url()).await?;
    /// let picked = admin.select_dead("emails", &DeadSelection::All).await?;
    /// for c in &picked {
    ///     let expected = c.dead_at.as_deref();
    ///     match admin.replay_dead_if_unchanged("emails", c.id.clone(), false, expected).await? {
    ///         ReplayOutcome::Replayed => println!("replayed {}", c.id),
    ///         ReplayOutcome::Changed => println!("{} died again since: left alone", c.id),
    ///         ReplayOutcome::NotDead => println!("{} is no longer dead", c.id),
    ///     }
    /// }
    /// let outcome = admin.replay_dead_if_unchanged("emails", "nope", false, Some("1")).await?;
    /// assert_eq!(outcome, ReplayOutcome::NotDead);
    /// # Ok(()) }
    /// ```
    pub async fn replay_dead_if_unchanged(
        &self,
        queue: &str,
        id: impl Into<JobId>,
        reset_attempts: bool,
        expected_dead_at: Option<&str>,
    ) -> Result<ReplayOutcome> {
        let reply = self
            .queue
            .replay_dead_at(queue, id.into(), reset_attempts, expected_dead_at)
            .await?;
        Ok(match reply {
            ReplayReply::Replayed | ReplayReply::ReplayedNoticed => ReplayOutcome::Replayed,
            ReplayReply::Changed => ReplayOutcome::Changed,
            ReplayReply::NotDead => ReplayOutcome::NotDead,
        })
    }

    /// Deletes dead-lettered job `id` for good (dead-list entry, hash, step
    /// results) in one script. With `expected_dead_at` (from
    /// [`DeadCandidate::dead_at`]), only if it is still that dead-lettering.
    pub async fn purge_dead(
        &self,
        queue: &str,
        id: impl Into<JobId>,
        expected_dead_at: Option<&str>,
    ) -> Result<PurgeOutcome> {
        let id = id.into();
        let k = QueueKeys::new(queue);
        let r: i64 = PURGE
            .key(&k.dead)
            .key(k.job(id.as_str()))
            .key(k.steps(id.as_str()))
            .key(&k.stats)
            .key(&k.guard)
            .arg(id.as_str())
            .arg(expected_dead_at.unwrap_or(""))
            .invoke_async(&mut self.queue.connection())
            .await
            .map_err(|e| QueueError::redis(queue, Some(&id), e))?;
        Ok(match r {
            1 => PurgeOutcome::Purged,
            -1 => PurgeOutcome::Changed,
            _ => PurgeOutcome::NotDead,
        })
    }
}
