//! `enqueue_many.lua`: writes many jobs of one queue in one script call (the
//! multi-job form of `enqueue.lua`, same per-job checks and replies), for
//! [`Queue`](crate::Queue)'s batches and its group commit of concurrent
//! single enqueues. Every job is validated before the first write; one TIME
//! and one stats update per call; a generated id skips the dedupe reads.

use redis::{Pipeline, Value};

use super::enqueue::{epoch_ms, millis, Enqueue, EnqueueReply};
use super::reply::{self, Fields};
use super::{lua_script, Call, LuaScript};
use crate::conn::RedisConnection;
use crate::error::{QueueError, Result};
use crate::keys::QueueKeys;

pub(crate) static SCRIPT: LuaScript<5> =
    lua_script!("enqueue_many.lua", keys = 5, args = 4, prelude(None));

/// The most jobs one call carries: bounds the time one script holds Redis
/// and the memory of one group commit. Larger batches are sent as several
/// calls (in one pipeline).
pub(crate) const MAX_JOBS_PER_CALL: usize = 256;

/// What an invalid job does to the call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    /// Nothing is written; the call fails with the script's error reply
    /// (a batch the caller built: all or nothing).
    All,
    /// The invalid job answers [`ManyReply::Invalid`]; the others are
    /// written (a group commit of independent callers).
    Each,
}

/// One job of the call.
pub(crate) struct ManyJob<'a> {
    pub(crate) job: Enqueue<'a>,
    /// Unique per enqueue call, kept across its retries (see `enqueue.rs`).
    pub(crate) token: &'a str,
    /// A generated id that this call sends for the first time: the script
    /// skips the dedupe reads. A retry must send `false` (the first attempt
    /// may have written it).
    pub(crate) fresh: bool,
}

/// What the script did with one job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ManyReply {
    /// As `enqueue.lua` answers for one job.
    Enqueued(EnqueueReply),
    /// Refused by validation (only in [`Mode::Each`]); nothing written for it.
    Invalid(String),
}

/// The call for `jobs` (all of queue `keys`).
pub(crate) fn call(keys: &QueueKeys, mode: Mode, jobs: &[ManyJob<'_>]) -> Call {
    // The `:int` modes: a job written answers its run_at alone, not a
    // `{'new', run_at}` table (cheaper for Redis to send; issue #12).
    let mode = match mode {
        Mode::All => "all:int",
        Mode::Each => "each:int",
    };
    call_in_mode(keys, mode, jobs)
}

/// The call's keys and numbered arguments for queue `keys` in `mode`,
/// before the jobs (each job's fields follow as the repeated tail).
pub(crate) fn call_head(keys: &QueueKeys, mode: &str) -> Call {
    SCRIPT
        .call([
            keys.main.clone(),
            keys.delayed.clone(),
            keys.stats.clone(),
            keys.wake.clone(),
            keys.guard.clone(),
        ])
        .arg(&keys.job_prefix)
        .arg(&keys.done_prefix)
        .arg(keys.once(""))
        .arg(mode)
}

/// The call for `jobs` with the script's `mode` argument as given (the
/// documented `all` / `each` of producers in other languages, or their
/// `:int` forms).
pub(crate) fn call_in_mode(keys: &QueueKeys, mode: &str, jobs: &[ManyJob<'_>]) -> Call {
    let mut call = call_head(keys, mode);
    for m in jobs {
        let j = &m.job;
        call = call
            .repeated_arg(j.id.as_str())
            .repeated_arg(j.job_type)
            .repeated_arg(j.schema_version)
            .repeated_arg(j.payload)
            .repeated_arg(j.max_attempts.max(1))
            .repeated_arg(millis(j.delay))
            .repeated_arg(epoch_ms(j.run_at))
            .repeated_arg(millis(j.once_for))
            .repeated_arg(m.token)
            .repeated_arg(if m.fresh { "1" } else { "0" })
            .repeated_arg(j.extra.len());
        for (name, value) in j.extra {
            call = call
                .repeated_arg(name.as_str())
                .repeated_arg(value.as_str());
        }
    }
    call
}

/// Runs one call (at most [`MAX_JOBS_PER_CALL`] jobs) and decodes its reply,
/// each job's on its own (see [`decode`]): the outer `Err` is the call's
/// failure, each inner one that job's own.
pub(crate) async fn run_each(
    conn: &mut RedisConnection,
    keys: &QueueKeys,
    mode: Mode,
    jobs: &[ManyJob<'_>],
) -> Result<Vec<Result<ManyReply>>> {
    let first = jobs.first().map(|m| m.job.id);
    let reply = call(keys, mode, jobs).run(conn, &keys.queue, first).await?;
    decode(&keys.queue, jobs, &reply)
}

/// [`run_each`] for script tests: the first job's error fails the result.
#[cfg(test)]
pub(crate) async fn run(
    conn: &mut RedisConnection,
    keys: &QueueKeys,
    mode: Mode,
    jobs: &[ManyJob<'_>],
) -> Result<Vec<ManyReply>> {
    run_each(conn, keys, mode, jobs)
        .await?
        .into_iter()
        .collect()
}

/// Adds the call to a pipeline; on NOSCRIPT the caller runs [`load`] and
/// resends the pipeline.
pub(crate) fn add_to(pipe: &mut Pipeline, keys: &QueueKeys, mode: Mode, jobs: &[ManyJob<'_>]) {
    call(keys, mode, jobs).add_to(pipe);
}

/// Loads the library after a pipeline sent at `sent` found it missing (or
/// takes the outcome of a load that ended after: `library::load_after`).
pub(crate) async fn load(
    conn: &mut RedisConnection,
    sent: std::time::Instant,
) -> redis::RedisResult<()> {
    super::library::load_after(conn, sent).await
}

/// One reply per job, in order: an integer (the run_at of a job written, as
/// the `:int` modes answer), or one decoded as [`EnqueueReply::decode`] or
/// `{'invalid', reason}`. A reply that is not an array, or a count that does
/// not match, is a protocol error of the whole call (the outer `Err`). Each
/// job's reply is decoded on its own: one that does not decode is that
/// job's error (naming it), and the other jobs keep their outcomes — the
/// call wrote them, and a caller told "not enqueued" for a job that was
/// written may enqueue it twice (a group commit answers each caller with its
/// own job's result; a batch reports the others in `PartialBatch`).
pub(crate) fn decode(
    queue: &str,
    jobs: &[ManyJob<'_>],
    reply: &Value,
) -> Result<Vec<Result<ManyReply>>> {
    let first = jobs.first().map(|m| m.job.id);
    let items = reply::array(reply).ok_or_else(|| {
        QueueError::protocol(queue, first, format!("enqueue_many reply: {reply:?}"))
    })?;
    if items.len() != jobs.len() {
        return Err(QueueError::protocol(
            queue,
            first,
            format!(
                "enqueue_many: {} replies for {} jobs",
                items.len(),
                jobs.len()
            ),
        ));
    }
    Ok(jobs
        .iter()
        .zip(items)
        .map(|(m, item)| decode_one(queue, m.job.id, item))
        .collect())
}

/// The reply of one job of the call.
fn decode_one(queue: &str, id: &crate::job::JobId, item: &Value) -> Result<ManyReply> {
    if let Value::Int(run_at_ms) = item {
        return Ok(ManyReply::Enqueued(EnqueueReply::Created {
            run_at_ms: *run_at_ms,
        }));
    }
    let f = Fields::new(queue, Some(id), "enqueue_many reply", item)?;
    if f.tag()? == "invalid" {
        return Ok(ManyReply::Invalid(f.text(1, "reason")?));
    }
    EnqueueReply::decode(queue, id, item).map(ManyReply::Enqueued)
}

#[cfg(test)]
mod tests {
    use redis::Value;

    use super::{decode, ManyJob, ManyReply};
    use crate::job::JobId;
    use crate::keys::QueueKeys;
    use crate::scripts::enqueue::{Enqueue, EnqueueReply};

    fn bulk(s: &str) -> Value {
        Value::BulkString(s.as_bytes().to_vec())
    }

    /// Job `id` of a call, sent without an enqueue token.
    fn test_job<'a>(keys: &'a QueueKeys, id: &'a JobId) -> ManyJob<'a> {
        ManyJob {
            job: Enqueue::test_job(keys, id, 1),
            token: "",
            fresh: false,
        }
    }

    #[test]
    fn decodes_one_reply_per_job_and_refuses_a_wrong_count() {
        let keys = QueueKeys::new("q");
        let (a, b) = ("a".into(), "b".into());
        let jobs = [test_job(&keys, &a), test_job(&keys, &b)];
        let reply = Value::Array(vec![
            Value::Array(vec![bulk("new"), Value::Int(5)]),
            Value::Array(vec![bulk("invalid"), bulk("extra field name: id")]),
        ]);
        let ok = |v: &Value| -> Vec<ManyReply> {
            decode("q", &jobs, v)
                .unwrap()
                .into_iter()
                .map(Result::unwrap)
                .collect()
        };
        assert_eq!(
            ok(&reply),
            vec![
                ManyReply::Enqueued(EnqueueReply::Created { run_at_ms: 5 }),
                ManyReply::Invalid("extra field name: id".into()),
            ]
        );
        // The `:int` modes answer a job written with its run_at alone.
        let ints = Value::Array(vec![Value::Int(7), Value::Array(vec![bulk("done")])]);
        assert_eq!(
            ok(&ints),
            vec![
                ManyReply::Enqueued(EnqueueReply::Created { run_at_ms: 7 }),
                ManyReply::Enqueued(EnqueueReply::Done),
            ]
        );
        let short = Value::Array(vec![Value::Array(vec![bulk("done")])]);
        let err = decode("q", &jobs, &short).unwrap_err();
        assert!(matches!(err, crate::QueueError::Protocol { .. }), "{err}");
    }

    /// A reply that does not decode fails only its own job: the other job's
    /// outcome is kept (it was written). Before, one bad reply failed the
    /// whole call's result, and every job of it read "not enqueued".
    #[test]
    fn one_undecodable_reply_fails_only_its_own_job() {
        let keys = QueueKeys::new("q");
        let (a, b) = ("a".into(), "b".into());
        let jobs = [test_job(&keys, &a), test_job(&keys, &b)];
        let bad = Value::Array(vec![Value::Array(vec![bulk("what")]), Value::Int(1)]);
        let mut replies = decode("q", &jobs, &bad).unwrap().into_iter();
        let err = replies.next().unwrap().unwrap_err();
        assert!(matches!(err, crate::QueueError::Protocol { .. }), "{err}");
        assert_eq!(err.job_id().map(|j| j.as_str()), Some("a"));
        // The script ran: whether it wrote job a is not known, so the
        // caller is not told "not enqueued" (it may enqueue again with the
        // same id to learn which).
        assert!(err.outcome_unknown(), "{err}");
        assert_eq!(
            replies.next().unwrap().unwrap(),
            ManyReply::Enqueued(EnqueueReply::Created { run_at_ms: 1 })
        );
    }
}
