//! What one enqueue asks for and what it answers: [`EnqueueOptions`] (id,
//! delay or run-at, once-marker, attempts, replica wait), [`Enqueued`] and
//! [`EnqueueOutcome`] (created, duplicate with the existing job's state, or
//! already completed), decoded from the enqueue script's reply. `Queue`
//! (`queue.rs`) sends them.

use std::time::Duration;

use crate::error::{QueueError, Result};
use crate::job::JobId;
use crate::scripts::enqueue::EnqueueReply;
use crate::state::JobState;

/// Options of one enqueue.
///
/// ```
/// use std::time::Duration;
/// let opts = queue_core::EnqueueOptions::new().id("invoice-1").delay(Duration::from_secs(60));
/// assert_eq!(opts.id.as_ref().unwrap().as_str(), "invoice-1");
/// ```
#[derive(Debug, Clone, Default)]
pub struct EnqueueOptions {
    /// Stable job id (business key). `None`: a random UUID.
    pub id: Option<JobId>,
    /// Run no earlier than this long from now (Redis clock).
    pub delay: Option<Duration>,
    /// Override the job type's `MAX_ATTEMPTS`.
    pub max_attempts: Option<u32>,
    /// After the write, `WAIT` for this many replicas, at most this long.
    pub replicas: Option<(u32, Duration)>,
    /// Run no earlier than this time (Redis clock). Takes precedence over `delay`.
    pub run_at: Option<std::time::SystemTime>,
    /// Refuse this id for this long even after the job completed and its
    /// record expired (used by periodic jobs: one run per period).
    pub once_for: Option<Duration>,
    /// Extra job-hash fields stored with the job (`enqueue.lua` ARGV 10..):
    /// how features such as deadlines, groups and trace context carry their
    /// enqueue options to the scripts that read them. Set them through those
    /// features' builder methods. An empty name, a name of a core job field
    /// ([`CORE_JOB_FIELDS`]) or a name given twice is refused before anything
    /// is sent ([`validate`](Self::validate)).
    pub extra_fields: Vec<(String, String)>,
}

/// The job hash fields the core scripts own: an extra field
/// ([`EnqueueOptions::extra_fields`]) may not take one of these names. Every
/// field a script writes into a job hash is here, but `group` and `batch`,
/// which producers set as extra fields (groups, workflow members): a producer
/// setting one of these (say `repaired_at`, `progress`, `notify`) would be
/// overwritten, or mislead a reader of the field. The scripts' own list is
/// `CORE_JOB_FIELDS` in `prelude.lua`; a test keeps the two equal.
pub const CORE_JOB_FIELDS: &[&str] = &[
    "id",
    "type",
    "v",
    "payload",
    "max_attempts",
    "attempts",
    "enqueued_at",
    "state",
    "delivered_at",
    "token",
    "lease_until",
    "fence",
    "last_error",
    "failed_at",
    "failed_token",
    "run_at",
    "dead_reason",
    "dead_at",
    "replayed_at",
    "enq_token",
    "worker",
    "cancel_requested",
    "limit_slot",
    "ready_at",
    "repaired_at",
    "first_started_at",
    "newer_since",
    "newer_attempts",
    "deferrals",
    "previous_dead_reason",
    "progress",
    "progress_message",
    "progress_at",
    "notify",
    "hist",
    "batch_of",
];

/// The extra fields the scripts read as counts (milliseconds: the start
/// deadlines of [`EnqueueOptions::expires_in`] and
/// [`EnqueueOptions::deadline`]). The scripts' own list is
/// `COUNT_EXTRA_FIELDS` in `prelude.lua`.
const COUNT_EXTRA_FIELDS: &[&str] = &["expires_at", "expires_after"];

/// Whether `value` is a count as the scripts read one (`as_count`): a
/// non-negative integer of at most 2^53 − 1.
fn is_count(value: &str) -> bool {
    value
        .parse::<u64>()
        .is_ok_and(|n| n <= crate::scripts::MAX_MS)
}

/// Checks extra fields as the enqueue scripts do, before anything is sent:
/// no empty name, no core job field, no name twice (a second `group` would
/// route the job by the first and record the last), and a count where the
/// scripts read one (`expires_at`, `expires_after`: another value, stored,
/// got the job dead-lettered as corrupt at its first claim).
pub(crate) fn check_extra_fields(
    queue: &str,
    job_id: Option<&JobId>,
    fields: &[(String, String)],
) -> Result<()> {
    let refuse = |name: &str, reason| QueueError::InvalidExtraField {
        queue: queue.to_string(),
        job_id: job_id.cloned(),
        name: name.to_string(),
        reason,
    };
    for (i, (name, value)) in fields.iter().enumerate() {
        if COUNT_EXTRA_FIELDS.contains(&name.as_str()) && !is_count(value) {
            return Err(refuse(
                name,
                "its value must be a non-negative integer (milliseconds) of at most 2^53 - 1",
            ));
        }
        if name.is_empty() {
            return Err(refuse(name, "an extra field name must not be empty"));
        }
        if CORE_JOB_FIELDS.contains(&name.as_str()) {
            return Err(refuse(name, "the name of a core job field"));
        }
        if fields[..i].iter().any(|(n, _)| n == name) {
            return Err(refuse(name, "given twice"));
        }
    }
    Ok(())
}

/// Checks that no argument of a job (payload, extra field names and values)
/// is longer than `limit` bytes ([`Queue::with_max_arg_len`](crate::Queue::with_max_arg_len))
/// before anything is sent: Redis would close the connection on it.
pub(crate) fn check_arg_lens(
    queue: &str,
    id: &JobId,
    opts: &EnqueueOptions,
    payload: &[u8],
    limit: usize,
) -> Result<()> {
    let refuse = |what: String, len: usize| QueueError::ArgumentTooLarge {
        queue: queue.to_string(),
        job_id: id.clone(),
        what,
        len,
        limit,
    };
    if payload.len() > limit {
        return Err(refuse("payload".to_string(), payload.len()));
    }
    for (name, value) in &opts.extra_fields {
        for len in [name.len(), value.len()] {
            if len > limit {
                return Err(refuse(format!("extra field `{name:.64}`"), len));
            }
        }
    }
    Ok(())
}

/// Checks a job id before anything is sent ([`JobId::validate`]).
pub(crate) fn check_id(queue: &str, id: &JobId) -> Result<()> {
    id.validate().map_err(|reason| QueueError::InvalidJobId {
        queue: queue.to_string(),
        id: id.to_string(),
        reason,
    })
}

/// Checks a queue name before anything is sent ([`crate::validate_queue_name`]).
pub(crate) fn check_queue_name(queue: &str) -> Result<()> {
    crate::keys::validate_queue_name(queue).map_err(|reason| QueueError::InvalidQueueName {
        queue: queue.to_string(),
        reason,
    })
}

impl EnqueueOptions {
    /// Defaults: random id, run now, the job type's attempt limit.
    pub fn new() -> Self {
        Self::default()
    }

    /// Checks these options for an enqueue to `queue` as
    /// [`Queue`](crate::Queue)'s enqueues do before anything is sent: the
    /// queue name ([`validate_queue_name`](crate::validate_queue_name)), the
    /// id when one is set ([`JobId::validate`]) and the extra field names
    /// (not empty, not a core job field of [`CORE_JOB_FIELDS`], none given
    /// twice). For a producer that stores an enqueue to send later (the
    /// outbox), so that a refusal comes when the enqueue is asked for.
    ///
    /// ```
    /// use queue_core::{EnqueueOptions, QueueError};
    /// assert!(EnqueueOptions::new().group("a").validate("emails").is_ok());
    /// let twice = EnqueueOptions {
    ///     extra_fields: vec![("group".into(), "a".into()), ("group".into(), "b".into())],
    ///     ..EnqueueOptions::new().id("invoice-1")
    /// };
    /// let err = twice.validate("emails").unwrap_err();
    /// assert!(matches!(err, QueueError::InvalidExtraField { .. }), "{err}");
    /// assert_eq!(err.job_id().map(|id| id.as_str()), Some("invoice-1"));
    /// ```
    pub fn validate(&self, queue: &str) -> Result<()> {
        check_queue_name(queue)?;
        if let Some(id) = &self.id {
            check_id(queue, id)?;
        }
        check_extra_fields(queue, self.id.as_ref(), &self.extra_fields)
    }

    /// Use a stable id; enqueuing it again is a no-op while the job exists or
    /// its completion record is retained.
    pub fn id(mut self, id: impl Into<JobId>) -> Self {
        self.id = Some(id.into());
        self
    }

    /// Delay the first run.
    pub fn delay(mut self, delay: Duration) -> Self {
        self.delay = Some(delay);
        self
    }

    /// Run at (no earlier than) `at`, compared with the Redis clock. A time
    /// in the past runs now.
    pub fn run_at(mut self, at: std::time::SystemTime) -> Self {
        self.run_at = Some(at);
        self
    }

    /// Accept this id only once for `ttl`, even after the job completed.
    pub fn once_for(mut self, ttl: Duration) -> Self {
        self.once_for = Some(ttl);
        self
    }

    /// Stores `name = value` on the job hash (see
    /// [`extra_fields`](Self::extra_fields)); a later call with the same name
    /// replaces the value.
    ///
    /// ```
    /// let opts = queue_core::EnqueueOptions::new().extra_field("tenant", "acme");
    /// assert_eq!(opts.extra_fields, vec![("tenant".to_string(), "acme".to_string())]);
    /// ```
    pub fn extra_field(mut self, name: &str, value: impl Into<String>) -> Self {
        self.extra_fields.retain(|(n, _)| n != name);
        self.extra_fields.push((name.to_string(), value.into()));
        self
    }

    /// Override the attempt limit.
    pub fn max_attempts(mut self, n: u32) -> Self {
        self.max_attempts = Some(n);
        self
    }

    /// Return `Ok` only once `replicas` replicas confirmed the write (Redis
    /// `WAIT`), or [`QueueError::NotReplicated`] after `timeout`. Narrows the
    /// window in which a primary failover loses an acknowledged enqueue. The
    /// `WAIT` runs on the shared connection and delays the commands queued
    /// behind it until the replicas answer (at most `timeout`).
    ///
    /// `timeout` is clamped to at least 1 ms and at most three quarters of
    /// the connection's [`response_timeout`](crate::ConnectionConfig::response_timeout):
    /// a zero (or sub-millisecond) timeout does not become Redis' `WAIT n 0`,
    /// which blocks until the replicas answer, for ever without them, and
    /// with it every call on the `Queue`'s connection.
    pub fn wait_for_replicas(mut self, replicas: u32, timeout: Duration) -> Self {
        self.replicas = Some((replicas, timeout));
        self
    }

    /// The job's rate key (a tenant, an API key): the per-key limits set
    /// with [`Queue::set_rate_limit`](crate::Queue::set_rate_limit) and
    /// [`Queue::set_concurrency_limit`](crate::Queue::set_concurrency_limit)
    /// (`LimitScope::EveryKey` / `Key`) apply to it. A job over its key's
    /// limit waits in the delayed set without using an attempt, and other
    /// keys' jobs go on (docs/LIMITS.md). Stored in the job field `rate_key`.
    ///
    /// ```
    /// let opts = queue_core::EnqueueOptions::new().rate_key("tenant-1");
    /// # let _ = opts;
    /// ```
    pub fn rate_key(self, key: impl Into<String>) -> Self {
        self.extra_field("rate_key", key)
    }

    /// Fair queuing: the job belongs to `group` (a tenant, a customer) and
    /// waits in that group's own list; workers take one job per group in
    /// turn, so one group's backlog never delays another group's jobs by
    /// more than one round (docs/GROUPS.md). Stored as the job field
    /// `group`; an empty name means no group. See also
    /// [`Queue::pause_group`](crate::Queue::pause_group).
    ///
    /// ```
    /// let opts = queue_core::EnqueueOptions::new().group("tenant-a");
    /// assert_eq!(opts.extra_fields, vec![("group".to_string(), "tenant-a".to_string())]);
    /// ```
    pub fn group(self, group: impl Into<String>) -> Self {
        self.extra_field(crate::groups::GROUP_FIELD, group)
    }

    /// Start deadline relative to the enqueue: a delivery (the first or a
    /// retry) not started within `ttl` of the enqueue (Redis clock, the job's
    /// `enqueued_at`) is not run; the worker that picks it up dead-letters it
    /// with reason `expired: ...` and counter `expired` (docs/RESULTS.md).
    /// Stored as the job field `expires_after` (ms). A running delivery is
    /// not stopped by it: see `Job::DEADLINE` for that.
    ///
    /// ```
    /// use std::time::Duration;
    /// let opts = queue_core::EnqueueOptions::new().expires_in(Duration::from_secs(30));
    /// assert_eq!(opts.extra_fields, vec![("expires_after".to_string(), "30000".to_string())]);
    /// ```
    ///
    /// A `ttl` beyond what a script can count (2^53 − 1 ms, about 285,000
    /// years; `Duration::MAX`) is stored as that count: no deadline in
    /// practice. Before, the larger number was stored as given and the claim
    /// dead-lettered the job as "corrupt field expires_after".
    pub fn expires_in(self, ttl: Duration) -> Self {
        self.extra_field("expires_after", crate::scripts::ms(ttl).to_string())
    }

    /// Absolute start deadline: like [`expires_in`](Self::expires_in), for
    /// deliveries not started before `at` (compared with the Redis clock, as
    /// [`run_at`](Self::run_at)). Stored as the job field `expires_at` (ms
    /// since the epoch, at most 2^53 − 1, as [`expires_in`](Self::expires_in)); a time before
    /// 1970 counts as already passed. With both, the earlier deadline applies.
    pub fn deadline(self, at: std::time::SystemTime) -> Self {
        let ms = at
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, crate::scripts::ms);
        self.extra_field("expires_at", ms.to_string())
    }
}

/// The result of an enqueue.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Enqueued {
    /// The job's id (the existing one for a duplicate).
    pub id: JobId,
    /// Whether the job was written or already known.
    pub outcome: EnqueueOutcome,
}

impl Enqueued {
    /// True when this call created the job.
    pub fn is_new(&self) -> bool {
        self.outcome == EnqueueOutcome::Created
    }
}

/// What an enqueue did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EnqueueOutcome {
    /// The job was written and will run.
    Created,
    /// A job with this id exists (queued, delayed, active or dead); nothing
    /// was written. `state` is [`JobState::Scheduled`] when a periodic
    /// firing's once-marker refused the id, and `JobState::Unknown("")`
    /// when the id's job key holds a hash without a `state` field (corrupt
    /// or another writer's data: the id is taken, nothing was written).
    ///
    /// `state` was a `String` before 0.1 was split into typed scripts; it
    /// compares with and converts from text (`state == "queued"`,
    /// `"queued".into()`) and prints the same.
    Duplicate {
        /// The existing job's state.
        state: JobState,
    },
    /// A job with this id completed within the retention window; nothing was written.
    AlreadyCompleted,
}

impl From<EnqueueReply> for EnqueueOutcome {
    fn from(reply: EnqueueReply) -> Self {
        match reply {
            EnqueueReply::Created { .. } => EnqueueOutcome::Created,
            EnqueueReply::Exists { state } => EnqueueOutcome::Duplicate { state },
            EnqueueReply::Done => EnqueueOutcome::AlreadyCompleted,
        }
    }
}

impl EnqueueOutcome {
    /// The outcome of an enqueue whose id the `Queue` generated for it (when
    /// `generated`): such an id exists in Redis only through this call, so a
    /// retry (its first attempt's reply lost) that finds the job, or its
    /// completion record, found this call's own job: `Created`. These calls
    /// send no enqueue token, one job field less to write (issue #12).
    pub(crate) fn of_call(self, generated: bool) -> Self {
        match self {
            EnqueueOutcome::Duplicate { .. } | EnqueueOutcome::AlreadyCompleted if generated => {
                EnqueueOutcome::Created
            }
            other => other,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{EnqueueOptions, CORE_JOB_FIELDS};
    use crate::job::JobId;
    use crate::keys::QueueKeys;
    use crate::scripts::enqueue::Enqueue;
    use crate::scripts::enqueue_many::{self, ManyJob, Mode};
    use crate::QueueError;

    /// The scripts refuse the names of `CORE_JOB_FIELDS` in `prelude.lua`;
    /// `validate` refuses those of the Rust list: the same names.
    #[test]
    fn the_core_job_fields_are_those_the_scripts_refuse() {
        let prelude = include_str!("scripts/prelude.lua");
        let start = prelude
            .find("local CORE_JOB_FIELDS = {")
            .expect("the prelude's list");
        let table = &prelude[start..];
        let table = &table[table.find('{').unwrap() + 1..table.find('}').unwrap()];
        let mut lua: Vec<&str> = table
            .split(',')
            .map(|entry| entry.split('=').next().unwrap().trim())
            .filter(|name| !name.is_empty())
            .collect();
        let mut rust = CORE_JOB_FIELDS.to_vec();
        lua.sort_unstable();
        rust.sort_unstable();
        assert_eq!(rust, lua);
    }

    /// The fields the scripts write into a job hash besides the enqueue's
    /// own: `repaired_at` (check --repair), `first_started_at` (claim),
    /// `newer_since`, `newer_attempts`, `deferrals` (defer), `previous_dead_reason` (replay), `progress*`,
    /// `notify` (result waiters), `hist` (history), `batch_of` (workflow
    /// callbacks), with `limit_slot` and `ready_at`. Each is refused as an
    /// extra field by `validate` and, on a real server, by `enqueue.lua` and
    /// `enqueue_many.lua` before any write. Before, the ten first were
    /// accepted: a producer could set `repaired_at` or `progress` at enqueue.
    const SCRIPT_WRITTEN: [&str; 14] = [
        "repaired_at",
        "first_started_at",
        "newer_since",
        "newer_attempts",
        "deferrals",
        "previous_dead_reason",
        "progress",
        "progress_message",
        "progress_at",
        "notify",
        "hist",
        "batch_of",
        "limit_slot",
        "ready_at",
    ];

    #[tokio::test]
    async fn validate_refuses_what_the_scripts_refuse_naming_queue_and_job() {
        let with = |fields: &[(&str, &str)]| EnqueueOptions {
            extra_fields: fields
                .iter()
                .map(|(n, v)| (n.to_string(), v.to_string()))
                .collect(),
            ..EnqueueOptions::new().id("j-1")
        };
        for bad in [
            with(&[("", "x")]),
            with(&[("state", "done")]),
            with(&[("group", "a"), ("tenant", "t"), ("group", "b")]),
        ] {
            let err = bad.validate("emails").unwrap_err();
            assert!(matches!(err, QueueError::InvalidExtraField { .. }), "{err}");
            assert_eq!(err.queue(), Some("emails"));
            assert_eq!(err.job_id().map(|id| id.as_str()), Some("j-1"));
        }
        assert!(with(&[("group", "a"), ("tenant", "t")])
            .validate("emails")
            .is_ok());
        let err = EnqueueOptions::new().validate("a}:job:x").unwrap_err();
        assert!(matches!(err, QueueError::InvalidQueueName { .. }), "{err}");

        let (_server, mut conn) = crate::scripts::test_redis().await;
        let keys = QueueKeys::new("emails");
        let id = JobId::from("j-1");
        for name in SCRIPT_WRITTEN {
            let err = with(&[(name, "1")]).validate("emails").unwrap_err();
            assert!(
                matches!(&err, QueueError::InvalidExtraField { name: n, .. } if n == name),
                "{name}: {err}"
            );
            let extra = [(name.to_string(), "1".to_string())];
            let job = Enqueue {
                extra: &extra,
                ..Enqueue::test_job(&keys, &id, 1)
            };
            let err = job.run(&mut conn).await.unwrap_err();
            assert!(err.to_string().contains("core job field"), "{name}: {err}");
            let many = [ManyJob {
                job,
                token: "t",
                fresh: true,
            }];
            let err = enqueue_many::run(&mut conn, &keys, Mode::All, &many)
                .await
                .unwrap_err();
            assert!(err.to_string().contains("core job field"), "{name}: {err}");
        }
        let written: i64 = redis::cmd("EXISTS")
            .arg(keys.job("j-1"))
            .arg(&keys.main)
            .query_async(&mut conn)
            .await
            .unwrap();
        assert_eq!(written, 0, "nothing written");
    }
}
