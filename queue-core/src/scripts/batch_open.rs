//! `batch_open.lua`: creates a batch's hash (state `open`, zero counts, the
//! default member policy and the callbacks' job specs), keeping an existing
//! one as it is (docs/WORKFLOWS.md).

use super::reply::Fields;
use super::{lua_script, LuaScript};
use crate::conn::RedisConnection;
use crate::error::Result;

pub(crate) static SCRIPT: LuaScript<1> =
    lua_script!("batch_open.lua", keys = 1, args = 1, prelude(None));

/// Opens one batch.
pub(crate) struct BatchOpen<'a> {
    /// The queue the batch hash lives on (for errors).
    pub(crate) queue: &'a str,
    /// The batch hash key.
    pub(crate) key: &'a str,
    /// Default member policy (`""`: none, a plain batch).
    pub(crate) policy: &'a str,
    /// Callback spec fields (`s_*`, `c_*`), name then value.
    pub(crate) spec: &'a [(String, Vec<u8>)],
}

/// What the script found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum BatchOpenReply {
    /// Created now.
    New,
    /// Already there, in this state.
    Exists { state: String },
}

impl BatchOpen<'_> {
    /// Runs the script.
    pub(crate) async fn run(&self, conn: &mut RedisConnection) -> Result<BatchOpenReply> {
        let mut call = SCRIPT.call([self.key]).arg(self.policy);
        for (name, value) in self.spec {
            call = call
                .repeated_arg(name.as_str())
                .repeated_arg(value.as_slice());
        }
        let reply = call.run(conn, self.queue, None).await?;
        let f = Fields::new(self.queue, None, "batch_open reply", &reply)?;
        match f.tag()?.as_str() {
            "new" => Ok(BatchOpenReply::New),
            "exists" => Ok(BatchOpenReply::Exists {
                state: f.text(1, "state")?,
            }),
            other => Err(f.error(format_args!("unknown outcome {other:?}"))),
        }
    }
}
