//! `batch_open.lua`: creates a batch's hash (state `open`, zero counts, the
//! default member policy, the callbacks' job specs, optional DAG metadata),
//! keeping an existing one as it is; enters it in the queue's batch index
//! and gives it the open TTL (docs/WORKFLOWS.md, "Operating batches").

use std::time::Duration;

use super::reply::Fields;
use super::{lua_script, LuaScript};
use crate::conn::RedisConnection;
use crate::error::{QueueError, Result};
use crate::keys::QueueKeys;

pub(crate) static SCRIPT: LuaScript<4> =
    lua_script!("batch_open.lua", keys = 4, args = 3, prelude(None));

/// How long a batch may stay open (never sealed) before it expires, unless
/// its builder sets another: 3 days.
pub const DEFAULT_OPEN_TTL: Duration = Duration::from_secs(3 * 24 * 3600);

/// Opens one batch.
pub(crate) struct BatchOpen<'a> {
    /// The queue the batch hash lives on (its home; names the index).
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
    /// Runs the script with the default open TTL and no metadata.
    pub(crate) async fn run(&self, conn: &mut RedisConnection) -> Result<BatchOpenReply> {
        self.run_with(conn, DEFAULT_OPEN_TTL, &[]).await
    }

    /// Runs the script: open TTL `ttl`, metadata fields `meta` (names `m_*`).
    pub(crate) async fn run_with(
        &self,
        conn: &mut RedisConnection,
        ttl: Duration,
        meta: &[(String, Vec<u8>)],
    ) -> Result<BatchOpenReply> {
        let keys = QueueKeys::new(self.queue);
        let id = self
            .key
            .strip_prefix(keys.batch("").as_str())
            .filter(|id| !id.is_empty())
            .ok_or_else(|| {
                QueueError::Config(format!(
                    "batch key {:?} is not a batch of queue `{}`",
                    self.key, self.queue
                ))
            })?;
        let ttl_ms = ttl.as_millis().clamp(1, u64::MAX as u128) as u64;
        let (index, sweep) = (keys.batches(), keys.batches_sweep());
        let mut call = SCRIPT
            .call([self.key, &index, &sweep, &keys.guard])
            .arg(self.policy)
            .arg(ttl_ms)
            .arg(id);
        for (name, value) in self.spec.iter().chain(meta) {
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
