//! The invariants the checker verifies ([`Violation`]), and the pure rules
//! that judge what `check.lua` read: is a page row suspicious, and which
//! invariants does one id's atomic probe break. No Redis here: `check.rs`
//! reads, this file decides.

use serde::Serialize;

use crate::job::JobId;
use crate::keys::QueueKeys;
use crate::state::JobState;

/// A structure that lists job ids.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Place {
    /// `q:{Q}:main`, waiting.
    Main,
    /// `q:{Q}:processing`, taken by a worker.
    Processing,
    /// `q:{Q}:delayed`, waiting for its run-at.
    Delayed,
    /// `q:{Q}:dead`, dead-lettered.
    Dead,
}

impl Place {
    /// Every place, in the order the checker reads them.
    pub(crate) const ALL: [Place; 4] =
        [Place::Main, Place::Processing, Place::Delayed, Place::Dead];

    /// The structure's name as `check.lua` takes it.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Place::Main => "main",
            Place::Processing => "processing",
            Place::Delayed => "delayed",
            Place::Dead => "dead",
        }
    }

    /// One bit per place (the checker's per-id fingerprint table).
    pub(crate) fn bit(self) -> u8 {
        1 << (self as u8)
    }

    /// Whether a job hash in `state` may sit here.
    fn admits(self, state: &JobState) -> bool {
        matches!(
            (self, state),
            (Place::Main, JobState::Queued)
                | (Place::Processing, JobState::Queued | JobState::Active)
                | (Place::Delayed, JobState::Delayed)
                | (Place::Dead, JobState::Dead)
        )
    }
}

/// One broken invariant (docs/ARCHITECTURE.md, "Key layout"; docs/OPERATIONS.md, "Invariant check").
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
#[non_exhaustive]
pub enum Violation {
    /// The id is listed more than once: in two structures, or twice in one list.
    Duplicate {
        /// Job id.
        id: JobId,
        /// Every place it is listed, once per entry.
        places: Vec<Place>,
    },
    /// A job hash that no structure lists: no worker will ever run it.
    OrphanHash {
        /// Job id.
        id: JobId,
        /// Its `state` field.
        state: Option<String>,
    },
    /// An entry whose job hash is gone (deleted or evicted).
    MissingHash {
        /// Job id.
        id: JobId,
        /// Where it is listed.
        places: Vec<Place>,
    },
    /// The hash's `state` disagrees with the structure that lists it.
    StateMismatch {
        /// Job id.
        id: JobId,
        /// Its `state` field.
        state: String,
        /// Where it is listed.
        place: Place,
    },
    /// A claimed (`active`) job in processing with no lease: the watchdog
    /// would never return it if its worker died.
    ActiveWithoutLease {
        /// Job id.
        id: JobId,
    },
    /// A lease whose id is not in processing.
    StrayLease {
        /// Job id.
        id: JobId,
    },
    /// A job field that is missing or not what the scripts expect.
    CorruptField {
        /// Job id.
        id: JobId,
        /// Field name (`state`, `attempts`, `max_attempts`, `token`).
        field: &'static str,
        /// Its value (none: missing).
        value: Option<String>,
    },
    /// A queue key of the wrong Redis type.
    WrongKeyType {
        /// The key.
        key: String,
        /// Its type.
        found: String,
        /// The type the queue uses.
        expected: &'static str,
    },
    /// A lifetime counter of `q:{Q}:stats` that is not a non-negative integer.
    BadCounter {
        /// Counter name.
        field: String,
        /// Its value.
        value: String,
    },
    /// A group whose waiting list has jobs but that is neither in the ring
    /// (`q:{Q}:groups`) nor paused: no fetch ever visits it, so its jobs wait
    /// forever, and `stats` / `groups()` do not see them (docs/GROUPS.md).
    /// An older version's resume during a rolling deploy leaves this.
    GroupOutOfRing {
        /// Group name.
        group: String,
        /// Jobs waiting in its list.
        waiting: u64,
    },
    /// A group's waiting list `q:{Q}:g:<group>` holds another Redis type
    /// (corrupt data): a fetch skips the group (it stays in the ring), so
    /// whatever was waiting in it is not served. Not read further.
    CorruptGroupList {
        /// Group name.
        group: String,
        /// The key.
        key: String,
        /// Its type.
        found: String,
    },
    /// The group ring `q:{Q}:groups` holds another Redis type (corrupt
    /// data): a fetch serves main only, so no group's jobs are served, and a
    /// grouped enqueue (or a retry, replay, repair into a group) is refused
    /// before any write. Not repaired: an operator deletes the key and
    /// `check --repair` then puts back each group with jobs
    /// ([`GroupOutOfRing`](Self::GroupOutOfRing)).
    CorruptGroupRing {
        /// The key.
        key: String,
        /// Its type.
        found: String,
    },
    /// The group pause hash `q:{Q}:gpaused` holds another Redis type
    /// (corrupt data): fetches and enqueues read it as "no group paused",
    /// so every group runs; pausing or resuming a group is refused.
    CorruptGroupPause {
        /// The key.
        key: String,
        /// Its type.
        found: String,
    },
}

impl Violation {
    /// The job concerned, when one is.
    pub fn job_id(&self) -> Option<&JobId> {
        match self {
            Violation::Duplicate { id, .. }
            | Violation::OrphanHash { id, .. }
            | Violation::MissingHash { id, .. }
            | Violation::StateMismatch { id, .. }
            | Violation::ActiveWithoutLease { id }
            | Violation::StrayLease { id }
            | Violation::CorruptField { id, .. } => Some(id),
            Violation::WrongKeyType { .. }
            | Violation::BadCounter { .. }
            | Violation::GroupOutOfRing { .. }
            | Violation::CorruptGroupList { .. }
            | Violation::CorruptGroupRing { .. }
            | Violation::CorruptGroupPause { .. } => None,
        }
    }

    /// The kind as one word (`orphan_hash`, ...), as in the JSON report.
    pub fn kind(&self) -> &'static str {
        match self {
            Violation::Duplicate { .. } => "duplicate",
            Violation::OrphanHash { .. } => "orphan_hash",
            Violation::MissingHash { .. } => "missing_hash",
            Violation::StateMismatch { .. } => "state_mismatch",
            Violation::ActiveWithoutLease { .. } => "active_without_lease",
            Violation::StrayLease { .. } => "stray_lease",
            Violation::CorruptField { .. } => "corrupt_field",
            Violation::WrongKeyType { .. } => "wrong_key_type",
            Violation::BadCounter { .. } => "bad_counter",
            Violation::GroupOutOfRing { .. } => "group_out_of_ring",
            Violation::CorruptGroupList { .. } => "corrupt_group_list",
            Violation::CorruptGroupRing { .. } => "corrupt_group_ring",
            Violation::CorruptGroupPause { .. } => "corrupt_group_pause",
        }
    }
}

impl std::fmt::Display for Violation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let opt = |v: &Option<String>| v.clone().unwrap_or_else(|| "(missing)".into());
        match self {
            Violation::Duplicate { id, places } => {
                write!(f, "job {id}: listed more than once: {places:?}")
            }
            Violation::OrphanHash { id, state } => write!(
                f,
                "job {id}: hash (state {}) listed in no structure",
                opt(state)
            ),
            Violation::MissingHash { id, places } => {
                write!(f, "job {id}: listed in {places:?} but its hash is gone")
            }
            Violation::StateMismatch { id, state, place } => {
                write!(f, "job {id}: state {state} but listed in {place:?}")
            }
            Violation::ActiveWithoutLease { id } => {
                write!(f, "job {id}: active in processing without a lease")
            }
            Violation::StrayLease { id } => write!(f, "job {id}: lease without a processing entry"),
            Violation::CorruptField { id, field, value } => {
                write!(f, "job {id}: field {field} is corrupt: {}", opt(value))
            }
            Violation::WrongKeyType {
                key,
                found,
                expected,
            } => write!(f, "key {key}: type {found}, expected {expected}"),
            Violation::BadCounter { field, value } => {
                write!(
                    f,
                    "counter {field} is not a non-negative integer: {value:?}"
                )
            }
            Violation::GroupOutOfRing { group, waiting } => write!(
                f,
                "group {group}: {waiting} job(s) waiting, but neither in the ring nor paused: no fetch serves them"
            ),
            Violation::CorruptGroupList { group, key, found } => write!(
                f,
                "group {group}: its waiting list {key} holds a {found}, not a list (corrupt data): the fetch skips the group"
            ),
            Violation::CorruptGroupRing { key, found } => write!(
                f,
                "group ring {key} holds a {found}, not a list (corrupt data): fetches serve main only, no group's jobs run, grouped enqueues are refused"
            ),
            Violation::CorruptGroupPause { key, found } => write!(
                f,
                "group pause hash {key} holds a {found}, not a hash (corrupt data): read as no group paused, pause/resume of a group refused"
            ),
        }
    }
}

/// What `check.lua` read of one job key.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct JobRow {
    /// `TYPE` of the key (`none` when it does not exist).
    pub(crate) key_type: String,
    pub(crate) state: Option<String>,
    pub(crate) attempts: Option<String>,
    pub(crate) max_attempts: Option<String>,
    pub(crate) token: Option<String>,
}

impl JobRow {
    fn is_hash(&self) -> bool {
        self.key_type == "hash"
    }

    fn job_state(&self) -> Option<JobState> {
        self.state.as_deref().map(JobState::parse)
    }
}

/// Everything about one id, read atomically by `check.lua`'s probe.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Probe {
    pub(crate) in_main: u64,
    pub(crate) in_processing: u64,
    pub(crate) in_dead: u64,
    pub(crate) in_delayed: bool,
    pub(crate) leased: bool,
    pub(crate) row: JobRow,
}

impl Probe {
    /// Every place the id is listed, once per entry.
    pub(crate) fn places(&self) -> Vec<Place> {
        let mut out = Vec::new();
        out.extend(std::iter::repeat_n(Place::Main, self.in_main as usize));
        out.extend(std::iter::repeat_n(
            Place::Processing,
            self.in_processing as usize,
        ));
        if self.in_delayed {
            out.push(Place::Delayed);
        }
        out.extend(std::iter::repeat_n(Place::Dead, self.in_dead as usize));
        out
    }
}

/// One group as `check.lua`'s `group` mode read it, atomically. `None`: the
/// key holds another type (its list: the fetch skips it; the ring or the pause
/// hash: the fetch refuses the queue), so membership cannot be judged.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct GroupProbe {
    /// Jobs in the group's list (0 when it does not exist).
    pub(crate) waiting: Option<u64>,
    /// The group is in the ring.
    pub(crate) in_ring: Option<bool>,
    /// The group is paused.
    pub(crate) paused: Option<bool>,
}

/// The violation of group `group` (non-empty name) from its probe: jobs
/// waiting while the group is neither in the ring nor paused.
pub(crate) fn group_violation(group: &str, p: &GroupProbe) -> Option<Violation> {
    match (p.waiting, p.in_ring, p.paused) {
        (Some(waiting), Some(false), Some(false)) if waiting > 0 && !group.is_empty() => {
            Some(Violation::GroupOutOfRing {
                group: group.to_string(),
                waiting,
            })
        }
        _ => None,
    }
}

/// A non-negative integer as the scripts write it (digits only: no sign,
/// no fraction, no `nan`/`inf`), within `u64`.
pub(crate) fn is_count(s: &str) -> bool {
    !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()) && s.parse::<u64>().is_ok()
}

/// The corrupt fields of an existing job hash. A dead job's counts are not
/// checked: it may be the minimal hash a missing one is dead-lettered with,
/// or a job dead-lettered *because* a field was corrupt.
pub(crate) fn field_problems(id: &JobId, row: &JobRow) -> Vec<Violation> {
    let mut out = Vec::new();
    if !row.is_hash() {
        return out;
    }
    let corrupt = |field, value: &Option<String>| Violation::CorruptField {
        id: id.clone(),
        field,
        value: value.clone(),
    };
    let state = row.job_state();
    match &state {
        Some(JobState::Queued | JobState::Active | JobState::Delayed | JobState::Dead) => {}
        _ => out.push(corrupt("state", &row.state)),
    }
    if state == Some(JobState::Dead) {
        // Parked for the operator: its reason says what was wrong, and a
        // replay with reset attempts (or a purge) is the way out.
        return out;
    }
    match row.attempts.as_deref() {
        Some(a) if is_count(a) && a.parse::<u32>().is_ok() => {}
        _ => out.push(corrupt("attempts", &row.attempts)),
    }
    match row.max_attempts.as_deref() {
        Some(m) if is_count(m) && m.parse::<u32>().is_ok_and(|m| m >= 1) => {}
        _ => out.push(corrupt("max_attempts", &row.max_attempts)),
    }
    if state == Some(JobState::Active) && row.token.as_deref().is_none_or(str::is_empty) {
        out.push(corrupt("token", &row.token));
    }
    out
}

/// Whether a row read from one page deserves an atomic probe: anything the
/// probe could report, judged from this page alone.
pub(crate) fn row_suspicious(place: Place, leased: bool, id: &JobId, row: &JobRow) -> bool {
    if !row.is_hash() {
        return true;
    }
    let Some(state) = row.job_state() else {
        return true;
    };
    !place.admits(&state)
        || (place == Place::Processing && state == JobState::Active && !leased)
        || !field_problems(id, row).is_empty()
}

/// The invariants one id breaks, from its atomic probe.
pub(crate) fn probe_violations(keys: &QueueKeys, id: &JobId, p: &Probe) -> Vec<Violation> {
    let mut out = Vec::new();
    let places = p.places();
    if places.len() > 1 {
        out.push(Violation::Duplicate {
            id: id.clone(),
            places: places.clone(),
        });
    }
    match p.row.key_type.as_str() {
        "none" if !places.is_empty() => out.push(Violation::MissingHash {
            id: id.clone(),
            places: places.clone(),
        }),
        "none" => {}
        "hash" => {
            if places.is_empty() {
                out.push(Violation::OrphanHash {
                    id: id.clone(),
                    state: p.row.state.clone(),
                });
            } else if let (&[place], Some(state)) = (places.as_slice(), p.row.job_state()) {
                let known = !matches!(state, JobState::Unknown(_) | JobState::Scheduled);
                if known && !place.admits(&state) {
                    out.push(Violation::StateMismatch {
                        id: id.clone(),
                        state: state.as_str().to_string(),
                        place,
                    });
                }
            }
            out.extend(field_problems(id, &p.row));
        }
        other => out.push(Violation::WrongKeyType {
            key: keys.job(id.as_str()),
            found: other.to_string(),
            expected: "hash",
        }),
    }
    if p.leased && p.in_processing == 0 {
        out.push(Violation::StrayLease { id: id.clone() });
    }
    if p.in_processing > 0 && !p.leased && p.row.job_state() == Some(JobState::Active) {
        out.push(Violation::ActiveWithoutLease { id: id.clone() });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(state: &str, attempts: &str, max: &str, token: Option<&str>) -> JobRow {
        JobRow {
            key_type: "hash".into(),
            state: Some(state.into()),
            attempts: Some(attempts.into()),
            max_attempts: Some(max.into()),
            token: token.map(String::from),
        }
    }

    fn kinds(v: &[Violation]) -> Vec<&'static str> {
        v.iter().map(Violation::kind).collect()
    }

    #[test]
    fn counts_are_plain_non_negative_integers() {
        for good in ["0", "7", "18446744073709551615"] {
            assert!(is_count(good), "{good}");
        }
        for bad in [
            "",
            "-1",
            "1.5",
            "nan",
            "inf",
            "-inf",
            " 1",
            "1e3",
            "18446744073709551616",
        ] {
            assert!(!is_count(bad), "{bad}");
        }
    }

    #[test]
    fn corrupt_fields_are_named() {
        let id = JobId::from("j");
        let bad = row("active", "nan", "0", None);
        let found: Vec<_> = field_problems(&id, &bad)
            .into_iter()
            .map(|v| match v {
                Violation::CorruptField { field, .. } => field,
                other => panic!("{other:?}"),
            })
            .collect();
        assert_eq!(found, ["attempts", "max_attempts", "token"]);
        // A minimal dead hash (dead-lettered because its hash was missing) is
        // fine, and so is a job dead-lettered for its corrupt attempts.
        let minimal = JobRow {
            key_type: "hash".into(),
            state: Some("dead".into()),
            ..JobRow::default()
        };
        assert!(field_problems(&id, &minimal).is_empty());
        assert!(field_problems(&id, &row("dead", "nan", "x", None)).is_empty());
        assert!(field_problems(&id, &row("paused", "1", "3", None)).len() == 1);
    }

    #[test]
    fn only_a_group_with_jobs_out_of_the_ring_and_not_paused_is_reported() {
        let probe = |waiting, in_ring, paused| GroupProbe {
            waiting,
            in_ring,
            paused,
        };
        let out = probe(Some(2), Some(false), Some(false));
        assert_eq!(
            group_violation("g", &out).map(|v| v.kind()),
            Some("group_out_of_ring")
        );
        for fine in [
            probe(Some(0), Some(false), Some(false)),
            probe(Some(2), Some(true), Some(false)),
            probe(Some(2), Some(false), Some(true)),
            probe(None, Some(false), Some(false)),
            probe(Some(2), None, Some(false)),
            probe(Some(2), Some(false), None),
        ] {
            assert_eq!(group_violation("g", &fine), None, "{fine:?}");
        }
        assert_eq!(group_violation("", &out), None, "main's turn is no group");
    }

    #[test]
    fn a_probe_reports_each_broken_invariant() {
        let keys = QueueKeys::new("q");
        let id = JobId::from("j");
        let clean = Probe {
            in_processing: 1,
            leased: true,
            row: row("active", "1", "3", Some("t")),
            ..Probe::default()
        };
        assert!(probe_violations(&keys, &id, &clean).is_empty());
        let unclaimed = Probe {
            in_processing: 1,
            row: row("queued", "0", "3", None),
            ..Probe::default()
        };
        assert!(probe_violations(&keys, &id, &unclaimed).is_empty());
        let cases = [
            (
                Probe {
                    in_main: 1,
                    in_dead: 1,
                    row: row("dead", "1", "3", None),
                    ..Probe::default()
                },
                vec!["duplicate"],
            ),
            (
                Probe {
                    row: row("queued", "0", "3", None),
                    ..Probe::default()
                },
                vec!["orphan_hash"],
            ),
            (
                Probe {
                    in_delayed: true,
                    leased: true,
                    row: JobRow {
                        key_type: "none".into(),
                        ..JobRow::default()
                    },
                    ..Probe::default()
                },
                vec!["missing_hash", "stray_lease"],
            ),
            (
                Probe {
                    in_main: 1,
                    row: row("delayed", "0", "3", None),
                    ..Probe::default()
                },
                vec!["state_mismatch"],
            ),
            (
                Probe {
                    in_processing: 1,
                    row: row("active", "1", "3", Some("t")),
                    ..Probe::default()
                },
                vec!["active_without_lease"],
            ),
            (
                Probe {
                    in_main: 1,
                    row: JobRow {
                        key_type: "string".into(),
                        ..JobRow::default()
                    },
                    ..Probe::default()
                },
                vec!["wrong_key_type"],
            ),
        ];
        for (probe, want) in cases {
            assert_eq!(
                kinds(&probe_violations(&keys, &id, &probe)),
                want,
                "{probe:?}"
            );
        }
    }
}
