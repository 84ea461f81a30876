//! The invariant checker ([`Admin::check`], `queue-watchdog check`): walks a
//! queue's structures and job hashes with the read-only `check.lua`, and
//! reports what breaks the invariants the design relies on
//! ([`Violation`]), optionally repairing what can be repaired
//! (`repair.rs`).
//!
//! How it stays cheap on a big, live queue:
//! - each structure is read in pages of [`PAGE`] ids, job hashes are found by
//!   `SCAN` (never `KEYS`);
//! - memory is one 64-bit fingerprint and a byte per id seen (where it is listed);
//! - a page row only makes an id *suspicious*; an id is reported only after one
//!   atomic probe (`check.lua` mode `probe`) confirms it, so a job that moved
//!   between two pages is never reported.
//!
//! A fingerprint collision (2⁻⁶⁴ per pair) can only hide an orphan hash, never
//! report a false one.

use std::collections::hash_map::DefaultHasher;
use std::collections::{BTreeSet, HashMap};
use std::hash::{Hash, Hasher};

use redis::Value;
use serde::Serialize;

use super::check_rules::{
    field_problems, group_violation, is_count, probe_violations, row_suspicious, GroupProbe,
    JobRow, Place, Probe, Violation,
};
use super::repair::{Repair, RepairAction};
use super::{admin_script, Admin, AdminError, Result, READ_ONLY};
use crate::error::QueueError;
use crate::job::JobId;
use crate::keys::QueueKeys;
use crate::scripts::reclaim::RECLAIM_MARK;

admin_script!(CHECK, "check.lua", READ_ONLY);

/// Ids read per page (and job keys per SCAN step).
pub const PAGE: usize = 500;
/// Suspicious ids probed at most per check; past it the report is `truncated`.
pub const MAX_PROBES: usize = 100_000;

/// How many entries the check read.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Scanned {
    /// Entries of main and of the groups' waiting lists.
    pub main: u64,
    /// Entries of processing.
    pub processing: u64,
    /// Entries of the delayed set.
    pub delayed: u64,
    /// Entries of the dead list.
    pub dead: u64,
    /// Leases.
    pub leases: u64,
    /// Job keys found by SCAN.
    pub job_keys: u64,
    /// Ids probed atomically (suspicious from a page).
    pub probed: u64,
    /// Leftover reclaim marks read in processing or the leases (a reclaim
    /// call that failed half-way left them; the watchdog's next reclaims
    /// remove them): no job, skipped, never reported or repaired as one.
    pub reclaim_marks: u64,
}

/// The result of [`Admin::check`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CheckReport {
    /// Queue checked.
    pub queue: String,
    /// What was read.
    pub scanned: Scanned,
    /// Every broken invariant found (before any repair).
    pub violations: Vec<Violation>,
    /// Repairs made (with `repair`): one per repairable violation.
    pub repairs: Vec<Repair>,
    /// More than [`MAX_PROBES`] ids were suspicious: the rest were not probed.
    pub truncated: bool,
    /// Cross-queue relay notices of this queue that could not be applied
    /// (their batch is gone or corrupt), kept in `q:{Q}:relay:dead`: listed
    /// by [`Queue::relay_dead`](crate::Queue::relay_dead) (docs/WORKFLOWS.md, "Relay").
    pub relay_dead_notices: u64,
}

impl CheckReport {
    /// No violation found.
    pub fn is_clean(&self) -> bool {
        self.violations.is_empty() && !self.truncated && self.relay_dead_notices == 0
    }
}

/// The 64-bit fingerprint of an id.
fn fingerprint(id: &str) -> u64 {
    let mut h = DefaultHasher::new();
    id.hash(&mut h);
    h.finish()
}

/// `SCAN MATCH` pattern of a literal prefix (glob characters escaped).
fn glob_prefix(prefix: &str) -> String {
    let mut out = String::with_capacity(prefix.len() + 1);
    for c in prefix.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out.push('*');
    out
}

fn text(v: &Value) -> Option<String> {
    match v {
        Value::BulkString(b) => Some(String::from_utf8_lossy(b).into_owned()),
        Value::SimpleString(s) => Some(s.clone()),
        Value::Int(i) => Some(i.to_string()),
        Value::Double(d) => Some(d.to_string()),
        _ => None,
    }
}

fn int(v: &Value) -> Option<i64> {
    match v {
        Value::Int(i) => Some(*i),
        other => text(other)?.parse().ok(),
    }
}

fn items(v: &Value) -> Option<&[Value]> {
    match v {
        Value::Array(a) => Some(a),
        _ => None,
    }
}

/// `{key type, state, attempts, max_attempts, token}`.
fn decode_row(v: &Value) -> Option<JobRow> {
    let f = items(v)?;
    Some(JobRow {
        key_type: text(f.first()?)?,
        state: f.get(1).and_then(text),
        attempts: f.get(2).and_then(text),
        max_attempts: f.get(3).and_then(text),
        token: f.get(4).and_then(text),
    })
}

/// One checker walk of one queue.
struct Walk<'a> {
    admin: &'a Admin,
    keys: QueueKeys,
    /// fingerprint → places seen (bits of [`Place::bit`]).
    seen: HashMap<u64, u8>,
    suspects: BTreeSet<String>,
    report: CheckReport,
}

impl Walk<'_> {
    fn protocol(&self, what: &str, reply: &Value) -> AdminError {
        QueueError::protocol(
            &self.keys.queue,
            None,
            format!("check.lua {what} reply {reply:?}"),
        )
        .into()
    }

    async fn call(&self, mode: &str, extra: &[&str]) -> Result<Value> {
        let k = &self.keys;
        let mut inv = CHECK.prepare_invoke();
        inv.key(&k.main)
            .key(&k.processing)
            .key(&k.delayed)
            .key(&k.dead)
            .key(&k.leases)
            .key(&k.stats)
            .key(&k.guard)
            .arg(mode)
            .arg(&k.job_prefix)
            .arg(&k.done_prefix);
        for a in extra {
            inv.arg(*a);
        }
        inv.invoke_async(&mut self.admin.queue.connection())
            .await
            .map_err(|e| QueueError::redis(&k.queue, None, e).into())
    }

    fn suspect(&mut self, id: String) {
        if self.suspects.len() < MAX_PROBES {
            self.suspects.insert(id);
        } else if !self.suspects.contains(&id) {
            self.report.truncated = true;
        }
    }

    /// Key types and counters, and the types of the group ring and pause
    /// hash. False when a structure has the wrong type (nothing else can be
    /// read then); a group ring or pause hash of another type is a finding
    /// ([`Violation::CorruptGroupRing`], [`Violation::CorruptGroupPause`])
    /// and the walk goes on.
    async fn types(&mut self) -> Result<bool> {
        let reply = self.call("types", &[]).await?;
        let bad = || self.protocol("types", &reply);
        let f = items(&reply).ok_or_else(bad)?;
        let types = f.get(1).and_then(items).ok_or_else(bad)?;
        let k = &self.keys;
        let expected = [
            (&k.main, "list"),
            (&k.processing, "list"),
            (&k.delayed, "zset"),
            (&k.dead, "list"),
            (&k.leases, "zset"),
            (&k.stats, "hash"),
        ];
        let mut found_bad = Vec::new();
        for ((key, want), found) in expected.iter().zip(types) {
            let found = text(found).ok_or_else(bad)?;
            if found != "none" && found != *want {
                found_bad.push(Violation::WrongKeyType {
                    key: key.to_string(),
                    found,
                    expected: want,
                });
            }
        }
        let ok = found_bad.is_empty();
        let stats = f.get(2).and_then(items).ok_or_else(bad)?;
        for pair in stats.chunks(2) {
            let (Some(field), Some(value)) = (text(&pair[0]), pair.get(1).and_then(text)) else {
                continue;
            };
            if !is_count(&value) {
                found_bad.push(Violation::BadCounter { field, value });
            }
        }
        // The group ring and pause hash (docs/GROUPS.md): of another type
        // they are findings, and the walk goes on (fetches keep serving main).
        if let Some(group_types) = f.get(3).and_then(items) {
            let ring = group_types.first().and_then(text).ok_or_else(bad)?;
            let paused = group_types.get(1).and_then(text).ok_or_else(bad)?;
            if ring != "none" && ring != "list" {
                found_bad.push(Violation::CorruptGroupRing {
                    key: k.groups(),
                    found: ring,
                });
            }
            if paused != "none" && paused != "hash" {
                found_bad.push(Violation::CorruptGroupPause {
                    key: k.groups_paused(),
                    found: paused,
                });
            }
        }
        self.report.violations.extend(found_bad);
        Ok(ok)
    }

    /// Pages through one structure; `None` for the leases. (Their key types
    /// were checked by [`Self::types`] first.)
    async fn structure(&mut self, place: Option<Place>) -> Result<()> {
        self.structure_named(place, place.map_or("leases", Place::as_str))
            .await
            .map(drop)
    }

    /// The waiting lists of the groups (docs/GROUPS.md), found by `SCAN`:
    /// each is paged like main (an id in it is waiting), then its group is
    /// read atomically ([`Self::group`]): jobs waiting while the group is
    /// neither in the ring nor paused are reported. A group key of another
    /// type is reported ([`Violation::CorruptGroupList`]) and the walk goes on.
    async fn group_lists(&mut self) -> Result<()> {
        let prefix = self.keys.group_prefix();
        let pattern = glob_prefix(&prefix);
        let mut names = BTreeSet::new();
        let mut cursor = 0u64;
        loop {
            let (next, keys) = self.scan(cursor, &pattern, "SCAN for group lists").await?;
            names.extend(
                keys.iter()
                    .filter_map(|k| k.strip_prefix(&prefix))
                    .map(str::to_string),
            );
            cursor = next;
            if cursor == 0 {
                break;
            }
        }
        for group in names {
            let name = format!("g:{group}");
            if let Some(found) = self.structure_named(Some(Place::Main), &name).await? {
                let key = self.keys.group(&group);
                tracing::warn!(queue = %self.keys.queue, group, key, found, "check: a group's waiting list holds another type");
                self.report
                    .violations
                    .push(Violation::CorruptGroupList { group, key, found });
                continue;
            }
            let probe = self.group(&group).await?;
            self.report
                .violations
                .extend(group_violation(&group, &probe));
        }
        Ok(())
    }

    /// One atomic read of group `group`: its list's length, whether it is in
    /// the ring, whether it is paused.
    async fn group(&self, group: &str) -> Result<GroupProbe> {
        let reply = self.call("group", &[group]).await?;
        let f = items(&reply).ok_or_else(|| self.protocol("group", &reply))?;
        let read = |i: usize| match f.get(i) {
            Some(Value::Nil) => Ok(None),
            v => v
                .and_then(int)
                .map(|n| Some(n.max(0) as u64))
                .ok_or_else(|| self.protocol("group", &reply)),
        };
        Ok(GroupProbe {
            waiting: read(1)?,
            in_ring: read(2)?.map(|n| n == 1),
            paused: read(3)?.map(|n| n == 1),
        })
    }

    /// One `SCAN` step of [`PAGE`] keys matching `pattern`.
    async fn scan(
        &self,
        cursor: u64,
        pattern: &str,
        what: &'static str,
    ) -> Result<(u64, Vec<String>)> {
        redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(pattern)
            .arg("COUNT")
            .arg(PAGE)
            .query_async(&mut self.admin.queue.connection())
            .await
            .map_err(AdminError::server(what))
    }

    /// Pages through one structure named `name` in `check.lua`. `Some(type)`
    /// when its key holds another type (nothing read).
    async fn structure_named(
        &mut self,
        place: Option<Place>,
        name: &str,
    ) -> Result<Option<String>> {
        let mut offset = 0usize;
        loop {
            let (off, lim) = (offset.to_string(), PAGE.to_string());
            let reply = self.call("page", &[name, &off, &lim]).await?;
            let bad = || self.protocol("page", &reply);
            let f = items(&reply).ok_or_else(bad)?;
            if let Some(found) = f.get(3) {
                return text(found).map(Some).ok_or_else(bad);
            }
            let len = f.get(1).and_then(int).ok_or_else(bad)?;
            let rows = f.get(2).and_then(items).ok_or_else(bad)?;
            let mut found = Vec::with_capacity(rows.len());
            for r in rows {
                let r = items(r).ok_or_else(bad)?;
                let id = r.first().and_then(text).ok_or_else(bad)?;
                let leased = !matches!(r.get(1), None | Some(Value::Nil));
                let row = r.get(2).and_then(decode_row).ok_or_else(bad)?;
                found.push((id, leased, row));
            }
            let n = found.len();
            for (id, leased, row) in found {
                if id == RECLAIM_MARK && matches!(place, Some(Place::Processing) | None) {
                    self.report.scanned.reclaim_marks += 1;
                    continue;
                }
                let fp = fingerprint(&id);
                let places = self.seen.entry(fp).or_insert(0);
                let suspicious = match place {
                    Some(place) => {
                        let repeated = *places != 0;
                        *places |= place.bit();
                        repeated || row_suspicious(place, leased, &JobId::from(id.as_str()), &row)
                    }
                    None => *places & Place::Processing.bit() == 0,
                };
                if suspicious {
                    self.suspect(id);
                }
            }
            let s = &mut self.report.scanned;
            let counter = match place {
                Some(Place::Main) => &mut s.main,
                Some(Place::Processing) => &mut s.processing,
                Some(Place::Delayed) => &mut s.delayed,
                Some(Place::Dead) => &mut s.dead,
                None => &mut s.leases,
            };
            *counter += n as u64;
            offset += n;
            if n == 0 || offset as i64 >= len {
                return Ok(None);
            }
        }
    }

    /// SCANs the job hashes: a hash listed nowhere seen, or with corrupt
    /// fields, is suspicious; a job key of another type is reported.
    async fn job_keys(&mut self) -> Result<()> {
        let pattern = glob_prefix(&self.keys.job_prefix);
        let mut cursor = 0u64;
        loop {
            let (next, keys) = self.scan(cursor, &pattern, "SCAN for job hashes").await?;
            if !keys.is_empty() {
                let args: Vec<&str> = keys.iter().map(String::as_str).collect();
                let reply = self.call("hashes", &args).await?;
                let bad = || self.protocol("hashes", &reply);
                let rows = items(&reply).and_then(|f| f.get(1)).and_then(items);
                let rows = rows.ok_or_else(bad)?;
                let mut found = Vec::with_capacity(rows.len());
                for r in rows {
                    let r = items(r).ok_or_else(bad)?;
                    let key = r.first().and_then(text).ok_or_else(bad)?;
                    let row = r.get(1).and_then(decode_row).ok_or_else(bad)?;
                    found.push((key, row));
                }
                self.report.scanned.job_keys += found.len() as u64;
                for (key, row) in found {
                    let Some(id) = key.strip_prefix(&self.keys.job_prefix) else {
                        continue;
                    };
                    let id = id.to_string();
                    match row.key_type.as_str() {
                        "none" => {}
                        "hash" => {
                            let listed = self.seen.get(&fingerprint(&id)).copied().unwrap_or(0);
                            let jid = JobId::from(id.as_str());
                            if listed == 0 || !field_problems(&jid, &row).is_empty() {
                                self.suspect(id);
                            }
                        }
                        _ => self.suspect(id),
                    }
                }
            }
            cursor = next;
            if cursor == 0 {
                return Ok(());
            }
        }
    }

    /// One atomic read of everything about `id`.
    async fn probe(&self, id: &str) -> Result<Probe> {
        let reply = self.call("probe", &[id]).await?;
        let bad = || self.protocol("probe", &reply);
        let f = items(&reply).ok_or_else(bad)?;
        let count = |i: usize| f.get(i).and_then(int).map(|n| n.max(0) as u64);
        let present = |i: usize| !matches!(f.get(i), None | Some(Value::Nil));
        Ok(Probe {
            in_main: count(1).ok_or_else(bad)?,
            in_processing: count(2).ok_or_else(bad)?,
            in_dead: count(3).ok_or_else(bad)?,
            in_delayed: present(4),
            leased: present(5),
            row: f.get(6).and_then(decode_row).ok_or_else(bad)?,
        })
    }
}

impl Admin {
    /// Checks the invariants of `queue` (every id listed once, in the
    /// structure its state names; no hash listed nowhere; no entry without
    /// a hash; every claimed job leased; no stray lease; sane job fields,
    /// key types and counters; every group with waiting jobs in the ring or
    /// paused) and, with `repair`, mends what can be mended
    /// without losing a job. Read-only without `repair`; safe on a live queue.
    /// Needs a single Redis server or a Sentinel primary (it SCANs for job
    /// hashes).
    ///
    /// ```
    /// # #[tokio::main] async fn main() -> Result<(), queue_core::admin::AdminError> {
    /// # let server = queue_testkit::RedisServer::start().unwrap();
    /// use queue_core::admin::Admin;
    ///
    /// let admin = Admin::connect(&server.url()).await?;
    /// admin.queue().enqueue_raw("emails", "send", 1, 3, Default::default(), b"\x80").await?;
    /// let report = admin.check("emails", false).await?;
    /// assert!(report.is_clean(), "{:?}", report.violations);
    /// assert_eq!(report.scanned.main, 1);
    /// # Ok(()) }
    /// ```
    pub async fn check(&self, queue: &str, repair: bool) -> Result<CheckReport> {
        if self.queue.connection().is_cluster() {
            return Err(AdminError::CheckNeedsSingleServer);
        }
        let mut walk = Walk {
            admin: self,
            keys: QueueKeys::new(queue),
            seen: HashMap::new(),
            suspects: BTreeSet::new(),
            report: CheckReport {
                queue: queue.to_string(),
                scanned: Scanned::default(),
                violations: Vec::new(),
                repairs: Vec::new(),
                truncated: false,
                relay_dead_notices: 0,
            },
        };
        if walk.types().await? {
            for place in Place::ALL {
                walk.structure(Some(place)).await?;
            }
            walk.group_lists().await?;
            walk.structure(None).await?;
            walk.job_keys().await?;
            let suspects = std::mem::take(&mut walk.suspects);
            walk.seen = HashMap::new();
            for id in suspects {
                let probe = walk.probe(&id).await?;
                walk.report.scanned.probed += 1;
                let jid = JobId::from(id);
                let found = probe_violations(&walk.keys, &jid, &probe);
                walk.report.violations.extend(found);
            }
        }
        let mut report = walk.report;
        if report.scanned.reclaim_marks > 0 {
            tracing::warn!(queue, marks = report.scanned.reclaim_marks, "check: leftover reclaim marks in processing or the leases (no job; the watchdog's reclaim removes them)");
        }
        let relay_dead: Option<u64> = redis::cmd("LLEN")
            .arg(QueueKeys::new(queue).relay_dead())
            .query_async(&mut self.queue.connection())
            .await
            .ok();
        report.relay_dead_notices = relay_dead.unwrap_or(0);
        if report.relay_dead_notices > 0 {
            tracing::warn!(queue, notices = report.relay_dead_notices, "check: cross-queue relay notices that could not be applied (see Queue::relay_dead)");
        }
        for v in &report.violations {
            tracing::warn!(queue, job_id = ?v.job_id().map(JobId::as_str), "check: {v}");
        }
        if repair {
            for v in &report.violations {
                match self.repair(queue, v).await {
                    Ok(Some(r)) => report.repairs.push(r),
                    Ok(None) => {}
                    // Refused for the data on its way (a corrupt key it would
                    // write to): recorded, and the other repairs run. Any
                    // other failure (Redis gone) ends the check as before.
                    Err(AdminError::Queue(e)) if e.is_data_error() => {
                        tracing::warn!(queue, job_id = ?v.job_id().map(JobId::as_str), error = %e, "check: repair refused; going on with the others");
                        report.repairs.push(Repair {
                            id: v.job_id().cloned(),
                            group: match v {
                                Violation::GroupOutOfRing { group, .. } => Some(group.clone()),
                                _ => None,
                            },
                            action: RepairAction::Refused,
                            detail: Some(e.to_string()),
                        });
                    }
                    Err(e) => return Err(e),
                }
            }
        }
        Ok(report)
    }
}
