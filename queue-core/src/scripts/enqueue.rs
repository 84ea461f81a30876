//! `enqueue.lua`: writes one job (hash + `LPUSH main`, or `ZADD delayed`),
//! refusing an id whose job or completion record exists (dedupe at enqueue,
//! DESIGN rule 7). [`Enqueue`] (one job's arguments) and [`EnqueueReply`]
//! (one job's outcome) are shared with `enqueue_many.rs`, which `Queue`
//! sends; the one-job script stays for producers in other languages
//! (docs/PROTOCOL.md) and for script tests.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use redis::Value;
use tracing::warn;

use super::reply::Fields;
#[cfg(test)]
use super::Call;
use super::{lua_script, LuaScript};
#[cfg(test)]
use crate::conn::RedisConnection;
use crate::error::Result;
use crate::job::JobId;
use crate::keys::QueueKeys;
use crate::state::JobState;

/// In the library for producers that call it by name and for script tests;
/// `Queue` sends `enqueue_many`.
#[cfg_attr(not(test), allow(dead_code))]
pub(crate) static SCRIPT: LuaScript<8> =
    lua_script!("enqueue.lua", keys = 8, args = 9, prelude(None));

/// One job to write.
pub(crate) struct Enqueue<'a> {
    /// The queue's keys (read by the one-job script's call; `enqueue_many`
    /// takes them once per call).
    #[cfg_attr(not(test), allow(dead_code))]
    pub(crate) keys: &'a QueueKeys,
    pub(crate) id: &'a JobId,
    pub(crate) job_type: &'a str,
    pub(crate) schema_version: u32,
    pub(crate) payload: &'a [u8],
    /// Deliveries before dead-lettering (at least 1 is sent).
    pub(crate) max_attempts: u32,
    pub(crate) delay: Option<Duration>,
    /// Absolute run-at (Redis clock); takes precedence over `delay`.
    pub(crate) run_at: Option<SystemTime>,
    /// Refuse the id for this long even after it completed (periodic jobs).
    pub(crate) once_for: Option<Duration>,
    /// Extra job-hash fields (ARGV 10..), name then value.
    pub(crate) extra: &'a [(String, String)],
}

/// What the script did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum EnqueueReply {
    /// Written; runs at `run_at_ms` (Redis clock).
    Created { run_at_ms: i64 },
    /// A job with this id exists, in `state`; nothing written.
    Exists { state: JobState },
    /// A completion record exists; nothing written.
    Done,
}

impl<'a> Enqueue<'a> {
    /// A plain job for script tests: type `t`, version 1, empty payload, run
    /// now, no once-marker, no extra fields (override with `..`).
    #[cfg(test)]
    pub(crate) fn test_job(keys: &'a QueueKeys, id: &'a JobId, max_attempts: u32) -> Self {
        Enqueue {
            keys,
            id,
            job_type: "t",
            schema_version: 1,
            payload: b"",
            max_attempts,
            delay: None,
            run_at: None,
            once_for: None,
            extra: &[],
        }
    }

    /// `enq_token` is unique per enqueue call (kept across its retries): a
    /// retry that finds it on the job answers `Created` again. `""`: none.
    #[cfg(test)]
    fn call(&self, enq_token: &str) -> Call {
        let (k, id) = (self.keys, self.id.as_str());
        let mut call = SCRIPT
            .call(script_keys(k, id))
            .arg(id)
            .arg(self.job_type)
            .arg(self.schema_version)
            .arg(self.payload)
            .arg(self.max_attempts.max(1))
            .arg(millis(self.delay))
            .arg(epoch_ms(self.run_at))
            .arg(millis(self.once_for))
            .arg(enq_token);
        for (name, value) in self.extra {
            call = call
                .repeated_arg(name.as_str())
                .repeated_arg(value.as_str());
        }
        call
    }

    /// Runs the script alone, without an enqueue token.
    #[cfg(test)]
    pub(crate) async fn run(&self, conn: &mut RedisConnection) -> Result<EnqueueReply> {
        self.run_with_token(conn, "").await
    }

    /// Runs the script alone, as the enqueue call identified by `enq_token`.
    #[cfg(test)]
    pub(crate) async fn run_with_token(
        &self,
        conn: &mut RedisConnection,
        enq_token: &str,
    ) -> Result<EnqueueReply> {
        let reply = self
            .call(enq_token)
            .run(conn, &self.keys.queue, Some(self.id))
            .await?;
        EnqueueReply::decode(&self.keys.queue, self.id, &reply)
    }
}

impl EnqueueReply {
    /// `{'new', run_at} | {'exists', state} | {'done'}`.
    ///
    /// `{'exists', ''}`: the job key holds a hash without a `state` field
    /// (corrupt or another writer's data); nothing was written, so it is a
    /// duplicate of unknown state (`JobState::Unknown("")`), never an error
    /// (an error reads "not enqueued" while the id is taken). Both scripts
    /// answer it so (`enqueue.lua`, `enqueue_many.lua`'s `write`).
    pub(crate) fn decode(queue: &str, id: &JobId, reply: &Value) -> Result<Self> {
        let f = Fields::new(queue, Some(id), "enqueue reply", reply)?;
        match f.tag()?.as_str() {
            "new" => Ok(EnqueueReply::Created {
                run_at_ms: f.int(1, "run_at")?,
            }),
            "exists" => {
                // Lossily: a foreign state that is not UTF-8 is still a
                // duplicate (the id is taken), not an unreadable reply.
                let state = String::from_utf8_lossy(&f.bytes(1, "state")?).into_owned();
                if state.is_empty() {
                    warn!(queue, job_id = %id,
                        "enqueue: the id's job hash has no state (corrupt or foreign data); nothing written, answered as a duplicate");
                }
                Ok(EnqueueReply::Exists {
                    state: JobState::parse(&state),
                })
            }
            "done" => Ok(EnqueueReply::Done),
            other => Err(f.error(format_args!("unknown outcome {other:?}"))),
        }
    }
}

pub(super) fn millis(d: Option<Duration>) -> u64 {
    d.map(super::ms).unwrap_or(0)
}

/// Milliseconds since the epoch, 0 for none (or before the epoch).
pub(super) fn epoch_ms(at: Option<SystemTime>) -> u64 {
    at.and_then(|t| t.duration_since(UNIX_EPOCH).ok())
        .map(|d| super::ms(d).max(1))
        .unwrap_or(0)
}

/// The keys of an `enqueue.lua` call for job `id`, in the script's order.
#[cfg(test)]
pub(crate) fn script_keys(k: &QueueKeys, id: &str) -> [String; 8] {
    [
        k.main.clone(),
        k.job(id),
        k.done(id),
        k.delayed.clone(),
        k.stats.clone(),
        k.once(id),
        k.wake.clone(),
        k.guard.clone(),
    ]
}

#[cfg(test)]
mod tests {
    use redis::Value;

    use super::EnqueueReply;
    use crate::state::JobState;

    fn bulk(s: &str) -> Value {
        Value::BulkString(s.as_bytes().to_vec())
    }

    #[test]
    fn decodes_each_outcome() {
        let id = "a".into();
        let dec = |v: Vec<Value>| EnqueueReply::decode("q", &id, &Value::Array(v));
        assert_eq!(
            dec(vec![bulk("new"), Value::Int(5)]).unwrap(),
            EnqueueReply::Created { run_at_ms: 5 }
        );
        assert_eq!(
            dec(vec![bulk("exists"), bulk("active")]).unwrap(),
            EnqueueReply::Exists {
                state: JobState::Active
            }
        );
        assert_eq!(dec(vec![bulk("done")]).unwrap(), EnqueueReply::Done);
        // A job hash without a state: a duplicate of unknown state.
        assert_eq!(
            dec(vec![bulk("exists"), bulk("")]).unwrap(),
            EnqueueReply::Exists {
                state: JobState::Unknown(String::new())
            }
        );
    }

    #[test]
    fn a_missing_or_unknown_field_is_a_protocol_error_naming_queue_and_job() {
        let id = "job-7".into();
        for bad in [
            Value::Int(1),
            Value::Array(vec![bulk("exists")]),
            Value::Array(vec![bulk("new")]),
            Value::Array(vec![bulk("what")]),
            Value::Array(vec![]),
        ] {
            let err = EnqueueReply::decode("emails", &id, &bad).unwrap_err();
            assert!(matches!(err, crate::QueueError::Protocol { .. }), "{err}");
            assert_eq!(err.queue(), Some("emails"));
            assert_eq!(err.job_id().map(|j| j.as_str()), Some("job-7"));
        }
    }
}
