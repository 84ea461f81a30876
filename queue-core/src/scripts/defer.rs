//! `defer.lua`: a delivery whose payload schema version is newer than the
//! worker's handler is given back without using an attempt (delayed for a
//! short time, lease dropped, only while the token matches), or dead-lettered
//! once no live worker has announced that version for the configured wait
//! (docs/RELIABILITY.md, "Rolling deploys").

use std::time::Duration;

use redis::Value;

use super::reply::Fields;
use super::{lua_script, LuaScript};
use crate::conn::RedisConnection;
use crate::error::Result;
use crate::job::JobId;
use crate::keys::QueueKeys;

pub(crate) static SCRIPT: LuaScript<7> =
    lua_script!("defer.lua", keys = 7, args = 6, prelude(super::DRAIN));

/// Gives back one delivery of a newer payload version.
pub(crate) struct Defer<'a> {
    pub(crate) keys: &'a QueueKeys,
    pub(crate) id: &'a JobId,
    pub(crate) token: &'a str,
    /// The payload's field in the versions hash (`type:version`).
    pub(crate) field: &'a str,
    /// How long the job stays in the delayed set before it is offered again.
    pub(crate) delay: Duration,
    /// How long no live worker may have announced the version before the
    /// job is dead-lettered.
    pub(crate) wait: Duration,
    /// The version this worker's handler knows (for the dead-letter reason).
    pub(crate) known: u32,
}

/// What the script did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum DeferReply {
    /// Back in the delayed set until `run_at_ms`, attempt not counted.
    Deferred { run_at_ms: i64 },
    /// Dead-lettered with `reason`.
    Dead { reason: String },
    /// The token no longer matches: the job was reclaimed.
    LeaseLost,
    /// An operator asked to cancel the job: nothing was written.
    CancelRequested,
}

impl Defer<'_> {
    /// Runs the script.
    pub(crate) async fn run(&self, conn: &mut RedisConnection) -> Result<DeferReply> {
        let (k, id) = (self.keys, self.id.as_str());
        let reply = SCRIPT
            .call([
                k.processing.clone(),
                k.leases.clone(),
                k.job(id),
                k.delayed.clone(),
                k.dead.clone(),
                k.stats.clone(),
                k.versions(),
            ])
            .arg(id)
            .arg(self.token)
            .arg(self.field)
            .arg(self.delay.as_millis() as u64)
            .arg(self.wait.as_millis() as u64)
            .arg(self.known)
            .run(conn, &k.queue, Some(self.id))
            .await?;
        DeferReply::decode(&k.queue, self.id, &reply)
    }
}

impl DeferReply {
    /// `{'deferred', run_at} | {'dead', reason} | {'lost'} | {'cancel_requested'}`.
    pub(crate) fn decode(queue: &str, id: &JobId, reply: &Value) -> Result<Self> {
        let f = Fields::new(queue, Some(id), "defer reply", reply)?;
        match f.tag()?.as_str() {
            "deferred" => Ok(DeferReply::Deferred {
                run_at_ms: f.int(1, "run_at")?,
            }),
            "dead" => Ok(DeferReply::Dead {
                reason: f.text(1, "reason")?,
            }),
            "lost" => Ok(DeferReply::LeaseLost),
            "cancel_requested" => Ok(DeferReply::CancelRequested),
            other => Err(f.error(format_args!("unknown outcome {other:?}"))),
        }
    }
}

#[cfg(test)]
mod tests {
    use redis::Value;

    use super::DeferReply;

    fn bulk(s: &str) -> Value {
        Value::BulkString(s.as_bytes().to_vec())
    }

    #[test]
    fn decodes_each_outcome_and_rejects_missing_fields() {
        let id = "j".into();
        let dec = |v: Vec<Value>| DeferReply::decode("q", &id, &Value::Array(v));
        assert_eq!(
            dec(vec![bulk("deferred"), Value::Int(9)]).unwrap(),
            DeferReply::Deferred { run_at_ms: 9 }
        );
        assert_eq!(
            dec(vec![bulk("dead"), bulk("gone")]).unwrap(),
            DeferReply::Dead {
                reason: "gone".into()
            }
        );
        assert_eq!(dec(vec![bulk("lost")]).unwrap(), DeferReply::LeaseLost);
        for bad in [vec![bulk("deferred")], vec![bulk("dead")], vec![]] {
            let err = dec(bad).unwrap_err();
            assert_eq!(err.job_id().map(|j| j.as_str()), Some("j"));
        }
    }
}
