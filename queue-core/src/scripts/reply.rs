//! Reading script replies without panicking on anything Redis sends: the
//! primitives (`text`, `bytes`, `int`, `array`) and [`Fields`], the decoder of
//! positional replies that every wrapper in `scripts/` uses.

use redis::Value;

use crate::error::{QueueError, Result};
use crate::job::JobId;

/// The text of a bulk/simple string or integer reply.
pub(crate) fn text(v: &Value) -> Option<String> {
    match v {
        Value::BulkString(b) => String::from_utf8(b.clone()).ok(),
        Value::SimpleString(s) => Some(s.clone()),
        Value::Int(i) => Some(i.to_string()),
        Value::Okay => Some("OK".to_string()),
        _ => None,
    }
}

/// Raw bytes of a string reply.
pub(crate) fn bytes(v: &Value) -> Option<Vec<u8>> {
    match v {
        Value::BulkString(b) => Some(b.clone()),
        Value::SimpleString(s) => Some(s.clone().into_bytes()),
        _ => None,
    }
}

/// An integer, whether sent as integer or as decimal text (read in place:
/// no copy of the text, as every numeric field of a claim row goes through
/// here).
pub(crate) fn int(v: &Value) -> Option<i64> {
    match v {
        Value::Int(i) => Some(*i),
        Value::BulkString(b) => std::str::from_utf8(b).ok()?.parse().ok(),
        Value::SimpleString(s) => s.parse().ok(),
        _ => None,
    }
}

/// The elements of an array reply.
pub(crate) fn array(v: &Value) -> Option<&[Value]> {
    match v {
        Value::Array(items) | Value::Set(items) => Some(items),
        Value::Nil => Some(&[]),
        _ => None,
    }
}

/// [`array`] of a reply the caller owns: its elements moved out, or the
/// reply itself back when it is not an array.
pub(crate) fn into_array(v: Value) -> std::result::Result<Vec<Value>, Value> {
    match v {
        Value::Array(items) | Value::Set(items) => Ok(items),
        Value::Nil => Ok(Vec::new()),
        other => Err(other),
    }
}

/// A positional script reply being decoded. Every accessor of a required
/// field fails with [`QueueError::Protocol`] naming the queue and job (and
/// the field) instead of defaulting.
pub(crate) struct Fields<'v> {
    queue: &'v str,
    job_id: Option<JobId>,
    /// Which reply this is (`"fail reply"`, `"claim row"`), for messages.
    what: &'static str,
    reply: &'v Value,
    items: &'v [Value],
}

impl<'v> Fields<'v> {
    /// The elements of an array reply; anything else is a protocol error.
    pub(crate) fn new(
        queue: &'v str,
        job_id: Option<&JobId>,
        what: &'static str,
        reply: &'v Value,
    ) -> Result<Self> {
        let items = array(reply).ok_or_else(|| {
            QueueError::protocol(queue, job_id, format!("{what} is not an array: {reply:?}"))
        })?;
        Ok(Fields {
            queue,
            job_id: job_id.cloned(),
            what,
            reply,
            items,
        })
    }

    /// Names the job once its id has been read from the reply itself.
    pub(crate) fn set_job_id(&mut self, id: &JobId) {
        self.job_id = Some(id.clone());
    }

    /// A protocol error about this reply.
    pub(crate) fn error(&self, detail: impl std::fmt::Display) -> QueueError {
        QueueError::protocol(
            self.queue,
            self.job_id.as_ref(),
            format!("{} {detail}: {:?}", self.what, self.reply),
        )
    }

    /// Field `i` read by `read`; `name` is for the error.
    pub(crate) fn field<T>(
        &self,
        i: usize,
        name: &str,
        read: impl Fn(&Value) -> Option<T>,
    ) -> Result<T> {
        self.items
            .get(i)
            .and_then(read)
            .ok_or_else(|| self.error(format_args!("field {i} ({name}) missing or malformed")))
    }

    /// Field `i` as text.
    pub(crate) fn text(&self, i: usize, name: &str) -> Result<String> {
        self.field(i, name, text)
    }

    /// Field `i` as raw bytes.
    pub(crate) fn bytes(&self, i: usize, name: &str) -> Result<Vec<u8>> {
        self.field(i, name, bytes)
    }

    /// Field `i` as an integer.
    pub(crate) fn int(&self, i: usize, name: &str) -> Result<i64> {
        self.field(i, name, int)
    }

    /// Field `i` as a non-negative integer.
    pub(crate) fn u64(&self, i: usize, name: &str) -> Result<u64> {
        self.field(i, name, |v| u64::try_from(int(v)?).ok())
    }

    /// Field `i` as a nested array (an empty one for nil).
    pub(crate) fn list(&self, i: usize, name: &str) -> Result<&'v [Value]> {
        let items: &'v [Value] = self.items;
        items
            .get(i)
            .and_then(array)
            .ok_or_else(|| self.error(format_args!("field {i} ({name}) missing or malformed")))
    }

    /// Field `i` as a list of `id, state` pairs: the stale entries a
    /// script dropped (promote, reclaim). Read lossily: the script has
    /// committed by now, and an id that is not UTF-8 (another producer's)
    /// must not fail the reply, and with it the caller's pass.
    pub(crate) fn dropped_entries(&self, i: usize) -> Result<Vec<(JobId, String)>> {
        let lossy = |v: &Value| bytes(v).map(|b| String::from_utf8_lossy(&b).into_owned());
        let mut out = Vec::new();
        for pair in self.list(i, "dropped entries")?.chunks(2) {
            let (Some(id), Some(state)) =
                (pair.first().and_then(lossy), pair.get(1).and_then(lossy))
            else {
                return Err(self.error(format_args!("dropped entry {pair:?}")));
            };
            out.push((JobId::from(id.as_str()), state));
        }
        Ok(out)
    }

    /// Number of fields.
    pub(crate) fn len(&self) -> usize {
        self.items.len()
    }

    /// The tag in field 0 (`"claimed"`, `"retry"`, ...).
    pub(crate) fn tag(&self) -> Result<String> {
        self.text(0, "tag")
    }

    /// [`tag`](Self::tag), read in place (a claim row's, once per job).
    pub(crate) fn tag_str(&self) -> Result<&'v str> {
        match self.items.first() {
            Some(Value::BulkString(b)) => std::str::from_utf8(b).ok(),
            Some(Value::SimpleString(s)) => Some(s.as_str()),
            _ => None,
        }
        .ok_or_else(|| self.error(format_args!("field 0 (tag) missing or malformed")))
    }
}

/// A lone integer reply, or a protocol error naming the queue and job.
pub(crate) fn integer(
    queue: &str,
    job_id: Option<&JobId>,
    what: &str,
    reply: &Value,
) -> Result<i64> {
    int(reply).ok_or_else(|| {
        QueueError::protocol(queue, job_id, format!("{what}: not an integer: {reply:?}"))
    })
}

/// A `1` / `0` reply as true / false; anything else is a protocol error.
pub(crate) fn flag(queue: &str, job_id: Option<&JobId>, what: &str, reply: &Value) -> Result<bool> {
    match integer(queue, job_id, what, reply)? {
        1 => Ok(true),
        0 => Ok(false),
        n => Err(QueueError::protocol(
            queue,
            job_id,
            format!("{what}: expected 1 or 0, got {n}"),
        )),
    }
}
