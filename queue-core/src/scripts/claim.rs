//! `claim.lua` and the claim row: the claim after a blocking `BLMOVE` (which
//! cannot run in a script, DESIGN rule 4), and the decoding of the rows that
//! `claim()` in `prelude.lua` returns, for this script and for `fetch.lua`.
//! A claimed row is one string (`claimed_row` in the prelude: each field its
//! decimal length, `:` and its bytes, read by [`Packed`]), any other
//! outcome a short array led by its tag. A claim retried with the same
//! token answers the same row (a lost reply never turns into `busy`); a row
//! that does not decode is [`ClaimRow::Unreadable`], on its own.

use std::time::Duration;

use redis::Value;

use super::reply::Fields;
use super::{lua_script, LuaScript};
use crate::conn::RedisConnection;
use crate::error::{QueueError, Result};
use crate::job::JobId;
use crate::keys::QueueKeys;

pub(crate) static SCRIPT: LuaScript<10> =
    lua_script!("claim.lua", keys = 10, args = 7, prelude(super::DRAIN));

/// Claims `id`, which a `BLMOVE` just moved to processing.
pub(crate) struct Claim<'a> {
    pub(crate) keys: &'a QueueKeys,
    /// The id as `BLMOVE` returned it.
    pub(crate) id: &'a [u8],
    pub(crate) lease: Duration,
    /// The fresh lease token of this delivery (DESIGN rule 3).
    pub(crate) token: &'a str,
}

impl Claim<'_> {
    /// Runs the script. A Redis failure is a [`QueueError::Redis`] naming the
    /// job (the caller may retry it with the same token: the retry answers
    /// the same row); a reply that does not decode is
    /// [`ClaimRow::Unreadable`], as a fetch's row is: the job may be leased
    /// to us already, and the caller dead-letters it with the reason.
    /// No worker name is written (see [`run_as`](Self::run_as)).
    #[cfg(any(test, feature = "failpoints"))]
    pub(crate) async fn run(&self, conn: &mut RedisConnection) -> Result<ClaimRow> {
        self.run_as(conn, "", false).await
    }

    /// [`run`](Self::run) by the worker named `worker`: the job's hash keeps
    /// it in its `worker` field for this delivery ("": none). `stopping`: the
    /// worker is shutting down, so a job nobody claimed goes back to the head
    /// of main unclaimed ([`Skip::Stopping`]).
    pub(crate) async fn run_as(
        &self,
        conn: &mut RedisConnection,
        worker: &str,
        stopping: bool,
    ) -> Result<ClaimRow> {
        let k = self.keys;
        let sent_at = tokio::time::Instant::now();
        let reply = SCRIPT
            .call([
                &k.processing,
                &k.leases,
                &k.dead,
                &k.stats,
                &k.guard,
                &k.paused(),
                &k.main,
                &k.limits(),
                &k.delayed,
                &k.wake,
            ])
            .arg(self.id)
            .arg(&k.job_prefix)
            .arg(&k.done_prefix)
            .arg(super::ms(self.lease))
            .arg(self.token)
            .arg(worker)
            .arg(if stopping { "1" } else { "0" })
            .invoke(conn)
            .await
            .map_err(|e| {
                let id = JobId::from(lossy(self.id));
                QueueError::redis(&k.queue, Some(&id), e)
            })?;
        Ok(ClaimRow::take_or_unreadable(&k.queue, reply).sent_at(sent_at))
    }
}

/// One claimed delivery: what the worker needs to run the job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Delivery {
    pub(crate) id: JobId,
    /// The lease token that ack, extend and fail must present.
    pub(crate) token: String,
    pub(crate) job_type: String,
    /// Payload schema version.
    pub(crate) version: u32,
    /// MessagePack payload.
    pub(crate) payload: Vec<u8>,
    /// 1 on the first delivery.
    pub(crate) attempt: u32,
    pub(crate) max_attempts: u32,
    pub(crate) enqueued_at_ms: i64,
    pub(crate) delivered_at_ms: i64,
    /// Fencing token: +1 on every delivery of this job, never reset.
    pub(crate) fence: u64,
    /// Redis time of the job's first claim (the start of its execution
    /// deadline, docs/RESULTS.md); this delivery's time when not known.
    pub(crate) first_started_at_ms: i64,
    /// When the request that claimed it was sent (local monotonic clock):
    /// where the local lease deadline is measured from.
    pub(crate) claim_sent_at: tokio::time::Instant,
    /// The enqueuing span's W3C `traceparent` (job field `traceparent`), if any.
    pub(crate) traceparent: Option<String>,
    /// Claimed with at least 256 older entries between it and the tail of
    /// the processing list (the row's `far`), which ack and fail send back:
    /// entries only join processing at the head, so a delivery claimed near
    /// the tail is still near it, and is looked for from the tail alone; a
    /// far one may be nearer the head by the time it ends (longer
    /// deliveries still running behind it), and is looked for at both ends
    /// (`unlist_delivery` in the prelude). False also when not known (a
    /// retried fetch's rows, a fetch of one or two jobs).
    pub(crate) far_from_tail: bool,
}

/// The fields of a claimed row, in order (`claimed_row` in prelude.lua):
/// one string, each field written as its length in decimal, `:` and its
/// bytes. The payload is last, so that it can keep the reply's buffer.
const PACKED_FIELDS: [&str; 13] = [
    "id",
    "token",
    "type",
    "schema version",
    "attempts",
    "max_attempts",
    "enqueued_at",
    "delivered_at",
    "fence",
    "traceparent",
    "first_started_at",
    "far",
    "payload",
];

/// Reads the fields of a claimed row one by one, as byte ranges.
struct Packed<'a> {
    buf: &'a [u8],
    at: usize,
}

impl<'a> Packed<'a> {
    fn new(buf: &'a [u8]) -> Self {
        Packed { buf, at: 0 }
    }
}

impl Iterator for Packed<'_> {
    type Item = std::ops::Range<usize>;

    /// The next field, or `None` when the row ends or its length does not
    /// read or fit.
    fn next(&mut self) -> Option<Self::Item> {
        let mut len: usize = 0;
        let mut at = self.at;
        loop {
            let b = *self.buf.get(at)?;
            at += 1;
            match b {
                b':' if at - self.at > 1 => break,
                // At most 10 digits: a length never reaches u32::MAX.
                b'0'..=b'9' if at - self.at <= 10 => len = len * 10 + usize::from(b - b'0'),
                _ => return None,
            }
        }
        let start = at;
        let end = start.checked_add(len).filter(|&e| e <= self.buf.len())?;
        self.at = end;
        Some(start..end)
    }
}

/// Bytes as text, invalid UTF-8 replaced (as a job id is read everywhere).
/// Valid UTF-8, the usual id, is checked by `from_utf8`'s fast path: the
/// replacing decoder walks the bytes chunk by chunk (~300 instructions per
/// claimed job, issue #12).
fn lossy(b: &[u8]) -> String {
    match std::str::from_utf8(b) {
        Ok(s) => s.to_owned(),
        Err(_) => String::from_utf8_lossy(b).into_owned(),
    }
}

/// The id of a claimed row, its first field, when that field reads.
fn packed_id(packed: &[u8]) -> Option<String> {
    Packed::new(packed).next().map(|r| lossy(&packed[r]))
}

/// A decimal integer as `str::parse::<i64>` reads one (an optional sign,
/// then digits), read from the bytes without a UTF-8 check first: a claimed
/// row has seven per job.
fn decimal(b: &[u8]) -> Option<i64> {
    let (negative, digits) = match b {
        [b'-', rest @ ..] => (true, rest),
        [b'+', rest @ ..] => (false, rest),
        _ => (false, b),
    };
    if digits.is_empty() {
        return None;
    }
    let mut n: i64 = 0;
    for &d in digits {
        if !d.is_ascii_digit() {
            return None;
        }
        let d = i64::from(d - b'0');
        n = n.checked_mul(10)?;
        n = match negative {
            true => n.checked_sub(d)?,
            false => n.checked_add(d)?,
        };
    }
    Some(n)
}

impl Delivery {
    /// A packed claimed row (see [`PACKED_FIELDS`]), or the buffer back with
    /// a [`QueueError::Protocol`] naming the queue, the job (once its id is
    /// read) and the field.
    fn unpack(queue: &str, buf: Vec<u8>) -> std::result::Result<Self, (Vec<u8>, QueueError)> {
        // Only on the error path: the message names the job when its id reads.
        let refuse = |buf: Vec<u8>, detail: String| {
            let id = packed_id(&buf).map(JobId::from);
            let shown = String::from_utf8_lossy(&buf[..buf.len().min(256)]).into_owned();
            let e =
                QueueError::protocol(queue, id.as_ref(), format!("claim row {detail}: {shown:?}"));
            (buf, e)
        };
        let field_error =
            |i: usize| format!("field {i} ({}) missing or malformed", PACKED_FIELDS[i]);
        let mut ranges: [std::ops::Range<usize>; 13] = Default::default();
        let mut fields = Packed::new(&buf);
        for (i, range) in ranges.iter_mut().enumerate() {
            match fields.next() {
                Some(r) => *range = r,
                None => return Err(refuse(buf, field_error(i))),
            }
        }
        if fields.at != buf.len() {
            return Err(refuse(buf, "has bytes after its payload".to_string()));
        }
        let text = |i: usize| std::str::from_utf8(&buf[ranges[i].clone()]).ok();
        let num = |i: usize| decimal(&buf[ranges[i].clone()]);
        let unsigned = |i: usize| num(i).and_then(|n| u64::try_from(n).ok());
        let small = |i: usize| unsigned(i).and_then(|n| u32::try_from(n).ok());
        // A count the worker only shows and compares (attempt, max_attempts):
        // above u32::MAX, u32::MAX. A producer may store any non-negative
        // integer as max_attempts (docs/PROTOCOL.md); the decisions that use
        // it (retry or dead-letter) are taken in Lua from the stored value.
        let count = |i: usize| unsigned(i).map(|n| u32::try_from(n).unwrap_or(u32::MAX));
        // Field `i`, or its index for the error.
        fn need<T>(v: Option<T>, i: usize) -> std::result::Result<T, usize> {
            v.ok_or(i)
        }
        let read = || -> std::result::Result<Delivery, usize> {
            let delivered_at_ms = need(num(7), 7)?;
            Ok(Delivery {
                // An id that is not UTF-8 (another producer's bytes) could
                // not be acked, extended or failed: every later call names
                // the job by its text, which is not its key. The row is
                // unreadable without its token (see `unreadable`).
                id: JobId::from(need(text(0), 0)?),
                token: need(text(1), 1)?.to_string(),
                job_type: need(text(2), 2)?.to_string(),
                version: need(small(3), 3)?,
                payload: Vec::new(),
                attempt: need(count(4), 4)?,
                max_attempts: need(count(5), 5)?.max(1),
                enqueued_at_ms: need(num(6), 6)?,
                delivered_at_ms,
                fence: need(unsigned(8), 8)?,
                // Empty on a first delivery: it is its own delivery time.
                first_started_at_ms: match ranges[10].is_empty() {
                    true => delivered_at_ms,
                    false => need(num(10), 10)?,
                },
                claim_sent_at: tokio::time::Instant::now(),
                traceparent: text(9).filter(|t| !t.is_empty()).map(str::to_string),
                // Only a hint, never a reason to refuse the delivery.
                far_from_tail: &buf[ranges[11].clone()] == b"1",
            })
        };
        let mut delivery = match read() {
            Ok(d) => d,
            Err(i) => return Err(refuse(buf, field_error(i))),
        };
        let payload_at = ranges[12].start;
        let mut payload = buf;
        payload.drain(..payload_at);
        delivery.payload = payload;
        Ok(delivery)
    }
}

/// Why a row was not claimed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Skip {
    /// `done`: a completion record exists; acked without running.
    Done,
    /// `missing`: the job hash was gone; dead-lettered.
    Missing,
    /// `busy`: another delivery owns the job.
    Busy,
    /// `gone`: the watchdog returned the id before this claim (claim.lua only).
    Gone,
    /// `paused`: the queue is paused; the id went back to main unclaimed
    /// (claim.lua only).
    Paused,
    /// `stopping`: the worker is shutting down; the id went back to the head
    /// of main unclaimed (claim.lua only, DESIGN rule 10).
    Stopping,
    /// `limited`: a queue limit lets no job start for this many ms; the id
    /// went back to main unclaimed (claim.lua only, docs/LIMITS.md).
    Limited(u64),
    /// `deferred`: the job's rate key is over its limit; the job went to the
    /// delayed set, unclaimed (docs/LIMITS.md).
    Deferred,
    /// `expired`: not started before its deadline; dead-lettered with
    /// reason `expired` (docs/RESULTS.md).
    Expired,
    /// Never a script's answer: the fetcher's name for a `stopping` hand-back
    /// it asked for because the job `BLMOVE` handed over found no free slot
    /// on the worker (the id went back to the head of main unclaimed).
    NoSlot,
}

impl Skip {
    /// The log line for a skipped row.
    pub(crate) fn reason(self) -> &'static str {
        match self {
            Skip::Done => "completion record exists: acked without running the handler again",
            Skip::Missing => "job hash missing or without a state: dead-lettered",
            Skip::Busy => "another delivery owns this job",
            Skip::Gone => "already returned by the watchdog before the claim",
            Skip::Paused => "queue paused: returned to the queue unclaimed",
            Skip::Stopping => "worker shutting down: returned to the queue unclaimed",
            Skip::Limited(_) => "queue limit reached: returned to the queue unclaimed",
            Skip::Deferred => "rate key over its limit: delayed until it has room, unclaimed",
            Skip::Expired => "not started before its deadline: dead-lettered as expired",
            Skip::NoSlot => {
                "no free slot on this worker: returned to the head of the queue unclaimed, fetched again once a slot is free"
            }
        }
    }
}

/// A row of a fetch or claim reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ClaimRow {
    /// Ours to run.
    Claimed(Delivery),
    /// Not ours to run.
    Skipped(JobId, Skip),
    /// `corrupt`: the job's stored data was corrupt (a count that is not a
    /// non-negative integer, a job key that is not a hash); the script
    /// dead-lettered it with this reason, which names the field.
    Corrupt(JobId, String),
    /// A row this version cannot decode. The job may be claimed (leased to
    /// us, with `token`): the caller dead-letters it alone, the other rows run.
    Unreadable(Unreadable),
}

/// What could be read of a row that does not decode.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Unreadable {
    /// The job id, when the row has one.
    pub(crate) id: Option<JobId>,
    /// The delivery's lease token, when the row is a readable `claimed` row
    /// up to its token: the job is then leased to this worker.
    pub(crate) token: Option<String>,
    /// The decoding error, naming the field.
    pub(crate) detail: String,
}

impl ClaimRow {
    /// [`decode`](Self::decode) of a row the caller owns (the fetch's), with
    /// a row that does not decode returned as [`ClaimRow::Unreadable`] (what
    /// could be read of it, and why).
    pub(crate) fn take_or_unreadable(queue: &str, mut row: Value) -> Self {
        Self::decode_owned(queue, &mut row).unwrap_or_else(|e| Self::unreadable(&row, &e))
    }

    /// What could be read of a row that did not decode (`e`): the id, and
    /// the token of a claimed row (the job is then leased to us).
    fn unreadable(reply: &Value, e: &QueueError) -> Self {
        let (id, token) = match reply {
            Value::BulkString(packed) => {
                // The token only with an id that is UTF-8: a job the
                // worker cannot name by its key is not failed by its text
                // (that call answers "lease lost" and changes nothing); it
                // is left leased for the watchdog, which dead-letters it
                // when its attempts run out, without it ever running.
                let id_is_text = Packed::new(packed)
                    .next()
                    .is_some_and(|r| std::str::from_utf8(&packed[r]).is_ok());
                let token = Packed::new(packed)
                    .nth(1)
                    .filter(|_| id_is_text)
                    .and_then(|r| std::str::from_utf8(&packed[r]).ok().map(str::to_string));
                (packed_id(packed), token)
            }
            _ => {
                let items = super::reply::array(reply).unwrap_or_default();
                (
                    items
                        .get(1)
                        .and_then(super::reply::bytes)
                        .map(|b| lossy(&b)),
                    None,
                )
            }
        };
        ClaimRow::Unreadable(Unreadable {
            id: id.map(JobId::from),
            token,
            detail: e.to_string(),
        })
    }

    /// A row: a claimed delivery is one string (`claimed_row` in
    /// prelude.lua, see [`Packed`]); any other outcome is an array
    /// `{'corrupt', id, reason}`, `{'limited', id, ms}` or `{tag, id}` with
    /// tag `done`, `missing`, `busy`, `gone`, `paused`, `stopping`, `deferred` or
    /// `expired`.
    #[cfg(test)]
    pub(crate) fn decode(queue: &str, reply: &Value) -> Result<Self> {
        Self::decode_owned(queue, &mut reply.clone())
    }

    /// [`decode`](Self::decode) of a row the caller owns: a claimed row's
    /// payload keeps the reply's buffer instead of a copy. A row that does
    /// not decode is left whole.
    fn decode_owned(queue: &str, row: &mut Value) -> Result<Self> {
        match row {
            Value::BulkString(packed) => {
                let buf = std::mem::take(packed);
                Delivery::unpack(queue, buf)
                    .map(ClaimRow::Claimed)
                    .map_err(|(buf, e)| {
                        *packed = buf;
                        e
                    })
            }
            other => Self::decode_other(queue, other),
        }
    }

    /// A row that is not a claimed delivery (an array led by its tag).
    fn decode_other(queue: &str, reply: &Value) -> Result<Self> {
        let mut f = Fields::new(queue, None, "claim row", reply)?;
        let tag = f.tag_str()?;
        let id = JobId::from(lossy(&f.bytes(1, "id")?));
        f.set_job_id(&id);
        let skip = match tag {
            "corrupt" => return Ok(ClaimRow::Corrupt(id, f.text(2, "reason")?)),
            "done" => Skip::Done,
            "missing" => Skip::Missing,
            "busy" => Skip::Busy,
            "gone" => Skip::Gone,
            "paused" => Skip::Paused,
            "stopping" => Skip::Stopping,
            "limited" => Skip::Limited(f.u64(2, "limit wait")?),
            "deferred" => Skip::Deferred,
            "expired" => Skip::Expired,
            other => return Err(f.error(format_args!("unknown claim outcome {other:?}"))),
        };
        Ok(ClaimRow::Skipped(id, skip))
    }

    /// Records when the claiming request was sent (decode stamps the reply's
    /// arrival, which is later than the lease start).
    pub(crate) fn sent_at(mut self, at: tokio::time::Instant) -> Self {
        if let ClaimRow::Claimed(d) = &mut self {
            d.claim_sent_at = at;
        }
        self
    }
}

#[cfg(test)]
mod tests {
    use redis::Value;

    use super::{ClaimRow, Skip, PACKED_FIELDS};
    use crate::job::JobId;

    /// An id that is valid UTF-8 reads as itself; invalid bytes are
    /// replaced, as everywhere a job id is read.
    #[test]
    fn lossy_keeps_valid_text_and_replaces_invalid_bytes() {
        assert_eq!(super::lossy(b"job-1:\xc3\xa9"), "job-1:\u{e9}");
        assert_eq!(super::lossy(b"a\xffb"), "a\u{fffd}b");
        assert_eq!(super::lossy(b""), "");
    }

    fn bulk(s: &str) -> Value {
        Value::BulkString(s.as_bytes().to_vec())
    }

    /// The fields of a claimed row, in `PACKED_FIELDS` order.
    fn claimed_fields() -> Vec<Vec<u8>> {
        [
            "j1", "tok", "send", "2", "1", "5", "100", "200", "4", "", "", "", "",
        ]
        .iter()
        .map(|f| f.as_bytes().to_vec())
        .collect()
    }

    /// `fields` as `claimed_row` in prelude.lua writes them.
    fn packed(fields: &[Vec<u8>]) -> Value {
        let mut out = Vec::new();
        for f in fields {
            out.extend_from_slice(format!("{}:", f.len()).as_bytes());
            out.extend_from_slice(f);
        }
        Value::BulkString(out)
    }

    fn delivery(fields: &[Vec<u8>]) -> super::Delivery {
        match ClaimRow::decode("q", &packed(fields)).unwrap() {
            ClaimRow::Claimed(d) => d,
            other => panic!("not claimed: {other:?}"),
        }
    }

    #[test]
    fn decodes_a_claimed_row() {
        let d = delivery(&claimed_fields());
        assert_eq!(
            (d.id.as_str(), d.token.as_str(), d.job_type.as_str()),
            ("j1", "tok", "send")
        );
        assert_eq!((d.version, d.attempt, d.max_attempts), (2, 1, 5));
        assert_eq!((d.enqueued_at_ms, d.delivered_at_ms), (100, 200));
        assert_eq!(d.fence, 4);
        assert!(d.payload.is_empty());
        assert_eq!(d.traceparent, None, "an empty traceparent is none");
        assert!(!d.far_from_tail, "an empty far is not far");
        assert_eq!(
            d.first_started_at_ms, 200,
            "no first start: the delivery time"
        );
    }

    /// Each field lands in its own place: a payload (last, keeping the
    /// reply's buffer), an id that is not ASCII, a traceparent, a first
    /// start and the far flag.
    #[test]
    fn decodes_every_field_in_its_place() {
        let tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let mut f = claimed_fields();
        f[0] = "j\u{e9}1".as_bytes().to_vec();
        f[9] = tp.as_bytes().to_vec();
        f[10] = b"150".to_vec();
        f[11] = b"1".to_vec();
        f[12] = vec![0x81, 0xa1, b'x', 0x01, 0, 0, 0, 9];
        let d = delivery(&f);
        assert_eq!(d.id.as_str(), "j\u{e9}1");
        assert_eq!(d.traceparent.as_deref(), Some(tp));
        assert_eq!(d.first_started_at_ms, 150);
        assert!(d.far_from_tail);
        assert_eq!(d.payload, vec![0x81, 0xa1, b'x', 0x01, 0, 0, 0, 9]);
        assert_eq!((d.token.as_str(), d.fence), ("tok", 4));
    }

    /// A claimed row whose id is not UTF-8 is unreadable, names its job
    /// lossily, and comes without its token: the worker cannot name the job
    /// by its key in any later call (its ack answered "lease lost" and the
    /// job ran again at every delivery), so it leaves it leased for the
    /// watchdog instead of running it or failing it by the wrong name.
    #[test]
    fn a_claimed_row_whose_id_is_not_utf8_is_unreadable_without_its_token() {
        let mut f = claimed_fields();
        f[0] = b"j\xff1".to_vec();
        let ClaimRow::Unreadable(u) = ClaimRow::take_or_unreadable("q", packed(&f)) else {
            panic!("a row whose id is not UTF-8 is unreadable")
        };
        assert_eq!(u.id.as_ref().map(JobId::as_str), Some("j\u{fffd}1"));
        assert_eq!(u.token, None);
        assert!(u.detail.contains("field 0 (id)"), "{}", u.detail);
    }

    /// An attempt or max_attempts above u32::MAX (a producer may store any
    /// non-negative integer as max_attempts) reads as u32::MAX. Before, the
    /// row was unreadable and the job dead-lettered at its first delivery.
    #[test]
    fn counts_above_u32_read_as_u32_max() {
        for (attempt, max) in [("1", "4294967296"), ("4294967296", "9007199254740991")] {
            let mut f = claimed_fields();
            f[4] = attempt.as_bytes().to_vec();
            f[5] = max.as_bytes().to_vec();
            let d = delivery(&f);
            let want = |t: &str| u32::try_from(t.parse::<u64>().unwrap()).unwrap_or(u32::MAX);
            assert_eq!(
                (d.attempt, d.max_attempts),
                (want(attempt), u32::MAX),
                "{attempt}/{max}"
            );
        }
        let mut f = claimed_fields();
        f[5] = b"4294967295".to_vec();
        assert_eq!(delivery(&f).max_attempts, u32::MAX);
    }

    /// `decimal` reads what `str::parse::<i64>` reads, and refuses what it
    /// refuses.
    #[test]
    fn decimal_reads_as_parse_does() {
        for t in [
            "0",
            "7",
            "-1",
            "+5",
            "1796543709862",
            "9223372036854775807",
            "-9223372036854775808",
            "9223372036854775808",
            "",
            "-",
            "+",
            "1.5",
            " 1",
            "1e3",
            "0x10",
            "--1",
            "12a",
        ] {
            assert_eq!(super::decimal(t.as_bytes()), t.parse::<i64>().ok(), "{t:?}");
        }
    }

    /// The far flag is only a hint for finding the delivery in processing:
    /// anything but `1` is not far, and the delivery still runs.
    #[test]
    fn a_far_flag_that_does_not_read_is_not_far() {
        for bad in [&b"x1"[..], b"11", b"0"] {
            let mut f = claimed_fields();
            f[11] = bad.to_vec();
            assert!(!delivery(&f).far_from_tail, "{bad:?}");
        }
    }

    #[test]
    fn decodes_skipped_rows() {
        let row = Value::Array(vec![bulk("gone"), bulk("j2")]);
        assert_eq!(
            ClaimRow::decode("q", &row).unwrap(),
            ClaimRow::Skipped("j2".into(), Skip::Gone)
        );
        let row = Value::Array(vec![bulk("limited"), bulk("j3"), Value::Int(250)]);
        assert_eq!(
            ClaimRow::decode("q", &row).unwrap(),
            ClaimRow::Skipped("j3".into(), Skip::Limited(250))
        );
    }

    /// A truncated row, a field that does not read (each of the numbers,
    /// and text that is not UTF-8) or bytes after the payload: a protocol
    /// error naming the queue, the job and the field.
    #[test]
    fn every_required_field_is_checked_and_the_error_names_the_job() {
        let whole = match packed(&claimed_fields()) {
            Value::BulkString(b) => b,
            _ => unreachable!(),
        };
        // From the end of the id ("2:j1") to one byte short.
        for cut in 4..whole.len() {
            let err =
                ClaimRow::decode("emails", &Value::BulkString(whole[..cut].to_vec())).unwrap_err();
            assert!(matches!(err, crate::QueueError::Protocol { .. }), "{err}");
            assert_eq!(err.queue(), Some("emails"));
            assert_eq!(err.job_id().map(|j| j.as_str()), Some("j1"), "cut at {cut}");
        }
        let bad = |i: usize, value: &[u8]| {
            let mut f = claimed_fields();
            f[i] = value.to_vec();
            ClaimRow::decode("q", &packed(&f)).unwrap_err().to_string()
        };
        for i in [3, 4, 5, 6, 7, 8, 10] {
            let err = bad(i, b"x1");
            assert!(err.contains(PACKED_FIELDS[i]), "field {i}: {err}");
        }
        assert!(bad(3, b"-1").contains("schema version"), "negative version");
        assert!(bad(8, b"-1").contains("fence"), "negative fence");
        for i in [1, 2] {
            let err = bad(i, &[0xff]);
            assert!(err.contains(PACKED_FIELDS[i]), "field {i}: {err}");
        }
        let mut longer = whole.clone();
        longer.push(0);
        assert!(ClaimRow::decode("q", &Value::BulkString(longer)).is_err());
        assert!(ClaimRow::decode("q", &Value::Array(vec![bulk("odd"), bulk("j")])).is_err());
        assert!(ClaimRow::decode("q", &Value::Array(vec![bulk("claimed")])).is_err());
    }

    /// A row that does not decode is unreadable, and still names its id and
    /// lease token (the job is leased to us: the caller dead-letters it);
    /// a skipped row reads as a skip.
    #[test]
    fn an_unreadable_row_keeps_its_id_and_token() {
        assert_eq!(
            ClaimRow::take_or_unreadable("q", Value::Array(vec![bulk("busy"), bulk("j2")])),
            ClaimRow::Skipped("j2".into(), Skip::Busy)
        );
        let mut bad_type = claimed_fields();
        bad_type[2] = vec![0xff];
        let mut cut = claimed_fields();
        cut.truncate(11);
        for fields in [bad_type, cut] {
            let ClaimRow::Unreadable(u) = ClaimRow::take_or_unreadable("q", packed(&fields)) else {
                panic!("a row that does not decode is unreadable")
            };
            assert_eq!(u.id.as_ref().map(|j| j.as_str()), Some("j1"));
            assert_eq!(
                u.token.as_deref(),
                Some("tok"),
                "the lease token is still read"
            );
        }
        let ClaimRow::Unreadable(u) =
            ClaimRow::take_or_unreadable("q", Value::Array(vec![bulk("what"), bulk("j4")]))
        else {
            panic!("an unknown outcome is unreadable")
        };
        assert_eq!(
            (u.id.as_ref().map(|j| j.as_str()), u.token),
            (Some("j4"), None)
        );
    }
}

#[cfg(test)]
mod fencing {
    use std::time::Duration;

    use super::ClaimRow;
    use crate::conn::RedisConnection;
    use crate::job::JobId;
    use crate::keys::QueueKeys;
    use crate::scripts::enqueue::Enqueue;
    use crate::scripts::fail::{Fail, FailKind};
    use crate::scripts::fetch::Fetch;
    use crate::scripts::promote::Promote;
    use crate::scripts::replay::Replay;

    const TRACEPARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    /// The extra field an enqueue in a traced span adds.
    fn traceparent_field() -> [(String, String); 1] {
        [("traceparent".to_string(), TRACEPARENT.to_string())]
    }

    async fn fetch_one(conn: &mut RedisConnection, keys: &QueueKeys) -> super::Delivery {
        let base = uuid::Uuid::new_v4().to_string();
        match fetch_with(conn, keys, &base, 1).await.pop() {
            Some(d) => d,
            None => panic!("expected a claimed row"),
        }
    }

    /// Up to `count` deliveries of one fetch with token base `base` (not a
    /// first try: a second call with the same base is a retry, answered
    /// from the first one's receipt); a row that is not claimed panics.
    async fn fetch_with(
        conn: &mut RedisConnection,
        keys: &QueueKeys,
        base: &str,
        count: usize,
    ) -> Vec<super::Delivery> {
        let fetch = Fetch {
            keys,
            lease: Duration::from_secs(30),
            token_base: base,
            count,
            first_try: false,
        };
        let rows = fetch.run(conn).await.unwrap();
        rows.into_iter()
            .map(|row| match row {
                ClaimRow::Claimed(d) => d,
                other => panic!("expected a claimed row, got {other:?}"),
            })
            .collect()
    }

    async fn fail(
        conn: &mut RedisConnection,
        keys: &QueueKeys,
        d: &super::Delivery,
        kind: FailKind,
    ) {
        let fail = Fail {
            keys,
            id: &d.id,
            token: &d.token,
            kind,
            message: "planned",
            delay: Duration::ZERO,
            far_from_tail: false,
        };
        fail.run(conn).await.unwrap();
    }

    /// Fails delivery `d` as retryable at once and promotes it: the job
    /// waits in main again.
    async fn retry_now(conn: &mut RedisConnection, keys: &QueueKeys, d: &super::Delivery) {
        fail(conn, keys, d, FailKind::Retry).await;
        Promote { keys, limit: 10 }.run(conn).await.unwrap();
    }

    /// [`retry_now`], then the job's next delivery.
    async fn redeliver(
        conn: &mut RedisConnection,
        keys: &QueueKeys,
        d: &super::Delivery,
    ) -> super::Delivery {
        retry_now(conn, keys, d).await;
        fetch_one(conn, keys).await
    }

    /// The claim row leaves out what it can (`claimed_row` in prelude.lua):
    /// a first delivery carries no first start (it is its own delivery
    /// time) and no traceparent when the job has none; a redelivery carries
    /// the first delivery's time, and a job's traceparent comes with every
    /// delivery. Fails when the row drops the first start of a redelivery.
    #[tokio::test]
    async fn a_redelivery_carries_the_first_start_and_the_traceparent() {
        let (_server, mut conn) = crate::scripts::test_redis().await;
        let keys = QueueKeys::new("rows");
        let (tp, extra) = (TRACEPARENT, traceparent_field());
        for (id, traced) in [("plain", false), ("traced", true)] {
            let id = JobId::from(id);
            let mut enqueue = Enqueue::test_job(&keys, &id, 5);
            if traced {
                enqueue.extra = &extra;
            }
            enqueue.run(&mut conn).await.unwrap();
            let first = fetch_one(&mut conn, &keys).await;
            assert_eq!(first.first_started_at_ms, first.delivered_at_ms, "{id}");
            // A later millisecond on the Redis clock for the redelivery.
            tokio::time::sleep(Duration::from_millis(5)).await;
            let second = redeliver(&mut conn, &keys, &first).await;
            assert_eq!(second.id, id);
            assert!(second.delivered_at_ms > first.delivered_at_ms, "{id}");
            assert_eq!(second.first_started_at_ms, first.delivered_at_ms, "{id}");
            let want = traced.then_some(tp);
            assert_eq!(first.traceparent.as_deref(), want, "{id}");
            assert_eq!(second.traceparent.as_deref(), want, "{id}");
        }
    }

    /// A fetch retried with its token base (its first reply lost) answers
    /// every delivery as the first try did, field for field, though the
    /// retry reads them back from the job hashes (`same_claim`) and the
    /// first try built them at the claim: a redelivered traced job (first
    /// start and traceparent in the row) and a first delivery (neither).
    #[tokio::test]
    async fn a_retried_fetch_answers_the_same_deliveries_field_for_field() {
        let (_server, mut conn) = crate::scripts::test_redis().await;
        let keys = QueueKeys::new("retried");
        let (tp, extra) = (TRACEPARENT, traceparent_field());
        let (traced, plain) = (JobId::from("traced"), JobId::from("plain"));
        let mut enqueue = Enqueue::test_job(&keys, &traced, 5);
        enqueue.extra = &extra;
        enqueue.run(&mut conn).await.unwrap();
        let first = fetch_one(&mut conn, &keys).await;
        tokio::time::sleep(Duration::from_millis(5)).await;
        retry_now(&mut conn, &keys, &first).await;
        Enqueue::test_job(&keys, &plain, 5)
            .run(&mut conn)
            .await
            .unwrap();
        let taken = fetch_with(&mut conn, &keys, "base", 2).await;
        let mut again = fetch_with(&mut conn, &keys, "base", 2).await;
        assert_eq!(taken.len(), 2);
        for (a, b) in taken.iter().zip(again.iter_mut()) {
            b.claim_sent_at = a.claim_sent_at;
        }
        assert_eq!(again, taken);
        let redelivered = taken.iter().find(|d| d.id == traced).unwrap();
        assert_eq!(redelivered.first_started_at_ms, first.delivered_at_ms);
        assert_eq!(redelivered.traceparent.as_deref(), Some(tp));
    }

    /// A claimed job reaches the worker as one reply value, whatever bytes
    /// its fields hold: an id and a type with `:` and digits in them, a
    /// payload with `:`, NUL and a length-like prefix, and a traceparent,
    /// all read back whole. Fails when the script replies an array per job
    /// (as before issue #12's packed row) or a field's bounds are misread.
    #[tokio::test]
    async fn a_claimed_row_is_one_reply_value_and_its_fields_read_back_whole() {
        let (_server, mut conn) = crate::scripts::test_redis().await;
        let keys = QueueKeys::new("packed");
        let extra = traceparent_field();
        let id = JobId::from("12:a:3:");
        let payload: &[u8] = b"5:ab:\0\xff:9:";
        let mut enqueue = Enqueue::test_job(&keys, &id, 7);
        enqueue.job_type = "t:2:x";
        enqueue.payload = payload;
        enqueue.extra = &extra;
        enqueue.run(&mut conn).await.unwrap();
        let fetch = Fetch {
            keys: &keys,
            lease: Duration::from_secs(30),
            token_base: "base",
            count: 4,
            first_try: false,
        };
        let reply = fetch.reply(&mut conn, "w1").await.unwrap();
        let rows = crate::scripts::reply::array(&reply).unwrap();
        assert_eq!(rows.len(), 1);
        assert!(
            matches!(rows[0], redis::Value::BulkString(_)),
            "one string per claimed job: {:?}",
            rows[0]
        );
        let ClaimRow::Claimed(first) = ClaimRow::decode("packed", &rows[0]).unwrap() else {
            panic!("not claimed: {rows:?}")
        };
        assert_eq!((&first.id, first.token.as_str()), (&id, "base:1"));
        assert_eq!(
            (first.job_type.as_str(), first.payload.as_slice()),
            ("t:2:x", payload)
        );
        assert_eq!((first.attempt, first.max_attempts, first.fence), (1, 7, 1));
        assert_eq!(first.traceparent.as_deref(), Some(TRACEPARENT));
        assert_eq!(first.first_started_at_ms, first.delivered_at_ms);
        // The retry of the same fetch reads the row back from the job hash.
        let mut again = fetch_with(&mut conn, &keys, "base", 4).await;
        again[0].claim_sent_at = first.claim_sent_at;
        assert_eq!(again, vec![first]);
    }

    /// The fencing token grows with every delivery: a retry, and a replay
    /// after dead-lettering (which resets attempts) both get a larger one.
    #[tokio::test]
    async fn every_delivery_gets_a_larger_fencing_token() {
        let (_server, mut conn) = crate::scripts::test_redis().await;
        let keys = QueueKeys::new("fencing");
        let id = JobId::from("job-1");
        let enqueue = Enqueue::test_job(&keys, &id, 5);
        enqueue.run(&mut conn).await.unwrap();
        let first = fetch_one(&mut conn, &keys).await;
        let second = redeliver(&mut conn, &keys, &first).await;
        fail(&mut conn, &keys, &second, FailKind::Permanent).await;
        let replay = Replay {
            keys: &keys,
            id: &id,
            reset_attempts: true,
        };
        replay.run(&mut conn).await.unwrap();
        let third = fetch_one(&mut conn, &keys).await;
        assert_eq!((first.attempt, second.attempt, third.attempt), (1, 2, 1));
        assert_eq!((first.fence, second.fence, third.fence), (1, 2, 3));
    }
}
