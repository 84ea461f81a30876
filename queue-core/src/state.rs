//! [`JobState`]: where a job is, as the `state` field of its hash says
//! (docs/ARCHITECTURE.md, "Key layout"). The Lua scripts write these strings;
//! Rust code reads and compares them only through this enum.

use std::fmt;
use std::str::FromStr;

/// The state of a job that exists in Redis.
///
/// A completed job has no state: its hash is gone and only its completion
/// record remains ([`EnqueueOutcome::AlreadyCompleted`](crate::EnqueueOutcome::AlreadyCompleted)).
///
/// ```
/// use queue_core::JobState;
/// let state: JobState = "active".parse().unwrap();
/// assert_eq!(state, JobState::Active);
/// assert_eq!(state.as_str(), "active");
/// assert_eq!(state, "active"); // compares with the stored text
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum JobState {
    /// Waiting in main, or just moved to processing and not yet claimed.
    Queued,
    /// Claimed by a worker: in processing with a lease and a token.
    Active,
    /// In the delayed set: a retry, a delayed enqueue or a watchdog return.
    Delayed,
    /// In the dead-letter list.
    Dead,
    /// Cancelled by an operator: only in a completion record (`status`), the
    /// job hash is gone (docs/FLOW-CONTROL.md).
    Cancelled,
    /// Only in [`EnqueueOutcome::Duplicate`](crate::EnqueueOutcome::Duplicate):
    /// the id's once-marker (periodic jobs) refused it.
    Scheduled,
    /// A state this version does not know (written by a newer version or by
    /// hand), kept as stored.
    Unknown(String),
}

impl JobState {
    /// The text stored in the job hash.
    pub fn as_str(&self) -> &str {
        match self {
            JobState::Queued => "queued",
            JobState::Active => "active",
            JobState::Delayed => "delayed",
            JobState::Dead => "dead",
            JobState::Scheduled => "scheduled",
            JobState::Cancelled => "cancelled",
            JobState::Unknown(s) => s,
        }
    }

    /// Reads a stored state; unknown text becomes [`JobState::Unknown`].
    pub fn parse(s: &str) -> JobState {
        match s {
            "queued" => JobState::Queued,
            "active" => JobState::Active,
            "delayed" => JobState::Delayed,
            "dead" => JobState::Dead,
            "scheduled" => JobState::Scheduled,
            "cancelled" => JobState::Cancelled,
            other => JobState::Unknown(other.to_string()),
        }
    }
}

impl fmt::Display for JobState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Serialized as its stored text (`"queued"`, `"cancelled"`, ...).
impl serde::Serialize for JobState {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl FromStr for JobState {
    type Err = std::convert::Infallible;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(JobState::parse(s))
    }
}

impl From<&str> for JobState {
    fn from(s: &str) -> Self {
        JobState::parse(s)
    }
}

impl From<String> for JobState {
    fn from(s: String) -> Self {
        JobState::parse(&s)
    }
}

impl From<JobState> for String {
    fn from(s: JobState) -> Self {
        s.as_str().to_string()
    }
}

impl PartialEq<str> for JobState {
    fn eq(&self, other: &str) -> bool {
        self.as_str() == other
    }
}

impl PartialEq<&str> for JobState {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == *other
    }
}

impl PartialEq<String> for JobState {
    fn eq(&self, other: &String) -> bool {
        self.as_str() == other
    }
}

#[cfg(test)]
mod tests {
    use super::JobState;

    #[test]
    fn every_state_round_trips_through_its_text() {
        for s in [
            JobState::Queued,
            JobState::Active,
            JobState::Delayed,
            JobState::Dead,
            JobState::Scheduled,
            JobState::Cancelled,
            JobState::Unknown("paused".into()),
        ] {
            assert_eq!(JobState::parse(s.as_str()), s);
            assert_eq!(s.to_string(), s.as_str());
        }
    }
}
