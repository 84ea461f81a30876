//! `claim.lua` and the claim row: the claim after a blocking `BLMOVE` (which
//! cannot run in a script, DESIGN rule 4), and the decoding of the rows that
//! `claim()` in `prelude.lua` returns, for this script and for `fetch.lua`.
//! A claim retried with the same token answers the same row (a lost reply
//! never turns into `busy`); a row that does not decode is
//! [`ClaimRow::Unreadable`], on its own.

use std::time::Duration;

use redis::Value;

use super::reply::Fields;
use super::{lua_script, LuaScript};
use crate::conn::RedisConnection;
use crate::error::{QueueError, Result};
use crate::job::JobId;
use crate::keys::QueueKeys;

pub(crate) static SCRIPT: LuaScript<10> =
    lua_script!("claim.lua", keys = 10, args = 6, prelude(super::DRAIN));

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
    /// the same row); a bad reply a [`QueueError::Protocol`].
    /// No worker name is written (see [`run_as`](Self::run_as)).
    #[cfg(any(test, feature = "failpoints"))]
    pub(crate) async fn run(&self, conn: &mut RedisConnection) -> Result<ClaimRow> {
        self.run_as(conn, "").await
    }

    /// [`run`](Self::run) by the worker named `worker`: the job's hash keeps
    /// it in its `worker` field for this delivery ("": none).
    pub(crate) async fn run_as(
        &self,
        conn: &mut RedisConnection,
        worker: &str,
    ) -> Result<ClaimRow> {
        let k = self.keys;
        let sent_at = tokio::time::Instant::now();
        let mut reply = SCRIPT
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
            .arg(self.lease.as_millis() as u64)
            .arg(self.token)
            .arg(worker)
            .invoke(conn)
            .await
            .map_err(|e| {
                let id = JobId::from(String::from_utf8_lossy(self.id).into_owned());
                QueueError::redis(&k.queue, Some(&id), e)
            })?;
        ClaimRow::decode_owned(&k.queue, &mut reply).map(|row| row.sent_at(sent_at))
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
    /// `limited`: a queue limit lets no job start for this many ms; the id
    /// went back to main unclaimed (claim.lua only, docs/LIMITS.md).
    Limited(u64),
    /// `deferred`: the job's rate key is over its limit; the job went to the
    /// delayed set, unclaimed (docs/LIMITS.md).
    Deferred,
    /// `expired`: not started before its deadline; dead-lettered with
    /// reason `expired` (docs/RESULTS.md).
    Expired,
}

impl Skip {
    /// The log line for a skipped row.
    pub(crate) fn reason(self) -> &'static str {
        match self {
            Skip::Done => "completion record exists: acked without running the handler again",
            Skip::Missing => "job hash missing: dead-lettered",
            Skip::Busy => "another delivery owns this job",
            Skip::Gone => "already returned by the watchdog before the claim",
            Skip::Paused => "queue paused: returned to the queue unclaimed",
            Skip::Limited(_) => "queue limit reached: returned to the queue unclaimed",
            Skip::Deferred => "rate key over its limit: delayed until it has room, unclaimed",
            Skip::Expired => "not started before its deadline: dead-lettered as expired",
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

    /// What could be read of a row that did not decode (`e`).
    fn unreadable(reply: &Value, e: &QueueError) -> Self {
        let items = super::reply::array(reply).unwrap_or_default();
        let field = |i: usize| items.get(i).and_then(super::reply::text);
        let id = items
            .get(1)
            .and_then(super::reply::bytes)
            .map(|b| JobId::from(String::from_utf8_lossy(&b).into_owned()));
        let token = match field(0).as_deref() {
            Some("claimed") => field(2),
            _ => None,
        };
        ClaimRow::Unreadable(Unreadable {
            id,
            token,
            detail: e.to_string(),
        })
    }

    /// `{'claimed', id, token, type, v, payload, attempts, max_attempts,
    /// enqueued_at, delivered_at, fence[, traceparent[, first_started_at]]}`
    /// (`claimed_row` in prelude.lua: the traceparent absent or empty for
    /// none; without first_started_at, as on a first delivery,
    /// delivered_at stands for it), `{'corrupt', id, reason}` or `{tag, id}`
    /// with tag `done`, `missing`, `busy` or `gone`.
    #[cfg(test)]
    pub(crate) fn decode(queue: &str, reply: &Value) -> Result<Self> {
        Self::decode_owned(queue, &mut reply.clone())
    }

    /// [`decode`](Self::decode) of a row the caller owns. Every field is
    /// checked first, in place; only then are a claimed row's token, type and
    /// payload moved out of `row` instead of copied (issue #12: an allocation
    /// and a copy each, per job). A row that does not decode is left whole.
    fn decode_owned(queue: &str, row: &mut Value) -> Result<Self> {
        let mut decoded = Self::check(queue, row)?;
        if let (ClaimRow::Claimed(d), Value::Array(items) | Value::Set(items)) = (&mut decoded, row)
        {
            let mut take = |i: usize| items.get_mut(i).map(super::reply::take_text);
            d.token = take(2).unwrap_or_default();
            d.job_type = take(3).unwrap_or_default();
            d.payload = items
                .get_mut(5)
                .map(super::reply::take_bytes)
                .unwrap_or_default();
        }
        Ok(decoded)
    }

    /// The row decoded, except that a claimed row's token, type and payload
    /// are only checked (left empty for [`decode_owned`](Self::decode_owned)
    /// to move out of the row).
    fn check(queue: &str, reply: &Value) -> Result<Self> {
        let items_len = super::reply::array(reply).map_or(0, <[Value]>::len);
        let mut f = Fields::new(queue, None, "claim row", reply)?;
        let tag = f.tag_str()?;
        let id = JobId::from(
            String::from_utf8(f.bytes(1, "id")?)
                .unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned()),
        );
        f.set_job_id(&id);
        let skip = match tag {
            "claimed" => {
                f.field(2, "token", super::reply::is_text)?;
                f.field(3, "type", super::reply::is_text)?;
                let version = f.u32(4, "schema version")?;
                f.field(5, "payload", super::reply::is_bytes)?;
                return Ok(ClaimRow::Claimed(Delivery {
                    token: String::new(),
                    job_type: String::new(),
                    version,
                    payload: Vec::new(),
                    attempt: f.u32(6, "attempts")?,
                    max_attempts: f.u32(7, "max_attempts")?.max(1),
                    enqueued_at_ms: f.int(8, "enqueued_at")?,
                    delivered_at_ms: f.int(9, "delivered_at")?,
                    fence: f.u64(10, "fence")?,
                    first_started_at_ms: match items_len {
                        n if n > 12 => f.int(12, "first_started_at")?,
                        _ => f.int(9, "delivered_at")?,
                    },
                    claim_sent_at: tokio::time::Instant::now(),
                    traceparent: f.optional(11, super::reply::text).filter(|t| !t.is_empty()),
                    id,
                }));
            }
            "corrupt" => return Ok(ClaimRow::Corrupt(id, f.text(2, "reason")?)),
            "done" => Skip::Done,
            "missing" => Skip::Missing,
            "busy" => Skip::Busy,
            "gone" => Skip::Gone,
            "paused" => Skip::Paused,
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

    use super::{ClaimRow, Skip};

    fn bulk(s: &str) -> Value {
        Value::BulkString(s.as_bytes().to_vec())
    }

    fn claimed_row() -> Vec<Value> {
        vec![
            bulk("claimed"),
            bulk("j1"),
            bulk("tok"),
            bulk("send"),
            bulk("2"),
            bulk(""),
            Value::Int(1),
            bulk("5"),
            bulk("100"),
            Value::Int(200),
            Value::Int(4),
        ]
    }

    #[test]
    fn decodes_a_claimed_row() {
        let ClaimRow::Claimed(d) = ClaimRow::decode("q", &Value::Array(claimed_row())).unwrap()
        else {
            panic!("not claimed")
        };
        assert_eq!(
            (d.id.as_str(), d.token.as_str(), d.job_type.as_str()),
            ("j1", "tok", "send")
        );
        assert_eq!((d.version, d.attempt, d.max_attempts), (2, 1, 5));
        assert_eq!((d.enqueued_at_ms, d.delivered_at_ms), (100, 200));
        assert_eq!(d.fence, 4);
        assert!(d.payload.is_empty());
        assert_eq!(d.traceparent, None, "a row without the element");
    }

    #[test]
    fn decodes_the_traceparent_element() {
        let tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        for (last, want) in [(tp, Some(tp)), ("", None)] {
            let mut row = claimed_row();
            row.push(bulk(last));
            let ClaimRow::Claimed(d) = ClaimRow::decode("q", &Value::Array(row)).unwrap() else {
                panic!("not claimed")
            };
            assert_eq!(d.traceparent.as_deref(), want);
        }
    }

    #[test]
    fn decodes_first_started_at_after_the_traceparent() {
        let mut row = claimed_row();
        row.extend([bulk(""), Value::Int(150)]);
        let ClaimRow::Claimed(d) = ClaimRow::decode("q", &Value::Array(row)).unwrap() else {
            panic!("not claimed")
        };
        assert_eq!((d.first_started_at_ms, d.traceparent), (150, None));
        let ClaimRow::Claimed(d) = ClaimRow::decode("q", &Value::Array(claimed_row())).unwrap()
        else {
            panic!("not claimed")
        };
        assert_eq!(d.first_started_at_ms, 200, "without it: the delivery time");
    }

    #[test]
    fn decodes_skipped_rows() {
        let row = Value::Array(vec![bulk("gone"), bulk("j2")]);
        assert_eq!(
            ClaimRow::decode("q", &row).unwrap(),
            ClaimRow::Skipped("j2".into(), Skip::Gone)
        );
    }

    #[test]
    fn every_required_field_is_checked_and_the_error_names_the_job() {
        for i in 2..11 {
            let mut row = claimed_row();
            row.truncate(i);
            let err = ClaimRow::decode("emails", &Value::Array(row)).unwrap_err();
            assert!(matches!(err, crate::QueueError::Protocol { .. }), "{err}");
            assert_eq!(err.queue(), Some("emails"));
            assert_eq!(err.job_id().map(|j| j.as_str()), Some("j1"), "field {i}");
        }
        let mut row = claimed_row();
        row[4] = bulk("-1");
        assert!(
            ClaimRow::decode("q", &Value::Array(row)).is_err(),
            "negative version"
        );
        assert!(ClaimRow::decode("q", &Value::Array(vec![bulk("claimed")])).is_err());
        assert!(ClaimRow::decode("q", &Value::Array(vec![bulk("odd"), bulk("j")])).is_err());
    }

    /// The fetch's path moves a claimed row's strings out of the reply: each
    /// lands in its own field (a payload, an id that is not UTF-8 read
    /// lossily, a numeric type as text, a traceparent), a skipped row reads
    /// as a skip, and an unreadable row still names its id and token (its
    /// fields are only taken once the whole row checked).
    #[test]
    fn a_row_taken_reads_as_a_row_copied() {
        let tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let mut row = claimed_row();
        row[1] = Value::BulkString(b"j\xff1".to_vec());
        row[3] = Value::Int(7);
        row[5] = Value::BulkString(vec![0x81, 0xa1, b'x', 0x01]);
        row.push(bulk(tp));
        let ClaimRow::Claimed(d) = ClaimRow::take_or_unreadable("q", Value::Array(row)) else {
            panic!("not claimed")
        };
        assert_eq!(
            (d.id.as_str(), d.token.as_str(), d.job_type.as_str()),
            ("j\u{fffd}1", "tok", "7")
        );
        assert_eq!(d.payload, vec![0x81, 0xa1, b'x', 0x01]);
        assert_eq!(
            (d.version, d.attempt, d.max_attempts, d.fence),
            (2, 1, 5, 4)
        );
        assert_eq!(d.traceparent.as_deref(), Some(tp));
        assert_eq!(
            ClaimRow::take_or_unreadable("q", Value::Array(vec![bulk("busy"), bulk("j2")])),
            ClaimRow::Skipped("j2".into(), Skip::Busy)
        );
        let mut bad_type = claimed_row();
        bad_type[3] = Value::BulkString(vec![0xff]);
        let mut no_payload = claimed_row();
        no_payload[5] = Value::Nil;
        for row in [bad_type, no_payload] {
            let ClaimRow::Unreadable(u) = ClaimRow::take_or_unreadable("q", Value::Array(row))
            else {
                panic!("a row that does not decode is unreadable")
            };
            assert_eq!(u.id.as_ref().map(|j| j.as_str()), Some("j1"));
            assert_eq!(
                u.token.as_deref(),
                Some("tok"),
                "the lease token is still read"
            );
        }
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
