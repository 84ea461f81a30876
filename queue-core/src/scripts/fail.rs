//! `fail.lua`: a failed attempt. Schedules a retry (delayed set, attempts
//! kept) or dead-letters the job with its reason, only while the delivery's
//! token matches (DESIGN rule 3).

use std::time::Duration;

use redis::Value;

use super::reply::Fields;
use super::{lua_script, LuaScript};
use crate::conn::RedisConnection;
use crate::error::Result;
use crate::job::JobId;
use crate::keys::QueueKeys;

pub(crate) static SCRIPT: LuaScript<8> =
    lua_script!("fail.lua", keys = 8, args = 6, prelude(super::DRAIN));

/// How the attempt failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FailKind {
    /// Retry while attempts are left, then dead-letter ("attempts exhausted").
    Retry,
    /// Dead-letter now (permanent error, unknown type or version, undecodable payload).
    Permanent,
}

impl FailKind {
    fn as_arg(self) -> &'static str {
        match self {
            FailKind::Retry => "retry",
            FailKind::Permanent => "permanent",
        }
    }
}

/// Records one failed attempt.
pub(crate) struct Fail<'a> {
    pub(crate) keys: &'a QueueKeys,
    pub(crate) id: &'a JobId,
    pub(crate) token: &'a str,
    pub(crate) kind: FailKind,
    /// The error (retry) or the dead-letter reason (permanent); sent cut to
    /// [`MAX_ERROR_BYTES`](super::MAX_ERROR_BYTES).
    pub(crate) message: &'a str,
    /// Retry delay, added to the Redis clock by the script (DESIGN rule 2).
    pub(crate) delay: Duration,
    /// Claimed far from the tail of processing
    /// ([`Delivery::far_from_tail`](super::claim::Delivery::far_from_tail)):
    /// the script may look for it from the head.
    pub(crate) far_from_tail: bool,
}

/// What the script did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum FailReply {
    /// Back in the delayed set until `run_at_ms`.
    Retry { run_at_ms: i64 },
    /// Dead-lettered with `reason`.
    Dead { reason: String },
    /// The token no longer matches: the job was reclaimed.
    LeaseLost,
    /// An operator asked to cancel the job: nothing was written; end it with
    /// `finish_cancel.lua`.
    CancelRequested,
}

impl Fail<'_> {
    /// Runs the script.
    pub(crate) async fn run(&self, conn: &mut RedisConnection) -> Result<FailReply> {
        let (k, id) = (self.keys, self.id.as_str());
        let reply = SCRIPT
            .call([
                k.processing.clone(),
                k.leases.clone(),
                k.job(id),
                k.delayed.clone(),
                k.dead.clone(),
                k.stats.clone(),
                k.wake.clone(),
                k.guard.clone(),
            ])
            .arg(id)
            .arg(self.token)
            .arg(self.kind.as_arg())
            .arg(&*super::cut_error(self.message))
            .arg(super::ms(self.delay))
            .arg(super::far_arg(self.far_from_tail))
            .run(conn, &k.queue, Some(self.id))
            .await?;
        crate::workflow::relay::hint_if_marked(&k.queue, &reply, 2);
        FailReply::decode(&k.queue, self.id, &reply)
    }
}

impl FailReply {
    /// `{'retry', run_at} | {'dead', reason} | {'lost'}`.
    pub(crate) fn decode(queue: &str, id: &JobId, reply: &Value) -> Result<Self> {
        let f = Fields::new(queue, Some(id), "fail reply", reply)?;
        match f.tag()?.as_str() {
            "retry" => Ok(FailReply::Retry {
                run_at_ms: f.int(1, "run_at")?,
            }),
            "dead" => Ok(FailReply::Dead {
                reason: f.text(1, "reason")?,
            }),
            "lost" => Ok(FailReply::LeaseLost),
            "cancel_requested" => Ok(FailReply::CancelRequested),
            other => Err(f.error(format_args!("unknown outcome {other:?}"))),
        }
    }
}

#[cfg(test)]
mod tests {
    use redis::Value;

    use super::FailReply;

    fn bulk(s: &str) -> Value {
        Value::BulkString(s.as_bytes().to_vec())
    }

    #[test]
    fn decodes_each_outcome_and_rejects_missing_fields() {
        let id = "j".into();
        let dec = |v: Vec<Value>| FailReply::decode("q", &id, &Value::Array(v));
        assert_eq!(
            dec(vec![bulk("retry"), Value::Int(9)]).unwrap(),
            FailReply::Retry { run_at_ms: 9 }
        );
        assert_eq!(
            dec(vec![bulk("dead"), bulk("boom")]).unwrap(),
            FailReply::Dead {
                reason: "boom".into()
            }
        );
        assert_eq!(dec(vec![bulk("lost")]).unwrap(), FailReply::LeaseLost);
        for bad in [
            vec![bulk("dead")],
            vec![bulk("retry")],
            vec![bulk("x")],
            vec![],
        ] {
            let err = dec(bad).unwrap_err();
            assert_eq!(err.job_id().map(|j| j.as_str()), Some("j"));
        }
    }
}
