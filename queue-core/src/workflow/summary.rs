//! Reading a batch back: [`BatchSummary`] (state and counts, for callbacks,
//! operators and `queue-watchdog batches show`) and [`ChildResult`] (a flow
//! child's outcome, for its parent).

use std::collections::HashMap;

use serde::de::DeserializeOwned;

use crate::conn::RedisConnection;
use crate::error::{QueueError, Result};
use crate::keys::QueueKeys;
use crate::queue::Queue;
use crate::results::{record_text, OUTPUT_MARK};

use super::engine::BatchRef;

/// A batch's state and counts, as its hash holds them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BatchSummary {
    /// The batch id (a flow's: its parent's job id).
    pub id: String,
    /// The queue its hash lives on.
    pub queue: String,
    /// `open` (members being enqueued), `sealed` (waiting for members) or
    /// `fired` (callbacks enqueued).
    pub state: String,
    /// Members registered.
    pub total: u64,
    /// Members that completed.
    pub succeeded: u64,
    /// Members dead-lettered.
    pub dead: u64,
    /// Members cancelled.
    pub cancelled: u64,
    /// Flow children under the fail-parent policy that did not succeed.
    pub failed: u64,
    /// Creation time, ms since the epoch (Redis clock).
    pub created_at_ms: i64,
    /// When the callbacks were enqueued, if they were.
    pub fired_at_ms: Option<i64>,
}

impl BatchSummary {
    /// Members finished so far (succeeded, dead or cancelled).
    pub fn finished(&self) -> u64 {
        self.succeeded + self.dead + self.cancelled
    }

    /// True when every member succeeded.
    pub fn all_succeeded(&self) -> bool {
        self.succeeded == self.total
    }

    /// Reads batch `key`; `None` when it does not exist (or expired).
    pub(crate) async fn read(conn: &mut RedisConnection, batch: &BatchRef) -> Result<Option<Self>> {
        // Named fields only: the callbacks' payloads in the same hash are binary.
        const FIELDS: [&str; 8] = [
            "state",
            "total",
            "succeeded",
            "dead",
            "cancelled",
            "failed",
            "created_at",
            "fired_at",
        ];
        let values: Vec<Option<String>> = redis::cmd("HMGET")
            .arg(&batch.key)
            .arg(&FIELDS[..])
            .query_async(conn)
            .await
            .map_err(|e| QueueError::redis(&batch.queue, None, e))?;
        let map: HashMap<&str, String> = FIELDS
            .iter()
            .zip(values)
            .filter_map(|(name, v)| Some((*name, v?)))
            .collect();
        if !map.contains_key("state") {
            return Ok(None);
        }
        let num = |name: &str| -> Result<i64> {
            match map.get(name) {
                None => Ok(0),
                Some(v) => v
                    .parse()
                    .map_err(|_| batch.error(format!("corrupt field {name}: {v:?}"))),
            }
        };
        let count = |name: &str| -> Result<u64> { Ok(num(name)?.max(0) as u64) };
        Ok(Some(BatchSummary {
            id: batch.id.clone(),
            queue: batch.queue.clone(),
            state: map.get("state").cloned().unwrap_or_default(),
            total: count("total")?,
            succeeded: count("succeeded")?,
            dead: count("dead")?,
            cancelled: count("cancelled")?,
            failed: count("failed")?,
            created_at_ms: num("created_at")?,
            fired_at_ms: map
                .contains_key("fired_at")
                .then(|| num("fired_at"))
                .transpose()?,
        }))
    }
}

/// One flow child's outcome, as its parent reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChildResult<T> {
    /// The child's job id.
    pub id: String,
    /// `Ok(result)` when it completed (`None`: it set no result), `Err(reason)`
    /// when it was dead-lettered or cancelled under [`ChildPolicy::Continue`]
    /// or [`ChildPolicy::FailParent`](super::ChildPolicy).
    ///
    /// [`ChildPolicy::Continue`]: super::ChildPolicy::Continue
    pub outcome: std::result::Result<Option<T>, String>,
}

/// Prefix of a result set with `ctx.set_child_result` (MessagePack, hex).
pub(crate) const TYPED_PREFIX: &str = "mp:";

/// Decodes one stored result (the bytes after `ok:`): a typed value a
/// `#[job]` fn returned ([`JobContext::set_output`]: the marker byte `0xc1`,
/// then MessagePack), `mp:<hex>` ([`JobContext::set_child_result`]:
/// MessagePack), or any other text (a plain `set_result_ref`) read as a
/// string-like `T`.
///
/// [`JobContext::set_output`]: crate::JobContext::set_output
/// [`JobContext::set_child_result`]: crate::JobContext::set_child_result
pub(crate) fn decode_result<T: DeserializeOwned>(
    raw: &[u8],
) -> std::result::Result<Option<T>, String> {
    match raw.split_first() {
        None => return Ok(None),
        Some((&OUTPUT_MARK, msgpack)) => {
            return rmp_serde::from_slice(msgpack)
                .map(Some)
                .map_err(|e| format!("stored typed result does not decode: {e}"));
        }
        Some(_) => {}
    }
    let raw = std::str::from_utf8(raw).map_err(|e| {
        format!(
            "stored result is neither a typed value nor text ({e}): {}",
            record_text(raw)
        )
    })?;
    if let Some(hex) = raw.strip_prefix(TYPED_PREFIX) {
        let bytes = (0..hex.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(hex.get(i..i + 2).unwrap_or("zz"), 16))
            .collect::<std::result::Result<Vec<u8>, _>>()
            .map_err(|e| format!("stored result is not hex: {e}"))?;
        return rmp_serde::from_slice(&bytes)
            .map(Some)
            .map_err(|e| format!("stored result does not decode: {e}"));
    }
    let de = serde::de::value::StrDeserializer::<serde::de::value::Error>::new(raw);
    T::deserialize(de)
        .map(Some)
        .map_err(|e| format!("stored result {raw:?} does not decode: {e}"))
}

/// Reads the results hash of flow `batch`: child id → outcome. Read as
/// bytes: a child's typed value ([`OUTPUT_MARK`] + MessagePack) is no UTF-8.
pub(crate) async fn read_results<T: DeserializeOwned>(
    conn: &mut RedisConnection,
    batch: &BatchRef,
) -> Result<Vec<ChildResult<T>>> {
    let map: HashMap<String, Vec<u8>> = redis::cmd("HGETALL")
        .arg(format!("{}:results", batch.key))
        .query_async(conn)
        .await
        .map_err(|e| QueueError::redis(&batch.queue, None, e))?;
    let mut out: Vec<ChildResult<T>> = map
        .into_iter()
        .map(|(id, v)| {
            let outcome = match (v.strip_prefix(b"ok:"), v.strip_prefix(b"err:")) {
                (Some(ok), _) => decode_result(ok)
                    .map_err(|e| batch.error(format!("child `{id}`: {e}")))
                    .map(Ok)?,
                (_, Some(err)) => Err(String::from_utf8_lossy(err).into_owned()),
                _ => {
                    return Err(batch.error(format!(
                        "child `{id}`: corrupt result {:?}",
                        record_text(&v)
                    )))
                }
            };
            Ok(ChildResult { id, outcome })
        })
        .collect::<Result<_>>()?;
    out.sort_by(|a, b| a.id.cmp(&b.id));
    Ok(out)
}

impl Queue {
    /// The state and counts of batch `id` homed on `queue` (a flow's: its
    /// parent's queue and id); `None` when it does not exist or expired
    /// (7 days after it fired).
    pub async fn batch(&self, queue: &str, id: &str) -> Result<Option<BatchSummary>> {
        let batch = BatchRef::new(queue, id);
        debug_assert_eq!(batch.key, QueueKeys::new(queue).batch(id));
        BatchSummary::read(&mut self.connection(), &batch).await
    }
}
