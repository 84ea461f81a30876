//! `ack.lua`: success, for a batch of deliveries of one queue. For each
//! delivery whose lease token still matches (DESIGN rule 3: every token of
//! the batch is checked) it writes the completion record, then drops the job
//! from processing and leases and drops the hash; counters once per batch.
//! The completion record carries the token, so a call retried after its
//! reply was lost answers [`AckReply::AlreadyCompleted`] instead of "lease
//! lost" (issue #11, item 1).

use std::time::Duration;

use super::{lua_script, LuaScript};
use crate::conn::RedisConnection;
use crate::error::{QueueError, Result};
use crate::job::JobId;
use crate::keys::QueueKeys;
use crate::scripts::claim::Delivery;

pub(crate) static SCRIPT: LuaScript<4> =
    lua_script!("ack.lua", keys = 4, args = 7, prelude(super::DRAIN));

/// One finished delivery to acknowledge.
#[derive(Debug, Clone)]
pub(crate) struct AckItem {
    pub(crate) id: JobId,
    pub(crate) token: String,
    /// The handler's result reference, stored in the completion record.
    pub(crate) result_ref: Option<Vec<u8>>,
    /// What the delivery's claim answered, for the completion record; `None`:
    /// the script reads it from the job hash (a field read each).
    pub(crate) claimed: Option<Claimed>,
    /// Claimed far from the tail of processing
    /// ([`Delivery::far_from_tail`]): the script may look for it from the
    /// head.
    pub(crate) far_from_tail: bool,
}

/// The fields of a delivery's completion record that its claim answered
/// (and that do not change while it runs: the token check proves it is the
/// same delivery).
#[derive(Debug, Clone)]
pub(crate) struct Claimed {
    pub(crate) attempt: u32,
    pub(crate) job_type: String,
    pub(crate) enqueued_at_ms: u64,
    pub(crate) delivered_at_ms: u64,
}

impl AckItem {
    /// [`taking`](Self::taking) of a delivery the caller keeps (the tests').
    #[cfg(test)]
    pub(crate) fn of(d: &Delivery, result_ref: Option<Vec<u8>>) -> AckItem {
        Self::taking(d.clone(), result_ref)
    }

    /// The ack of delivery `d`, with its claimed fields for the record,
    /// taking the delivery's strings instead of copying them (a delivery is
    /// acked once).
    pub(crate) fn taking(d: Delivery, result_ref: Option<Vec<u8>>) -> AckItem {
        // An attempt of u32::MAX may be a larger stored count the claim
        // row's decode clamped: the script reads the record's fields from
        // the job instead (the record keeps the stored count).
        let times = claimed_times(&d).filter(|_| d.attempt != u32::MAX);
        AckItem {
            id: d.id,
            token: d.token,
            far_from_tail: d.far_from_tail,
            result_ref,
            claimed: times.map(|(enqueued_at_ms, delivered_at_ms)| Claimed {
                attempt: d.attempt,
                job_type: d.job_type,
                enqueued_at_ms,
                delivered_at_ms,
            }),
        }
    }
}

/// The delivery's `enqueued_at` and `delivered_at` for the record, or `None`
/// for a time before the epoch (corrupt data the claim passed on): the
/// script then reads the record's fields from the job.
fn claimed_times(d: &Delivery) -> Option<(u64, u64)> {
    Some((
        u64::try_from(d.enqueued_at_ms).ok()?,
        u64::try_from(d.delivered_at_ms).ok()?,
    ))
}

/// Acknowledges a batch of deliveries of one queue in one script call.
pub(crate) struct Ack<'a> {
    pub(crate) keys: &'a QueueKeys,
    /// The name of the worker that claimed the items (its `worker` field).
    pub(crate) worker: &'a str,
    pub(crate) items: &'a [AckItem],
    /// How long the completion record is kept (zero: none).
    pub(crate) retention: Duration,
    /// Write the record as one compact string, not a hash
    /// (`WorkerConfig::compact_records`).
    pub(crate) compact: bool,
}

/// What the ack did for one delivery.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AckReply {
    /// Acknowledged by this call.
    Completed,
    /// Already acknowledged by this same delivery (token): an earlier call
    /// whose reply was lost landed. Only recognisable while the completion
    /// record exists (a retention of zero keeps none: then `LeaseLost`).
    AlreadyCompleted,
    /// The token no longer matches: the job was reclaimed.
    LeaseLost,
    /// The job hash is not a hash (corrupt data): nothing was written for
    /// this delivery; its lease expires and the watchdog deals with it.
    Unreadable,
}

impl Ack<'_> {
    /// Runs the script; one reply per item, in order.
    pub(crate) async fn run(&self, conn: &mut RedisConnection) -> Result<Vec<AckReply>> {
        let k = self.keys;
        let mut call = SCRIPT
            .call([&k.processing, &k.leases, &k.stats, &k.guard])
            .arg(&k.job_prefix)
            .arg(&k.done_prefix)
            .arg(&k.steps_prefix)
            .arg(super::ms(self.retention))
            .arg(&k.tput_prefix)
            .arg(if self.compact { "compact" } else { "hash" })
            .arg(self.worker);
        for item in self.items {
            call = call
                .repeated_arg(item.id.as_str())
                .repeated_arg(&item.token)
                .repeated_arg(item.result_ref.as_deref().unwrap_or_default());
            call = match &item.claimed {
                Some(c) => call
                    .repeated_arg(c.attempt)
                    .repeated_arg(c.job_type.as_str())
                    .repeated_arg(c.enqueued_at_ms)
                    .repeated_arg(c.delivered_at_ms),
                None => call
                    .repeated_arg("")
                    .repeated_arg("")
                    .repeated_arg("")
                    .repeated_arg(""),
            };
            call = call.repeated_arg(super::far_arg(item.far_from_tail));
        }
        let reply = call.run(conn, &k.queue, self.only_job()).await?;
        self.decode(&reply)
    }

    /// The job an error of the whole call names: the batch's only job, or
    /// none for a batch of several (the error concerns them all; the acker
    /// logs it in each job's span, which names the job). Before, it named
    /// the first job, so each job's log line named another job.
    fn only_job(&self) -> Option<&JobId> {
        match self.items {
            [only] => Some(&only.id),
            _ => None,
        }
    }

    /// One [`AckReply`] per item, from the script's string of one digit per
    /// delivery; a reply of another kind or length is a protocol error
    /// naming the queue (and the job, for a batch of one), an unknown code
    /// one naming the queue and the code's job.
    fn decode(&self, reply: &redis::Value) -> Result<Vec<AckReply>> {
        let queue = &self.keys.queue;
        let first = self.only_job();
        let codes: &[u8] = match reply {
            redis::Value::BulkString(b) => b,
            redis::Value::SimpleString(s) => s.as_bytes(),
            other => {
                return Err(QueueError::protocol(
                    queue,
                    first,
                    format!("ack reply is not a string of codes: {other:?}"),
                ))
            }
        };
        if codes.len() != self.items.len() {
            return Err(QueueError::protocol(
                queue,
                first,
                format!(
                    "ack reply has {} codes for {} deliveries",
                    codes.len(),
                    self.items.len()
                ),
            ));
        }
        // 4: acknowledged, and the job's batch is on another queue: the ack
        // wrote a relay notice, which this process's relay moves at once.
        let mut noted = false;
        let out: Result<Vec<AckReply>> = codes
            .iter()
            .zip(self.items)
            .map(|(code, item)| match code {
                b'1' => Ok(AckReply::Completed),
                b'4' => {
                    noted = true;
                    Ok(AckReply::Completed)
                }
                b'2' => Ok(AckReply::AlreadyCompleted),
                b'0' => Ok(AckReply::LeaseLost),
                b'3' => Ok(AckReply::Unreadable),
                n => Err(QueueError::protocol(
                    queue,
                    Some(&item.id),
                    format!("ack reply: unknown code {:?}", char::from(*n)),
                )),
            })
            .collect();
        if noted {
            crate::workflow::relay::hint(queue);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::{Ack, AckItem, AckReply, SCRIPT};
    use crate::conn::{connect, ConnectionConfig, RedisConnection};
    use crate::job::JobId;
    use crate::keys::QueueKeys;
    use crate::scripts::claim::{ClaimRow, Delivery};
    use crate::scripts::enqueue::Enqueue;
    use crate::scripts::fetch::Fetch;
    use redis::Value;

    const RETENTION: Duration = Duration::from_secs(60);

    async fn conn(url: &str, response_timeout: Duration) -> RedisConnection {
        let cfg = ConnectionConfig {
            response_timeout,
            ..ConnectionConfig::default()
        };
        connect(url, &cfg).await.unwrap()
    }

    /// A delivery as a claim would answer it, without Redis.
    fn delivery(id: &str) -> Delivery {
        Delivery {
            id: JobId::from(id),
            token: format!("tok-{id}"),
            job_type: "t".into(),
            version: 1,
            payload: Vec::new(),
            attempt: 1,
            max_attempts: 3,
            enqueued_at_ms: 100,
            delivered_at_ms: 200,
            fence: 1,
            first_started_at_ms: 200,
            claim_sent_at: tokio::time::Instant::now(),
            traceparent: None,
            far_from_tail: false,
        }
    }

    /// A delivery whose attempt reads u32::MAX (maybe a larger stored count,
    /// clamped by the claim row's decode) sends no claimed fields: the
    /// script reads the record's from the job. Others send theirs.
    #[test]
    fn a_clamped_attempt_is_not_sent_for_the_record() {
        let clamped = Delivery {
            attempt: u32::MAX,
            ..delivery("a")
        };
        assert!(AckItem::of(&clamped, None).claimed.is_none());
        let sent = AckItem::of(&delivery("b"), None).claimed.unwrap();
        assert_eq!(sent.attempt, 1);
    }

    /// The reply is one digit per delivery, in order; a reply of another
    /// length or kind, or an unknown digit, is a protocol error naming the
    /// queue and the job.
    #[tokio::test]
    async fn the_reply_is_one_code_per_delivery() {
        let keys = QueueKeys::new("codes");
        let items: Vec<AckItem> = ["a", "b", "c", "d", "e"]
            .iter()
            .map(|id| AckItem::of(&delivery(id), None))
            .collect();
        let ack = Ack {
            keys: &keys,
            worker: "w",
            items: &items,
            retention: RETENTION,
            compact: false,
        };
        let codes = ack.decode(&Value::BulkString(b"12034".to_vec())).unwrap();
        assert_eq!(
            codes,
            [
                AckReply::Completed,
                AckReply::AlreadyCompleted,
                AckReply::LeaseLost,
                AckReply::Unreadable,
                AckReply::Completed,
            ]
        );
        let err = |reply: Value| ack.decode(&reply).unwrap_err();
        let e = err(Value::BulkString(b"1203".to_vec()));
        assert!(e.to_string().contains("4 codes for 5"), "{e}");
        let e = err(Value::BulkString(b"12x34".to_vec()));
        assert!(e.to_string().contains("unknown code 'x'"), "{e}");
        assert_eq!(e.job_id().map(|j| j.as_str()), Some("c"));
        assert_eq!(e.queue(), Some("codes"));
        let e = err(Value::Array(vec![Value::Int(1); 5]));
        assert!(e.to_string().contains("not a string of codes"), "{e}");
    }

    /// Enqueues `id` and claims it: the delivery to acknowledge.
    async fn delivered(conn: &mut RedisConnection, keys: &QueueKeys, id: &str) -> Delivery {
        let id = JobId::from(id);
        Enqueue::test_job(keys, &id, 3).run(conn).await.unwrap();
        // A token base of its own: a fetch retried with the same base gets
        // the deliveries of the first one (its receipt).
        let token_base = format!("tok-{id}");
        let fetch = Fetch {
            keys,
            lease: Duration::from_secs(30),
            token_base: &token_base,
            count: 1,
            first_try: false,
        };
        match fetch.run(conn).await.unwrap().pop() {
            Some(ClaimRow::Claimed(d)) => d,
            other => panic!("expected a claimed row, got {other:?}"),
        }
    }

    /// `DEBUG SLEEP secs` on a connection of its own: Redis runs nothing
    /// else meanwhile. Returns the raw reply once the sleep is over.
    fn debug_sleep(port: u16, secs: &str) -> std::io::Result<String> {
        use std::io::{Read, Write};
        let mut stream = std::net::TcpStream::connect(("127.0.0.1", port))?;
        stream.set_read_timeout(Some(Duration::from_secs(30)))?;
        stream.write_all(format!("DEBUG SLEEP {secs}\r\n").as_bytes())?;
        let mut buf = [0u8; 256];
        let n = stream.read(&mut buf)?;
        Ok(String::from_utf8_lossy(&buf[..n]).into_owned())
    }

    /// The completion record of finished job `id`, as a waiting producer
    /// reads it (`result_wait.lua`).
    async fn finished_record(
        c: &mut RedisConnection,
        keys: &QueueKeys,
        id: &JobId,
    ) -> std::collections::BTreeMap<String, Vec<u8>> {
        use crate::scripts::result_wait::{ResultWait, WaitState};
        let state = ResultWait {
            keys,
            id,
            woken: false,
            was_pending: false,
        }
        .run(c)
        .await
        .unwrap();
        match state {
            WaitState::Finished(rec) => rec,
            other => panic!("{id}: {other:?}"),
        }
    }

    fn item(d: &Delivery) -> AckItem {
        AckItem::of(d, None)
    }

    /// The ack of `d` with a token that is not its delivery's (a stale one).
    fn stale(d: &Delivery) -> AckItem {
        let mut other = item(d);
        other.token.push_str("-old");
        other
    }

    /// A private redis-server, a connection to it, and two deliveries (`a`,
    /// `b`) of queue `queue`, enqueued and claimed.
    async fn two_delivered(
        queue: &str,
        a: &str,
        b: &str,
    ) -> (
        queue_testkit::RedisServer,
        RedisConnection,
        QueueKeys,
        Delivery,
        Delivery,
    ) {
        let server = queue_testkit::RedisServer::start().unwrap();
        let mut c = conn(&server.url(), Duration::from_secs(5)).await;
        let keys = QueueKeys::new(queue);
        let a = delivered(&mut c, &keys, a).await;
        let b = delivered(&mut c, &keys, b).await;
        (server, c, keys, a, b)
    }

    async fn ack(
        conn: &mut RedisConnection,
        keys: &QueueKeys,
        items: &[AckItem],
    ) -> crate::Result<Vec<AckReply>> {
        ack_as(conn, keys, items, false).await
    }

    /// [`ack`], the record written compact (one string) or as a hash.
    async fn ack_as(
        conn: &mut RedisConnection,
        keys: &QueueKeys,
        items: &[AckItem],
        compact: bool,
    ) -> crate::Result<Vec<AckReply>> {
        Ack {
            keys,
            worker: "",
            items,
            retention: RETENTION,
            compact,
        }
        .run(conn)
        .await
    }

    /// `ack.lua` called directly for delivery `d`, with a raw retention and
    /// raw record fields (attempts, type, enqueued_at, delivered_at): values
    /// the typed wrapper does not send.
    async fn raw_ack(
        c: &mut RedisConnection,
        keys: &QueueKeys,
        retention: &str,
        d: &Delivery,
        fields: [&str; 4],
    ) -> crate::Result<Value> {
        SCRIPT
            .call([&keys.processing, &keys.leases, &keys.stats, &keys.guard])
            .arg(&keys.job_prefix)
            .arg(&keys.done_prefix)
            .arg(&keys.steps_prefix)
            .arg(retention)
            .arg(&keys.tput_prefix)
            .arg("hash")
            .arg("w-1")
            .repeated_arg(d.id.as_str())
            .repeated_arg(&d.token)
            .repeated_arg("")
            .repeated_arg(fields[0])
            .repeated_arg(fields[1])
            .repeated_arg(fields[2])
            .repeated_arg(fields[3])
            .repeated_arg(super::super::far_arg(d.far_from_tail))
            .run(c, &keys.queue, Some(&d.id))
            .await
    }

    /// A retention of "for ever" (`Duration::MAX`) keeps the record for the
    /// longest time a script takes, in both formats: `as u64` of its
    /// milliseconds wrapped around, and the hash record expired at once
    /// (the job's dedupe lost) or the compact one's `SET` was refused (the
    /// job ran again at every delivery).
    #[tokio::test]
    async fn a_retention_of_for_ever_keeps_the_record() {
        let (_s, mut c, keys, a, b) = two_delivered("forever", "fa", "fb").await;
        for (d, compact) in [(&a, false), (&b, true)] {
            let replies = Ack {
                keys: &keys,
                worker: "",
                items: &[item(d)],
                retention: Duration::MAX,
                compact,
            }
            .run(&mut c)
            .await
            .unwrap();
            assert_eq!(replies, [AckReply::Completed], "compact {compact}");
            let ttl: i64 = redis::cmd("PTTL")
                .arg(keys.done(d.id.as_str()))
                .query_async(&mut c)
                .await
                .unwrap();
            assert!(ttl > 1_000_000_000_000_000, "compact {compact}: PTTL {ttl}");
        }
        // A script caller asking for more than 2^53 - 1 ms is refused before
        // any write (PEXPIRE or SET PX would fail after the record).
        let d = delivered(&mut c, &keys, "fc").await;
        let (attempt, enqueued, delivered) = (
            d.attempt.to_string(),
            d.enqueued_at_ms.to_string(),
            d.delivered_at_ms.to_string(),
        );
        let fields = [attempt.as_str(), &d.job_type, &enqueued, &delivered];
        let err = raw_ack(&mut c, &keys, "9223372036854775000", &d, fields)
            .await
            .unwrap_err();
        assert!(err.to_string().contains("retention_ms"), "{err}");
        let exists: bool = redis::cmd("EXISTS")
            .arg(keys.done("fc"))
            .query_async(&mut c)
            .await
            .unwrap();
        assert!(!exists, "nothing written");
    }

    /// One call acks several deliveries and checks each token: a stale token
    /// in the batch is refused without touching the others.
    #[tokio::test]
    async fn a_batch_checks_every_token_and_answers_per_job() {
        let (_server, mut c, keys, a, b) = two_delivered("acks", "a", "b").await;
        let replies = ack(&mut c, &keys, &[item(&a), stale(&b)]).await.unwrap();
        assert_eq!(replies, [AckReply::Completed, AckReply::LeaseLost]);
        let processing: Vec<String> = redis::cmd("LRANGE")
            .arg(&keys.processing)
            .arg(0)
            .arg(-1)
            .query_async(&mut c)
            .await
            .unwrap();
        assert_eq!(processing, ["b"], "only the acked job left processing");
        let completed: u64 = redis::cmd("HGET")
            .arg(&keys.stats)
            .arg("completed")
            .query_async(&mut c)
            .await
            .unwrap();
        assert_eq!(completed, 1);
    }

    /// A batch drops every acked job's hash and lease and gives the step
    /// results of the jobs that kept some the record's retention (issue #12:
    /// these are one variadic call per batch now, not one per job); with a
    /// retention of zero the step results go with the job.
    #[tokio::test]
    async fn a_batch_drops_hashes_and_leases_and_expires_step_results() {
        let server = queue_testkit::RedisServer::start().unwrap();
        let mut c = conn(&server.url(), Duration::from_secs(5)).await;
        for retention in [RETENTION, Duration::ZERO] {
            let keys = QueueKeys::new(&format!("steps{}", retention.as_millis()));
            let ds = [
                delivered(&mut c, &keys, "a").await,
                delivered(&mut c, &keys, "b").await,
                delivered(&mut c, &keys, "c").await,
            ];
            let _: () = redis::cmd("HSET")
                .arg(keys.steps("b"))
                .arg("charge")
                .arg("ok")
                .query_async(&mut c)
                .await
                .unwrap();
            let items: Vec<AckItem> = ds.iter().map(item).collect();
            let replies = Ack {
                keys: &keys,
                worker: "",
                items: &items,
                retention,
                compact: false,
            }
            .run(&mut c)
            .await
            .unwrap();
            assert_eq!(replies, [AckReply::Completed; 3]);
            for id in ["a", "b", "c"] {
                let job: bool = redis::cmd("EXISTS")
                    .arg(keys.job(id))
                    .query_async(&mut c)
                    .await
                    .unwrap();
                assert!(!job, "the hash of {id} is dropped");
            }
            let leased: u64 = redis::cmd("ZCARD")
                .arg(&keys.leases)
                .query_async(&mut c)
                .await
                .unwrap();
            let processing: u64 = redis::cmd("LLEN")
                .arg(&keys.processing)
                .query_async(&mut c)
                .await
                .unwrap();
            assert_eq!((leased, processing), (0, 0));
            let ttl: i64 = redis::cmd("PTTL")
                .arg(keys.steps("b"))
                .query_async(&mut c)
                .await
                .unwrap();
            if retention.is_zero() {
                assert_eq!(ttl, -2, "step results go with the job");
            } else {
                assert!(
                    ttl > 0 && ttl <= RETENTION.as_millis() as i64,
                    "step results expire with the record, PTTL {ttl}"
                );
            }
        }
    }

    /// Issue #11 item 1 (ack part): the first ack lands but its reply is lost
    /// (the client times out while Redis is busy); the retried ack with the
    /// same token must answer "completed", not "lease lost".
    #[tokio::test]
    async fn a_retried_ack_whose_first_reply_was_lost_answers_completed() {
        let server =
            queue_testkit::RedisServer::start_with(&["--enable-debug-command", "yes"]).unwrap();
        let url = server.url();
        let keys = QueueKeys::new("acks");
        let mut normal = conn(&url, Duration::from_secs(10)).await;
        let mut impatient = conn(&url, Duration::from_millis(300)).await;
        // Load the library first: a "Function not found" answer after the
        // sleep would not be followed by a resend, since the client has given
        // up by then.
        assert_eq!(ack(&mut normal, &keys, &[]).await.unwrap(), []);
        // The scenario needs the first call to time out; on a loaded machine
        // the sleep may start late, so try a few fresh jobs.
        for attempt in 0..5 {
            let d = delivered(&mut normal, &keys, &format!("job-{attempt}")).await;
            let port = server.port();
            let sleeper = std::thread::spawn(move || debug_sleep(port, "1.5"));
            tokio::time::sleep(Duration::from_millis(200)).await;
            let first = ack(&mut impatient, &keys, &[item(&d)]).await;
            let slept = sleeper.join().unwrap().unwrap();
            assert!(slept.starts_with("+OK"), "DEBUG SLEEP: {slept}");
            if first.is_ok() {
                continue; // the sleep started too late: the reply was not lost
            }
            // Redis ran the first call after the sleep; its reply was lost.
            let retried = ack(&mut normal, &keys, &[item(&d)]).await.unwrap();
            assert_eq!(retried, [AckReply::AlreadyCompleted]);
            let in_processing: Option<i64> = redis::cmd("LPOS")
                .arg(&keys.processing)
                .arg(d.id.as_str())
                .query_async(&mut normal)
                .await
                .unwrap();
            assert_eq!(in_processing, None);
            // Another token is still refused.
            let refused = ack(&mut normal, &keys, &[stale(&d)]).await.unwrap();
            assert_eq!(refused, [AckReply::LeaseLost]);
            return;
        }
        panic!("the first ack never timed out behind DEBUG SLEEP");
    }

    /// An error of the whole call names the queue and, for a batch of
    /// several jobs, no job (the acker logs it in each job's span); for a
    /// batch of one, that job. Before, it named the batch's first job, so the
    /// acker's line for every other job of the batch named the wrong one.
    #[tokio::test]
    async fn a_failed_batch_names_no_job_and_a_failed_single_ack_its_job() {
        let (_server, mut c, keys, a, b) = two_delivered("batch-error", "a", "b").await;
        raw(&mut c, &["DEL", &keys.processing]).await;
        raw(&mut c, &["SET", &keys.processing, "x"]).await;
        let err = ack(&mut c, &keys, &[item(&a), item(&b)]).await.unwrap_err();
        assert!(
            err.to_string().contains("refused before any write"),
            "{err}"
        );
        assert_eq!(err.queue(), Some("batch-error"));
        assert_eq!(err.job_id(), None, "{err}");
        let err = ack(&mut c, &keys, &[item(&b)]).await.unwrap_err();
        assert_eq!(err.job_id().map(|j| j.as_str()), Some("b"), "{err}");
        // A reply of the wrong length, decoded for two jobs: no job either.
        let items = [item(&a), item(&b)];
        let two = Ack {
            keys: &keys,
            worker: "",
            items: &items,
            retention: RETENTION,
            compact: false,
        };
        let err = two.decode(&Value::BulkString(b"1".to_vec())).unwrap_err();
        assert_eq!(err.job_id(), None, "{err}");
    }

    /// A stale delivery whose completion record key holds a third type
    /// (corrupt data) answers lease lost; the batch's other deliveries, acked
    /// before it in the same call, are not stopped half-way by an error.
    #[tokio::test]
    async fn a_record_key_of_a_third_type_does_not_fail_the_batch_half_way() {
        let (_server, mut c, keys, a, b) = two_delivered("corrupt-record", "a", "b").await;
        let _: () = redis::cmd("RPUSH")
            .arg(keys.done("b"))
            .arg("x")
            .query_async(&mut c)
            .await
            .unwrap();
        for compact in [false, true] {
            let replies = ack_as(&mut c, &keys, &[item(&a), stale(&b)], compact)
                .await
                .unwrap();
            let first = if compact {
                AckReply::AlreadyCompleted
            } else {
                AckReply::Completed
            };
            assert_eq!(replies, [first, AckReply::LeaseLost], "compact {compact}");
        }
    }

    /// A live delivery (its token matches) whose completion record key
    /// holds a third type (corrupt data) does not stop the batch half-way
    /// (the deliveries after it left unacked, to run again): the record
    /// replaces the corrupt key (in the compact form), and both jobs are
    /// acked.
    #[tokio::test]
    async fn a_live_delivery_with_a_record_key_of_a_third_type_is_acked() {
        for compact in [false, true] {
            let (_server, mut c, keys, a, b) = two_delivered("corrupt-live", "a", "b").await;
            raw(&mut c, &["RPUSH", &keys.done("a"), "x"]).await;
            let replies = ack_as(&mut c, &keys, &[item(&a), item(&b)], compact).await;
            assert_eq!(
                replies.unwrap(),
                [AckReply::Completed, AckReply::Completed],
                "compact {compact}"
            );
            // Replaced by the compact form, which every reader reads.
            let want = "string";
            assert_eq!(
                raw(&mut c, &["TYPE", &keys.done("a")]).await,
                Value::SimpleString(want.into())
            );
            assert_eq!(
                raw(&mut c, &["LLEN", &keys.processing]).await,
                Value::Int(0)
            );
            assert_eq!(raw(&mut c, &["ZCARD", &keys.leases]).await, Value::Int(0));
        }
    }

    /// `processing` or `leases` of another type (corrupt data): the ack is
    /// refused before any write, so no record exists without its removal.
    #[tokio::test]
    async fn a_queue_key_of_another_type_refuses_the_ack_before_any_write() {
        for broken in ["processing", "leases"] {
            let (_server, mut c, keys, a, _) = two_delivered("corrupt-keys", "a", "b").await;
            let key = if broken == "processing" {
                &keys.processing
            } else {
                &keys.leases
            };
            raw(&mut c, &["DEL", key]).await;
            raw(&mut c, &["SET", key, "x"]).await;
            let err = ack(&mut c, &keys, &[item(&a)]).await.unwrap_err();
            assert!(
                err.to_string().contains("refused before any write"),
                "{broken}: {err}"
            );
            assert_eq!(
                raw(&mut c, &["EXISTS", &keys.done("a")]).await,
                Value::Int(0),
                "{broken}"
            );
            assert_eq!(
                raw(&mut c, &["HGET", &keys.job("a"), "state"]).await,
                Value::BulkString(b"active".to_vec()),
                "{broken}"
            );
        }
    }

    /// A counter key of another type (the stats hash, the per-minute
    /// throughput counter) never fails an ack: counters come last and are
    /// skipped.
    #[tokio::test]
    async fn a_counter_key_of_another_type_never_fails_the_ack() {
        let (_server, mut c, keys, a, b) = two_delivered("corrupt-counters", "a", "b").await;
        raw(&mut c, &["DEL", &keys.stats]).await;
        raw(&mut c, &["RPUSH", &keys.stats, "x"]).await;
        let Value::Array(t) = raw(&mut c, &["TIME"]).await else {
            panic!("TIME")
        };
        let Value::BulkString(secs) = &t[0] else {
            panic!("TIME")
        };
        let minute: u64 = String::from_utf8_lossy(secs).parse::<u64>().unwrap() / 60;
        for m in [minute, minute + 1] {
            raw(&mut c, &["RPUSH", &format!("{}{m}", keys.tput_prefix), "x"]).await;
        }
        let replies = ack(&mut c, &keys, &[item(&a), item(&b)]).await.unwrap();
        assert_eq!(replies, [AckReply::Completed, AckReply::Completed]);
        assert_eq!(
            raw(&mut c, &["EXISTS", &keys.job("a"), &keys.job("b")]).await,
            Value::Int(0)
        );
    }

    /// One raw command's reply.
    async fn raw(c: &mut RedisConnection, args: &[&str]) -> Value {
        let mut cmd = redis::cmd(args[0]);
        for a in &args[1..] {
            cmd.arg(*a);
        }
        cmd.query_async(c).await.unwrap()
    }

    /// A job hash whose counts are not counts (corrupt data: here
    /// `enqueued_at = abc`), acked by a caller that sends no record fields
    /// (the script reads them from the job), with compact records (the
    /// default): the record is still one readable string, with the result
    /// and the token (0 for the unreadable count), so the waiting producer
    /// gets the result and a retried ack answers "already acked". Before,
    /// the count was packed as is, the string did not parse, and the record
    /// read as `status done` alone (stop 48 review).
    #[tokio::test]
    async fn a_corrupt_count_on_the_job_still_gives_a_readable_compact_record() {
        let server = queue_testkit::RedisServer::start().unwrap();
        let mut c = conn(&server.url(), Duration::from_secs(5)).await;
        let keys = QueueKeys::new("corrupt_count");
        let d = delivered(&mut c, &keys, "j").await;
        raw(&mut c, &["HSET", &keys.job("j"), "enqueued_at", "abc"]).await;
        let mut read = item(&d);
        read.claimed = None;
        read.result_ref = Some(b"r:1 2".to_vec());
        assert_eq!(
            ack_as(&mut c, &keys, &[read.clone()], true).await.unwrap(),
            [AckReply::Completed]
        );
        let rec = finished_record(&mut c, &keys, &d.id).await;
        assert_eq!(
            rec.get("result").map(Vec::as_slice),
            Some(&b"r:1 2"[..]),
            "{rec:?}"
        );
        assert_eq!(rec.get("enqueued_at").map(Vec::as_slice), Some(&b"0"[..]));
        assert_eq!(
            ack_as(&mut c, &keys, &[read], true).await.unwrap(),
            [AckReply::AlreadyCompleted]
        );
    }

    /// A compact record (WorkerConfig::compact_records) is one string with
    /// the retention as its TTL, and whatever reads a record reads it: a
    /// retried ack with the same token (its first reply lost) answers
    /// completed and another token lease lost, as with a hash; the producer
    /// waiting for the result, the operator's cancel, `Queue::completion`,
    /// and the dedupe of a re-enqueue and of a redelivery see it. Records of
    /// both forms live side by side in one queue.
    #[tokio::test]
    async fn a_compact_record_is_one_string_that_every_reader_reads() {
        use crate::scripts::cancel::Cancel;
        use crate::scripts::claim::Skip;
        use crate::scripts::enqueue::EnqueueReply;
        use crate::CancelOutcome;

        let (server, mut c, keys, d, h) = two_delivered("compact", "c", "h").await;
        let mut with_result = item(&d);
        with_result.result_ref = Some(b"r:1 2".to_vec());
        assert_eq!(
            ack_as(&mut c, &keys, &[with_result.clone()], true)
                .await
                .unwrap(),
            [AckReply::Completed]
        );
        assert_eq!(
            ack(&mut c, &keys, &[item(&h)]).await.unwrap(),
            [AckReply::Completed]
        );
        let kind = |key: String, c: &mut RedisConnection| {
            let mut c = c.clone();
            async move {
                let t: String = redis::cmd("TYPE")
                    .arg(key)
                    .query_async(&mut c)
                    .await
                    .unwrap();
                t
            }
        };
        assert_eq!(kind(keys.done("c"), &mut c).await, "string");
        assert_eq!(kind(keys.done("h"), &mut c).await, "hash");
        let ttl: i64 = redis::cmd("PTTL")
            .arg(keys.done("c"))
            .query_async(&mut c)
            .await
            .unwrap();
        assert!(ttl > 0 && ttl <= RETENTION.as_millis() as i64, "PTTL {ttl}");

        // A retried ack (its first reply lost) and a stale token.
        assert_eq!(
            ack_as(&mut c, &keys, &[with_result], true).await.unwrap(),
            [AckReply::AlreadyCompleted]
        );
        assert_eq!(
            ack(&mut c, &keys, &[stale(&d)]).await.unwrap(),
            [AckReply::LeaseLost]
        );

        // The waiting producer's read: the same fields as a hash record.
        for (id, result) in [("c", Some(&b"r:1 2"[..])), ("h", None)] {
            let rec = finished_record(&mut c, &keys, &JobId::from(id)).await;
            assert_eq!(
                rec.get("status").map(Vec::as_slice),
                Some(&b"done"[..]),
                "{id}"
            );
            assert_eq!(rec.get("result").map(Vec::as_slice), result, "{id}");
            let token = if id == "c" { &d.token } else { &h.token };
            assert_eq!(rec.get("token"), Some(&token.as_bytes().to_vec()), "{id}");
            for field in [
                "finished_at",
                "attempts",
                "enqueued_at",
                "delivered_at",
                "type",
                "worker",
            ] {
                assert!(rec.contains_key(field), "{id}: {field} in {rec:?}");
            }
        }
        // The operator's cancel and the admin read.
        let cancel = Cancel {
            keys: &keys,
            id: &JobId::from("c"),
            retention: RETENTION,
        };
        assert_eq!(
            cancel.run(&mut c).await.unwrap(),
            CancelOutcome::AlreadyFinished {
                status: "done".into()
            }
        );
        let queue = crate::Queue::connect(&server.url()).await.unwrap();
        let rec = queue.completion("compact", "c").await.unwrap().unwrap();
        assert_eq!(rec.get("status").map(String::as_str), Some("done"));
        assert_eq!(rec.get("attempts").map(String::as_str), Some("1"));
        assert_eq!(rec.get("result").map(String::as_str), Some("r:1 2"));

        // Dedupe: a re-enqueue of the id, and a redelivery of it, see the record.
        let again = Enqueue::test_job(&keys, &d.id, 3)
            .run(&mut c)
            .await
            .unwrap();
        assert_eq!(again, EnqueueReply::Done);
        let _: () = redis::cmd("LPUSH")
            .arg(&keys.main)
            .arg("c")
            .query_async(&mut c)
            .await
            .unwrap();
        let fetch = Fetch {
            keys: &keys,
            lease: Duration::from_secs(30),
            token_base: "again",
            count: 1,
            first_try: false,
        };
        let rows = fetch.run(&mut c).await.unwrap();
        assert!(
            matches!(rows.as_slice(), [ClaimRow::Skipped(id, Skip::Done)] if id.as_str() == "c"),
            "a redelivery of a finished job is not run: {rows:?}"
        );
    }

    /// The record's delivery fields (attempts, type, enqueued_at,
    /// delivered_at, worker) are the claim's, whether the caller sends them
    /// (the worker: no field read per job) or not (`queue_core::testing::ack`:
    /// the script reads them from the job hash), in both record forms, and
    /// when sent numbers are not counts (read from the job then too).
    #[tokio::test]
    async fn the_record_carries_the_claims_fields_whether_sent_or_read() {
        use crate::scripts::fetch::FetchReply;

        let server = queue_testkit::RedisServer::start().unwrap();
        let mut c = conn(&server.url(), Duration::from_secs(5)).await;
        let keys = QueueKeys::new("fields");
        for id in ["sent", "read", "compact", "bad"] {
            let id = JobId::from(id);
            Enqueue::test_job(&keys, &id, 3).run(&mut c).await.unwrap();
        }
        let fetch = Fetch {
            keys: &keys,
            lease: Duration::from_secs(30),
            token_base: "fields",
            count: 4,
            first_try: true,
        };
        let FetchReply::Rows(rows) = fetch.run_or_paused_as(&mut c, "w-1").await.unwrap() else {
            panic!("paused")
        };
        let ds: std::collections::HashMap<String, Delivery> = rows
            .into_iter()
            .map(|r| match r {
                ClaimRow::Claimed(d) => (d.id.to_string(), d),
                other => panic!("{other:?}"),
            })
            .collect();
        let run = |items: Vec<AckItem>, compact: bool, c: &mut RedisConnection| {
            let mut c = c.clone();
            let keys = keys.clone();
            async move {
                Ack {
                    keys: &keys,
                    worker: "w-1",
                    items: &items,
                    retention: RETENTION,
                    compact,
                }
                .run(&mut c)
                .await
            }
        };
        let mut read = item(&ds["read"]);
        read.claimed = None;
        for (items, compact) in [
            (vec![item(&ds["sent"]), read], false),
            (vec![item(&ds["compact"])], true),
        ] {
            let replies = run(items, compact, &mut c).await.unwrap();
            assert!(
                replies.iter().all(|r| *r == AckReply::Completed),
                "{replies:?}"
            );
        }
        for id in ["sent", "read", "compact"] {
            let d = &ds[id];
            let rec = finished_record(&mut c, &keys, &d.id).await;
            let field = |name: &str| String::from_utf8(rec[name].clone()).unwrap();
            assert_eq!(
                [
                    field("attempts"),
                    field("type"),
                    field("enqueued_at"),
                    field("delivered_at"),
                    field("worker")
                ],
                [
                    d.attempt.to_string(),
                    d.job_type.clone(),
                    d.enqueued_at_ms.to_string(),
                    d.delivered_at_ms.to_string(),
                    "w-1".to_string()
                ],
                "{id}"
            );
        }

        // Sent numbers that are not counts (no worker of this version sends
        // them): the record takes the job's own fields instead, and the
        // delivery is acked like any other.
        let d = &ds["bad"];
        let retention = crate::scripts::ms(RETENTION).to_string();
        let delivered = d.delivered_at_ms.to_string();
        let reply = raw_ack(
            &mut c,
            &keys,
            &retention,
            d,
            ["7", "other", "soon", &delivered],
        )
        .await
        .unwrap();
        assert_eq!(reply, Value::BulkString(b"1".to_vec()));
        let rec: Vec<Option<String>> = redis::cmd("HMGET")
            .arg(keys.done("bad"))
            .arg(&["attempts", "type", "enqueued_at", "worker"])
            .query_async(&mut c)
            .await
            .unwrap();
        assert_eq!(
            rec,
            [
                Some(d.attempt.to_string()),
                Some(d.job_type.clone()),
                Some(d.enqueued_at_ms.to_string()),
                Some("w-1".to_string())
            ]
        );
    }
}
