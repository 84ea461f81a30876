//! `batch_seal.lua`: seals a batch once its members are registered and
//! enqueued; it fires at once when they all already finished.

use super::reply::Fields;
use super::{lua_script, LuaScript};
use crate::conn::RedisConnection;
use crate::error::Result;

pub(crate) static SCRIPT: LuaScript<1> =
    lua_script!("batch_seal.lua", keys = 1, args = 0, prelude(None));

/// Seals one batch.
pub(crate) struct BatchSeal<'a> {
    /// The queue the batch hash lives on (for errors).
    pub(crate) queue: &'a str,
    /// The batch hash key.
    pub(crate) key: &'a str,
}

impl BatchSeal<'_> {
    /// Runs the script; the batch's state after it (`sealed`, `fired`, or
    /// `missing`).
    pub(crate) async fn run(&self, conn: &mut RedisConnection) -> Result<String> {
        let reply = SCRIPT.call([self.key]).run(conn, self.queue, None).await?;
        Fields::new(self.queue, None, "batch_seal reply", &reply)?.tag()
    }
}
