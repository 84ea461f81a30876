//! Operating batches (docs/WORKFLOWS.md, "Operating batches"): a page of a
//! queue's batches, newest first, from the index `batch_open.lua` writes
//! ([`Admin::batches`], `batches.lua`), and everything about one batch —
//! counts, TTL, callbacks or parent, members with their outcomes, the DAG it
//! belongs to ([`Admin::batch_detail`], `batch.lua`, then
//! `batch_members.lua` on each other queue its members are on). All are
//! read-only scripts (one snapshot each per queue); [`batch_links`] names the
//! batches a job's hash points to (its page links to them).

use std::collections::HashMap;

use redis::Value;
use serde::Serialize;

use super::{admin_script, Admin, JobInfo, Page, Result, READ_ONLY};
use crate::error::QueueError;
use crate::keys::QueueKeys;
use crate::scripts::reply::Fields;
use crate::workflow::parse_key;

admin_script!(LIST, "batches.lua", READ_ONLY);
admin_script!(DETAIL, "batch.lua", READ_ONLY);
admin_script!(MEMBERS, "batch_members.lua", READ_ONLY);

/// The outcome of a member of a batch opened before members on other queues
/// were recorded, not found on the batch's queue and not counted: it may be
/// on another queue (its state unknown here) or never enqueued.
pub const OUTCOME_ELSEWHERE: &str = "on another queue or not enqueued";

/// Members listed at most by [`Admin::batch_detail`].
pub const BATCH_MEMBER_CAP: u64 = 500;

/// One batch in a listing.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct BatchRow {
    /// The batch id (a flow's or DAG step's: the parent's job id).
    pub id: String,
    /// `open`, `sealed` or `fired`.
    pub state: String,
    /// Members registered.
    pub total: u64,
    /// Members that completed.
    pub succeeded: u64,
    /// Members dead-lettered.
    pub dead: u64,
    /// Members cancelled.
    pub cancelled: u64,
    /// Fail-parent members that did not succeed.
    pub failed: u64,
    /// When it was opened (ms, Redis clock).
    pub created_at_ms: i64,
    /// When it was sealed.
    pub sealed_at_ms: Option<i64>,
    /// When it fired.
    pub fired_at_ms: Option<i64>,
    /// An open batch: when it expires unless sealed.
    pub expires_at_ms: Option<i64>,
    /// The DAG it belongs to, if any.
    pub dag: Option<String>,
}

impl BatchRow {
    /// Members finished (succeeded, dead or cancelled).
    pub fn finished(&self) -> u64 {
        self.succeeded + self.dead + self.cancelled
    }
}

/// A page of [`Admin::batches`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct BatchListing {
    /// Redis clock when the page was read.
    pub now_ms: i64,
    /// Entries in the index (including expired ones not yet swept).
    pub indexed: u64,
    /// The page's batches, newest first.
    pub batches: Vec<BatchRow>,
    /// Entries of this page whose batch expired (left out of `batches`).
    pub expired: u64,
    /// The offset of the next page, when there is one.
    pub next_offset: Option<u64>,
}

/// A callback of a batch, or a flow's / DAG step's parent.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct BatchCallback {
    /// `on_success` or `on_complete` (a flow's parent, a DAG's step).
    pub role: &'static str,
    /// Its job id.
    pub id: String,
    /// Its job type.
    pub job_type: String,
}

/// One member and what became of it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct BatchMember {
    /// Job id.
    pub id: String,
    /// Counted by the batch (it finished).
    pub counted: bool,
    /// `succeeded`, `failed` (flows: with `reason`), the job's state while
    /// its hash exists (`queued`, `active`, `dead`, ...; read on the
    /// member's own queue), `completed` (a completion record), `finished`,
    /// `not enqueued`, or [`OUTCOME_ELSEWHERE`] (a batch opened by an older
    /// version: a member not on the batch's queue may be on another one).
    pub outcome: String,
    /// Why it failed, when the batch recorded it.
    pub reason: Option<String>,
    /// Its queue when it is not the batch's (recorded when it was
    /// registered); `None`: the batch's queue (or unknown, see
    /// [`OUTCOME_ELSEWHERE`]).
    pub queue: Option<String>,
}

/// A step of the DAG a batch belongs to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DagStepInfo {
    /// The step name (its job id: `<dag>:<name>`).
    pub name: String,
    /// The steps it runs after (`name=continue` / `name=ignore`: the policy).
    pub after: Vec<String>,
}

/// Everything about one batch ([`Admin::batch_detail`](crate::admin::Admin::batch_detail)).
///
/// `#[non_exhaustive]`: a later version may add a field without breaking
/// your code, so it is read, not built, outside this crate (not even from
/// another one):
///
/// ```compile_fail,E0639
/// fn copy(d: queue_core::admin::BatchDetail) -> queue_core::admin::BatchDetail {
///     queue_core::admin::BatchDetail { ..d }
/// }
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct BatchDetail {
    /// Its home queue.
    pub queue: String,
    /// State and counts.
    #[serde(flatten)]
    pub row: BatchRow,
    /// Redis clock when read.
    pub now_ms: i64,
    /// Time to live of its hash (ms): open batches (the open TTL) and fired
    /// ones (kept 7 days); `None`: kept (sealed, waiting for members).
    pub ttl_ms: Option<i64>,
    /// The default member policy (`fail` for flows and DAGs; none: a batch).
    pub policy: Option<String>,
    /// The first fail-parent member that failed, with its reason. `None`
    /// also while a replay of the member it named left others counted: the
    /// fire works the first of them out.
    pub failed_child: Option<String>,
    /// What the batch could not do because its data was corrupt (a
    /// callback not queued, a member not counted; docs/WORKFLOWS.md), one
    /// line each; `None`: nothing.
    pub errors: Option<String>,
    /// Callbacks (a flow's or DAG step's parent is `on_complete`).
    pub callbacks: Vec<BatchCallback>,
    /// Batches the parent is itself a member of (nested flows, DAG steps
    /// with dependents), as (queue, id).
    pub parent_feeds: Vec<(String, String)>,
    /// Members registered.
    pub members_total: u64,
    /// Members, sorted by id, at most [`BATCH_MEMBER_CAP`]: all of them, or
    /// (see [`members_sample`](Self::members_sample)) a sample of that many.
    pub members: Vec<BatchMember>,
    /// True when the batch has more members than [`members`](Self::members)
    /// lists: they are the first [`BATCH_MEMBER_CAP`] that `SSCAN` yielded
    /// (sorted), not the first by id, so that one call never reads or sorts
    /// a whole large member set.
    pub members_sample: bool,
    /// The DAG's steps, when the batch belongs to one: all of them, or
    /// for a DAG of more than 256 steps only this batch's own step (each
    /// batch of such a DAG stores its own line, not the whole shape).
    pub dag_steps: Vec<DagStepInfo>,
    /// How many steps the DAG has (more than [`dag_steps`](Self::dag_steps)
    /// lists for a DAG of more than 256 steps); 0 outside a DAG.
    pub dag_steps_total: usize,
}

/// A batch a job's hash points to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct BatchLink {
    /// `member` (the job counts in it) or `spawned_by` (a callback or parent).
    pub role: &'static str,
    /// The batch's home queue.
    pub queue: String,
    /// The batch id.
    pub id: String,
}

/// The batches job `info` belongs to (its `batch` field: one key a line)
/// or was spawned by (`batch_of`); unparsable keys are left out.
pub fn batch_links(info: &JobInfo) -> Vec<BatchLink> {
    let mut out = Vec::new();
    for (field, role) in [("batch", "member"), ("batch_of", "spawned_by")] {
        for key in info.field(field).unwrap_or("").lines() {
            if let Some(b) = parse_key(key) {
                out.push(BatchLink {
                    role,
                    queue: b.queue,
                    id: b.id,
                });
            }
        }
    }
    out
}

fn opt_ms(s: &str, what: &str, queue: &str, id: &str) -> Result<Option<i64>> {
    if s.is_empty() {
        return Ok(None);
    }
    s.parse().map(Some).map_err(|_| {
        QueueError::Workflow {
            queue: queue.to_string(),
            batch: id.to_string(),
            detail: format!("corrupt field {what}: {s:?}"),
        }
        .into()
    })
}

fn row_from(queue: &str, id: &str, get: impl Fn(&str) -> String) -> Result<BatchRow> {
    let n = |name: &str| -> Result<u64> {
        Ok(opt_ms(&get(name), name, queue, id)?.unwrap_or(0).max(0) as u64)
    };
    Ok(BatchRow {
        id: id.to_string(),
        state: get("state"),
        total: n("total")?,
        succeeded: n("succeeded")?,
        dead: n("dead")?,
        cancelled: n("cancelled")?,
        failed: n("failed")?,
        created_at_ms: opt_ms(&get("created_at"), "created_at", queue, id)?.unwrap_or(0),
        sealed_at_ms: opt_ms(&get("sealed_at"), "sealed_at", queue, id)?,
        fired_at_ms: opt_ms(&get("fired_at"), "fired_at", queue, id)?,
        expires_at_ms: opt_ms(&get("expires_at"), "expires_at", queue, id)?,
        dag: Some(get("m_dag")).filter(|d| !d.is_empty()),
    })
}

/// `m_steps` (one line a step: `name<TAB>dep,dep`) as steps.
fn dag_steps(text: &str) -> Vec<DagStepInfo> {
    text.lines()
        .filter(|l| !l.is_empty())
        .map(|l| {
            let (name, deps) = l.split_once('\t').unwrap_or((l, ""));
            DagStepInfo {
                name: name.to_string(),
                after: deps
                    .split(',')
                    .filter(|d| !d.is_empty())
                    .map(str::to_string)
                    .collect(),
            }
        })
        .collect()
}

impl Admin {
    /// A page of `queue`'s batches, newest first (open, sealed and fired;
    /// fired ones stay listed until they expire 7 days after firing).
    pub async fn batches(&self, queue: &str, page: Page) -> Result<BatchListing> {
        let k = QueueKeys::new(queue);
        let limit = page.limit.min(1 << 20);
        let reply: Value = LIST
            .key(k.batches())
            .key(&k.guard)
            .arg(page.offset.min(1 << 40))
            .arg(limit)
            .arg(k.batch(""))
            .invoke_async(&mut self.queue.connection())
            .await
            .map_err(|e| QueueError::redis(queue, None, e))?;
        let f = Fields::new(queue, None, "batches reply", &reply)?;
        let now_ms = f.int(0, "now")?;
        let indexed = f.u64(1, "entries")?;
        let mut batches = Vec::new();
        let mut expired = 0;
        let mut entries = 0;
        for item in f.list(2, "rows")? {
            entries += 1;
            let r = Fields::new(queue, None, "batches row", item)?;
            const NAMES: [&str; 10] = [
                "state",
                "total",
                "succeeded",
                "dead",
                "cancelled",
                "failed",
                "sealed_at",
                "fired_at",
                "expires_at",
                "m_dag",
            ];
            let id = r.text(0, "id")?;
            let mut map: HashMap<&str, String> = HashMap::new();
            map.insert("created_at", r.text(1, "created_at")?);
            for (i, name) in NAMES.iter().enumerate() {
                map.insert(name, r.text(2 + i, name)?);
            }
            if map["state"].is_empty() {
                expired += 1;
                continue;
            }
            // The index score is the creation time, written with the hash.
            let created = map["created_at"]
                .split('.')
                .next()
                .unwrap_or("")
                .to_string();
            map.insert("created_at", created);
            batches.push(row_from(queue, &id, |n| {
                map.get(n).cloned().unwrap_or_default()
            })?);
        }
        let next = page.offset + entries;
        Ok(BatchListing {
            now_ms,
            indexed,
            batches,
            expired,
            next_offset: (entries == limit && next < indexed).then_some(next),
        })
    }

    /// Everything about batch `id` homed on `queue`; `None` when there is
    /// no such batch (never opened, or expired).
    pub async fn batch_detail(&self, queue: &str, id: &str) -> Result<Option<BatchDetail>> {
        let k = QueueKeys::new(queue);
        let reply: Value = DETAIL
            .key(k.batch(id))
            .key(&k.guard)
            .arg(&k.job_prefix)
            .arg(&k.done_prefix)
            .arg(BATCH_MEMBER_CAP)
            .invoke_async(&mut self.queue.connection())
            .await
            .map_err(|e| QueueError::redis(queue, None, e))?;
        let f = Fields::new(queue, None, "batch reply", &reply)?;
        if f.len() == 0 {
            return Ok(None);
        }
        let now_ms = f.int(0, "now")?;
        let pttl = f.int(1, "pttl")?;
        let pairs = f.list(2, "fields")?;
        let mut map: HashMap<String, String> = HashMap::new();
        for pair in pairs.chunks(2) {
            if let [name, value] = pair {
                let text = |v: &Value| crate::scripts::reply::text(v).unwrap_or_default();
                map.insert(text(name), text(value));
            }
        }
        let get = |n: &str| map.get(n).cloned().unwrap_or_default();
        let row = row_from(queue, id, get)?;
        let mut callbacks = Vec::new();
        for (prefix, role) in [("s_", "on_success"), ("c_", "on_complete")] {
            if let Some(cb) = map.get(&format!("{prefix}id")) {
                callbacks.push(BatchCallback {
                    role,
                    id: cb.clone(),
                    job_type: map
                        .get(&format!("{prefix}type"))
                        .cloned()
                        .unwrap_or_default(),
                });
            }
        }
        let parent_feeds = map
            .get("c_member")
            .map(|m| {
                m.lines()
                    .filter_map(parse_key)
                    .map(|b| (b.queue, b.id))
                    .collect()
            })
            .unwrap_or_default();
        let mut rows = Vec::new();
        for item in f.list(4, "members")? {
            let r = Fields::new(queue, None, "batch member", item)?;
            rows.push(MemberRow {
                id: r.text(0, "id")?,
                counted: r.u64(1, "counted")? == 1,
                // Bytes: a child's typed value (`0xc1` + MessagePack) is no UTF-8.
                result: r.bytes(2, "result")?,
                state: r.text(3, "state")?,
                completed: r.u64(4, "done")? == 1,
                place: r.text(5, "queue")?,
            });
        }
        self.read_members_elsewhere(&k.batch(id), &mut rows).await?;
        let members = rows.into_iter().map(MemberRow::member).collect();
        Ok(Some(BatchDetail {
            queue: queue.to_string(),
            now_ms,
            ttl_ms: (pttl >= 0).then_some(pttl),
            policy: map.get("policy").cloned(),
            // '': a replay cleared the named child; the fire works the first
            // failure out (prelude.lua wf_unfinish).
            failed_child: map.get("failed_child").filter(|f| !f.is_empty()).cloned(),
            errors: batch_errors(&map),
            callbacks,
            parent_feeds,
            members_total: f.u64(3, "members")?,
            members_sample: f.u64(5, "sample")? == 1,
            members,
            dag_steps_total: get("m_steps_total")
                .parse()
                .unwrap_or_else(|_| dag_steps(&get("m_steps")).len()),
            dag_steps: dag_steps(&get("m_steps")),
            row,
        }))
    }
}

/// A member as `batch.lua` listed it, its state read on its own queue.
struct MemberRow {
    id: String,
    counted: bool,
    result: Vec<u8>,
    state: String,
    completed: bool,
    /// `""` the batch's queue, `"?"` unknown (a batch of an older version),
    /// else the member's queue.
    place: String,
}

impl MemberRow {
    fn member(self) -> BatchMember {
        let elsewhere = self.place == "?";
        let (outcome, reason) = if self.result.starts_with(b"ok:") {
            ("succeeded".to_string(), None)
        } else if let Some(reason) = self.result.strip_prefix(b"err:") {
            (
                "failed".to_string(),
                Some(String::from_utf8_lossy(reason).into_owned()),
            )
        } else if !self.state.is_empty() {
            (self.state, None)
        } else if elsewhere && !self.counted {
            (OUTCOME_ELSEWHERE.to_string(), None)
        } else if self.completed {
            ("completed".to_string(), None)
        } else if self.counted {
            ("finished".to_string(), None)
        } else {
            ("not enqueued".to_string(), None)
        };
        BatchMember {
            id: self.id,
            counted: self.counted,
            outcome,
            reason,
            queue: (!self.place.is_empty() && !elsewhere).then_some(self.place),
        }
    }
}

impl Admin {
    /// Fills in the state and completion record of the `rows` on other
    /// queues than the batch's (`batch` its key): one read-only script per
    /// queue, on that queue's own keys (another cluster slot, maybe).
    async fn read_members_elsewhere(&self, batch: &str, rows: &mut [MemberRow]) -> Result<()> {
        let mut queues: Vec<String> = Vec::new();
        for r in rows.iter() {
            if !r.place.is_empty() && r.place != "?" && !queues.contains(&r.place) {
                queues.push(r.place.clone());
            }
        }
        for q in queues {
            let k = QueueKeys::new(&q);
            let idx: Vec<usize> = (0..rows.len()).filter(|&i| rows[i].place == q).collect();
            let mut call = MEMBERS.key(&k.guard);
            call.arg(batch).arg(&k.job_prefix).arg(&k.done_prefix);
            for &i in &idx {
                call.arg(&rows[i].id);
            }
            let reply: Value = call
                .invoke_async(&mut self.queue.connection())
                .await
                .map_err(|e| QueueError::redis(&q, None, e))?;
            let items = crate::scripts::reply::array(&reply).unwrap_or_default();
            if items.len() != idx.len() {
                return Err(QueueError::protocol(
                    &q,
                    None,
                    format!(
                        "batch members reply: {} rows for {} members",
                        items.len(),
                        idx.len()
                    ),
                )
                .into());
            }
            for (item, &i) in items.iter().zip(&idx) {
                let r = Fields::new(&q, None, "batch member", item)?;
                rows[i].state = r.text(0, "state")?;
                rows[i].completed = r.u64(1, "done")? == 1;
            }
        }
        Ok(())
    }
}

/// `fire_error` and `count_error` of a batch hash, joined (none: `None`).
fn batch_errors(map: &HashMap<String, String>) -> Option<String> {
    let lines: Vec<&str> = ["fire_error", "count_error"]
        .iter()
        .filter_map(|f| map.get(*f).map(String::as_str))
        .filter(|v| !v.is_empty())
        .collect();
    (!lines.is_empty()).then(|| lines.join("\n"))
}
