//! Regression tests of the script layer against a real redis-server (issue
//! #11): a claim, fetch, fail or cancelled end (finish_cancel) retried with
//! its token after a lost reply gets the same answer; corrupt job data is dead-lettered naming the field; a
//! queue key of the wrong type is refused before any write; a corrupt counter
//! never blocks a move; replay and purge touch only dead jobs; one bad claim
//! row is reported alone; a deferred newer-version delivery gives its attempt
//! back once, does not start the execution deadline, and is given back while
//! its version is announced even with a zero wait.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use redis::Value;

use super::claim::{Claim, ClaimRow, Delivery, Skip};
use super::enqueue::Enqueue;
use super::fail::{Fail, FailKind, FailReply};
use super::fetch::Fetch;
use super::promote::Promote;
use super::reclaim::Reclaim;
use super::replay::{Replay, ReplayReply};
use crate::conn::{connect, ConnectionConfig, RedisConnection};
use crate::error::Result;
use crate::job::JobId;
use crate::keys::QueueKeys;

const LEASE: Duration = Duration::from_secs(30);

/// One throwaway redis-server (DEBUG allowed) and one queue on it.
struct Fixture {
    server: queue_testkit::RedisServer,
    conn: RedisConnection,
    keys: QueueKeys,
}

/// One dead-list trim (no length cap) of the entries older than 1 ms, at
/// most 10 of them.
async fn trim_expired(
    keys: &QueueKeys,
    conn: &mut RedisConnection,
) -> super::dead_trim::DeadTrimReply {
    super::dead_trim::DeadTrim {
        keys,
        max_len: 0,
        retention: Duration::from_millis(1),
        limit: 10,
    }
    .run(conn)
    .await
    .unwrap()
}

/// The `LPOS` calls among a script's `calls` (`MONITOR` lines) that walk a
/// whole list (no `MAXLEN`).
fn whole_walks(calls: &[String]) -> usize {
    whole_walks_of(calls, None)
}

/// [`whole_walks`] of list `key` only (`None`: of any list).
fn whole_walks_of(calls: &[String], key: Option<&str>) -> usize {
    calls
        .iter()
        .map(|l| super::monitor_args(l))
        .filter(|a| a.first().map(String::as_str) == Some("LPOS"))
        .filter(|a| key.is_none_or(|k| a.get(1).map(String::as_str) == Some(k)))
        .filter(|a| !a.iter().any(|x| x.eq_ignore_ascii_case("MAXLEN")))
        .count()
}

/// Where a job id is found.
#[derive(Debug, Default, PartialEq, Eq)]
struct Places {
    main: bool,
    processing: bool,
    leased: bool,
    delayed: bool,
    dead: bool,
}

impl Places {
    /// Waiting in main, and nowhere else.
    fn main_only() -> Self {
        Places {
            main: true,
            ..Places::default()
        }
    }

    /// In the dead list, and nowhere else.
    fn dead_only() -> Self {
        Places {
            dead: true,
            ..Places::default()
        }
    }

    /// In the delayed set, and nowhere else.
    fn delayed_only() -> Self {
        Places {
            delayed: true,
            ..Places::default()
        }
    }
}

impl Fixture {
    async fn start() -> Self {
        let server =
            queue_testkit::RedisServer::start_with(&["--enable-debug-command", "local"]).unwrap();
        let conn = connect(&server.url(), &ConnectionConfig::default())
            .await
            .unwrap();
        Fixture {
            server,
            conn,
            keys: QueueKeys::new("hardening"),
        }
    }

    async fn cmd(&mut self, args: &[&str]) -> Value {
        self.try_cmd(args).await.expect("command succeeds")
    }

    /// The reply, or `None` on an error reply (e.g. a key of the wrong type).
    async fn try_cmd(&mut self, args: &[&str]) -> Option<Value> {
        let mut cmd = redis::cmd(args[0]);
        for a in &args[1..] {
            cmd.arg(*a);
        }
        cmd.query_async(&mut self.conn).await.ok()
    }

    async fn enqueue(&mut self, id: &str, max_attempts: u32) {
        self.enqueue_extra(id, max_attempts, &[]).await;
    }

    /// [`enqueue`](Self::enqueue) with extra job fields.
    async fn enqueue_extra(&mut self, id: &str, max_attempts: u32, extra: &[(String, String)]) {
        let id = JobId::from(id);
        Enqueue {
            extra,
            ..Enqueue::test_job(&self.keys, &id, max_attempts)
        }
        .run(&mut self.conn)
        .await
        .unwrap();
    }

    async fn fetch(&mut self, count: usize, token_base: &str) -> Result<Vec<ClaimRow>> {
        let mut conn = self.conn.clone();
        self.fetch_on(&mut conn, count, token_base).await
    }

    /// A fetch as a retry sends it (the receipt is read first).
    async fn fetch_on(
        &self,
        conn: &mut RedisConnection,
        count: usize,
        token_base: &str,
    ) -> Result<Vec<ClaimRow>> {
        self.fetch_try(conn, count, token_base, false).await
    }

    /// A fetch; `first_try`: as the worker sends the first try of a fresh base.
    async fn fetch_try(
        &self,
        conn: &mut RedisConnection,
        count: usize,
        token_base: &str,
        first_try: bool,
    ) -> Result<Vec<ClaimRow>> {
        Fetch {
            keys: &self.keys,
            lease: LEASE,
            token_base,
            count,
            first_try,
        }
        .run(conn)
        .await
    }

    async fn fetch_one(&mut self) -> Delivery {
        let base = uuid::Uuid::new_v4().to_string();
        match self.fetch(1, &base).await.unwrap().pop() {
            Some(ClaimRow::Claimed(d)) => d,
            other => panic!("expected a claimed row, got {other:?}"),
        }
    }

    async fn fail(&mut self, d: &Delivery, kind: FailKind) -> Result<FailReply> {
        Fail {
            keys: &self.keys,
            id: &d.id,
            token: &d.token,
            kind,
            message: "planned",
            delay: Duration::ZERO,
            far_from_tail: false,
        }
        .run(&mut self.conn)
        .await
    }

    /// Gives `d` back as a worker whose handler knows version 1 of a
    /// version-2 payload (`t:2`), due at once, waiting at most `wait` for a
    /// worker that announces `t:2`.
    async fn defer(&mut self, d: &Delivery, wait: Duration) -> FailReply {
        super::defer::Defer {
            delay: Duration::ZERO,
            wait,
            ..super::defer::Defer::test_v2(&self.keys, d)
        }
        .run(&mut self.conn)
        .await
        .unwrap()
    }

    /// The Redis clock in ms (the clock of every job timestamp).
    async fn redis_now_ms(&mut self) -> i64 {
        let (s, us): (i64, i64) = redis::cmd("TIME")
            .query_async(&mut self.conn)
            .await
            .unwrap();
        s * 1000 + us / 1000
    }

    /// The next delivery of a job given back or retried at once: promoted
    /// to main, then fetched, after the Redis clock moved on from `after`
    /// (a delivery time) so that the two deliveries' times differ.
    async fn redeliver_after(&mut self, after: &Delivery) -> Delivery {
        let start = Instant::now();
        while self.redis_now_ms().await <= after.delivered_at_ms {
            assert!(start.elapsed() < Duration::from_secs(10), "Redis clock");
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        self.promote().await.unwrap();
        self.fetch_one().await
    }

    async fn reclaim(&mut self) -> Result<super::reclaim::ReclaimReply> {
        Reclaim::for_tests(&self.keys).run(&mut self.conn).await
    }

    /// Pushes 3,000 filler ids (`<name>-<n>`) on each list: longer than a
    /// stale entry's first search (1,000 entries from the tail).
    async fn fill_lists(&mut self, lists: &[(&String, &str)]) {
        for (list, name) in lists {
            let ids: Vec<String> = (0..3_000).map(|n| format!("{name}-{n}")).collect();
            let mut args = vec!["RPUSH", list.as_str()];
            args.extend(ids.iter().map(String::as_str));
            self.cmd(&args).await;
        }
    }

    async fn promote(&mut self) -> Result<super::promote::PromoteReply> {
        Promote {
            keys: &self.keys,
            limit: 100,
        }
        .run(&mut self.conn)
        .await
    }

    /// Cancels queued job `id`: it must answer cancelled from the queue
    /// and leave the job nowhere.
    async fn cancel_queued(&mut self, id: &str) {
        let outcome = super::cancel::Cancel {
            keys: &self.keys,
            id: &JobId::from(id),
            retention: Duration::from_secs(60),
        }
        .run(&mut self.conn.clone())
        .await
        .unwrap();
        assert_eq!(
            outcome,
            crate::CancelOutcome::Cancelled {
                from: crate::state::JobState::Queued
            }
        );
        assert_eq!(self.places(id).await, Places::default());
    }

    async fn job(&mut self, id: &str) -> HashMap<String, String> {
        let key = self.keys.job(id);
        redis::cmd("HGETALL")
            .arg(key)
            .query_async(&mut self.conn)
            .await
            .unwrap()
    }

    async fn places(&mut self, id: &str) -> Places {
        let k = self.keys.clone();
        // A key of the wrong type holds nothing.
        let in_list = |v: Option<Value>| !matches!(v, None | Some(Value::Nil));
        Places {
            main: in_list(self.try_cmd(&["LPOS", &k.main, id]).await),
            processing: in_list(self.try_cmd(&["LPOS", &k.processing, id]).await),
            leased: in_list(self.try_cmd(&["ZSCORE", &k.leases, id]).await),
            delayed: in_list(self.try_cmd(&["ZSCORE", &k.delayed, id]).await),
            dead: in_list(self.try_cmd(&["LPOS", &k.dead, id]).await),
        }
    }

    /// Runs `op` on a connection that gives up after 200 ms while a second
    /// connection holds the server in `DEBUG SLEEP`: the script still runs
    /// after the sleep, but its reply is lost to the caller.
    async fn lose_reply<T: std::fmt::Debug>(
        &self,
        op: impl AsyncFnOnce(&mut RedisConnection) -> Result<T>,
    ) {
        let mut impatient = connect(
            &self.server.url(),
            &ConnectionConfig {
                response_timeout: Duration::from_millis(200),
                ..ConnectionConfig::default()
            },
        )
        .await
        .unwrap();
        let mut sleeper = connect(&self.server.url(), &ConnectionConfig::default())
            .await
            .unwrap();
        let sleeping = tokio::spawn(async move {
            redis::cmd("DEBUG")
                .arg("SLEEP")
                .arg(1)
                .query_async::<Value>(&mut sleeper)
                .await
        });
        tokio::time::sleep(Duration::from_millis(150)).await;
        let lost = op(&mut impatient).await;
        assert!(lost.is_err(), "the reply should time out: {lost:?}");
        sleeping.await.unwrap().unwrap();
    }

    /// Waits until job `id`'s `state` is `want` (the delayed script ran).
    async fn wait_state(&mut self, id: &str, want: &str) {
        let start = Instant::now();
        while self.job(id).await.get("state").map(String::as_str) != Some(want) {
            assert!(start.elapsed() < Duration::from_secs(10), "state {want}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

#[tokio::test]
async fn a_claim_retried_after_its_reply_was_lost_gets_the_same_delivery() {
    let mut fx = Fixture::start().await;
    fx.enqueue("j1", 1).await;
    let k = fx.keys.clone();
    let id = fx
        .cmd(&["LMOVE", &k.main, &k.processing, "RIGHT", "LEFT"])
        .await;
    let Value::BulkString(id) = id else {
        panic!("{id:?}")
    };
    let claim = Claim {
        keys: &k,
        id: &id,
        lease: LEASE,
        token: "tok-1",
    };
    // Loaded first: an FCALL before the library is loaded only gets "Function not found".
    super::claim::SCRIPT.load(&mut fx.conn).await.unwrap();
    fx.lose_reply(async |c| claim.run(c).await).await;
    fx.wait_state("j1", "active").await;
    let ClaimRow::Claimed(d) = claim.run(&mut fx.conn.clone()).await.unwrap() else {
        panic!("the retry must answer the same delivery, not busy")
    };
    assert_eq!((d.token.as_str(), d.attempt, d.fence), ("tok-1", 1, 1));
    let job = fx.job("j1").await;
    assert_eq!(job["attempts"], "1", "the retry claims nothing more");
    let other = Claim {
        token: "tok-2",
        ..claim
    };
    let row = other.run(&mut fx.conn.clone()).await.unwrap();
    assert_eq!(row, ClaimRow::Skipped("j1".into(), Skip::Busy));
}

#[tokio::test]
async fn a_fetch_retried_after_its_reply_was_lost_gets_the_same_deliveries() {
    let mut fx = Fixture::start().await;
    for id in ["j1", "j2"] {
        fx.enqueue(id, 1).await;
    }
    super::fetch::SCRIPT.load(&mut fx.conn).await.unwrap();
    fx.lose_reply(async |c| fx.fetch_on(c, 5, "base").await)
        .await;
    fx.wait_state("j2", "active").await;
    let rows = fx.fetch(5, "base").await.unwrap();
    let tokens: Vec<_> = rows
        .iter()
        .map(|r| match r {
            ClaimRow::Claimed(d) => (d.id.to_string(), d.token.clone(), d.attempt),
            other => panic!("not the same delivery: {other:?}"),
        })
        .collect();
    assert_eq!(
        tokens,
        [
            ("j1".to_string(), "base:1".to_string(), 1),
            ("j2".to_string(), "base:2".to_string(), 1)
        ]
    );
    let receipt = fx.keys.fetch_receipt("base");
    let Value::Int(ttl) = fx.cmd(&["PTTL", &receipt]).await else {
        panic!("receipt ttl")
    };
    assert!(ttl > 0 && ttl <= LEASE.as_millis() as i64 / 2, "{ttl}");
    // A new fetch (another token base) takes nothing more.
    assert!(fx.fetch(5, "other").await.unwrap().is_empty());
}

/// A retried fetch whose receipt holds an entry without its `tag:` (written
/// by hand: corrupt data) answers that entry as a row of nothing claimed
/// and the others as before. Before, it raised a Lua error at every retry.
#[tokio::test]
async fn a_receipt_entry_without_its_tag_is_a_busy_row_not_a_lua_error() {
    let mut fx = Fixture::start().await;
    fx.enqueue("j1", 1).await;
    assert_eq!(fx.fetch(5, "base").await.unwrap().len(), 1);
    let receipt = fx.keys.fetch_receipt("base");
    fx.cmd(&["RPUSH", &receipt, "corrupt"]).await;
    let rows = fx.fetch(5, "base").await.unwrap();
    assert!(
        matches!(&rows[..], [ClaimRow::Claimed(d), ClaimRow::Skipped(id, Skip::Busy)]
            if d.id.as_str() == "j1" && id.as_str() == "corrupt"),
        "{rows:?}"
    );
}

/// A first try (which does not read its receipt: a fresh token base has
/// none) whose receipt key holds a string (corrupt data), with the queue's
/// optional keys absent and with events on (one of them present): refused
/// before any write, naming the key; the jobs stay waiting, unclaimed. Once
/// the key is repaired, the same first try claims them. Before, the fetch
/// moved and claimed the jobs, then its RPUSH to the receipt raised: the
/// worker got an error and the jobs stayed active, run by nobody, until
/// their leases expired (an attempt spent).
#[tokio::test]
async fn a_first_try_whose_receipt_key_is_corrupt_is_refused_before_any_write() {
    for events in [false, true] {
        let mut fx = Fixture::start().await;
        let k = fx.keys.clone();
        if events {
            fx.cmd(&["SET", &k.events_on(), "100"]).await;
        }
        fx.enqueue("j1", 3).await;
        fx.enqueue("j2", 3).await;
        let receipt = k.fetch_receipt("fresh");
        fx.cmd(&["SET", &receipt, "x"]).await;
        let mut conn = fx.conn.clone();
        let err = fx.fetch_try(&mut conn, 2, "fresh", true).await.unwrap_err();
        assert!(
            err.to_string().contains("refused before any write")
                && err.to_string().contains(&receipt),
            "events {events}: {err}"
        );
        for id in ["j1", "j2"] {
            assert_eq!(
                fx.places(id).await,
                Places::main_only(),
                "events {events}: {id}"
            );
            let job = fx.job(id).await;
            assert_eq!(
                (job["state"].as_str(), job["attempts"].as_str()),
                ("queued", "0")
            );
        }
        fx.cmd(&["DEL", &receipt]).await;
        let rows = fx.fetch_try(&mut conn, 2, "fresh", true).await.unwrap();
        assert!(
            matches!(&rows[..], [ClaimRow::Claimed(_), ClaimRow::Claimed(_)]),
            "events {events}: {rows:?}"
        );
    }
}

/// The worker's own sequence: a first try that skips the receipt read (a
/// fresh token base has none), its reply lost, then the retry with the same
/// base, which reads the receipt the first try wrote.
#[tokio::test]
async fn a_first_try_whose_reply_was_lost_is_answered_by_its_retry() {
    let mut fx = Fixture::start().await;
    for id in ["j1", "j2", "j3"] {
        fx.enqueue(id, 1).await;
    }
    super::fetch::SCRIPT.load(&mut fx.conn).await.unwrap();
    fx.lose_reply(async |c| fx.fetch_try(c, 2, "fresh", true).await)
        .await;
    fx.wait_state("j2", "active").await;
    let rows = fx.fetch(2, "fresh").await.unwrap();
    let ids: Vec<_> = rows
        .iter()
        .map(|r| match r {
            ClaimRow::Claimed(d) => (d.id.to_string(), d.token.clone()),
            other => panic!("not the same delivery: {other:?}"),
        })
        .collect();
    assert_eq!(
        ids,
        [
            ("j1".to_string(), "fresh:1".to_string()),
            ("j2".to_string(), "fresh:2".to_string())
        ]
    );
    let job = fx.job("j3").await;
    assert_eq!(job["state"], "queued", "the retry claimed nothing more");
}

#[tokio::test]
async fn a_fail_retried_after_its_reply_was_lost_gets_the_same_outcome() {
    let mut fx = Fixture::start().await;
    fx.enqueue("j1", 3).await;
    let d = fx.fetch_one().await;
    super::fail::SCRIPT.load(&mut fx.conn).await.unwrap();
    let keys = fx.keys.clone();
    let fail = Fail {
        keys: &keys,
        id: &d.id,
        token: &d.token,
        kind: FailKind::Retry,
        message: "planned",
        delay: Duration::from_secs(60),
        far_from_tail: false,
    };
    fx.lose_reply(async |c| fail.run(c).await).await;
    fx.wait_state("j1", "delayed").await;
    let again = fail.run(&mut fx.conn.clone()).await.unwrap();
    let run_at = fx.job("j1").await["run_at"].parse().unwrap();
    assert_eq!(
        again,
        FailReply::Retry { run_at_ms: run_at },
        "not lease lost"
    );
    let stale = Fail {
        token: "another delivery",
        ..fail
    };
    let reply = stale.run(&mut fx.conn.clone()).await.unwrap();
    assert_eq!(reply, FailReply::LeaseLost);
}

/// A cancelled delivery's end (`finish_cancel.lua`) whose reply was lost is
/// retried with the same token and answers that the job ended cancelled:
/// the record keeps the token. Before, the hash was gone and the retry
/// answered "lease lost", so the runner logged a cancelled job as a lost
/// lease. Another token still gets "lease lost".
#[tokio::test]
async fn a_finish_cancel_retried_after_its_reply_was_lost_answers_cancelled() {
    let mut fx = Fixture::start().await;
    fx.enqueue("j1", 3).await;
    let d = fx.fetch_one().await;
    let k = fx.keys.clone();
    fx.cmd(&["HSET", &k.job("j1"), "cancel_requested", "1"])
        .await;
    let cancelled = fx.fail(&d, FailKind::Retry).await.unwrap();
    assert_eq!(cancelled, FailReply::CancelRequested);
    super::finish_cancel::SCRIPT
        .load(&mut fx.conn)
        .await
        .unwrap();
    let finish = super::finish_cancel::FinishCancel {
        keys: &k,
        id: &d.id,
        token: &d.token,
        retention: Duration::from_secs(60),
        message: "cancelled",
        far_from_tail: false,
    };
    fx.lose_reply(async |c| finish.run(c).await).await;
    let start = Instant::now();
    while !fx.job("j1").await.is_empty() {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "the lost call ran"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let again = finish.run(&mut fx.conn.clone()).await.unwrap();
    assert!(again, "the retry answers cancelled, not lease lost");
    let stale = super::finish_cancel::FinishCancel {
        token: "another delivery",
        ..finish
    };
    assert!(!stale.run(&mut fx.conn.clone()).await.unwrap());
}

/// A fail retried after an operator replayed the job it dead-lettered (and
/// the job died again, here of a corrupt field at its next fetch) is not
/// answered as if its own outcome stood: the replay started a new life, so
/// the old delivery's retry answers "lease lost", whatever the job's state.
/// (Found by the model test: the retry answered the later dead reason.)
#[tokio::test]
async fn a_fail_retried_after_a_replay_of_its_job_answers_lease_lost() {
    let mut fx = Fixture::start().await;
    fx.enqueue("j1", 3).await;
    let d = fx.fetch_one().await;
    let first = fx.fail(&d, FailKind::Permanent).await.unwrap();
    assert!(matches!(first, FailReply::Dead { .. }), "{first:?}");
    let replay = Replay {
        keys: &fx.keys,
        id: &d.id,
        reset_attempts: false,
    };
    assert_eq!(
        replay.run(&mut fx.conn.clone()).await.unwrap(),
        ReplayReply::Replayed
    );
    let again = fx.fail(&d, FailKind::Permanent).await.unwrap();
    assert_eq!(again, FailReply::LeaseLost, "replayed, waiting");
    // Dead again, of another cause: still not this delivery's outcome.
    let job = fx.keys.job("j1");
    fx.cmd(&["HSET", &job, "attempts", "nan"]).await;
    let rows = fx.fetch(1, "second").await.unwrap();
    assert!(matches!(rows[..], [ClaimRow::Corrupt(..)]), "{rows:?}");
    let late = fx.fail(&d, FailKind::Permanent).await.unwrap();
    assert_eq!(late, FailReply::LeaseLost, "dead again, of a corrupt field");
}

#[tokio::test]
async fn one_unreadable_row_is_reported_alone() {
    let mut fx = Fixture::start().await;
    for id in ["j1", "j2", "j3"] {
        fx.enqueue(id, 3).await;
    }
    let key = fx.keys.job("j2");
    let _: () = redis::cmd("HSET")
        .arg(&key)
        .arg("type")
        .arg(b"\xff\xfe".as_slice())
        .query_async(&mut fx.conn)
        .await
        .unwrap();
    let rows = fx
        .fetch(3, "b")
        .await
        .expect("the batch is not thrown away");
    assert!(matches!(&rows[0], ClaimRow::Claimed(d) if d.id.as_str() == "j1"));
    let ClaimRow::Unreadable(bad) = &rows[1] else {
        panic!("{rows:?}")
    };
    assert_eq!(bad.id.as_ref().map(JobId::as_str), Some("j2"));
    assert_eq!(bad.token.as_deref(), Some("b:2"));
    assert!(bad.detail.contains("type"), "{}", bad.detail);
    assert!(matches!(&rows[2], ClaimRow::Claimed(d) if d.id.as_str() == "j3"));
}

#[tokio::test]
async fn corrupt_counts_are_dead_lettered_naming_the_field() {
    let mut fx = Fixture::start().await;
    // Claim: attempts -inf.
    fx.enqueue("claim", 3).await;
    fx.cmd(&["HSET", &fx.keys.job("claim"), "attempts", "-inf"])
        .await;
    let rows = fx.fetch(1, "b").await.unwrap();
    assert!(
        matches!(&rows[..], [ClaimRow::Corrupt(id, why)] if id.as_str() == "claim" && why.contains("attempts")),
        "{rows:?}"
    );
    // Fail: max_attempts nan.
    fx.enqueue("fail", 3).await;
    let d = fx.fetch_one().await;
    fx.cmd(&["HSET", &fx.keys.job("fail"), "max_attempts", "nan"])
        .await;
    let reply = fx.fail(&d, FailKind::Retry).await.unwrap();
    assert!(
        matches!(&reply, FailReply::Dead { reason } if reason.contains("max_attempts")),
        "{reply:?}"
    );
    // Reclaim: attempts nan on an expired lease.
    fx.enqueue("reclaim", 3).await;
    fx.fetch_one().await;
    fx.cmd(&["HSET", &fx.keys.job("reclaim"), "attempts", "nan"])
        .await;
    let leases = fx.keys.leases.clone();
    fx.cmd(&["ZADD", &leases, "1", "reclaim"]).await;
    assert_eq!(fx.reclaim().await.unwrap().dead_lettered, 1);
    for id in ["claim", "fail", "reclaim"] {
        let dead = Places::dead_only();
        assert_eq!(fx.places(id).await, dead, "{id}");
        let job = fx.job(id).await;
        assert_eq!(job["state"], "dead", "{id}");
        assert!(job["dead_reason"].starts_with("corrupt field"), "{job:?}");
    }
}

/// A watchdog with a backoff base of 0 returns a job of 1,025 attempts or
/// more like any other: the backoff's exponent is capped (0 × 2^1024 was
/// NaN, which ZADD refused half-way through the pass, at every pass).
#[tokio::test]
async fn a_zero_backoff_base_returns_a_job_of_many_attempts() {
    let mut fx = Fixture::start().await;
    fx.enqueue("many", 5000).await;
    fx.fetch_one().await;
    let job = fx.keys.job("many");
    fx.cmd(&["HSET", &job, "attempts", "2000"]).await;
    let leases = fx.keys.leases.clone();
    fx.cmd(&["ZADD", &leases, "1", "many"]).await;
    let backoff = crate::Backoff {
        base: Duration::ZERO,
        max: Duration::from_secs(60),
    };
    let reply = Reclaim {
        backoff: &backoff,
        ..Reclaim::for_tests(&fx.keys)
    }
    .run(&mut fx.conn)
    .await
    .expect("the pass runs");
    assert_eq!(reply.reclaimed, 1);
    assert_eq!(fx.job("many").await["state"], "delayed");
}

/// A fetch of more jobs than one Lua `unpack` takes (~8,000 values)
/// writes its whole receipt: its `RPUSH` raised after every job was moved
/// and claimed, the reply was lost, and each of those deliveries burned an
/// attempt at its lease's expiry.
#[tokio::test]
async fn a_fetch_larger_than_an_unpack_writes_its_whole_receipt() {
    let mut fx = Fixture::start().await;
    const N: usize = 8_200;
    let ids: Vec<JobId> = (0..N).map(|i| JobId::from(format!("j{i}"))).collect();
    let jobs: Vec<super::enqueue_many::ManyJob<'_>> = ids
        .iter()
        .map(|id| super::enqueue_many::ManyJob {
            job: Enqueue::test_job(&fx.keys, id, 3),
            token: "t",
            fresh: true,
        })
        .collect();
    for chunk in jobs.chunks(1000) {
        super::enqueue_many::run(
            &mut fx.conn,
            &fx.keys,
            super::enqueue_many::Mode::Each,
            chunk,
        )
        .await
        .unwrap();
    }
    let tokens = |rows: Vec<ClaimRow>| -> Vec<String> {
        rows.into_iter()
            .filter_map(|r| match r {
                ClaimRow::Claimed(d) => Some(d.token),
                _ => None,
            })
            .collect()
    };
    let first = tokens(fx.fetch(N, "wide-fetch").await.expect("the fetch answers"));
    assert_eq!(first.len(), N, "every job claimed");
    // A retry of the same fetch (its reply lost) gets the same deliveries.
    let again = tokens(fx.fetch(N, "wide-fetch").await.expect("the retry answers"));
    assert!(again == first, "the retry's deliveries differ");
}

/// A cancelled delivery's record with a retention of 0 (a caller other
/// than the typed wrapper, which sends at least 1) still expires: PEXPIRE 0
/// deleted it, and the `last_error` written after it made a record with no
/// status and no TTL, so the id answered "done" to every enqueue for ever.
#[tokio::test]
async fn a_cancel_record_with_a_retention_of_zero_still_expires() {
    let mut fx = Fixture::start().await;
    fx.enqueue("fc0", 3).await;
    let d = fx.fetch_one().await;
    let k = fx.keys.clone();
    let done = super::finish_cancel::SCRIPT
        .call([
            k.processing.clone(),
            k.leases.clone(),
            k.job("fc0"),
            k.done("fc0"),
            k.stats.clone(),
            k.steps("fc0"),
            k.guard.clone(),
        ])
        .arg("fc0")
        .arg(&d.token)
        .arg(0)
        .arg("stopped")
        .arg(super::far_arg(d.far_from_tail))
        .run(&mut fx.conn, &k.queue, Some(&d.id))
        .await
        .unwrap();
    assert_eq!(done, Value::Int(1));
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(
        fx.cmd(&["EXISTS", &k.done("fc0")]).await,
        Value::Int(0),
        "no record without a TTL"
    );
}

#[tokio::test]
async fn a_job_key_that_is_not_a_hash_is_dead_lettered() {
    let mut fx = Fixture::start().await;
    let k = fx.keys.clone();
    fx.cmd(&["SET", &k.job("promoted"), "garbage"]).await;
    fx.cmd(&["ZADD", &k.delayed, "1", "promoted"]).await;
    assert_eq!(fx.promote().await.unwrap().promoted, 1);
    fx.enqueue("claimed", 3).await;
    fx.cmd(&["DEL", &k.job("claimed")]).await;
    fx.cmd(&["SADD", &k.job("claimed"), "x"]).await;
    let rows = fx.fetch(1, "b").await.unwrap();
    assert!(matches!(&rows[..], [ClaimRow::Corrupt(..)]), "{rows:?}");
    for id in ["promoted", "claimed"] {
        let dead = Places::dead_only();
        assert_eq!(fx.places(id).await, dead, "{id}");
        let reason = &fx.job(id).await["dead_reason"];
        assert!(reason.contains("not a hash"), "{reason}");
    }
}

#[tokio::test]
async fn a_queue_key_of_the_wrong_type_is_refused_before_any_write() {
    let mut fx = Fixture::start().await;
    let k = fx.keys.clone();
    fx.enqueue("j1", 3).await;
    let d = fx.fetch_one().await;
    fx.cmd(&["SET", &k.delayed, "x"]).await;
    let err = fx.fail(&d, FailKind::Retry).await.unwrap_err();
    assert!(
        err.to_string().contains("refused before any write"),
        "{err}"
    );
    let active = Places {
        processing: true,
        leased: true,
        ..Places::default()
    };
    assert_eq!(fx.places("j1").await, active, "fail left the job in place");
    assert_eq!(fx.job("j1").await["state"], "active");

    fx.cmd(&["DEL", &k.delayed]).await;
    assert_eq!(
        fx.fail(&d, FailKind::Retry).await.unwrap(),
        FailReply::Retry {
            run_at_ms: fx.job("j1").await["failed_at"].parse().unwrap()
        }
    );
    fx.cmd(&["SET", &k.main, "x"]).await;
    assert!(fx.promote().await.is_err());
    let delayed = Places::delayed_only();
    assert_eq!(
        fx.places("j1").await,
        delayed,
        "promote left the job in place"
    );
}

#[tokio::test]
async fn a_corrupt_counter_never_blocks_a_move() {
    let mut fx = Fixture::start().await;
    let k = fx.keys.clone();
    fx.enqueue("j1", 3).await;
    let d = fx.fetch_one().await;
    fx.cmd(&["HSET", &k.stats, "failed", "many", "retried", "x"])
        .await;
    let reply = fx.fail(&d, FailKind::Retry).await.unwrap();
    assert!(matches!(reply, FailReply::Retry { .. }), "{reply:?}");
    let delayed = Places::delayed_only();
    assert_eq!(fx.places("j1").await, delayed);
}

/// A stats key of another type never fails a transition after its writes
/// (the counters come last and are skipped): the enqueue and the cancel
/// answer what they did, instead of an error for a change that was made.
#[tokio::test]
async fn a_stats_key_of_another_type_never_fails_a_transition() {
    let mut fx = Fixture::start().await;
    let k = fx.keys.clone();
    fx.cmd(&["SET", &k.stats, "x"]).await;
    fx.enqueue("j1", 3).await; // unwraps the reply
    fx.enqueue("j2", 3).await;
    let queued = Places::main_only();
    assert_eq!(fx.places("j1").await, queued);
    fx.cancel_queued("j2").await;
}

/// A completion record key of another type (corrupt data) under a job that
/// is cancelled: the cancel's record replaces it instead of failing the
/// script after its history was written.
#[tokio::test]
async fn a_cancel_replaces_a_record_key_of_another_type() {
    let mut fx = Fixture::start().await;
    let k = fx.keys.clone();
    fx.enqueue("j1", 3).await;
    fx.cmd(&["RPUSH", &k.done("j1"), "x"]).await;
    fx.cancel_queued("j1").await;
    assert_eq!(
        fx.cmd(&["HGET", &k.done("j1"), "status"]).await,
        Value::BulkString(b"cancelled".to_vec())
    );
}

#[tokio::test]
async fn replay_and_purge_touch_only_dead_jobs() {
    let mut fx = Fixture::start().await;
    let k = fx.keys.clone();
    // A stale dead-list entry for an id whose live job waits in main.
    fx.enqueue("j1", 3).await;
    fx.cmd(&["LPUSH", &k.dead, "j1"]).await;
    let id = JobId::from("j1");
    let replay = Replay {
        keys: &k,
        id: &id,
        reset_attempts: true,
    };
    assert_eq!(
        replay.run(&mut fx.conn.clone()).await.unwrap(),
        ReplayReply::NotDead
    );
    let admin = crate::admin::Admin::connect(&fx.server.url())
        .await
        .unwrap();
    assert_eq!(
        admin.purge_dead("hardening", "j1", None).await.unwrap(),
        crate::admin::PurgeOutcome::NotDead
    );
    let Value::Int(len) = fx.cmd(&["LLEN", &k.main]).await else {
        panic!("main length")
    };
    assert_eq!(len, 1, "replay must not push the live job a second time");
    assert_eq!(fx.job("j1").await["state"], "queued", "purge kept the job");
}

/// The promoter's wake list is only a hint: a wake key of another type is
/// skipped, the retry is still scheduled, and the promoter is told how long
/// until it is due.
#[tokio::test]
async fn a_wake_key_of_another_type_never_blocks_a_retry() {
    let mut fx = Fixture::start().await;
    fx.enqueue("w1", 3).await;
    let d = fx.fetch_one().await;
    let wake = fx.keys.wake.clone();
    fx.cmd(&["SET", &wake, "not a list"]).await;
    let reply = fx.fail(&d, FailKind::Retry).await.unwrap();
    assert!(matches!(reply, FailReply::Retry { .. }), "{reply:?}");
    assert_eq!(fx.job("w1").await["state"], "delayed");
    let promoted = fx.promote().await.unwrap();
    assert_eq!(promoted.promoted, 1, "the retry (delay 0) is due");
    assert_eq!(promoted.next_due_in, None, "the delayed set is empty now");
}

#[tokio::test]
async fn a_defer_retried_after_its_reply_was_lost_gets_the_same_outcome() {
    use super::defer::Defer;
    let mut fx = Fixture::start().await;
    fx.enqueue("j1", 1).await;
    let d = fx.fetch_one().await;
    assert_eq!(d.attempt, 1);
    super::defer::SCRIPT.load(&mut fx.conn).await.unwrap();
    let keys = fx.keys.clone();
    let defer = Defer::test_v2(&keys, &d);
    fx.lose_reply(async |c| defer.run(c).await).await;
    fx.wait_state("j1", "delayed").await;
    let again = defer.run(&mut fx.conn.clone()).await.unwrap();
    let job = fx.job("j1").await;
    let run_at = job["run_at"].parse().unwrap();
    assert_eq!(again, FailReply::Retry { run_at_ms: run_at });
    assert_eq!(job["attempts"], "0", "the attempt is given back once");
    assert!(!job.contains_key("token"), "lease dropped");
    let places = fx.places("j1").await;
    assert_eq!(places, Places::delayed_only());
    let stale = Defer {
        token: "another delivery",
        ..defer
    };
    assert_eq!(
        stale.run(&mut fx.conn.clone()).await.unwrap(),
        FailReply::LeaseLost
    );
}

/// Extra job fields (enqueue.lua ARGV 10..) land on the job hash; a name the
/// core scripts own, or an odd count, is refused before any write.
#[tokio::test]
async fn enqueue_extra_fields_are_stored_and_core_names_refused() {
    let mut f = Fixture::start().await;
    let (keys, conn) = (f.keys.clone(), f.conn.clone());
    let send = |id: &'static str, extra: Vec<(String, String)>| {
        let (keys, mut conn) = (keys.clone(), conn.clone());
        async move {
            let id = JobId::from(id);
            Enqueue {
                extra: &extra,
                ..Enqueue::test_job(&keys, &id, 1)
            }
            .run(&mut conn)
            .await
        }
    };
    let pair = |n: &str, v: &str| (n.to_string(), v.to_string());
    send("x1", vec![pair("tenant", "acme"), pair("expires_at", "42")])
        .await
        .unwrap();
    let job = keys.job("x1");
    assert_eq!(
        f.cmd(&["HMGET", &job, "tenant", "expires_at", "state"])
            .await,
        Value::Array(vec![
            Value::BulkString(b"acme".to_vec()),
            Value::BulkString(b"42".to_vec()),
            Value::BulkString(b"queued".to_vec()),
        ])
    );
    for bad in [vec![pair("state", "done")], vec![pair("", "v")]] {
        assert!(send("x2", bad).await.is_err());
    }
    assert_eq!(f.cmd(&["EXISTS", &keys.job("x2")]).await, Value::Int(0));
    assert_eq!(f.cmd(&["LLEN", &keys.main]).await, Value::Int(1));
}

/// Runs `progress.lua` for job `id` of the fixture's queue.
async fn progress(f: &Fixture, id: &JobId, token: &str, done: u64) -> Result<bool> {
    super::progress::Progress {
        keys: &f.keys,
        id,
        token,
        done,
        message: "half way",
    }
    .run(&mut f.conn.clone())
    .await
}

/// `progress.lua` writes only while the delivery's token owns the job
/// (docs/RESULTS.md): another token, or the same one after the ack, writes
/// nothing.
#[tokio::test]
async fn a_stale_delivery_writes_no_progress() {
    let mut f = Fixture::start().await;
    f.enqueue("p1", 3).await;
    let d = f.fetch_one().await;
    assert!(progress(&f, &d.id, &d.token, 50).await.unwrap());
    assert!(!progress(&f, &d.id, "stale-token", 90).await.unwrap());
    let job = f.keys.job("p1");
    assert_eq!(
        f.cmd(&["HMGET", &job, "progress", "progress_message"])
            .await,
        Value::Array(vec![
            Value::BulkString(b"50".to_vec()),
            Value::BulkString(b"half way".to_vec()),
        ])
    );
    assert!(
        progress(&f, &d.id, &d.token, u64::MAX).await.is_err(),
        "not a count Lua holds exactly: refused"
    );
    let mut conn = f.conn.clone();
    let items = [super::ack::AckItem::of(&d, None)];
    super::ack::Ack {
        keys: &f.keys,
        worker: "",
        items: &items,
        retention: Duration::from_secs(60),
        compact: false,
    }
    .run(&mut conn)
    .await
    .unwrap();
    assert!(!progress(&f, &d.id, &d.token, 100).await.unwrap());
    assert_eq!(
        f.cmd(&["EXISTS", &job]).await,
        Value::Int(0),
        "not recreated"
    );
}

/// A job past its start deadline is dead-lettered `expired` by the claim,
/// never claimed; a corrupt deadline field is dead-lettered naming it.
#[tokio::test]
async fn a_claim_past_the_deadline_dead_letters_the_job_as_expired() {
    let mut f = Fixture::start().await;
    let keys = f.keys.clone();
    for (id, field, value) in [
        ("gone", "expires_at", "1"),
        ("now", "expires_after", "0"),
        ("later", "expires_after", "600000"),
        ("bad", "expires_at", "1"),
    ] {
        f.enqueue_extra(id, 3, &[(field.to_string(), value.to_string())])
            .await;
    }
    // Enqueue refuses a deadline that is no count: a hand edit (or an older
    // producer) stores one.
    f.cmd(&["HSET", &keys.job("bad"), "expires_at", "soon"])
        .await;
    let rows = f.fetch(4, "deadlines").await.unwrap();
    assert_eq!(rows[0], ClaimRow::Skipped("gone".into(), Skip::Expired));
    assert_eq!(rows[1], ClaimRow::Skipped("now".into(), Skip::Expired));
    assert!(matches!(&rows[2], ClaimRow::Claimed(d) if d.id.as_str() == "later"));
    assert!(
        matches!(&rows[3], ClaimRow::Corrupt(id, why) if id.as_str() == "bad" && why.contains("expires_at")),
        "{:?}",
        rows[3]
    );
    let places = f.places("gone").await;
    assert!(
        places.dead && !places.processing && !places.leased,
        "{places:?}"
    );
    let reason = f.cmd(&["HGET", &keys.job("gone"), "dead_reason"]).await;
    assert!(
        matches!(&reason, Value::BulkString(b) if b.starts_with(b"expired")),
        "{reason:?}"
    );
    assert_eq!(
        f.cmd(&["HGET", &keys.stats, "expired"]).await,
        Value::BulkString(b"2".to_vec())
    );
}

/// The batch move (LRANGE + LPUSH + LTRIM) and the one ZADD of a fetch
/// leave what one LMOVE and ZADD per job did: oldest first, processing in
/// LMOVE RIGHT LEFT order, the rest still waiting in main, and every claimed
/// job leased until the `lease_until` of its hash.
#[tokio::test]
async fn a_batch_fetch_moves_oldest_first_and_leases_every_claimed_job() {
    let mut fx = Fixture::start().await;
    for id in ["j1", "j2", "j3", "j4"] {
        fx.enqueue(id, 1).await;
    }
    let rows = fx.fetch(3, "base").await.unwrap();
    let ids: Vec<String> = rows
        .iter()
        .map(|r| match r {
            ClaimRow::Claimed(d) => d.id.to_string(),
            other => panic!("not claimed: {other:?}"),
        })
        .collect();
    assert_eq!(ids, ["j1", "j2", "j3"]);
    let k = fx.keys.clone();
    let list = |v: Value| -> Vec<String> {
        match v {
            Value::Array(items) => items
                .into_iter()
                .map(|i| match i {
                    Value::BulkString(b) => String::from_utf8(b).unwrap(),
                    other => panic!("list item {other:?}"),
                })
                .collect(),
            other => panic!("list {other:?}"),
        }
    };
    assert_eq!(
        list(fx.cmd(&["LRANGE", &k.processing, "0", "-1"]).await),
        ["j3", "j2", "j1"]
    );
    assert_eq!(list(fx.cmd(&["LRANGE", &k.main, "0", "-1"]).await), ["j4"]);
    for id in &ids {
        let Value::BulkString(until) = fx.cmd(&["HGET", &k.job(id), "lease_until"]).await else {
            panic!("lease_until of {id}")
        };
        let Value::BulkString(score) = fx.cmd(&["ZSCORE", &k.leases, id]).await else {
            panic!("no lease for {id}")
        };
        assert_eq!(score, until, "{id}");
    }
    // The last job, then an empty queue: a short batch, then nothing.
    assert_eq!(fx.fetch(3, "more").await.unwrap().len(), 1);
    assert!(fx.fetch(3, "none").await.unwrap().is_empty());
}

/// Main of another type under a fetch with groups: a group's turn could
/// claim a job before main's turn first touched main, and the fetch then
/// failed with that job claimed and delivered to no one (each retry claimed
/// one more). The fetch is now refused before any write.
#[tokio::test]
async fn a_main_of_another_type_refuses_a_grouped_fetch_before_any_write() {
    let mut fx = Fixture::start().await;
    let k = fx.keys.clone();
    let group = [("group".to_string(), "G".to_string())];
    fx.enqueue("m1", 3).await;
    for id in ["g1", "g2"] {
        fx.enqueue_extra(id, 3, &group).await;
    }
    // main's turn takes m1: the ring now gives G the next turn.
    assert!(
        matches!(&fx.fetch(1, "first").await.unwrap()[..], [ClaimRow::Claimed(d)] if d.id.as_str() == "m1")
    );
    fx.cmd(&["SET", &k.main, "x"]).await;
    let err = fx.fetch(2, "second").await.unwrap_err();
    assert!(
        err.to_string().contains("refused before any write"),
        "{err}"
    );
    assert_eq!(fx.job("g1").await["state"], "queued");
    assert_eq!(
        fx.cmd(&["LLEN", &k.group("G")]).await,
        Value::Int(2),
        "both group jobs still wait"
    );
}

/// A due grouped job whose group list holds another type: promote used to
/// fail on it after earlier jobs moved, on every pass (the whole delayed set
/// stuck). It is dead-lettered with the reason, and the others are promoted.
#[tokio::test]
async fn promote_dead_letters_a_job_whose_group_list_is_corrupt_and_goes_on() {
    let mut fx = Fixture::start().await;
    let k = fx.keys.clone();
    fx.enqueue("p1", 3).await;
    fx.enqueue_extra("g1", 3, &[("group".to_string(), "G".to_string())])
        .await;
    for row in fx.fetch(2, "both").await.unwrap() {
        let ClaimRow::Claimed(d) = row else {
            panic!("claimed expected: {row:?}")
        };
        fx.fail(&d, FailKind::Retry).await.unwrap();
    }
    fx.cmd(&["SET", &k.group("G"), "x"]).await;
    fx.promote().await.unwrap();
    assert_eq!(fx.places("p1").await, Places::main_only());
    assert_eq!(fx.places("g1").await, Places::dead_only());
    let reason = fx.job("g1").await["dead_reason"].clone();
    assert!(reason.contains("cannot wait in its group"), "{reason}");
}

/// A delayed set of another type: promote is refused before any write with
/// the key named (it used to be a bare WRONGTYPE from its first read, which
/// named nothing).
#[tokio::test]
async fn promote_names_a_delayed_key_of_another_type() {
    let mut fx = Fixture::start().await;
    let k = fx.keys.clone();
    fx.cmd(&["SET", &k.delayed, "x"]).await;
    let err = fx.promote().await.unwrap_err().to_string();
    assert!(err.contains(&k.delayed), "{err}");
    assert!(err.contains("refused before any write"), "{err}");
}

/// Stale delayed entries of jobs that are elsewhere: an active job (its
/// delivery runs), a queued job (waiting in main) and a dead one. Each
/// entry is dropped, answered with the job's state, and the job is left
/// where it is. Before, each was pushed on main and set `queued`: the
/// active job ran twice, the queued one was listed twice, the dead one ran
/// while it was listed dead. A retried job (state `delayed`) still moves.
#[tokio::test]
async fn promote_drops_the_delayed_entry_of_a_job_in_another_state() {
    let mut fx = Fixture::start().await;
    let k = fx.keys.clone();
    for id in ["active", "dead", "retried"] {
        fx.enqueue(id, 3).await;
        let d = fx.fetch_one().await;
        match id {
            "dead" => drop(fx.fail(&d, FailKind::Permanent).await.unwrap()),
            "retried" => drop(fx.fail(&d, FailKind::Retry).await.unwrap()),
            _ => {}
        }
    }
    fx.enqueue("queued", 3).await;
    for id in ["active", "dead", "queued"] {
        fx.cmd(&["ZADD", &k.delayed, "1", id]).await;
    }
    let reply = fx.promote().await.unwrap();
    assert_eq!(reply.promoted, 1, "only the retried job moves");
    let mut dropped: Vec<(String, String)> = reply
        .dropped
        .iter()
        .map(|(id, state)| (id.to_string(), state.clone()))
        .collect();
    dropped.sort();
    let expected = [("active", "active"), ("dead", "dead"), ("queued", "queued")]
        .map(|(id, state)| (id.to_string(), state.to_string()));
    assert_eq!(dropped, expected);
    let active = Places {
        processing: true,
        leased: true,
        ..Places::default()
    };
    assert_eq!(fx.places("active").await, active);
    assert_eq!(fx.job("active").await["state"], "active");
    assert_eq!(fx.places("dead").await, Places::dead_only());
    assert_eq!(fx.job("dead").await["state"], "dead");
    assert_eq!(fx.places("queued").await, Places::main_only());
    assert_eq!(fx.places("retried").await, Places::main_only());
    let main = fx.cmd(&["LRANGE", &k.main, "0", "-1"]).await;
    let main: Vec<String> = redis::from_redis_value(main).unwrap();
    assert_eq!(main.len(), 2, "each waiting job listed once: {main:?}");
}

/// A delayed entry whose job is not where its state says (a hand edit, an
/// older bug) is not simply dropped: a `queued` job in no list is made
/// waiting, a `dead` job missing from the dead list is put back on it, an
/// `active` job neither in processing nor leased and a state that is no job
/// state are dead-lettered naming why. Before, each was dropped and the job
/// left in no list: lost (found by the fuzz review of stop 42).
#[tokio::test]
async fn promote_never_strands_a_job_whose_state_is_not_delayed() {
    let mut fx = Fixture::start().await;
    let k = fx.keys.clone();
    for (id, state) in [
        ("q", "queued"),
        ("d", "dead"),
        ("a", "active"),
        ("x", "x"),
        ("e", ""),
    ] {
        fx.cmd(&["HSET", &k.job(id), "id", id, "type", "t", "state", state])
            .await;
        fx.cmd(&["HSET", &k.job(id), "attempts", "0", "max_attempts", "3"])
            .await;
        fx.cmd(&["ZADD", &k.delayed, "1", id]).await;
    }
    let reply = fx.promote().await.unwrap();
    assert_eq!(reply.promoted, 4, "{reply:?}");
    assert_eq!(fx.places("q").await, Places::main_only());
    assert_eq!(fx.job("q").await["state"], "queued");
    for id in ["d", "a", "x", "e"] {
        assert_eq!(fx.places(id).await, Places::dead_only(), "{id}");
    }
    let reason = |h: HashMap<String, String>| h.get("dead_reason").cloned().unwrap_or_default();
    assert!(reason(fx.job("a").await).contains("neither in processing nor leased"));
    assert!(reason(fx.job("x").await).contains("corrupt field state: 'x'"));
    assert!(reason(fx.job("e").await).contains("corrupt field state"));
    assert_eq!(
        reply
            .dropped
            .iter()
            .map(|(id, s)| (id.as_str(), s.as_str()))
            .collect::<Vec<_>>(),
        [("d", "dead")],
        "the dead job is dropped from delayed and relisted"
    );
}

/// Stale delayed entries (the job's state says it is elsewhere) over long
/// lists: a promote call walks a list whole at most `STALE_WALKS` (4) times
/// (`MONITOR` shows the script's `LPOS` calls), where each lookup walked
/// the whole of main, processing or dead before (a pass over many stale
/// entries blocked Redis for seconds); the entry needing a fifth walk waits
/// for the next call, which finishes it. No job is listed twice or left in
/// none: `q-head` waits at the far end of main (not pushed again),
/// `q-nowhere` is in no list (made waiting), `a-head` is taken at the far
/// end of processing (not dead-lettered), `d-head` is at the dead list's
/// head (found there without a walk, where dead letters are pushed: not
/// relisted) and `d-gone` missing from it (relisted).
#[tokio::test]
async fn promote_walks_long_lists_for_stale_entries_a_bounded_number_of_times() {
    let mut fx = Fixture::start().await;
    let k = fx.keys.clone();
    fx.fill_lists(&[
        (&k.main, "waiting"),
        (&k.processing, "running"),
        (&k.dead, "buried"),
    ])
    .await;
    // Promoted in score order: q-head (one walk), q-nowhere (two), a-head
    // (one), d-head (none: 1,000 entries from the head), then d-gone (one)
    // in the next call.
    for (score, id, state) in [
        ("1", "q-head", "queued"),
        ("2", "q-nowhere", "queued"),
        ("3", "a-head", "active"),
        ("4", "d-head", "dead"),
        ("5", "d-gone", "dead"),
    ] {
        fx.cmd(&["HSET", &k.job(id), "id", id, "type", "t", "state", state])
            .await;
        fx.cmd(&["HSET", &k.job(id), "attempts", "0", "max_attempts", "3"])
            .await;
        fx.cmd(&["ZADD", &k.delayed, score, id]).await;
    }
    fx.cmd(&["LPUSH", &k.main, "q-head"]).await;
    fx.cmd(&["LPUSH", &k.processing, "a-head"]).await;
    fx.cmd(&["LPUSH", &k.dead, "d-head"]).await;

    let mut conn = fx.conn.clone();
    let mut left = Vec::new();
    for _ in 0..2 {
        let mut c = conn.clone();
        let calls = super::script_commands(&fx.server.url(), &mut conn, async {
            Promote {
                keys: &k,
                limit: 100,
            }
            .run(&mut c)
            .await
            .unwrap();
        })
        .await;
        let walks = whole_walks(&calls);
        assert!(walks <= 4, "{walks} whole walks in one call: {calls:?}");
        match fx.cmd(&["ZCARD", &k.delayed]).await {
            Value::Int(n) => left.push(n),
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(
        left,
        [1, 0],
        "the entry needing a fifth walk waits for the next call"
    );
    for (list, id, listed) in [
        (&k.main, "q-head", 1),
        (&k.main, "q-nowhere", 1),
        (&k.main, "a-head", 0),
        (&k.dead, "a-head", 0),
        (&k.dead, "d-head", 1),
        (&k.dead, "d-gone", 1),
    ] {
        let Value::Array(at) = fx.cmd(&["LPOS", list, id, "COUNT", "0"]).await else {
            panic!("LPOS COUNT answers an array");
        };
        assert_eq!(at.len(), listed, "{id}: entries in {list}");
    }
}

/// A delayed entry whose job completed (its hash gone, its completion
/// record kept) is dropped, not dead-lettered as "job hash missing"; one
/// whose hash is gone with no record still is.
#[tokio::test]
async fn promote_drops_the_delayed_entry_of_a_completed_job() {
    let mut fx = Fixture::start().await;
    let k = fx.keys.clone();
    fx.cmd(&["HSET", &k.done("done"), "status", "completed"])
        .await;
    fx.cmd(&["SET", &k.done("compact"), "packed-record"]).await;
    for id in ["done", "compact", "gone"] {
        fx.cmd(&["ZADD", &k.delayed, "1", id]).await;
    }
    let reply = fx.promote().await.unwrap();
    assert_eq!(reply.promoted, 1, "the job with no record is dead-lettered");
    let mut dropped: Vec<String> = reply
        .dropped
        .iter()
        .map(|(id, state)| format!("{id}:{state}"))
        .collect();
    dropped.sort();
    assert_eq!(dropped, ["compact:completed", "done:completed"]);
    for id in ["done", "compact"] {
        assert_eq!(fx.places(id).await, Places::default(), "{id}");
        assert!(fx.job(id).await.is_empty(), "{id}: no hash written");
    }
    assert_eq!(fx.places("gone").await, Places::dead_only());
    let reason = fx.job("gone").await["dead_reason"].clone();
    assert!(reason.contains("job hash missing"), "{reason}");
}

/// A dead entry whose job key holds another type stopped the trim half-way
/// (after the entries before it were popped) on every pass: the dead list
/// grew without bound. It is unlisted (the key is left alone) and the trim
/// goes on.
#[tokio::test]
async fn dead_trim_unlists_an_entry_whose_job_key_is_another_type() {
    let mut fx = Fixture::start().await;
    let k = fx.keys.clone();
    fx.enqueue("j1", 1).await;
    let d = fx.fetch_one().await;
    fx.fail(&d, FailKind::Permanent).await.unwrap();
    fx.cmd(&["LPUSH", &k.dead, "bad"]).await;
    fx.cmd(&["SET", &k.job("bad"), "x"]).await;
    tokio::time::sleep(Duration::from_millis(5)).await;
    let reply = trim_expired(&k, &mut fx.conn.clone()).await;
    // `j1` deleted, `bad` unlisted.
    assert_eq!((reply.trimmed, reply.unlisted, reply.remaining), (1, 1, 0));
    assert_eq!(
        fx.cmd(&["TYPE", &k.job("bad")]).await,
        Value::SimpleString("string".into())
    );
}

/// Expired dead entries whose hashes say another state (stale: a hand edit,
/// an older bug). Each is unlisted and its job left where it is when it is
/// there (`q-waiting`, in main); otherwise it is put where its state says,
/// as promote and reclaim do with their stale entries: a `queued` job in no
/// list is made waiting, a `delayed` one goes back to the delayed set, an
/// `active` one neither in processing nor leased is dead-lettered again,
/// naming why. Before, each was unlisted and left in no list: lost.
#[tokio::test]
async fn dead_trim_never_strands_a_job_whose_state_is_not_dead() {
    let mut fx = Fixture::start().await;
    let k = fx.keys.clone();
    for (id, state) in [
        ("q-lost", "queued"),
        ("q-waiting", "queued"),
        ("d-lost", "delayed"),
        ("a-lost", "active"),
    ] {
        let job = k.job(id);
        fx.cmd(&["HSET", &job, "id", id, "state", state, "dead_at", "1"])
            .await;
        fx.cmd(&["HSET", &job, "run_at", "4000000000000"]).await;
        fx.cmd(&["LPUSH", &k.dead, id]).await;
    }
    fx.cmd(&["LPUSH", &k.main, "q-waiting"]).await;
    let reply = trim_expired(&k, &mut fx.conn.clone()).await;
    // Nothing deleted: four stale entries unlisted (`a-lost` listed again).
    assert_eq!((reply.trimmed, reply.unlisted, reply.remaining), (0, 4, 1));
    let mut places = Vec::new();
    for id in ["q-lost", "q-waiting", "d-lost", "a-lost"] {
        places.push((id, fx.places(id).await, fx.job(id).await["state"].clone()));
    }
    assert_eq!(
        places,
        [
            ("q-lost", Places::main_only(), "queued".to_string()),
            ("q-waiting", Places::main_only(), "queued".to_string()),
            ("d-lost", Places::delayed_only(), "delayed".to_string()),
            ("a-lost", Places::dead_only(), "dead".to_string()),
        ]
    );
    let reason = &fx.job("a-lost").await["dead_reason"];
    assert!(
        reason.contains("neither in processing nor leased"),
        "{reason}"
    );
}

/// Stale dead entries (state `queued` or `active`) over a main and a
/// processing list each longer than the trim's first search (1,000 entries
/// from the tail). A call walks a list whole at most `STALE_WALKS` (4)
/// times (`MONITOR` shows the script's `LPOS` calls): where each lookup
/// walked the whole list before (500 of them over a main of 200,500: 1.5 s
/// of blocked Redis in one call). The entry that needs a fifth walk waits
/// for the next call, which finishes it. No job is listed twice or left in
/// none: `q-head`, waiting at the far end of main, is not pushed again;
/// `q-nowhere` and `q-nowhere-2`, in no list, are made waiting; `a-head`,
/// taken at the far end of processing, is not dead-lettered again.
#[tokio::test]
async fn dead_trim_walks_long_lists_for_stale_entries_a_bounded_number_of_times() {
    let mut fx = Fixture::start().await;
    let k = fx.keys.clone();
    fx.fill_lists(&[(&k.main, "waiting"), (&k.processing, "running")])
        .await;
    // Trimmed from the tail: in this order.
    for (id, state) in [
        ("q-head", "queued"),
        ("q-tail", "queued"),
        ("q-nowhere", "queued"),
        ("a-head", "active"),
        ("q-nowhere-2", "queued"),
    ] {
        fx.cmd(&["HSET", &k.job(id), "id", id, "state", state, "dead_at", "1"])
            .await;
        fx.cmd(&["LPUSH", &k.dead, id]).await;
    }
    fx.cmd(&["LPUSH", &k.main, "q-head"]).await;
    fx.cmd(&["RPUSH", &k.main, "q-tail"]).await;
    fx.cmd(&["LPUSH", &k.processing, "a-head"]).await;

    let mut conn = fx.conn.clone();
    let mut replies = Vec::new();
    for _ in 0..2 {
        let mut c = conn.clone();
        let calls = super::script_commands(&fx.server.url(), &mut conn, async {
            let r = trim_expired(&k, &mut c).await;
            replies.push((r.trimmed, r.unlisted, r.remaining));
        })
        .await;
        let walks = whole_walks(&calls);
        assert!(walks <= 4, "{walks} whole walks in one call: {calls:?}");
    }
    assert_eq!(
        replies,
        [(0, 4, 1), (0, 1, 0)],
        "the entry needing a fifth walk waits for the next call"
    );
    for (id, listed) in [
        ("q-head", 1),
        ("q-tail", 1),
        ("q-nowhere", 1),
        ("q-nowhere-2", 1),
        ("a-head", 0),
    ] {
        let Value::Array(at) = fx.cmd(&["LPOS", &k.main, id, "COUNT", "0"]).await else {
            panic!("LPOS COUNT answers an array");
        };
        assert_eq!(at.len(), listed, "{id}: entries in main");
    }
    let places = fx.places("a-head").await;
    assert_eq!(
        places,
        Places {
            processing: true,
            ..Places::default()
        }
    );
    assert_eq!(fx.job("a-head").await["state"], "active");
    assert_eq!(fx.job("q-head").await["state"], "queued");
}

/// A cancel or a finished cancel with a list of another type (leases,
/// processing) is refused before any write: no record without the job's
/// removal from its lists.
#[tokio::test]
async fn a_cancel_with_a_queue_key_of_another_type_is_refused_before_any_write() {
    let mut fx = Fixture::start().await;
    let k = fx.keys.clone();
    fx.enqueue("j1", 3).await;
    fx.cmd(&["SET", &k.leases, "x"]).await;
    let err = super::cancel::Cancel {
        keys: &k,
        id: &JobId::from("j1"),
        retention: Duration::from_secs(60),
    }
    .run(&mut fx.conn.clone())
    .await
    .unwrap_err();
    assert!(
        err.to_string().contains("refused before any write"),
        "{err}"
    );
    assert_eq!(fx.cmd(&["EXISTS", &k.done("j1")]).await, Value::Int(0));
    assert_eq!(fx.cmd(&["LLEN", &k.main]).await, Value::Int(1));

    fx.cmd(&["DEL", &k.leases]).await;
    let d = fx.fetch_one().await;
    fx.cmd(&["DEL", &k.processing]).await;
    fx.cmd(&["SET", &k.processing, "x"]).await;
    let err = super::finish_cancel::FinishCancel {
        keys: &k,
        id: &d.id,
        token: &d.token,
        retention: Duration::from_secs(60),
        message: "cancelled",
        far_from_tail: false,
    }
    .run(&mut fx.conn.clone())
    .await
    .unwrap_err();
    assert!(
        err.to_string().contains("refused before any write"),
        "{err}"
    );
    assert_eq!(fx.cmd(&["EXISTS", &k.done("j1")]).await, Value::Int(0));
    assert_eq!(fx.job("j1").await["state"], "active");
}

/// A lock whose fencing counter is corrupt: a value that is not a count
/// (or a count's text INCR refuses, such as `007`) is replaced like a
/// missing counter and the lock is taken with a fencing
/// number; a counter key of another type refuses the call before the lock
/// is taken. Before, both failed after the lock's SET: the lock stayed held
/// by a caller that saw an error, for its whole ttl.
#[tokio::test]
async fn a_corrupt_fencing_counter_never_leaves_a_lock_held_by_a_failed_call() {
    use super::lock_acquire::{LockAcquire, LockAcquireReply};
    let mut fx = Fixture::start().await;
    let keys = crate::keys::LockKeys::new("hardening");
    fx.cmd(&["SET", &keys.fence, "not a number"]).await;
    let acquire = LockAcquire {
        keys: &keys,
        token: "owner-1",
        ttl: Duration::from_secs(30),
    };
    let reply = acquire.run(&mut fx.conn.clone()).await.unwrap();
    assert!(
        matches!(reply, LockAcquireReply::Acquired { fencing } if fencing > 1),
        "{reply:?}"
    );
    // Digits that INCR refuses (a leading zero): replaced the same way.
    for corrupt in ["007", "00"] {
        fx.cmd(&["DEL", &keys.lock]).await;
        fx.cmd(&["SET", &keys.fence, corrupt]).await;
        let reply = acquire.run(&mut fx.conn.clone()).await;
        assert!(
            matches!(reply, Ok(LockAcquireReply::Acquired { fencing }) if fencing > 1),
            "{corrupt}: {reply:?}"
        );
    }
    fx.cmd(&["DEL", &keys.lock, &keys.fence]).await;
    fx.cmd(&["RPUSH", &keys.fence, "x"]).await;
    assert!(acquire.run(&mut fx.conn.clone()).await.is_err());
    assert_eq!(
        fx.cmd(&["EXISTS", &keys.lock]).await,
        Value::Int(0),
        "the lock is free"
    );
}

/// Replay of a dead grouped job when the ring holds another type: refused
/// before any write. Before, the id was pushed on its group's list while it
/// was still dead-lettered, and a retried replay pushed it twice.
#[tokio::test]
async fn a_replay_into_a_corrupt_group_is_refused_before_any_write() {
    let mut fx = Fixture::start().await;
    let k = fx.keys.clone();
    fx.enqueue_extra("g1", 1, &[("group".to_string(), "G".to_string())])
        .await;
    let d = fx.fetch_one().await;
    fx.fail(&d, FailKind::Permanent).await.unwrap();
    fx.cmd(&["DEL", &k.groups()]).await;
    fx.cmd(&["SET", &k.groups(), "x"]).await;
    let replay = Replay {
        keys: &k,
        id: &d.id,
        reset_attempts: true,
    };
    assert!(replay.run(&mut fx.conn.clone()).await.is_err());
    assert_eq!(fx.cmd(&["EXISTS", &k.group("G")]).await, Value::Int(0));
    assert_eq!(fx.job("g1").await["state"], "dead");
}

/// A completion record key of a third type (corrupt data: records are
/// hashes or compact strings) is not a record. A fetch used to take the job
/// for done and delete it without running it; it is dead-lettered naming the
/// key. An enqueue of that id used to answer "done"; it is refused.
#[tokio::test]
async fn a_record_key_of_a_third_type_never_makes_a_job_done() {
    let mut fx = Fixture::start().await;
    let k = fx.keys.clone();
    fx.enqueue("j1", 3).await;
    fx.cmd(&["RPUSH", &k.done("j1"), "x"]).await;
    let rows = fx.fetch(1, "base").await.unwrap();
    assert!(
        matches!(&rows[..], [ClaimRow::Corrupt(id, why)] if id.as_str() == "j1" && why.contains("completion record key holds a list")),
        "{rows:?}"
    );
    assert_eq!(fx.places("j1").await, Places::dead_only());
    let again = Enqueue::test_job(&k, &JobId::from("j1"), 3)
        .run(&mut fx.conn.clone())
        .await;
    assert!(again.is_err(), "{again:?}");
}

/// A replay starts a new life: what an operator asked of the old one
/// (`cancel_requested`) and the version wait of the old one (`newer_since`)
/// are dropped. Before, a job cancelled while running, whose worker then died
/// (reclaim dead-lettered it keeping the request), was told to cancel at the
/// first heartbeat after its replay, and any error ended it `cancelled`: the
/// replay silently undone.
#[tokio::test]
async fn a_replayed_job_forgets_the_cancel_requested_of_its_earlier_life() {
    use super::extend::{Extend, ExtendReply};
    let mut fx = Fixture::start().await;
    let k = fx.keys.clone();
    fx.enqueue("c1", 1).await;
    let d = fx.fetch_one().await;
    let cancel = super::cancel::Cancel {
        keys: &k,
        id: &d.id,
        retention: Duration::from_secs(60),
    };
    let outcome = cancel.run(&mut fx.conn.clone()).await.unwrap();
    assert_eq!(outcome, crate::CancelOutcome::Requested { first: true });
    // The worker dies: its lease expires and the watchdog dead-letters it
    // (1 attempt of 1), keeping the request on the hash.
    fx.cmd(&["ZADD", &k.leases, "0", "c1"]).await;
    assert_eq!(fx.reclaim().await.unwrap().dead_lettered, 1);
    assert!(fx.job("c1").await.contains_key("cancel_requested"));
    let replay = Replay {
        keys: &k,
        id: &d.id,
        reset_attempts: true,
    };
    assert_eq!(
        replay.run(&mut fx.conn.clone()).await.unwrap(),
        ReplayReply::Replayed
    );
    assert!(!fx.job("c1").await.contains_key("cancel_requested"));
    let d2 = fx.fetch_one().await;
    let extend = Extend {
        keys: &k,
        id: &d2.id,
        token: &d2.token,
        lease: LEASE,
    };
    let beat = extend.run(&mut fx.conn.clone()).await.unwrap();
    assert!(
        matches!(
            beat,
            ExtendReply::Extended {
                cancel_requested: false,
                ..
            }
        ),
        "{beat:?}"
    );
    let failed = fx.fail(&d2, FailKind::Permanent).await.unwrap();
    assert!(matches!(failed, FailReply::Dead { .. }), "{failed:?}");
}

/// A job given back for its payload version (the wait for a worker that
/// announces it began long ago), then run by a worker that has the version
/// (it failed, retryably), then taken again by an older worker: the wait
/// starts again, the job is given back. Before, the `newer_since` of the
/// first give-back survived the run in between: the older worker
/// dead-lettered the job at once, without a fresh wait.
#[tokio::test]
async fn a_give_back_after_the_job_ran_in_between_waits_afresh() {
    let mut fx = Fixture::start().await;
    let k = fx.keys.clone();
    fx.enqueue("v2", 5).await;
    let wait = Duration::from_secs(3600);
    let d = fx.fetch_one().await;
    assert!(matches!(fx.defer(&d, wait).await, FailReply::Retry { .. }));
    // The wait began two hours ago.
    fx.cmd(&["HSET", &k.job("v2"), "newer_since", "1"]).await;
    // A worker that has the version runs it; it fails and is retried at once.
    let ran = fx.redeliver_after(&d).await;
    assert_eq!(ran.attempt, 1);
    let retry = fx.fail(&ran, FailKind::Retry).await.unwrap();
    assert!(matches!(retry, FailReply::Retry { .. }), "{retry:?}");
    // An older worker takes it next.
    let d = fx.redeliver_after(&ran).await;
    assert_eq!(d.attempt, 2);
    let again = fx.defer(&d, wait).await;
    assert!(matches!(again, FailReply::Retry { .. }), "{again:?}");
    let job = fx.job("v2").await;
    let since: i64 = job["newer_since"].parse().unwrap();
    assert!(since > 1, "the wait starts again: {job:?}");
    assert_eq!(job["attempts"], "1", "the run's attempt stays counted");
}

/// Give-backs of one job, while a worker that has its version is announced
/// (busy elsewhere), are spaced twice as far apart each time, from the
/// configured delay up to a minute: a job the workers taking it cannot run
/// does not cycle through main every delay. Before, every give-back waited
/// the same delay.
#[tokio::test]
async fn give_backs_of_a_job_are_spaced_twice_as_far_each_time() {
    let mut fx = Fixture::start().await;
    let k = fx.keys.clone();
    fx.enqueue("v2", 5).await;
    let until = fx.redis_now_ms().await + 3_600_000;
    fx.cmd(&["HSET", &k.versions(), "t:2", &until.to_string()])
        .await;
    let delay = Duration::from_secs(10);
    let mut waits = Vec::new();
    let mut d = fx.fetch_one().await;
    for _ in 0..5 {
        let before = fx.redis_now_ms().await;
        let reply = super::defer::Defer {
            delay,
            wait: Duration::ZERO,
            ..super::defer::Defer::test_v2(&k, &d)
        }
        .run(&mut fx.conn)
        .await
        .unwrap();
        let FailReply::Retry { run_at_ms } = reply else {
            panic!("given back while announced: {reply:?}");
        };
        waits.push((run_at_ms - before) / 1000);
        // Due now, so that the next delivery can be fetched.
        fx.cmd(&["ZADD", &k.delayed, "0", "v2"]).await;
        d = fx.redeliver_after(&d).await;
    }
    assert_eq!(
        waits,
        vec![10, 20, 40, 60, 60],
        "seconds to each next offer"
    );
    assert_eq!(
        fx.job("v2").await["attempts"],
        "1",
        "only the delivery in flight counts"
    );
}

/// A job dead-lettered because no worker announced its payload version
/// (`newer_since` long ago) and replayed once the workers are upgraded gets
/// a fresh wait. Before, `newer_since` survived the replay: the first defer
/// (a worker of the old version still running) dead-lettered it at once.
#[tokio::test]
async fn a_replayed_job_waits_afresh_for_its_payload_version() {
    let mut fx = Fixture::start().await;
    let k = fx.keys.clone();
    fx.enqueue("v1", 3).await;
    let run_defer =
        async |fx: &mut Fixture, d: &Delivery| fx.defer(d, Duration::from_secs(3600)).await;
    let d = fx.fetch_one().await;
    assert!(matches!(
        run_defer(&mut fx, &d).await,
        FailReply::Retry { .. }
    ));
    // Two hours pass with no worker announcing t:2.
    fx.cmd(&["HSET", &k.job("v1"), "newer_since", "1"]).await;
    fx.promote().await.unwrap();
    let d = fx.fetch_one().await;
    let dead = run_defer(&mut fx, &d).await;
    assert!(matches!(dead, FailReply::Dead { .. }), "{dead:?}");
    let replay = Replay {
        keys: &k,
        id: &d.id,
        reset_attempts: false,
    };
    assert_eq!(
        replay.run(&mut fx.conn.clone()).await.unwrap(),
        ReplayReply::Replayed
    );
    assert!(!fx.job("v1").await.contains_key("newer_since"));
    let d = fx.fetch_one().await;
    let again = run_defer(&mut fx, &d).await;
    assert!(matches!(again, FailReply::Retry { .. }), "{again:?}");
}

/// A delivery given back for a newer payload version never ran its handler,
/// so it does not start the job's execution deadline: the next delivery that
/// runs is the first start. A job that already ran once (a retried failure)
/// keeps its first start through a later give-back. Before, the deferred
/// delivery's time stayed `first_started_at`: in a rolling deploy a
/// `#[job(deadline = 1m)]` job given back for two minutes was dead-lettered
/// "deadline exceeded" by the upgraded worker without ever running.
#[tokio::test]
async fn a_deferred_delivery_does_not_start_the_execution_deadline() {
    let mut fx = Fixture::start().await;
    fx.enqueue("j1", 3).await;
    let deferred = fx.fetch_one().await;
    assert_eq!(deferred.first_started_at_ms, deferred.delivered_at_ms);
    let wait = Duration::from_secs(60);
    assert!(matches!(
        fx.defer(&deferred, wait).await,
        FailReply::Retry { .. }
    ));
    assert!(!fx.job("j1").await.contains_key("first_started_at"));
    let ran = fx.redeliver_after(&deferred).await;
    assert_eq!(ran.attempt, 1);
    assert_eq!(
        ran.first_started_at_ms, ran.delivered_at_ms,
        "the first start is the delivery that runs, not the deferred one ({})",
        deferred.delivered_at_ms
    );

    // It ran and failed; a later give-back keeps that first start.
    assert!(matches!(
        fx.fail(&ran, FailKind::Retry).await.unwrap(),
        FailReply::Retry { .. }
    ));
    let deferred = fx.redeliver_after(&ran).await;
    assert!(matches!(
        fx.defer(&deferred, wait).await,
        FailReply::Retry { .. }
    ));
    let again = fx.redeliver_after(&deferred).await;
    assert_eq!(again.attempt, 2);
    assert_eq!(again.first_started_at_ms, ran.delivered_at_ms);
}

/// With `newer_version_wait = 0` a job whose version a live worker has
/// announced is still given back (for that worker), never dead-lettered.
/// Before, the announcement reset the wait to 0 ms and `0 < 0` was false:
/// dead-lettered while an upgraded worker was running.
#[tokio::test]
async fn a_zero_wait_gives_the_job_back_while_its_version_is_announced() {
    let mut fx = Fixture::start().await;
    let keys = fx.keys.clone();
    super::announce::Announce {
        keys: &keys,
        fields: &["t:2".to_string()],
        ttl: Duration::from_secs(60),
    }
    .run(&mut fx.conn)
    .await
    .unwrap();
    fx.enqueue("j1", 1).await;
    let d = fx.fetch_one().await;
    let reply = fx.defer(&d, Duration::ZERO).await;
    assert!(matches!(reply, FailReply::Retry { .. }), "{reply:?}");
    assert_eq!(fx.places("j1").await, Places::delayed_only());
    // No live announcement: a zero wait dead-letters at once, as before.
    let versions = fx.keys.versions();
    fx.cmd(&["DEL", &versions]).await;
    let d = fx.redeliver_after(&d).await;
    let reply = fx.defer(&d, Duration::ZERO).await;
    assert!(matches!(reply, FailReply::Dead { .. }), "{reply:?}");
}

/// The snapshot of `keys` through `stats.lua`, reading at most `group_limit`
/// group lists.
async fn stats_of(fx: &Fixture, group_limit: u64) -> Result<super::stats::StatsReply> {
    super::stats::Stats {
        keys: &fx.keys,
        group_limit,
    }
    .run(&mut fx.conn.clone())
    .await
}

/// A group of the ring whose list key holds a string (corrupt data) failed
/// `stats` with WRONGTYPE (the watchdog's `stats` exited 2, a sampler's
/// gauges froze), where a fetch skips such a group. The group is left out
/// of `grouped` and counted as unreadable; the other groups are counted.
#[tokio::test]
async fn stats_leaves_out_a_group_list_of_another_type() {
    let mut fx = Fixture::start().await;
    let k = fx.keys.clone();
    for (id, group) in [("a1", "A"), ("b1", "B"), ("b2", "B")] {
        fx.enqueue_extra(id, 3, &[("group".to_string(), group.to_string())])
            .await;
    }
    fx.enqueue("plain", 3).await;
    fx.cmd(&["DEL", &k.group("A")]).await;
    fx.cmd(&["SET", &k.group("A"), "x"]).await;
    let s = stats_of(&fx, crate::admin::STATS_GROUP_LIMIT)
        .await
        .expect("stats with a corrupt group list");
    assert_eq!(s.main, 1);
    assert_eq!(
        (s.grouped, s.grouped_unreadable, s.grouped_partial),
        (2, 1, false)
    );
    // The public snapshot, as `queue-watchdog stats` and the samplers read it.
    let queue = crate::Queue::from_connection(fx.conn.clone());
    let stats = queue.stats(&k.queue).await.unwrap();
    assert_eq!((stats.grouped, stats.grouped_unreadable), (2, 1));
}

/// Each group read costs `stats` one call (O(groups): 100,000 groups took
/// ~170 ms of Redis per snapshot): a snapshot reads at most its group limit
/// and says when groups were left unread; a limit of 0 reads none.
#[tokio::test]
async fn stats_reads_at_most_its_group_limit_and_says_so() {
    let mut fx = Fixture::start().await;
    for (id, group) in [("a1", "A"), ("b1", "B"), ("c1", "C"), ("c2", "C")] {
        fx.enqueue_extra(id, 3, &[("group".to_string(), group.to_string())])
            .await;
    }
    let all = stats_of(&fx, 3).await.unwrap();
    assert_eq!((all.grouped, all.grouped_partial), (4, false));
    let some = stats_of(&fx, 2).await.unwrap();
    assert!(some.grouped_partial && some.grouped < 4, "{some:?}");
    let none = stats_of(&fx, 0).await.unwrap();
    assert_eq!((none.grouped, none.grouped_partial), (0, true));
    // A paused group (out of the ring once a fetch meets it) is read too.
    let paused = fx.keys.groups_paused();
    fx.cmd(&["HSET", &paused, "D", "1"]).await;
    fx.enqueue_extra("d1", 3, &[("group".to_string(), "D".to_string())])
        .await;
    let with_paused = stats_of(&fx, 4).await.unwrap();
    assert_eq!(
        (with_paused.grouped, with_paused.grouped_partial),
        (5, false)
    );
}

/// `oldest_waiting_ms` read the oldest waiting job's `enqueued_at`: a job
/// enqueued with a delay read as waiting since its enqueue right after it
/// was promoted (a job scheduled a day ahead read as a day old, feeding
/// `queue_oldest_job_age_seconds` and its alert). It counts from the job's
/// due time (`ready_at`, written by promote), which a producer may not set.
#[tokio::test]
async fn oldest_waiting_counts_from_the_due_time_not_the_enqueue() {
    const DELAY: Duration = Duration::from_millis(2_000);
    let mut fx = Fixture::start().await;
    let k = fx.keys.clone();
    let id = JobId::from("later");
    let reply = Enqueue {
        delay: Some(DELAY),
        ..Enqueue::test_job(&k, &id, 3)
    }
    .run(&mut fx.conn.clone())
    .await
    .unwrap();
    let super::enqueue::EnqueueReply::Created { run_at_ms } = reply else {
        panic!("created expected: {reply:?}")
    };
    let start = Instant::now();
    while fx.redis_now_ms().await < run_at_ms {
        assert!(start.elapsed() < Duration::from_secs(30), "Redis clock");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(fx.promote().await.unwrap().promoted, 1);
    let job = fx.job("later").await;
    assert_eq!(job["ready_at"], run_at_ms.to_string(), "{job:?}");
    let queue = crate::Queue::from_connection(fx.conn.clone());
    let stats = queue.stats(&k.queue).await.unwrap();
    let oldest = stats.oldest_waiting_ms.expect("a job waits");
    assert!(
        oldest < DELAY.as_millis() as u64,
        "waiting since its due time, not since its enqueue: {oldest} ms"
    );

    // A replay starts a new wait too.
    let d = fx.fetch_one().await;
    fx.fail(&d, FailKind::Permanent).await.unwrap();
    let replayed = Replay {
        keys: &k,
        id: &id,
        reset_attempts: false,
    }
    .run(&mut fx.conn.clone())
    .await
    .unwrap();
    assert_eq!(replayed, ReplayReply::Replayed);
    let job = fx.job("later").await;
    assert_eq!(job["ready_at"], job["replayed_at"], "{job:?}");
}

/// The ids of the claimed rows of a fetch of up to `count` jobs.
async fn fetched_ids(fx: &mut Fixture, count: usize) -> Vec<String> {
    let base = uuid::Uuid::new_v4().to_string();
    let rows = fx.fetch(count, &base).await.expect("the fetch answers");
    rows.into_iter()
        .map(|row| match row {
            ClaimRow::Claimed(d) => d.id.as_str().to_string(),
            other => panic!("expected a claimed row, got {other:?}"),
        })
        .collect()
}

/// A group pause hash of another type (corrupt data) was read as "not
/// paused" by the grouped enqueue, which created the ring; after that every
/// fetch refused with WRONGTYPE (`fair_state`'s type check of the pause
/// hash), so the ungrouped jobs in main stopped too. The pause hash now reads
/// as no group paused in the fetch as in the enqueue: main and the groups
/// are served. A ring of another type (a grouped enqueue is refused then)
/// made every fetch refuse the same way: main is served, the groups wait.
#[tokio::test]
async fn a_corrupt_group_pause_hash_does_not_stop_main() {
    let mut fx = Fixture::start().await;
    let k = fx.keys.clone();
    let group = [("group".to_string(), "G".to_string())];
    fx.cmd(&["SET", &k.groups_paused(), "x"]).await;
    fx.enqueue("m1", 3).await;
    assert_eq!(fetched_ids(&mut fx, 1).await, ["m1"]);
    // The first grouped enqueue succeeds and creates the ring.
    fx.enqueue_extra("g1", 3, &group).await;
    fx.enqueue("m2", 3).await;
    assert_eq!(fx.cmd(&["EXISTS", &k.groups()]).await, Value::Int(1));
    let mut got = fetched_ids(&mut fx, 4).await;
    got.sort();
    assert_eq!(got, ["g1", "m2"], "main and the group are both served");
    assert_eq!(
        fx.cmd(&["GET", &k.groups_paused()]).await,
        Value::BulkString(b"x".to_vec()),
        "the corrupt key is left for the operator"
    );

    // A ring of another type: main is served, the group's job waits.
    fx.cmd(&["DEL", &k.groups_paused()]).await;
    fx.enqueue_extra("g2", 3, &group).await;
    fx.cmd(&["DEL", &k.groups()]).await;
    fx.cmd(&["SET", &k.groups(), "x"]).await;
    fx.enqueue("m3", 3).await;
    assert_eq!(fetched_ids(&mut fx, 4).await, ["m3"]);
    assert_eq!(fx.job("g2").await["state"], "queued");
    assert_eq!(fx.cmd(&["LLEN", &k.group("G")]).await, Value::Int(1));
    assert!(fetched_ids(&mut fx, 4).await.is_empty());
}

/// `stats` left a ring or pause hash of another type out silently: its
/// groups' jobs were neither counted nor said unreadable. Each is counted
/// in `grouped_unreadable` (with a warning in the Redis log), and the
/// groups the other key lists are still counted.
#[tokio::test]
async fn stats_counts_a_corrupt_group_ring_or_pause_hash_as_unreadable() {
    let mut fx = Fixture::start().await;
    let k = fx.keys.clone();
    for (id, group) in [("a1", "A"), ("b1", "B")] {
        fx.enqueue_extra(id, 3, &[("group".to_string(), group.to_string())])
            .await;
    }
    fx.cmd(&["SET", &k.groups_paused(), "x"]).await;
    let s = stats_of(&fx, crate::admin::STATS_GROUP_LIMIT)
        .await
        .expect("stats with a corrupt pause hash");
    assert_eq!((s.grouped, s.grouped_unreadable), (2, 1));
    fx.cmd(&["DEL", &k.groups_paused()]).await;
    fx.cmd(&["HSET", &k.groups_paused(), "B", "1"]).await;
    fx.cmd(&["DEL", &k.groups()]).await;
    fx.cmd(&["SET", &k.groups(), "x"]).await;
    let s = stats_of(&fx, crate::admin::STATS_GROUP_LIMIT)
        .await
        .unwrap();
    assert_eq!(
        (s.grouped, s.grouped_unreadable),
        (1, 1),
        "B (paused) counted, the ring unreadable"
    );
}

/// `Queue::groups` failed whole on one corrupt group key: an `LLEN` of a
/// group list of another type failed the pipeline (WRONGTYPE), a pause time
/// that is not an integer failed the decoding. The others are listed, that
/// one marked `unreadable`; pause times are read leniently; a ring or pause
/// hash of another type is said, not an error; the limit is said.
#[tokio::test]
async fn groups_lists_the_others_and_marks_a_group_of_another_type() {
    let mut fx = Fixture::start().await;
    let k = fx.keys.clone();
    fx.cmd(&["HSET", &k.groups_paused(), "P", "not a time"])
        .await;
    for (id, group) in [
        ("a1", "A"),
        ("b1", "B"),
        ("b2", "B"),
        ("c1", "C"),
        ("p1", "P"),
    ] {
        fx.enqueue_extra(id, 3, &[("group".to_string(), group.to_string())])
            .await;
    }
    fx.cmd(&["HSET", &k.groups_paused(), "B", "1500.7"]).await;
    fx.cmd(&["DEL", &k.group("A")]).await;
    fx.cmd(&["SET", &k.group("A"), "x"]).await;
    let queue = crate::Queue::from_connection(fx.conn.clone());
    let groups = queue.groups(&k.queue).await.expect("no WRONGTYPE");
    let got: Vec<(&str, u64, Option<i64>, bool)> = groups
        .iter()
        .map(|g| (g.group.as_str(), g.waiting, g.paused_since_ms, g.unreadable))
        .collect();
    assert_eq!(
        got,
        [
            ("A", 0, None, true),
            ("B", 2, Some(1500), false),
            ("C", 1, None, false),
            ("P", 1, Some(0), false),
        ]
    );
    let some = queue.groups_with_limit(&k.queue, 2).await.unwrap();
    assert!(some.partial, "{some:?}");
    assert_eq!(some.groups.len(), 2, "{some:?}");
    let all = queue.groups_with_limit(&k.queue, 4).await.unwrap();
    assert!(!all.partial && all.groups.len() == 4, "{all:?}");
    // A group with two entries in the ring for a while (docs/GROUPS.md) is
    // listed once, and the listing is whole (it read as "more groups than
    // listed").
    fx.cmd(&["RPUSH", &k.groups(), "C"]).await;
    let twice = queue.groups_with_limit(&k.queue, 4).await.unwrap();
    assert!(!twice.partial && twice.groups.len() == 4, "{twice:?}");
    // A ring of another type: its groups are not listed, the paused ones are.
    fx.cmd(&["DEL", &k.groups()]).await;
    fx.cmd(&["SET", &k.groups(), "x"]).await;
    let listing = queue.groups_with_limit(&k.queue, 100).await.unwrap();
    assert!(listing.ring_unreadable && !listing.paused_unreadable);
    let names: Vec<&str> = listing.groups.iter().map(|g| g.group.as_str()).collect();
    assert_eq!(names, ["B", "P"]);
    // A pause hash of another type too: nothing listed, both said.
    fx.cmd(&["DEL", &k.groups_paused()]).await;
    fx.cmd(&["SET", &k.groups_paused(), "x"]).await;
    let listing = queue.groups_with_limit(&k.queue, 100).await.unwrap();
    assert!(listing.ring_unreadable && listing.paused_unreadable && listing.groups.is_empty());
    assert!(queue.groups(&k.queue).await.unwrap().is_empty());
}

/// A corrupt `attempts` of multi-byte characters ("a" then 40 × "é": its
/// 64-byte cut falls inside an "é") dead-letters the job with a reason cut
/// at a character boundary: the history entry and the reason are valid
/// UTF-8, and `Admin::job_history` / `job_detail` read them. Before, the cut
/// split the character, cjson wrote the broken bytes into `hist:<id>`, and
/// the history failed to read ("Cannot convert from UTF-8"): `jobs show`
/// exited 2.
#[tokio::test]
async fn a_corrupt_field_of_multibyte_characters_leaves_a_readable_history() {
    let mut fx = Fixture::start().await;
    fx.enqueue("j2", 3).await;
    let attempts = format!("a{}", "é".repeat(40));
    fx.cmd(&["HSET", &fx.keys.job("j2"), "attempts", &attempts])
        .await;
    let rows = fx.fetch(1, "b").await.unwrap();
    assert!(
        matches!(&rows[..], [ClaimRow::Corrupt(id, _)] if id.as_str() == "j2"),
        "{rows:?}"
    );
    // What the scripts stored: valid UTF-8.
    let raw_reason = fx.cmd(&["HGET", &fx.keys.job("j2"), "dead_reason"]).await;
    let Value::BulkString(reason) = raw_reason else {
        panic!("a dead reason: {raw_reason:?}")
    };
    let reason = String::from_utf8(reason).expect("the stored reason is UTF-8");
    assert!(
        reason.starts_with("corrupt field attempts: 'aéé"),
        "{reason}"
    );
    let hist = fx.keys.hist("j2");
    let Value::Array(entries) = fx.cmd(&["LRANGE", &hist, "0", "-1"]).await else {
        panic!("history entries")
    };
    assert!(!entries.is_empty());
    for e in entries {
        let Value::BulkString(b) = e else {
            panic!("{e:?}")
        };
        String::from_utf8(b).expect("every history entry is UTF-8");
    }
    // What the operator reads.
    let admin = crate::admin::Admin::connect(&fx.server.url())
        .await
        .unwrap();
    let history = admin.job_history("hardening", "j2").await.unwrap();
    let dead = history
        .iter()
        .find(|e| e.kind == crate::EventKind::DeadLettered)
        .expect("a dead entry");
    let detail = dead.detail.as_deref().unwrap_or_default();
    assert!(detail.starts_with("corrupt field attempts"), "{detail}");
    assert!(!detail.contains('\u{fffd}'), "cut at a boundary: {detail}");
    admin
        .job_detail("hardening", "j2")
        .await
        .unwrap()
        .expect("the job");
}

/// A history entry that is not UTF-8 (written by an older version, or by
/// another writer) is read lossily: the rest of the history is not lost.
#[tokio::test]
async fn a_history_entry_that_is_not_utf8_is_read_lossily() {
    let mut fx = Fixture::start().await;
    fx.enqueue("j3", 3).await;
    let hist = fx.keys.hist("j3");
    let mut entry = br#"{"e":"dead","t":5,"a":1,"d":"corrupt field attempts: 'a"#.to_vec();
    entry.extend_from_slice(&"é".as_bytes()[..1]);
    entry.extend_from_slice(br#"'"}"#);
    let _: () = redis::cmd("RPUSH")
        .arg(&hist)
        .arg(entry)
        .query_async(&mut fx.conn)
        .await
        .unwrap();
    let admin = crate::admin::Admin::connect(&fx.server.url())
        .await
        .unwrap();
    let history = admin.job_history("hardening", "j3").await.unwrap();
    assert!(
        history
            .iter()
            .any(|e| e.kind == crate::EventKind::DeadLettered
                && e.detail
                    .as_deref()
                    .is_some_and(|d| d.starts_with("corrupt field attempts"))),
        "{history:?}"
    );
}

/// `progress.lua` keeps at most 1,024 bytes of the message, cut at a
/// character boundary (the stored message is valid UTF-8). Before, the cut
/// could split a multi-byte character.
#[tokio::test]
async fn a_long_progress_message_is_cut_at_a_character_boundary() {
    let mut f = Fixture::start().await;
    f.enqueue("p2", 3).await;
    let d = f.fetch_one().await;
    // "a" then "é"s: byte 1,024 is the first byte of an "é".
    let message = format!("a{}", "é".repeat(600));
    let stored = super::progress::Progress {
        keys: &f.keys,
        id: &d.id,
        token: &d.token,
        done: 1,
        message: &message,
    }
    .run(&mut f.conn.clone())
    .await
    .unwrap();
    assert!(stored);
    let Value::BulkString(b) = f
        .cmd(&["HGET", &f.keys.job("p2"), "progress_message"])
        .await
    else {
        panic!("a progress message")
    };
    let text = String::from_utf8(b).expect("the stored message is UTF-8");
    assert_eq!(
        text.len(),
        1023,
        "the last whole character within 1,024 bytes"
    );
    assert!(message.starts_with(&text));
}

impl Fixture {
    /// A stale processing entry of `id` whose provisional lease has expired
    /// (as after the watchdog adopted it and the orphan grace passed).
    async fn stale_entry(&mut self, id: &str) {
        let k = self.keys.clone();
        self.cmd(&["RPUSH", &k.processing, id]).await;
        self.cmd(&["ZADD", &k.leases, "1", id]).await;
    }

    /// The score of `id` in the delayed set.
    async fn delayed_at(&mut self, id: &str) -> Option<String> {
        let k = self.keys.clone();
        match self.cmd(&["ZSCORE", &k.delayed, id]).await {
            Value::BulkString(b) => Some(String::from_utf8(b).unwrap()),
            Value::Nil => None,
            other => panic!("ZSCORE: {other:?}"),
        }
    }
}

/// Stale processing entries of jobs that are not running: a dead job (e.g.
/// an operator pushed its id on main by hand; the fetch answered busy and
/// left it in processing, the watchdog adopted it) and a delayed job
/// scheduled a week ahead, each also once missing from its own list. The
/// entry and lease are dropped and answered; the dead job stays dead with
/// its attempts, relisted when it was missing; the delayed job keeps its
/// run_at. A job in an unknown state is dead-lettered naming the state.
/// Before, reclaim took any state but `active` for "never claimed": the dead
/// job went to delayed and then main, and ran as attempt 2 of 1 while listed
/// dead; the delayed job was due in milliseconds; the unknown state was
/// overwritten.
#[tokio::test]
async fn reclaim_drops_the_stale_processing_entry_of_a_dead_or_delayed_job() {
    let mut fx = Fixture::start().await;
    let k = fx.keys.clone();
    for id in [
        "dead",
        "dead-unlisted",
        "delayed",
        "delayed-unlisted",
        "odd",
    ] {
        fx.enqueue(id, if id.starts_with("dead") { 1 } else { 3 })
            .await;
        let d = fx.fetch_one().await;
        if id.starts_with("dead") {
            fx.fail(&d, FailKind::Permanent).await.unwrap();
        } else if id.starts_with("delayed") {
            fx.fail(&d, FailKind::Retry).await.unwrap();
        } else {
            fx.fail(&d, FailKind::Retry).await.unwrap();
            fx.cmd(&["HSET", &k.job(id), "state", "odd"]).await;
            fx.cmd(&["ZREM", &k.delayed, id]).await;
        }
    }
    let week = (fx.redis_now_ms().await + 7 * 86_400_000).to_string();
    for id in ["delayed", "delayed-unlisted"] {
        fx.cmd(&["HSET", &k.job(id), "run_at", &week]).await;
        fx.cmd(&["ZADD", &k.delayed, &week, id]).await;
    }
    fx.cmd(&["ZREM", &k.delayed, "delayed-unlisted"]).await;
    fx.cmd(&["LREM", &k.dead, "0", "dead-unlisted"]).await;
    for id in [
        "dead",
        "dead-unlisted",
        "delayed",
        "delayed-unlisted",
        "odd",
    ] {
        fx.stale_entry(id).await;
    }

    let reply = fx.reclaim().await.unwrap();
    assert_eq!((reply.reclaimed, reply.dead_lettered), (0, 1), "{reply:?}");
    let mut dropped: Vec<(String, String)> = reply
        .dropped
        .iter()
        .map(|(id, s)| (id.to_string(), s.clone()))
        .collect();
    dropped.sort();
    assert_eq!(
        dropped,
        [
            ("dead", "dead"),
            ("dead-unlisted", "dead"),
            ("delayed", "delayed"),
            ("delayed-unlisted", "delayed")
        ]
        .map(|(a, b)| (a.to_string(), b.to_string()))
    );
    for id in ["dead", "dead-unlisted"] {
        assert_eq!(fx.places(id).await, Places::dead_only(), "{id}");
        let job = fx.job(id).await;
        assert_eq!(job["state"], "dead", "{id}");
        assert_eq!(job["attempts"], "1", "{id}");
    }
    for id in ["delayed", "delayed-unlisted"] {
        assert_eq!(fx.places(id).await, Places::delayed_only(), "{id}");
        assert_eq!(fx.job(id).await["run_at"], week, "{id}");
        assert_eq!(
            fx.delayed_at(id).await.as_deref(),
            Some(week.as_str()),
            "{id}"
        );
    }
    assert_eq!(fx.places("odd").await, Places::dead_only());
    let reason = fx.job("odd").await["dead_reason"].clone();
    assert_eq!(reason, "corrupt field state: 'odd'");

    // Nothing of them runs: the promoter has nothing due.
    fx.promote().await.unwrap();
    assert_eq!(fx.places("dead").await, Places::dead_only());
    assert_eq!(fx.fetch(5, "after").await.unwrap(), vec![]);
}

/// A processing entry left by a job that completed (its hash gone, its
/// completion record kept): the entry and lease are dropped and answered
/// `completed`, with no dead letter. An entry with neither hash nor record
/// is still dead-lettered "job hash missing". Before, both were dead-lettered:
/// an acked job showed up as a false dead letter.
#[tokio::test]
async fn reclaim_drops_the_stale_entry_of_a_completed_job() {
    let mut fx = Fixture::start().await;
    let k = fx.keys.clone();
    fx.enqueue("acked", 3).await;
    let d = fx.fetch_one().await;
    let items = [super::ack::AckItem::of(&d, None)];
    super::ack::Ack {
        keys: &k,
        worker: "",
        items: &items,
        retention: Duration::from_secs(600),
        compact: false,
    }
    .run(&mut fx.conn.clone())
    .await
    .unwrap();
    fx.stale_entry("acked").await;
    fx.stale_entry("vanished").await;

    let reply = fx.reclaim().await.unwrap();
    assert_eq!(
        reply.dropped,
        vec![(JobId::from("acked"), "completed".to_string())],
        "{reply:?}"
    );
    assert_eq!(reply.dead_lettered, 1, "{reply:?}");
    assert_eq!(fx.places("acked").await, Places::default());
    assert!(fx.job("acked").await.is_empty(), "no hash recreated");
    assert_eq!(fx.places("vanished").await, Places::dead_only());
    assert!(fx.job("vanished").await["dead_reason"].starts_with("job hash missing"));
}

/// An active job whose lease expired but whose processing entry was lost
/// (a hand edit, an older bug): the lease's score is the job's
/// lease_until, so it is the lost delivery, returned (or dead-lettered when
/// its attempts are exhausted) like any. A lease that matches no active
/// delivery is dropped and answered. Before, the lease was removed silently
/// and the job stayed `active`, in no list, until `check --repair`.
#[tokio::test]
async fn an_expired_lease_whose_processing_entry_was_lost_is_returned() {
    let mut fx = Fixture::start().await;
    let k = fx.keys.clone();
    fx.enqueue("retry", 3).await;
    fx.fetch_one().await;
    fx.enqueue("last", 1).await;
    fx.fetch_one().await;
    for id in ["retry", "last"] {
        fx.cmd(&["LREM", &k.processing, "0", id]).await;
        fx.cmd(&["HSET", &k.job(id), "lease_until", "5"]).await;
        fx.cmd(&["ZADD", &k.leases, "5", id]).await;
    }
    fx.enqueue("queued", 3).await;
    fx.cmd(&["ZADD", &k.leases, "5", "queued"]).await;

    let reply = fx.reclaim().await.unwrap();
    assert_eq!((reply.reclaimed, reply.dead_lettered), (1, 1), "{reply:?}");
    assert_eq!(
        reply.dropped,
        vec![(JobId::from("queued"), "lease only (queued)".to_string())]
    );
    assert_eq!(fx.places("retry").await, Places::delayed_only());
    assert_eq!(fx.job("retry").await["state"], "delayed");
    assert_eq!(fx.places("last").await, Places::dead_only());
    assert!(fx.job("last").await["dead_reason"].starts_with("attempts exhausted (1 of 1)"));
    assert_eq!(fx.places("queued").await, Places::main_only());
}

/// The oldest dead letter (the tail) has a `dead_at` of `inf`, `1e300` or a
/// year ahead (hand edits), with older dead letters before it: retention
/// trimming deletes them all. Before, `inf` never counted as expired
/// (`now - inf` is `-inf`): the trim stopped at the tail for good and no
/// dead letter was ever deleted by age again. A dead letter of now is kept.
#[tokio::test]
async fn retention_trimming_is_not_stopped_by_a_dead_at_that_is_no_time() {
    let mut fx = Fixture::start().await;
    let k = fx.keys.clone();
    let now = fx.redis_now_ms().await;
    let year_ahead = (now + 365 * 86_400_000).to_string();
    let old = (now - 1_000_000_000).to_string();
    for bad in ["inf", "1e300", year_ahead.as_str()] {
        fx.cmd(&["DEL", &k.dead]).await;
        fx.cmd(&["HSET", &k.job("bad"), "state", "dead", "dead_at", bad])
            .await;
        fx.cmd(&["LPUSH", &k.dead, "bad"]).await;
        for id in ["o1", "o2"] {
            fx.cmd(&["HSET", &k.job(id), "state", "dead", "dead_at", &old])
                .await;
            fx.cmd(&["LPUSH", &k.dead, id]).await;
        }
        let fresh = fx.redis_now_ms().await.to_string();
        fx.cmd(&["HSET", &k.job("fresh"), "state", "dead", "dead_at", &fresh])
            .await;
        fx.cmd(&["LPUSH", &k.dead, "fresh"]).await;
        let reply = super::dead_trim::DeadTrim {
            keys: &k,
            max_len: 0,
            retention: Duration::from_secs(3600),
            limit: 100,
        }
        .run(&mut fx.conn)
        .await
        .unwrap();
        assert_eq!((reply.trimmed, reply.remaining), (3, 1), "dead_at {bad}");
        assert_eq!(
            fx.places("fresh").await,
            Places::dead_only(),
            "dead_at {bad}"
        );
        assert!(fx.job("bad").await.is_empty(), "dead_at {bad}: deleted");
    }
}

/// The bytes of a reply's bulk string, as UTF-8 (valid: a cut never splits
/// a character).
fn utf8_of(v: &Value) -> String {
    let Value::BulkString(b) = v else {
        panic!("a bulk string: {v:?}")
    };
    String::from_utf8(b.clone()).expect("valid UTF-8")
}

/// What the fixture's queue keeps of a failure of job `id`: `last_error`
/// (and `dead_reason` when dead), the history entries' details and the
/// event stream's details.
async fn stored_errors(fx: &mut Fixture, id: &str) -> Vec<String> {
    let job = fx.keys.job(id);
    let mut out = vec![utf8_of(&fx.cmd(&["HGET", &job, "last_error"]).await)];
    if let Value::BulkString(_) = fx.cmd(&["HGET", &job, "dead_reason"]).await {
        out.push(utf8_of(&fx.cmd(&["HGET", &job, "dead_reason"]).await));
    }
    let Value::Array(entries) = fx.cmd(&["LRANGE", &fx.keys.hist(id), "0", "-1"]).await else {
        panic!("history entries")
    };
    assert!(!entries.is_empty(), "a history entry");
    for e in &entries {
        let entry: serde_json::Value = serde_json::from_str(&utf8_of(e)).unwrap();
        out.push(entry["d"].as_str().expect("a detail").to_string());
    }
    let Value::Array(events) = fx.cmd(&["XRANGE", &fx.keys.events(), "-", "+"]).await else {
        panic!("events")
    };
    let mut details = 0;
    for ev in &events {
        let Value::Array(entry) = ev else {
            panic!("{ev:?}")
        };
        let Value::Array(fields) = &entry[1] else {
            panic!("{ev:?}")
        };
        for pair in fields.chunks(2) {
            if utf8_of(&pair[0]) == "detail" {
                out.push(utf8_of(&pair[1]));
                details += 1;
            }
        }
    }
    assert!(details > 0, "a failure event");
    out
}

/// A handler error of 1 MB (multi-byte characters) is stored cut to 4 KB at
/// a character boundary, saying how long it was, in `last_error`, the
/// history, the event stream and the dead-letter reason: by the worker's
/// `Fail` (it sends it cut) and by `fail.lua` itself for a caller that
/// sends it whole. Before, each retry stored it whole in the job hash, a
/// history entry (up to 50) and the event stream (~10,000 entries): Redis
/// ran out of memory.
#[tokio::test]
async fn a_huge_failure_message_is_stored_cut() {
    let mut fx = Fixture::start().await;
    fx.cmd(&["SET", &fx.keys.events_on(), "10000"]).await;
    let huge = "é".repeat(512 * 1024);
    let limit = super::MAX_ERROR_BYTES;
    // Through the worker's wrapper: retried, then dead.
    fx.enqueue("big", 2).await;
    let mut d = fx.fetch_one().await;
    for attempt in 1..=2 {
        if attempt == 2 {
            d = fx.redeliver_after(&d).await;
        }
        Fail {
            keys: &fx.keys,
            id: &d.id,
            token: &d.token,
            kind: FailKind::Retry,
            message: &huge,
            delay: Duration::ZERO,
            far_from_tail: false,
        }
        .run(&mut fx.conn)
        .await
        .unwrap();
    }
    assert_eq!(fx.places("big").await, Places::dead_only());
    // A caller that sends it whole: the script cuts it before any write.
    fx.enqueue("raw", 1).await;
    let d = fx.fetch_one().await;
    let k = fx.keys.clone();
    super::fail::SCRIPT
        .call([
            k.processing.clone(),
            k.leases.clone(),
            k.job("raw"),
            k.delayed.clone(),
            k.dead.clone(),
            k.stats.clone(),
            k.wake.clone(),
            k.guard.clone(),
        ])
        .arg("raw")
        .arg(d.token.as_str())
        .arg("permanent")
        .arg(huge.as_str())
        .arg(0)
        .arg(super::far_arg(d.far_from_tail))
        .run(&mut fx.conn, &k.queue, Some(&d.id))
        .await
        .unwrap();
    for id in ["big", "raw"] {
        let stored = stored_errors(&mut fx, id).await;
        assert!(stored.len() >= 4, "{id}: {}", stored.len());
        for s in stored {
            // `attempts exhausted (2 of 2): ` leads a dead reason.
            assert!(s.len() <= limit + 64, "{id}: {} bytes stored", s.len());
            assert!(s.contains("ééé"), "{id}: the message's start is kept");
            assert!(
                s.ends_with(&format!("… ({} bytes)", huge.len())),
                "{id}: says how long it was: {}",
                &s[s.len() - 40..]
            );
        }
    }
}

/// A relative delay near the largest one (`Duration::MAX`, sent as 2^53 − 1
/// ms) stores a run time the scripts read as a count, at enqueue and at a
/// retry: the job stays delayed (promote leaves it, the checker's reader
/// takes its `run_at`). Before, `now + delay` went past 2^53 − 1: the stored
/// run_at (and the delayed score) was no count, and the promoter
/// dead-lettered the job as corrupt once it came due... never, while the
/// checker and `jobs show` read garbage.
#[tokio::test]
async fn a_delay_near_the_largest_stores_a_run_at_that_is_a_count() {
    let mut fx = Fixture::start().await;
    let id = JobId::from("far");
    Enqueue {
        delay: Some(Duration::MAX),
        ..Enqueue::test_job(&fx.keys, &id, 3)
    }
    .run(&mut fx.conn)
    .await
    .unwrap();
    fx.enqueue("far-retry", 3).await;
    let d = fx.fetch_one().await;
    let reply = Fail {
        keys: &fx.keys,
        id: &d.id,
        token: &d.token,
        kind: FailKind::Retry,
        message: "later",
        delay: Duration::MAX,
        far_from_tail: false,
    }
    .run(&mut fx.conn)
    .await
    .unwrap();
    assert!(matches!(reply, FailReply::Retry { .. }), "{reply:?}");
    fx.promote().await.unwrap();
    let max = super::MAX_MS;
    for id in ["far", "far-retry"] {
        let job = fx.job(id).await;
        assert_eq!(
            job.get("state").map(String::as_str),
            Some("delayed"),
            "{id}"
        );
        let run_at = job.get("run_at").expect("a run_at");
        let n: u64 = run_at.parse().unwrap_or_else(|_| panic!("{id}: {run_at}"));
        assert!(n <= max, "{id}: {n}");
        let delayed = fx.keys.delayed.clone();
        let score = utf8_of(&fx.cmd(&["ZSCORE", &delayed, id]).await);
        assert_eq!(score.parse::<f64>().unwrap(), n as f64, "{id}");
        assert_eq!(fx.places(id).await, Places::delayed_only(), "{id}");
    }
}

/// An extra field the scripts read as a count (`expires_at`,
/// `expires_after`) with a value that is none is refused at enqueue, before
/// any write, by `enqueue.lua` and by `enqueue_many.lua`. Before, it was
/// stored, and the job was dead-lettered "corrupt field" at its first claim.
#[tokio::test]
async fn a_count_extra_field_that_is_no_count_is_refused_at_enqueue() {
    let mut fx = Fixture::start().await;
    let pair = |n: &str, v: &str| vec![(n.to_string(), v.to_string())];
    for (i, extra) in [
        pair("expires_at", "soon"),
        pair("expires_after", "-5"),
        pair("expires_after", "1.5"),
        pair("expires_at", "1e300"),
    ]
    .into_iter()
    .enumerate()
    {
        let id = JobId::from(format!("x{i}"));
        let err = Enqueue {
            extra: &extra,
            ..Enqueue::test_job(&fx.keys, &id, 1)
        }
        .run(&mut fx.conn)
        .await
        .unwrap_err();
        assert!(err.to_string().contains(&extra[0].0), "{err}");
        assert_eq!(fx.places(id.as_str()).await, Places::default());
        assert_eq!(
            fx.cmd(&["EXISTS", &fx.keys.job(id.as_str())]).await,
            Value::Int(0)
        );
        // The batch form: that job answers invalid, nothing written.
        let many = super::enqueue_many::ManyJob {
            job: Enqueue {
                extra: &extra,
                ..Enqueue::test_job(&fx.keys, &id, 1)
            },
            token: "",
            fresh: false,
        };
        let replies = super::enqueue_many::run_each(
            &mut fx.conn,
            &fx.keys,
            super::enqueue_many::Mode::Each,
            &[many],
        )
        .await
        .unwrap();
        match &replies[..] {
            [Ok(super::enqueue_many::ManyReply::Invalid(why))] => {
                assert!(why.contains(&extra[0].0), "{why}")
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(
            fx.cmd(&["EXISTS", &fx.keys.job(id.as_str())]).await,
            Value::Int(0)
        );
    }
    // A count is stored.
    let ok = pair("expires_after", "60000");
    fx.enqueue_extra("fine", 1, &ok).await;
    assert_eq!(
        fx.job("fine")
            .await
            .get("expires_after")
            .map(String::as_str),
        Some("60000")
    );
}

/// The entries of the fair-queuing ring naming `group`.
async fn ring_entries(fx: &mut Fixture, group: &str) -> usize {
    let ring = fx.keys.groups();
    match fx.cmd(&["LRANGE", &ring, "0", "-1"]).await {
        Value::Array(entries) => entries
            .iter()
            .filter(|e| matches!(e, Value::BulkString(b) if b == group.as_bytes()))
            .count(),
        other => panic!("{other:?}"),
    }
}

/// Due grouped jobs of groups with no job waiting, promoted while the ring
/// holds many other groups, join the ring once each without a walk of it.
/// Before, each one's group was looked for in the whole ring first (an
/// `LPOS` per job): 1,000 due retries promoted into a ring of 100,000
/// groups kept Redis busy for 6 s in one call (stop 46 review). A group
/// whose last waiting job is cancelled leaves the ring, so that its next
/// job joins it once too.
#[tokio::test]
async fn grouped_jobs_join_the_ring_once_without_walking_it() {
    let mut fx = Fixture::start().await;
    let k = fx.keys.clone();
    for i in 0..200 {
        let group = [("group".to_string(), format!("other{i}"))];
        fx.enqueue_extra(&format!("o{i}"), 3, &group).await;
    }
    for j in 0..20 {
        let (id, group) = (format!("due{j}"), format!("new{j}"));
        fx.cmd(&["HSET", &k.job(&id), "id", &id, "type", "t", "v", "1"])
            .await;
        fx.cmd(&["HSET", &k.job(&id), "payload", "", "state", "delayed"])
            .await;
        fx.cmd(&["HSET", &k.job(&id), "attempts", "1", "max_attempts", "3"])
            .await;
        fx.cmd(&["HSET", &k.job(&id), "group", &group]).await;
        fx.cmd(&["ZADD", &k.delayed, "1", &id]).await;
    }
    let (url, mut conn, mut c) = (fx.server.url(), fx.conn.clone(), fx.conn.clone());
    let calls = super::script_commands(&url, &mut conn, async {
        let reply = Promote {
            keys: &k,
            limit: 100,
        }
        .run(&mut c)
        .await
        .unwrap();
        assert_eq!(reply.promoted, 20, "{reply:?}");
    })
    .await;
    assert_eq!(whole_walks(&calls), 0, "{calls:?}");
    for j in 0..20 {
        let group = format!("new{j}");
        assert_eq!(ring_entries(&mut fx, &group).await, 1, "{group}");
        assert_eq!(fx.cmd(&["LLEN", &k.group(&group)]).await, Value::Int(1));
    }

    super::cancel::Cancel {
        keys: &k,
        id: &JobId::from("o0"),
        retention: Duration::from_secs(60),
    }
    .run(&mut fx.conn.clone())
    .await
    .unwrap();
    assert_eq!(
        ring_entries(&mut fx, "other0").await,
        0,
        "emptied by a cancel"
    );
    let group = [("group".to_string(), "other0".to_string())];
    fx.enqueue_extra("o0-again", 3, &group).await;
    assert_eq!(ring_entries(&mut fx, "other0").await, 1);
}

/// Stale processing entries of dead jobs (a manual retry of dead letters:
/// pushed on main by hand, the fetch answered busy and left them in
/// processing, the watchdog adopted them), over a dead list of 6,006. Dead
/// letters in its middle: a reclaim call walks the dead list whole at most 4
/// times, stops before the next such entry's writes and says so (`cut`),
/// and a watchdog pass calls again at once, so one pass drops them all.
/// Recent dead letters (at the head, where they are pushed): found without a
/// whole walk, all in one call. Each dead job stays dead, listed once.
/// Before, every such entry walked the dead list from its head: 500 of them
/// 5,000 from the tail of a dead list of 1,000,000 kept Redis busy 18 s in
/// one call; and the first bounded version, searching from the tail only,
/// walked the whole list for each recent one (stop 46 review).
#[tokio::test]
async fn reclaim_walks_the_dead_list_a_bounded_number_of_times() {
    let mut fx = Fixture::start().await;
    let k = fx.keys.clone();
    fx.fill_lists(&[(&k.dead, "buried")]).await;
    let ids = fx.dead_letter_all("middle", 6).await;
    let head: Vec<String> = (0..3_000).map(|n| format!("later-{n}")).collect();
    let mut args = vec!["LPUSH", k.dead.as_str()];
    args.extend(head.iter().map(String::as_str));
    fx.cmd(&args).await;
    for id in &ids {
        fx.stale_entry(id).await;
    }
    let (first, walks) = fx.reclaim_counting_dead_walks().await;
    assert_eq!(walks, 4);
    assert!(first.cut, "{first:?}");
    assert_eq!(first.dropped.len(), 4, "{first:?}");

    // The two left wait for the next call; the four dropped are made stale
    // again, so that a pass meets six.
    for id in &ids[..4] {
        fx.stale_entry(id).await;
    }
    let url = fx.server.url();
    let watchdog = crate::Watchdog::connect(&url, [k.queue.as_str()], Default::default())
        .await
        .unwrap();
    let report = watchdog.run_once().await.unwrap();
    assert_eq!(report.dropped, 6, "one pass drops them all: {report:?}");

    let recent = fx.dead_letter_all("recent", 6).await;
    for id in &recent {
        fx.stale_entry(id).await;
    }
    let (call, walks) = fx.reclaim_counting_dead_walks().await;
    assert_eq!(walks, 0, "recent dead letters are found from the head");
    assert!(!call.cut && call.dropped.len() == 6, "{call:?}");
    for id in ids.iter().chain(&recent) {
        assert_eq!(fx.places(id).await, Places::dead_only(), "{id}");
        match fx.cmd(&["LPOS", &k.dead, id, "COUNT", "0"]).await {
            Value::Array(at) => assert_eq!(at.len(), 1, "{id} listed once: {at:?}"),
            other => panic!("{other:?}"),
        }
    }
}

impl Fixture {
    /// Enqueues, claims and dead-letters `n` jobs `<name><i>` (one attempt
    /// each): they are pushed on the dead list's head.
    async fn dead_letter_all(&mut self, name: &str, n: usize) -> Vec<String> {
        let ids: Vec<String> = (0..n).map(|i| format!("{name}{i}")).collect();
        for id in &ids {
            self.enqueue(id, 1).await;
            let d = self.fetch_one().await;
            self.fail(&d, FailKind::Permanent).await.unwrap();
        }
        ids
    }

    /// One reclaim call, and the whole walks of the dead list it made
    /// (`LPOS` of the dead list without `MAXLEN`, by `MONITOR`).
    async fn reclaim_counting_dead_walks(&mut self) -> (super::reclaim::ReclaimReply, usize) {
        let (url, mut conn, mut c) = (self.server.url(), self.conn.clone(), self.conn.clone());
        let k = self.keys.clone();
        let mut reply = None;
        let calls = super::script_commands(&url, &mut conn, async {
            reply = Some(Reclaim::for_tests(&k).run(&mut c).await.unwrap());
        })
        .await;
        let walks = whole_walks_of(&calls, Some(&k.dead));
        (reply.expect("the call ran"), walks)
    }
}

/// A job hash that lost its `state` field (corrupt data), met by a promote
/// (its delayed entry) or a reclaim (its processing entry, lease expired):
/// dead-lettered as `corrupt field state: missing`, as a claim names it.
/// Before, both said "job hash missing" of a hash that exists.
#[tokio::test]
async fn a_hash_without_state_is_named_as_such_by_promote_and_reclaim() {
    let mut fx = Fixture::start().await;
    let k = fx.keys.clone();
    for id in ["late", "held"] {
        fx.cmd(&["HSET", &k.job(id), "id", id, "type", "t", "attempts", "1"])
            .await;
    }
    fx.cmd(&["ZADD", &k.delayed, "1", "late"]).await;
    fx.stale_entry("held").await;
    fx.promote().await.unwrap();
    fx.reclaim().await.unwrap();
    for id in ["late", "held"] {
        assert_eq!(fx.places(id).await, Places::dead_only(), "{id}");
        let job = fx.job(id).await;
        assert_eq!(job["dead_reason"], "corrupt field state: missing", "{id}");
    }
}

/// `cron_mark.lua` never moves a job's record back for the same schedule
/// (workers mark in any order), replaces a record of another schedule or an
/// unreadable one, and refuses a cron hash of another type without writing.
#[tokio::test]
async fn a_cron_record_only_moves_forward_for_its_schedule() {
    let mut fx = Fixture::start().await;
    let keys = fx.keys.clone();
    let mark = |schedule: &'static str, firing: i64| super::cron_mark::CronMark {
        keys: &keys,
        job_type: "tick",
        schedule,
        firing,
    };
    let every_min = "0 * * * * *";
    let record = |fx: &Fixture| {
        let mut conn = fx.conn.clone();
        let key = fx.keys.cron();
        async move { crate::scripts::raw_text(&mut conn, &["HGET", &key, "tick"]).await }
    };
    assert!(mark(every_min, 120).run(&mut fx.conn).await.unwrap());
    assert!(
        !mark(every_min, 60).run(&mut fx.conn).await.unwrap(),
        "moved back"
    );
    assert!(!mark(every_min, 120).run(&mut fx.conn).await.unwrap());
    assert_eq!(record(&fx).await.as_deref(), Some("120 0 * * * * *"));
    // A changed schedule's record replaces the old one, even if earlier.
    assert!(mark("0 0 * * * *", 60).run(&mut fx.conn).await.unwrap());
    assert_eq!(record(&fx).await.as_deref(), Some("60 0 0 * * * *"));
    // A value written by hand is replaced.
    fx.cmd(&["HSET", &fx.keys.cron(), "tick", "garbage"]).await;
    assert!(mark(every_min, 30).run(&mut fx.conn).await.unwrap());
    assert_eq!(record(&fx).await.as_deref(), Some("30 0 * * * * *"));
    // A record ahead of the Redis clock (written while it was ahead) or
    // not in digits (`1e11` reads as a count in Lua's tonumber) is
    // replaced: kept, it refused every mark until the clock caught up
    // (stop 48 review).
    for ahead in ["99999999999 0 * * * * *", "1e11 0 * * * * *"] {
        fx.cmd(&["HSET", &fx.keys.cron(), "tick", ahead]).await;
        assert!(
            mark(every_min, 60).run(&mut fx.conn).await.unwrap(),
            "{ahead}"
        );
        assert_eq!(record(&fx).await.as_deref(), Some("60 0 * * * * *"));
    }
    // A cron hash of another type: an error, nothing written.
    fx.cmd(&["DEL", &fx.keys.cron()]).await;
    fx.cmd(&["SET", &fx.keys.cron(), "x"]).await;
    assert!(mark(every_min, 180).run(&mut fx.conn).await.is_err());
    assert_eq!(
        crate::scripts::raw_text(&mut fx.conn, &["GET", &fx.keys.cron()])
            .await
            .as_deref(),
        Some("x")
    );
}

/// A fetch of jobs with large payloads stops claiming once its rows hold 16
/// MiB (the job that crosses it is the last): the rest of the batch goes
/// back to main's tail in its order, unclaimed, and the next fetch takes it.
/// Before, the whole batch was claimed into one reply (4 × 6 MiB here; 64 ×
/// 8 MiB timed out at the client, and every retry answered it again while
/// the jobs' attempts ran out unrun: stop 48 review).
#[tokio::test]
async fn a_fetch_of_large_payloads_stops_at_its_byte_budget() {
    let mut fx = Fixture::start().await;
    let big = "x".repeat(6 * 1024 * 1024);
    for id in ["a", "b", "c", "d"] {
        fx.enqueue(id, 1).await;
        fx.cmd(&["HSET", &fx.keys.job(id), "payload", &big]).await;
    }
    let claimed = |rows: &[ClaimRow]| -> Vec<String> {
        rows.iter()
            .map(|r| match r {
                ClaimRow::Claimed(d) => d.id.to_string(),
                other => panic!("{other:?}"),
            })
            .collect()
    };
    let rows = fx.fetch(4, "big-1").await.unwrap();
    assert_eq!(claimed(&rows), ["a", "b", "c"]);
    let (processing, main) = (fx.keys.processing.clone(), fx.keys.main.clone());
    assert_eq!(
        crate::scripts::raw_int(&mut fx.conn, &["LLEN", &processing]).await,
        3
    );
    assert_eq!(
        crate::scripts::raw_int(&mut fx.conn, &["LLEN", &main]).await,
        1
    );
    assert_eq!(
        crate::scripts::raw_int(&mut fx.conn, &["ZCARD", &fx.keys.leases]).await,
        3
    );
    let state = crate::scripts::raw_text(&mut fx.conn, &["HGET", &fx.keys.job("d"), "state"]).await;
    assert_eq!(state.as_deref(), Some("queued"));
    // A retry of the same fetch answers the same three rows.
    assert_eq!(
        claimed(&fx.fetch(4, "big-1").await.unwrap()),
        ["a", "b", "c"]
    );
    assert_eq!(claimed(&fx.fetch(4, "big-2").await.unwrap()), ["d"]);
}

/// A cancel of a waiting job finds it from the end of main it sits near
/// (the oldest job at the tail: no walk of the whole list), a grouped job
/// in its group's list without looking at main or processing, and one in
/// the middle of main with one walk. Before, main and processing were each
/// walked from the head (the oldest of 3,000,000 waiting jobs: 263 ms of
/// Redis; a grouped job: 150 ms) (stop 48 review).
#[tokio::test]
async fn a_cancel_looks_for_a_waiting_job_from_the_end_it_sits_near() {
    let mut fx = Fixture::start().await;
    let k = fx.keys.clone();
    fx.enqueue("oldest", 1).await;
    let filler: Vec<String> = (0..5000).map(|i| format!("f{i}")).collect();
    let mut args = vec!["LPUSH", k.main.as_str()];
    args.extend(filler[..2500].iter().map(String::as_str));
    fx.cmd(&args).await;
    fx.enqueue("middle", 1).await;
    let mut args = vec!["LPUSH", k.main.as_str()];
    args.extend(filler[2500..].iter().map(String::as_str));
    fx.cmd(&args).await;
    fx.enqueue_extra("grouped", 1, &[("group".to_string(), "acme".to_string())])
        .await;
    let url = fx.server.url();
    let mut conn = fx.conn.clone();
    for (id, walks_of_main, lpos_of_main) in [
        ("oldest", 0, true),
        ("grouped", 0, false),
        ("middle", 1, true),
    ] {
        let mut c = conn.clone();
        let calls = super::script_commands(&url, &mut conn, async {
            let outcome = super::cancel::Cancel {
                keys: &k,
                id: &JobId::from(id),
                retention: Duration::from_secs(60),
            }
            .run(&mut c)
            .await
            .unwrap();
            assert!(
                matches!(outcome, crate::CancelOutcome::Cancelled { .. }),
                "{id}: {outcome:?}"
            );
        })
        .await;
        assert_eq!(
            whole_walks_of(&calls, Some(&k.main)),
            walks_of_main,
            "{id}: {calls:?}"
        );
        assert_eq!(
            whole_walks_of(&calls, Some(&k.processing)),
            0,
            "{id}: {calls:?}"
        );
        let looked_at_main = calls
            .iter()
            .map(|l| super::monitor_args(l))
            .any(|a| a.first().map(String::as_str) == Some("LPOS") && a.get(1) == Some(&k.main));
        assert_eq!(looked_at_main, lpos_of_main, "{id}: {calls:?}");
        assert_eq!(fx.places(id).await, Places::default(), "{id}");
    }
    assert_eq!(
        crate::scripts::raw_int(&mut fx.conn, &["LLEN", &k.main]).await,
        5000,
        "only the cancelled ids left main"
    );
}
