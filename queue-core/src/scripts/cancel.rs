//! `cancel.lua`: an operator's cancel of one job. A waiting or delayed job
//! ends with a completion record of status `cancelled`; a running one gets
//! `cancel_requested` on its hash. Decoded into [`CancelOutcome`].

use std::time::Duration;

use super::reply::Fields;
use super::{lua_script, LuaScript};
use crate::conn::RedisConnection;
use crate::error::Result;
use crate::flow::CancelOutcome;
use crate::job::JobId;
use crate::keys::QueueKeys;
use crate::state::JobState;

pub(crate) static SCRIPT: LuaScript<10> =
    lua_script!("cancel.lua", keys = 10, args = 2, prelude(super::DRAIN));

/// Cancels one job.
pub(crate) struct Cancel<'a> {
    pub(crate) keys: &'a QueueKeys,
    pub(crate) id: &'a JobId,
    /// How long the completion record (status `cancelled`) is kept.
    pub(crate) retention: Duration,
}

impl Cancel<'_> {
    /// Runs the script.
    pub(crate) async fn run(&self, conn: &mut RedisConnection) -> Result<CancelOutcome> {
        let (k, id) = (self.keys, self.id.as_str());
        let reply = SCRIPT
            .call([
                k.main.clone(),
                k.processing.clone(),
                k.leases.clone(),
                k.delayed.clone(),
                k.job(id),
                k.done(id),
                k.stats.clone(),
                k.steps(id),
                k.guard.clone(),
                k.limits(),
            ])
            .arg(id)
            .arg(super::ms(self.retention).max(1))
            .run(conn, &k.queue, Some(self.id))
            .await?;
        decode(&k.queue, self.id, &reply)
    }
}

/// `{'cancelled', state} | {'requested', 1|0} | {'finished', status} |
/// {'dead'} | {'not_found'} | {'unknown', state}`.
fn decode(queue: &str, id: &JobId, reply: &redis::Value) -> Result<CancelOutcome> {
    let f = Fields::new(queue, Some(id), "cancel reply", reply)?;
    Ok(match f.tag()?.as_str() {
        "cancelled" => CancelOutcome::Cancelled {
            from: JobState::parse(&f.text(1, "state")?),
        },
        "requested" => CancelOutcome::Requested {
            first: f.int(1, "first request")? == 1,
        },
        "finished" => CancelOutcome::AlreadyFinished {
            status: f.text(1, "status")?,
        },
        "dead" => CancelOutcome::Dead,
        "not_found" => CancelOutcome::NotFound,
        "unknown" => CancelOutcome::Unexpected {
            state: JobState::parse(&f.text(1, "state")?),
        },
        other => return Err(f.error(format_args!("unknown cancel outcome {other:?}"))),
    })
}

#[cfg(test)]
mod tests {
    use redis::Value;

    use super::decode;
    use crate::flow::CancelOutcome;
    use crate::state::JobState;

    fn bulk(s: &str) -> Value {
        Value::BulkString(s.as_bytes().to_vec())
    }

    #[test]
    fn decodes_each_outcome_and_rejects_missing_fields() {
        let id = "j".into();
        let dec = |v: Vec<Value>| decode("q", &id, &Value::Array(v));
        assert_eq!(
            dec(vec![bulk("cancelled"), bulk("delayed")]).unwrap(),
            CancelOutcome::Cancelled {
                from: JobState::Delayed
            }
        );
        assert_eq!(
            dec(vec![bulk("requested"), Value::Int(1)]).unwrap(),
            CancelOutcome::Requested { first: true }
        );
        assert_eq!(
            dec(vec![bulk("not_found")]).unwrap(),
            CancelOutcome::NotFound
        );
        for bad in [
            vec![bulk("cancelled")],
            vec![bulk("finished")],
            vec![bulk("x")],
        ] {
            let err = dec(bad).unwrap_err();
            assert_eq!(err.job_id().map(|j| j.as_str()), Some("j"));
        }
    }
}
