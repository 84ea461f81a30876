//! `batch_add.lua`: registers member ids of a batch before they are
//! enqueued; each id counts in `total` once (docs/WORKFLOWS.md). Members on
//! another queue than the batch's have it recorded (batch field `where:<id>`).

use super::reply::Fields;
use super::{lua_script, LuaScript};
use crate::conn::RedisConnection;
use crate::error::Result;

pub(crate) static SCRIPT: LuaScript<2> =
    lua_script!("batch_add.lua", keys = 2, args = 2, prelude(None));

/// Registers members of one batch.
pub(crate) struct BatchAdd<'a> {
    /// The queue the batch hash lives on (for errors).
    pub(crate) queue: &'a str,
    /// The batch hash key.
    pub(crate) key: &'a str,
    /// Policy of these members (`""`: the batch's default).
    pub(crate) policy: &'a str,
    /// The members' queue when it is not the batch's (`""`: the batch's).
    pub(crate) member_queue: &'a str,
    /// Member ids.
    pub(crate) ids: &'a [String],
}

/// What the script did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum BatchAddReply {
    /// Registered; this many ids were new members.
    Added(u64),
    /// The batch already fired: nothing registered.
    Fired,
    /// No such batch (never opened, or expired).
    Missing,
}

impl BatchAdd<'_> {
    /// Runs the script.
    pub(crate) async fn run(&self, conn: &mut RedisConnection) -> Result<BatchAddReply> {
        let members = format!("{}:members", self.key);
        let mut call = SCRIPT
            .call([self.key, members.as_str()])
            .arg(self.policy)
            .arg(self.member_queue);
        for id in self.ids {
            call = call.repeated_arg(id.as_str());
        }
        let reply = call.run(conn, self.queue, None).await?;
        let f = Fields::new(self.queue, None, "batch_add reply", &reply)?;
        match f.tag()?.as_str() {
            "added" => Ok(BatchAddReply::Added(f.u64(1, "added")?)),
            "fired" => Ok(BatchAddReply::Fired),
            "missing" => Ok(BatchAddReply::Missing),
            other => Err(f.error(format_args!("unknown outcome {other:?}"))),
        }
    }
}
