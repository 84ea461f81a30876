//! `cron_mark.lua`: a periodic job's last handled firing, kept in its
//! queue's cron hash ([`QueueKeys::cron`]) as `<unix seconds> <schedule>`,
//! and [`last_marked`], which reads it back when a scheduler starts: the
//! firings after it that no scheduler enqueued (every worker down, or Redis
//! unreachable, across a firing) are caught up from there
//! (background/scheduler.rs, docs/ARCHITECTURE.md "Cron catch-up").
//!
//! [`QueueKeys::cron`]: crate::QueueKeys::cron

use redis::AsyncCommands;

use super::reply;
use super::{lua_script, LuaScript};
use crate::conn::RedisConnection;
use crate::error::{QueueError, Result};
use crate::keys::QueueKeys;

pub(crate) static SCRIPT: LuaScript<1> =
    lua_script!("cron_mark.lua", keys = 1, args = 3, prelude(None));

/// Marks `firing` (unix seconds) handled for `job_type` under `schedule`;
/// never moves a record of the same schedule back.
pub(crate) struct CronMark<'a> {
    pub(crate) keys: &'a QueueKeys,
    pub(crate) job_type: &'a str,
    pub(crate) schedule: &'a str,
    pub(crate) firing: i64,
}

impl CronMark<'_> {
    /// Runs the script: whether the record moved (false: it already held
    /// this firing or a later one).
    pub(crate) async fn run(&self, conn: &mut RedisConnection) -> Result<bool> {
        let k = self.keys;
        let firing = u64::try_from(self.firing).map_err(|_| {
            QueueError::Config(format!(
                "periodic job type `{}` on queue `{}`: firing before 1970 ({})",
                self.job_type, k.queue, self.firing
            ))
        })?;
        let reply = SCRIPT
            .call([k.cron()])
            .arg(self.job_type)
            .arg(firing)
            .arg(self.schedule)
            .run(conn, &k.queue, None)
            .await?;
        reply::flag(&k.queue, None, "cron mark reply", &reply)
    }
}

/// What the cron hash holds for one periodic job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Marked {
    /// No record: the job was never fired on this Redis (or before stop 48).
    Nothing,
    /// The last firing handled (unix seconds) under the same schedule.
    Firing(i64),
    /// A record of another schedule (a deploy changed it), or a value that
    /// does not read as `<seconds> <schedule>` (written by hand).
    Stale(String),
}

/// Reads `value` (the cron hash's field of a job) for `schedule`.
pub(crate) fn parse(value: Option<&str>, schedule: &str) -> Marked {
    let Some(value) = value else {
        return Marked::Nothing;
    };
    match value.split_once(' ') {
        // Digits only, as the script reads them (`+5`, `1e11` are not).
        Some((secs, expr)) if expr == schedule && secs.bytes().all(|b| b.is_ascii_digit()) => {
            match secs.parse::<i64>() {
                Ok(secs) => Marked::Firing(secs),
                Err(_) => Marked::Stale(value.to_string()),
            }
        }
        _ => Marked::Stale(value.to_string()),
    }
}

/// The record of `job_type` on its queue, read for `schedule`. A key of
/// another type is an `Err` (WRONGTYPE) as any Redis error.
pub(crate) async fn last_marked(
    conn: &mut RedisConnection,
    keys: &QueueKeys,
    job_type: &str,
    schedule: &str,
) -> redis::RedisResult<Marked> {
    let value: Option<Vec<u8>> = conn.hget(keys.cron(), job_type).await?;
    let value = value.map(|v| String::from_utf8_lossy(&v).into_owned());
    Ok(parse(value.as_deref(), schedule))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_reads_only_for_its_own_schedule() {
        let s = "0 */5 * * * *";
        assert_eq!(parse(None, s), Marked::Nothing);
        assert_eq!(
            parse(Some("1767261600 0 */5 * * * *"), s),
            Marked::Firing(1767261600)
        );
        for other in [
            "1767261600 0 0 * * * *",
            "1767261600",
            "x 0 */5 * * * *",
            "-5 0 */5 * * * *",
            "+5 0 */5 * * * *",
            "1e11 0 */5 * * * *",
            " 0 */5 * * * *",
            "99999999999999999999 0 */5 * * * *",
            "",
        ] {
            assert_eq!(
                parse(Some(other), s),
                Marked::Stale(other.to_string()),
                "{other:?}"
            );
        }
    }
}
