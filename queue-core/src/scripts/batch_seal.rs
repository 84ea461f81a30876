//! `batch_seal.lua`: seals a batch once its members are registered and
//! enqueued; it fires at once when they all already finished. Its
//! callbacks enter the queue's pending hash until it fires (a producer may
//! wait for one before it exists, docs/RESULTS.md).

use super::reply::Fields;
use super::{lua_script, LuaScript};
use crate::conn::RedisConnection;
use crate::error::Result;
use crate::keys::QueueKeys;

pub(crate) static SCRIPT: LuaScript<3> =
    lua_script!("batch_seal.lua", keys = 3, args = 0, prelude(None));

/// Seals one batch.
pub(crate) struct BatchSeal<'a> {
    /// The queue the batch hash lives on (its pending hash; errors).
    pub(crate) queue: &'a str,
    /// The batch hash key.
    pub(crate) key: &'a str,
}

impl BatchSeal<'_> {
    /// Runs the script; the batch's state after it (`sealed`, `fired`, or
    /// `missing`).
    #[cfg(test)]
    pub(crate) async fn run(&self, conn: &mut RedisConnection) -> Result<String> {
        Ok(self.run_marked(conn).await?.0)
    }

    /// Runs the script; the batch's state after it, and whether its fire
    /// wrote relay notices (the caller relays the batch's queue).
    pub(crate) async fn run_marked(&self, conn: &mut RedisConnection) -> Result<(String, bool)> {
        let keys = QueueKeys::new(self.queue);
        let reply = SCRIPT
            .call([self.key.to_string(), keys.pending(), keys.guard])
            .run(conn, self.queue, None)
            .await?;
        let f = Fields::new(self.queue, None, "batch_seal reply", &reply)?;
        let relay = f.text(1, "relay").is_ok_and(|t| t == "relay");
        Ok((f.tag()?, relay))
    }
}
