//! Script-level tests of the limits (docs/LIMITS.md): `fetch.lua` and
//! `claim.lua` under a queue rate limit, a queue concurrency cap and per-key
//! limits, `set_limits.lua`'s validation and its release of the jobs
//! deferred under changed limits, a deferred job back from its booking, and
//! a deferred delivery's release of its start (`defer.lua`).

use std::time::Duration;

use redis::AsyncCommands;

use super::ack::{Ack, AckItem};
use super::claim::{Claim, ClaimRow, Skip};
use super::defer::Defer;
use super::enqueue::Enqueue;
use super::fail::FailReply;
use super::fetch::{Fetch, FetchReply};
use super::promote::Promote;
use super::reclaim::Reclaim;
use super::replay::{Replay, ReplayReply};
use super::set_limits::{SetLimits, SetLimitsReply};
use crate::conn::RedisConnection;
use crate::keys::QueueKeys;

const LEASE: Duration = Duration::from_secs(30);

async fn setup(queue: &str) -> (queue_testkit::RedisServer, RedisConnection, QueueKeys) {
    let (server, conn) = crate::scripts::test_redis().await;
    (server, conn, QueueKeys::new(queue))
}

async fn enqueue(conn: &mut RedisConnection, keys: &QueueKeys, id: &str, rate_key: Option<&str>) {
    let extra: Vec<(String, String)> = rate_key
        .map(|k| vec![("rate_key".to_string(), k.to_string())])
        .unwrap_or_default();
    Enqueue {
        extra: &extra,
        ..Enqueue::test_job(keys, &id.into(), 3)
    }
    .run(conn)
    .await
    .unwrap();
}

async fn set(
    conn: &mut RedisConnection,
    keys: &QueueKeys,
    fields: &[(&str, &str)],
) -> SetLimitsReply {
    let fields: Vec<(String, String)> = fields
        .iter()
        .map(|(n, v)| (n.to_string(), v.to_string()))
        .collect();
    SetLimits::Fields(&fields)
        .run_to_end(keys, conn)
        .await
        .unwrap()
}

async fn fetch(conn: &mut RedisConnection, keys: &QueueKeys, count: usize) -> FetchReply {
    fetch_leased(conn, keys, count, LEASE).await
}

/// [`fetch`] with a lease of `lease`.
async fn fetch_leased(
    conn: &mut RedisConnection,
    keys: &QueueKeys,
    count: usize,
    lease: Duration,
) -> FetchReply {
    Fetch {
        keys,
        lease,
        token_base: &uuid::Uuid::new_v4().to_string(),
        count,
        first_try: false,
    }
    .run_or_paused(conn)
    .await
    .unwrap()
}

fn claimed(reply: &FetchReply) -> Vec<String> {
    let FetchReply::Rows(rows) = reply else {
        panic!("rows expected, got {reply:?}")
    };
    rows.iter()
        .filter_map(|r| match r {
            ClaimRow::Claimed(d) => Some(d.id.to_string()),
            _ => None,
        })
        .collect()
}

async fn attempts(conn: &mut RedisConnection, keys: &QueueKeys, id: &str) -> Option<u32> {
    conn.hget(keys.job(id), "attempts").await.unwrap()
}

/// A queue rate of 3 per 10 s: a fetch of 5 claims 3, the next fetch is
/// `Limited` with the wait until the window frees, and a BLMOVE'd id goes
/// back to main unclaimed; no attempt is used.
#[tokio::test]
async fn a_queue_rate_limit_claims_up_to_the_limit_then_answers_the_wait() {
    let (_server, mut conn, keys) = setup("limits-rate").await;
    for id in ["j1", "j2", "j3", "j4", "j5"] {
        enqueue(&mut conn, &keys, id, None).await;
    }
    set(&mut conn, &keys, &[("rate", "3/10000")]).await;
    assert_eq!(
        claimed(&fetch(&mut conn, &keys, 5).await),
        ["j1", "j2", "j3"]
    );
    let FetchReply::Limited(wait) = fetch(&mut conn, &keys, 5).await else {
        panic!("limited expected")
    };
    assert!(
        wait > Duration::from_secs(9) && wait <= Duration::from_secs(10),
        "{wait:?}"
    );
    assert_eq!(conn.llen::<_, u64>(&keys.main).await.unwrap(), 2);
    assert_eq!(attempts(&mut conn, &keys, "j4").await, Some(0));

    let moved: String = conn
        .lmove(
            &keys.main,
            &keys.processing,
            redis::Direction::Right,
            redis::Direction::Left,
        )
        .await
        .unwrap();
    let row = Claim {
        keys: &keys,
        id: moved.as_bytes(),
        lease: LEASE,
        token: "tok",
    }
    .run(&mut conn)
    .await
    .unwrap();
    assert!(
        matches!(row, ClaimRow::Skipped(_, Skip::Limited(ms)) if ms > 9_000),
        "{row:?}"
    );
    let main: Vec<String> = conn.lrange(&keys.main, 0, -1).await.unwrap();
    assert_eq!(main, ["j5", "j4"], "back at the tail: still first in line");
    assert_eq!(attempts(&mut conn, &keys, "j4").await, Some(0));
    // Without the limit the queue drains.
    set(&mut conn, &keys, &[("rate", "")]).await;
    assert_eq!(claimed(&fetch(&mut conn, &keys, 5).await), ["j4", "j5"]);
}

/// A rate window of 10^14 ms or more (accepted: up to 2^53 - 1) answers a
/// wait the worker reads. Before, the reply was `limited:2e+14` (Lua's
/// number formatting), a protocol error: the fetcher retried for ever.
#[tokio::test]
async fn a_huge_rate_window_answers_a_readable_wait() {
    let (_server, mut conn, keys) = setup("limits-huge-window").await;
    for id in ["j1", "j2"] {
        enqueue(&mut conn, &keys, id, None).await;
    }
    set(&mut conn, &keys, &[("rate", "1/200000000000000")]).await;
    assert_eq!(claimed(&fetch(&mut conn, &keys, 2).await), ["j1"]);
    let FetchReply::Limited(wait) = fetch(&mut conn, &keys, 2).await else {
        panic!("limited expected")
    };
    assert!(
        wait > Duration::from_millis(199_999_000_000_000)
            && wait <= Duration::from_millis(200_000_000_000_000),
        "{wait:?}"
    );
}

/// A queue concurrency cap of 2 counts live leases: a third job starts only
/// once a lease is gone (acked) or expired (a dead worker's).
#[tokio::test]
async fn a_queue_concurrency_cap_counts_live_leases() {
    let (_server, mut conn, keys) = setup("limits-conc").await;
    for id in ["j1", "j2", "j3"] {
        enqueue(&mut conn, &keys, id, None).await;
    }
    set(&mut conn, &keys, &[("concurrency", "2")]).await;
    assert_eq!(claimed(&fetch(&mut conn, &keys, 5).await), ["j1", "j2"]);
    assert!(
        matches!(fetch(&mut conn, &keys, 5).await, FetchReply::Limited(w) if w == Duration::from_millis(100))
    );
    // j1's worker died: its lease expired (score in the past).
    let _: () = conn.zadd(&keys.leases, "j1", 1).await.unwrap();
    assert_eq!(claimed(&fetch(&mut conn, &keys, 5).await), ["j3"]);
}

/// Per-key limits: a key over its rate or its concurrency cap has its job
/// deferred to the delayed set (no attempt used), other keys' jobs in the
/// same fetch are claimed, and the deferred jobs of one key are spread one
/// rate step apart.
#[tokio::test]
async fn a_key_over_its_limit_is_deferred_and_other_keys_go_on() {
    let (_server, mut conn, keys) = setup("limits-keys").await;
    for (id, key) in [
        ("a1", "A"),
        ("a2", "A"),
        ("a3", "A"),
        ("b1", "B"),
        ("c1", "C"),
        ("c2", "C"),
    ] {
        enqueue(&mut conn, &keys, id, Some(key)).await;
    }
    enqueue(&mut conn, &keys, "plain", None).await;
    set(
        &mut conn,
        &keys,
        &[
            ("key_rate", "1/10000"),
            ("key_concurrency:C", "1"),
            ("key_rate:C", "100/1000"),
        ],
    )
    .await;
    let reply = fetch(&mut conn, &keys, 10).await;
    assert_eq!(claimed(&reply), ["a1", "b1", "c1", "plain"]);
    let FetchReply::Rows(rows) = &reply else {
        unreachable!()
    };
    let deferred: Vec<_> = rows
        .iter()
        .filter_map(|r| match r {
            ClaimRow::Skipped(id, Skip::Deferred) => Some(id.to_string()),
            _ => None,
        })
        .collect();
    assert_eq!(deferred, ["a2", "a3", "c2"]);
    let a2: f64 = conn.zscore(&keys.delayed, "a2").await.unwrap();
    let a3: f64 = conn.zscore(&keys.delayed, "a3").await.unwrap();
    assert!(
        (a3 - a2 - 10_000.0).abs() < 1.0,
        "spread one step apart: {a2} {a3}"
    );
    for id in ["a2", "a3", "c2"] {
        assert_eq!(attempts(&mut conn, &keys, id).await, Some(0), "{id}");
        let state: String = conn.hget(keys.job(id), "state").await.unwrap();
        assert_eq!(state, "delayed");
    }
    assert_eq!(conn.llen::<_, u64>(&keys.processing).await.unwrap(), 4);
    // c1 finishes (its lease goes): C has room again.
    let _: () = conn.zrem(&keys.leases, "c1").await.unwrap();
    let _: () = conn.zrem(&keys.delayed, "c2").await.unwrap();
    let _: () = conn.hset(keys.job("c2"), "state", "queued").await.unwrap();
    let _: () = conn.lpush(&keys.main, "c2").await.unwrap();
    assert_eq!(claimed(&fetch(&mut conn, &keys, 10).await), ["c2"]);
}

/// `set_limits.lua` refuses a bad field or value before any write; a
/// corrupt queue-level field refuses the fetch before anything moves.
#[tokio::test]
async fn bad_limits_are_refused_before_any_write() {
    let (_server, mut conn, keys) = setup("limits-bad").await;
    enqueue(&mut conn, &keys, "j1", None).await;
    for bad in [
        ("rate", "100"),
        ("rate", "1/0"),
        ("concurrency", "-1"),
        ("nope", "1"),
    ] {
        let fields = vec![
            ("key_rate".to_string(), "1/1000".to_string()),
            (bad.0.to_string(), bad.1.to_string()),
        ];
        assert!(
            SetLimits::Fields(&fields)
                .run(&keys, &mut conn)
                .await
                .is_err(),
            "{bad:?}"
        );
    }
    assert!(!conn.exists::<_, bool>(keys.limits()).await.unwrap());
    let _: () = conn.hset(keys.limits(), "rate", "fast").await.unwrap();
    let err = Fetch {
        keys: &keys,
        lease: LEASE,
        token_base: "t",
        count: 1,
        first_try: false,
    }
    .run_or_paused(&mut conn)
    .await
    .unwrap_err();
    assert!(
        err.to_string().contains("corrupt limits field rate"),
        "{err}"
    );
    assert_eq!(conn.llen::<_, u64>(&keys.main).await.unwrap(), 1);
    SetLimits::ClearAll.run(&keys, &mut conn).await.unwrap();
    assert_eq!(claimed(&fetch(&mut conn, &keys, 1).await), ["j1"]);
}

/// A key's start log of another type (corrupt data) used to fail the fetch
/// after it had claimed the jobs before it (claimed, delivered to no one,
/// and the next fetch failed on the same job again). The key's limits are
/// skipped for that job; every job is claimed.
#[tokio::test]
async fn a_key_log_of_another_type_skips_that_keys_limits_instead_of_failing_the_fetch() {
    let (_server, mut conn, keys) = setup("limits-corrupt-log").await;
    enqueue(&mut conn, &keys, "a1", Some("A")).await;
    enqueue(&mut conn, &keys, "b1", Some("B")).await;
    enqueue(&mut conn, &keys, "plain", None).await;
    set(&mut conn, &keys, &[("key_rate", "1/10000")]).await;
    let _: () = conn
        .set(format!("{}:started:B", keys.limits()), "x")
        .await
        .unwrap();
    assert_eq!(
        claimed(&fetch(&mut conn, &keys, 10).await),
        ["a1", "b1", "plain"]
    );
    assert_eq!(conn.zcard::<_, u64>(&keys.leases).await.unwrap(), 3);
}

/// A key's booked next start that is no time at all (`1e300`, corrupt
/// data) deferred its jobs forever; it is ignored, and the job is deferred
/// to the key's next free start.
#[tokio::test]
async fn a_booking_far_past_any_window_is_ignored() {
    let (_server, mut conn, keys) = setup("limits-booking").await;
    for id in ["a1", "a2"] {
        enqueue(&mut conn, &keys, id, Some("A")).await;
    }
    set(&mut conn, &keys, &[("key_rate", "1/10000")]).await;
    let _: () = conn
        .set(format!("{}:next:A", keys.limits()), "1e300")
        .await
        .unwrap();
    assert_eq!(claimed(&fetch(&mut conn, &keys, 10).await), ["a1"]);
    let a2: f64 = conn.zscore(&keys.delayed, "a2").await.unwrap();
    let (now, _): (u64, u64) = redis::cmd("TIME").query_async(&mut conn).await.unwrap();
    assert!(a2 < (now as f64 + 60.0) * 1000.0, "deferred to {a2}");
}

/// A per-key override that does not parse (set by hand: `key_rate:acme =
/// 1/0`, `key_concurrency:acme = one`) made that key unlimited: every acme
/// job was claimed in one fetch. It is ignored and the every-key default
/// applies (one acme job claimed, the others deferred); only `none` makes a
/// key unlimited.
#[tokio::test]
async fn a_corrupt_key_override_falls_back_to_the_every_key_default() {
    let (_server, mut conn, keys) = setup("limits-corrupt-override").await;
    for id in ["a1", "a2", "a3"] {
        enqueue(&mut conn, &keys, id, Some("acme")).await;
    }
    for id in ["f1", "f2"] {
        enqueue(&mut conn, &keys, id, Some("free")).await;
    }
    set(
        &mut conn,
        &keys,
        &[("key_rate", "1/60000"), ("key_concurrency", "1")],
    )
    .await;
    let _: () = conn
        .hset_multiple(
            keys.limits(),
            &[
                ("key_rate:acme", "1/0"),
                ("key_concurrency:acme", "one"),
                ("key_rate:free", "none"),
                ("key_concurrency:free", "none"),
            ],
        )
        .await
        .unwrap();
    let reply = fetch(&mut conn, &keys, 10).await;
    assert_eq!(claimed(&reply), ["a1", "f1", "f2"]);
    for id in ["a2", "a3"] {
        assert_eq!(attempts(&mut conn, &keys, id).await, Some(0), "{id}");
        let state: String = conn.hget(keys.job(id), "state").await.unwrap();
        assert_eq!(state, "delayed", "{id}");
    }
}

/// How many times `cmd` ran (scripts' calls included) and the µs of Redis
/// time of all FCALLs, since the last `CONFIG RESETSTAT`.
async fn command_stats(conn: &mut RedisConnection, cmd: &str) -> (u64, u64) {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(conn)
        .await
        .unwrap();
    let field = |name: &str, what: &str| -> u64 {
        info.lines()
            .find_map(|l| l.strip_prefix(&format!("cmdstat_{name}:")))
            .and_then(|l| {
                l.split(',')
                    .find_map(|f| f.strip_prefix(&format!("{what}=")))
            })
            .map_or(0, |v| v.parse().unwrap())
    };
    (field(cmd, "calls"), field("fcall", "usec"))
}

/// A per-key concurrency cap cost a fetch work in proportion to the cap for
/// every waiting job of the key it looked at (the whole running set read, a
/// ZSCORE per running id): cap 2000 with 2000 running, one fetch of 10
/// looking at 109 waiting jobs of the key made 218,000 ZSCOREs (hundreds of
/// ms of Redis time). Only running ids whose recorded lease has passed are
/// looked at now, once per key per call. The count stays exact: a delivery
/// whose lease a heartbeat extended still counts, an acked one (lease gone)
/// or a dead worker's (lease expired) does not.
#[tokio::test]
async fn a_key_at_a_large_concurrency_cap_costs_a_fetch_no_work_per_running_job() {
    let (_server, mut conn, keys) = setup("limits-big-cap").await;
    let running: Vec<String> = (0..2000).map(|i| format!("r{i}")).collect();
    for id in &running {
        enqueue(&mut conn, &keys, id, Some("hot")).await;
    }
    assert_eq!(claimed(&fetch(&mut conn, &keys, 2000).await).len(), 2000);
    enqueue(&mut conn, &keys, "cold", Some("cold")).await;
    for i in 0..200 {
        enqueue(&mut conn, &keys, &format!("w{i}"), Some("hot")).await;
    }
    set(&mut conn, &keys, &[("key_concurrency", "2000")]).await;
    // The running set the 2000 claims under the cap would have written (id
    // -> lease at claim); r0's claimed lease has passed but a heartbeat
    // extended its real lease.
    let leases: Vec<(String, f64)> = conn.zrange_withscores(&keys.leases, 0, -1).await.unwrap();
    let set_key = format!("{}:running:hot", keys.limits());
    let members: Vec<(f64, String)> = leases.iter().map(|(id, s)| (*s, id.clone())).collect();
    let _: () = conn.zadd_multiple(&set_key, &members).await.unwrap();
    let (now, _): (u64, u64) = redis::cmd("TIME").query_async(&mut conn).await.unwrap();
    let now_ms = now as f64 * 1000.0;
    let _: () = conn.zadd(&set_key, "r0", now_ms - 1000.0).await.unwrap();

    let _: () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query_async(&mut conn)
        .await
        .unwrap();
    let reply = fetch(&mut conn, &keys, 10).await;
    let (zscores, usec) = command_stats(&mut conn, "zscore").await;
    eprintln!("fetch at the cap: {zscores} ZSCOREs, {usec} µs of FCALL time");
    assert_eq!(
        claimed(&reply),
        ["cold"],
        "the heartbeat-extended r0 still counts"
    );
    let FetchReply::Rows(rows) = &reply else {
        unreachable!()
    };
    let deferred = rows
        .iter()
        .filter(|r| matches!(r, ClaimRow::Skipped(_, Skip::Deferred)))
        .count();
    assert_eq!(deferred, 109);
    assert!(zscores <= 10, "{zscores} ZSCOREs for one fetch");
    let r0: f64 = conn.zscore(&set_key, "r0").await.unwrap();
    assert!(r0 > now_ms, "re-scored to its real lease: {r0}");

    // r1 acked (its lease gone), r2's worker died (its lease expired): two
    // slots free, two waiting jobs of the key are claimed.
    let _: () = conn.zrem(&keys.leases, "r1").await.unwrap();
    let _: () = conn.zadd(&keys.leases, "r2", now_ms - 500.0).await.unwrap();
    let _: () = conn.zadd(&set_key, "r2", now_ms - 500.0).await.unwrap();
    assert_eq!(
        claimed(&fetch(&mut conn, &keys, 10).await),
        ["w109", "w110"]
    );
}

/// The keys' running sets left in Redis (SCAN, any type).
async fn running_sets(conn: &mut RedisConnection, keys: &QueueKeys) -> Vec<String> {
    let pattern = format!("{}:running:*", keys.limits());
    let mut iter: redis::AsyncIter<String> = conn.scan_match(&pattern).await.unwrap();
    let mut out = Vec::new();
    while let Some(k) = iter.next_item().await {
        out.push(k.unwrap());
    }
    out
}

/// A rate key's running set (`<limits>:running:<k>`) was never removed: it
/// was pruned only when the same key was claimed again, so one zset stayed
/// for every rate key ever used. 100 jobs of 100 keys (every key at most 1
/// running), 99 acked and one reclaimed after its lease expired: once their
/// leases have passed, the fetches of the queue sweep every set away (at
/// most 64 ids and sets per fetch), the index of the sets too.
#[tokio::test]
async fn the_running_sets_of_finished_keys_are_swept() {
    let (_server, mut conn, keys) = setup("limits-sweep").await;
    for i in 0..100 {
        enqueue(&mut conn, &keys, &format!("j{i}"), Some(&format!("k{i}"))).await;
    }
    set(&mut conn, &keys, &[("key_concurrency", "1")]).await;
    let lease = Duration::from_millis(300);
    let reply = fetch_leased(&mut conn, &keys, 100, lease).await;
    let FetchReply::Rows(rows) = reply else {
        panic!("rows expected")
    };
    let items: Vec<AckItem> = rows
        .iter()
        .filter_map(|r| match r {
            ClaimRow::Claimed(d) if d.id.to_string() != "j0" => Some(AckItem::of(d, None)),
            _ => None,
        })
        .collect();
    assert_eq!(items.len(), 99);
    Ack {
        keys: &keys,
        worker: "",
        items: &items,
        retention: Duration::from_secs(60),
        compact: false,
    }
    .run(&mut conn)
    .await
    .unwrap();
    assert_eq!(running_sets(&mut conn, &keys).await.len(), 100);
    // j0's worker died: its lease expires and the watchdog returns it.
    tokio::time::sleep(lease + Duration::from_millis(100)).await;
    let reclaimed = Reclaim::for_tests(&keys).run(&mut conn).await.unwrap();
    assert_eq!(reclaimed.reclaimed, 1);
    let mut fetches = 0;
    while fetches < 5 && !running_sets(&mut conn, &keys).await.is_empty() {
        assert_eq!(claimed(&fetch(&mut conn, &keys, 10).await).len(), 0);
        fetches += 1;
    }
    let left = running_sets(&mut conn, &keys).await;
    assert!(
        left.is_empty(),
        "{} sets left after {fetches} fetches, e.g. {:?}",
        left.len(),
        left.first()
    );
    assert!(fetches <= 4, "{fetches} fetches");
    assert!(!conn
        .exists::<_, bool>(format!("{}:runkeys", keys.limits()))
        .await
        .unwrap());
}

/// A fetch of a queue with limits whose main holds another type is refused
/// before its first write: the sweep of finished running sets (a write)
/// runs only after main and processing were checked. Before, the sweep
/// pruned a set, then the type check raised: a half-applied call.
#[tokio::test]
async fn a_fetch_refused_for_its_main_writes_nothing_not_even_the_sweep() {
    let (_server, mut conn, keys) = setup("limits-refused").await;
    set(&mut conn, &keys, &[("key_concurrency", "1")]).await;
    let running = format!("{}:running:acme", keys.limits());
    let index = format!("{}:runkeys", keys.limits());
    let () = conn.zadd(&running, "finished-long-ago", 1).await.unwrap();
    let () = conn.zadd(&index, "acme", 1).await.unwrap();
    let () = conn.set(&keys.main, "not a list").await.unwrap();
    let refused = Fetch {
        keys: &keys,
        lease: LEASE,
        token_base: "refused",
        count: 10,
        first_try: false,
    }
    .run_or_paused(&mut conn)
    .await;
    assert!(refused.is_err(), "{refused:?}");
    let left: Vec<String> = conn.zrange(&running, 0, -1).await.unwrap();
    assert_eq!(left, vec!["finished-long-ago".to_string()]);
    let indexed: Vec<String> = conn.zrange(&index, 0, -1).await.unwrap();
    assert_eq!(indexed, vec!["acme".to_string()]);
}

/// A queue's start log (`<limits>:started`) of another type, under a
/// queue rate: the fetch, the claim after a BLMOVE and the limits read are
/// refused before any write, naming the key. Before, the sweep of finished
/// running sets wrote first, then the window read raised a bare WRONGTYPE
/// naming no key.
#[tokio::test]
async fn a_fetch_refused_for_its_start_log_writes_nothing_not_even_the_sweep() {
    let (_server, mut conn, keys) = setup("limits-started-refused").await;
    enqueue(&mut conn, &keys, "j1", None).await;
    set(
        &mut conn,
        &keys,
        &[("rate", "5/60000"), ("key_concurrency", "1")],
    )
    .await;
    let started = format!("{}:started", keys.limits());
    let running = format!("{}:running:acme", keys.limits());
    let index = format!("{}:runkeys", keys.limits());
    let () = conn.zadd(&running, "finished-long-ago", 1).await.unwrap();
    let () = conn.zadd(&index, "acme", 1).await.unwrap();
    let () = conn.set(&started, "not a zset").await.unwrap();
    let refused = Fetch {
        keys: &keys,
        lease: LEASE,
        token_base: "refused",
        count: 10,
        first_try: false,
    }
    .run_or_paused(&mut conn)
    .await
    .unwrap_err();
    assert!(refused.to_string().contains(&started), "{refused}");
    let left: Vec<String> = conn.zrange(&running, 0, -1).await.unwrap();
    assert_eq!(left, vec!["finished-long-ago".to_string()]);
    let indexed: Vec<String> = conn.zrange(&index, 0, -1).await.unwrap();
    assert_eq!(indexed, vec!["acme".to_string()]);

    let moved: String = conn
        .lmove(
            &keys.main,
            &keys.processing,
            redis::Direction::Right,
            redis::Direction::Left,
        )
        .await
        .unwrap();
    let claim = Claim {
        keys: &keys,
        id: moved.as_bytes(),
        lease: LEASE,
        token: "tok",
    }
    .run(&mut conn)
    .await
    .unwrap_err();
    assert!(claim.to_string().contains(&started), "{claim}");
    let left: Vec<String> = conn.zrange(&running, 0, -1).await.unwrap();
    assert_eq!(left, vec!["finished-long-ago".to_string()]);
    assert_eq!(attempts(&mut conn, &keys, "j1").await, Some(0));

    let read = crate::scripts::limits_read::read(&keys, &mut conn)
        .await
        .err()
        .expect("the limits read is refused");
    assert!(read.to_string().contains(&started), "{read}");
}

/// Enqueues "newer" then "runnable" (with `rate_key`) under `limits`,
/// fetches one ("newer"), and gives it back as a worker that knows only
/// version 1 of its version-2 payload (`defer.lua`), for a minute.
async fn defer_the_first_of_two(
    conn: &mut RedisConnection,
    keys: &QueueKeys,
    limits: &[(&str, &str)],
    rate_key: Option<&str>,
) {
    let queue = &keys.queue;
    for id in ["newer", "runnable"] {
        enqueue(conn, keys, id, rate_key).await;
    }
    set(conn, keys, limits).await;
    let reply = fetch(conn, keys, 1).await;
    let FetchReply::Rows(rows) = &reply else {
        panic!("{queue}: rows expected, got {reply:?}")
    };
    let [ClaimRow::Claimed(newer)] = rows.as_slice() else {
        panic!("{queue}: one claim expected, got {rows:?}")
    };
    assert_eq!(newer.id.as_str(), "newer", "{queue}");
    let back = Defer::test_v2(keys, newer).run(conn).await.unwrap();
    assert!(matches!(back, FailReply::Retry { .. }), "{queue}: {back:?}");
}

/// A delivery given back for a newer payload version (`defer.lua`) never ran
/// its handler, so it uses no start of a rate limit and holds no concurrency
/// slot: the next waiting job starts at once. One queue per limit: the
/// queue's rate, a key's rate, the queue's concurrency and a key's
/// concurrency. Before, the given-back delivery's start stayed in the rate
/// logs for the whole window: in a rolling deploy the bounces used up the
/// rate and runnable jobs were `Limited` (the queue's rate) or deferred (a
/// key's). The concurrency slots were already freed with the lease.
#[tokio::test]
async fn a_deferred_delivery_uses_no_start_of_the_limits() {
    let (_server, mut conn, _) = setup("limits-defer").await;
    let cases = [
        ("defer-rate", &[("rate", "1/60000")][..], None),
        ("defer-key-rate", &[("key_rate", "1/60000")], Some("tenant")),
        ("defer-conc", &[("concurrency", "1")], None),
        (
            "defer-key-conc",
            &[("key_concurrency", "1")],
            Some("tenant"),
        ),
    ];
    for (queue, limits, rate_key) in cases {
        let keys = QueueKeys::new(queue);
        defer_the_first_of_two(&mut conn, &keys, limits, rate_key).await;
        let next = claimed(&fetch(&mut conn, &keys, 1).await);
        assert_eq!(next, ["runnable"], "{queue}");
    }
}

/// A key's start log of another type (corrupt data; fetches skip that key's
/// limits) does not fail the give-back: `defer.lua` checks the logs before
/// its first write, leaves that one as it is, and still releases the start
/// in the queue's log.
#[tokio::test]
async fn a_deferred_delivery_skips_a_start_log_of_another_type() {
    let (_server, mut conn, keys) = setup("limits-defer-corrupt").await;
    let bad_log = format!("{}:started:B", keys.limits());
    let _: () = conn.set(&bad_log, "x").await.unwrap();
    let limits = [("rate", "1/60000"), ("key_rate", "1/60000")];
    defer_the_first_of_two(&mut conn, &keys, &limits, Some("B")).await;
    assert_eq!(conn.get::<_, String>(&bad_log).await.unwrap(), "x");
    assert_eq!(claimed(&fetch(&mut conn, &keys, 1).await), ["runnable"]);
}

/// The Redis clock, ms.
async fn redis_now(conn: &mut RedisConnection) -> u64 {
    let (s, us): (u64, u64) = redis::cmd("TIME").query_async(conn).await.unwrap();
    s * 1000 + us / 1000
}

/// Where `id` waits in the delayed set (its run_at).
async fn run_at(conn: &mut RedisConnection, keys: &QueueKeys, id: &str) -> u64 {
    let score: f64 = conn.zscore(&keys.delayed, id).await.unwrap();
    score as u64
}

/// The ids of a fetch's deferred rows.
fn deferred(reply: &FetchReply) -> Vec<String> {
    let FetchReply::Rows(rows) = reply else {
        panic!("rows expected, got {reply:?}")
    };
    rows.iter()
        .filter_map(|r| match r {
            ClaimRow::Skipped(id, Skip::Deferred) => Some(id.to_string()),
            _ => None,
        })
        .collect()
}

/// Makes delayed job `id` due now (`ZADD delayed <TIME> id`) and promotes it.
async fn make_due(conn: &mut RedisConnection, keys: &QueueKeys, id: &str) {
    let now = redis_now(conn).await;
    let _: () = conn.zadd(&keys.delayed, id, now).await.unwrap();
    let promoted = Promote { keys, limit: 10 }.run(conn).await.unwrap();
    assert_eq!(promoted.promoted, 1, "{id}");
}

/// Key 1/60000, jobs A B C D: A starts, B C D are booked one window apart
/// (A's start + 60, 120, 180 s). B comes back while A's start is still in
/// the window (its claim came a few ms sooner after its booking than A's
/// did: here made due at once) and is deferred again. It was sent behind
/// the key's whole backlog (A's start + 240 s, after D), its slot left
/// empty; it now waits for the window's own wait (A's start + 60 s) and the
/// booking is not extended. Once claimed, it carries no mark any more.
#[tokio::test]
async fn a_deferred_job_back_early_keeps_its_place_instead_of_going_behind_the_backlog() {
    let (_server, mut conn, keys) = setup("limits-back-early").await;
    for id in ["A", "B", "C", "D"] {
        enqueue(&mut conn, &keys, id, Some("k")).await;
    }
    set(&mut conn, &keys, &[("key_rate", "1/60000")]).await;
    let reply = fetch(&mut conn, &keys, 10).await;
    assert_eq!(claimed(&reply), ["A"]);
    assert_eq!(deferred(&reply), ["B", "C", "D"]);
    let a_start: u64 = conn.hget(keys.job("A"), "delivered_at").await.unwrap();
    for (id, at) in [("B", 60_000), ("C", 120_000), ("D", 180_000)] {
        assert_eq!(run_at(&mut conn, &keys, id).await, a_start + at, "{id}");
    }
    let booking = format!("{}:next:k", keys.limits());
    let booked: u64 = conn.get(&booking).await.unwrap();

    make_due(&mut conn, &keys, "B").await;
    let reply = fetch(&mut conn, &keys, 10).await;
    assert_eq!(deferred(&reply), ["B"]);
    let b = run_at(&mut conn, &keys, "B").await;
    assert!(
        b <= a_start + 60_000,
        "B deferred again to A's start + {} ms",
        b - a_start
    );
    assert_eq!(conn.get::<_, u64>(&booking).await.unwrap(), booked);
    for (id, at) in [("C", 120_000), ("D", 180_000)] {
        assert_eq!(run_at(&mut conn, &keys, id).await, a_start + at, "{id}");
    }

    // A's start leaves the window: B is claimed, and unmarked.
    let _: () = conn
        .del(format!("{}:started:k", keys.limits()))
        .await
        .unwrap();
    make_due(&mut conn, &keys, "B").await;
    assert_eq!(claimed(&fetch(&mut conn, &keys, 10).await), ["B"]);
    assert!(!conn
        .hexists::<_, _, bool>(keys.job("B"), "limit_slot")
        .await
        .unwrap());
    let index: Vec<String> = conn
        .zrange(format!("{}:deferred:k", keys.limits()), 0, -1)
        .await
        .unwrap();
    assert_eq!(index, ["C", "D"]);
}

/// 50 jobs of key `noisy` at 1/60000: 49 deferred up to +49 min. Clearing
/// the key's limit left them there (a promote moved 0) and kept the
/// booking: with 2/1000 set next, a new job was deferred behind the old
/// chain (+49 min). The change releases them (due now, all promoted) and
/// drops the booking: a new job over 2/1000 waits at most one window.
#[tokio::test]
async fn clearing_a_keys_limit_releases_its_deferred_jobs_and_its_booking() {
    let (_server, mut conn, keys) = setup("limits-release").await;
    for i in 0..50 {
        enqueue(&mut conn, &keys, &format!("j{i}"), Some("noisy")).await;
    }
    set(&mut conn, &keys, &[("key_rate:noisy", "1/60000")]).await;
    let reply = fetch(&mut conn, &keys, 100).await;
    assert_eq!(claimed(&reply), ["j0"]);
    assert_eq!(deferred(&reply).len(), 49);
    // The same value again changes nothing.
    let same = set(&mut conn, &keys, &[("key_rate:noisy", "1/60000")]).await;
    assert_eq!(same.released, 0);
    assert_eq!(
        Promote {
            keys: &keys,
            limit: 100
        }
        .run(&mut conn)
        .await
        .unwrap()
        .promoted,
        0
    );

    let cleared = set(&mut conn, &keys, &[("key_rate:noisy", "")]).await;
    assert_eq!(cleared.released, 49);
    let promoted = Promote {
        keys: &keys,
        limit: 100,
    }
    .run(&mut conn)
    .await
    .unwrap();
    assert_eq!(promoted.promoted, 49);
    assert_eq!(claimed(&fetch(&mut conn, &keys, 100).await).len(), 49);

    set(&mut conn, &keys, &[("key_rate:noisy", "2/1000")]).await;
    // j0's start leaves the window.
    let _: () = conn
        .del(format!("{}:started:noisy", keys.limits()))
        .await
        .unwrap();
    for id in ["n1", "n2", "n3"] {
        enqueue(&mut conn, &keys, id, Some("noisy")).await;
    }
    let reply = fetch(&mut conn, &keys, 10).await;
    assert_eq!(claimed(&reply), ["n1", "n2"]);
    assert_eq!(deferred(&reply), ["n3"]);
    let now = redis_now(&mut conn).await;
    let n3 = run_at(&mut conn, &keys, "n3").await;
    assert!(n3 <= now + 1000, "n3 deferred {} ms ahead", n3 - now);
}

/// A change of the every-key default (1/60000 to 2/1000) releases every
/// key's deferred jobs, and they are booked again as first deferrals under
/// the new rate: one step (500 ms) apart from now, not all at once.
#[tokio::test]
async fn a_new_every_key_rate_books_the_deferred_jobs_again_under_it() {
    let (_server, mut conn, keys) = setup("limits-rebook").await;
    let ids: Vec<String> = (0..6).map(|i| format!("j{i}")).collect();
    for id in &ids {
        enqueue(&mut conn, &keys, id, Some("t")).await;
    }
    set(&mut conn, &keys, &[("key_rate", "1/60000")]).await;
    assert_eq!(deferred(&fetch(&mut conn, &keys, 10).await).len(), 5);

    let changed = set(&mut conn, &keys, &[("key_rate", "2/1000")]).await;
    assert_eq!((changed.released, changed.pending), (5, 0));
    let promoted = Promote {
        keys: &keys,
        limit: 100,
    }
    .run(&mut conn)
    .await
    .unwrap();
    assert_eq!(promoted.promoted, 5);
    // j0's start leaves the window.
    let _: () = conn
        .del(format!("{}:started:t", keys.limits()))
        .await
        .unwrap();
    let reply = fetch(&mut conn, &keys, 10).await;
    assert_eq!(claimed(&reply), ["j1", "j2"]);
    let again = deferred(&reply);
    assert_eq!(again, ["j3", "j4", "j5"]);
    let mut at = Vec::new();
    for id in &again {
        at.push(run_at(&mut conn, &keys, id).await);
    }
    let now = redis_now(&mut conn).await;
    assert!(at[0] <= now + 1000, "{at:?} (now {now})");
    assert_eq!([at[1] - at[0], at[2] - at[1]], [500, 500], "{at:?}");
}

/// A release left pending (more deferred jobs than one call releases) takes
/// only the jobs deferred before the change: 600 jobs of key `t` deferred at
/// 1/60000, the every-key rate changed to 2/1000 by one call (500 released,
/// the key still pending), the released jobs promoted and fetched (some
/// deferred again, under the new rate). The next call releases the 100 left
/// from before the change; the jobs deferred after it keep their run_at.
#[tokio::test]
async fn a_pending_release_leaves_the_jobs_deferred_after_the_change() {
    let (_server, mut conn, keys) = setup("limits-release-pending").await;
    for i in 0..601 {
        enqueue(&mut conn, &keys, &format!("j{i}"), Some("t")).await;
    }
    set(&mut conn, &keys, &[("key_rate", "1/60000")]).await;
    assert_eq!(deferred(&fetch(&mut conn, &keys, 700).await).len(), 600);

    let change = fields(&[("key_rate", "2/1000")]);
    let first = SetLimits::Fields(&change)
        .run(&keys, &mut conn)
        .await
        .unwrap();
    assert_eq!((first.released, first.pending), (500, 1));
    let releasing = format!("{}:releasing", keys.limits());
    let marked: f64 = conn.zscore(&releasing, "t").await.unwrap();
    // Deferrals after the change come at a later Redis ms than its mark.
    while redis_now(&mut conn).await <= marked as u64 {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let promoted = Promote {
        keys: &keys,
        limit: 1000,
    }
    .run(&mut conn)
    .await
    .unwrap();
    assert_eq!(promoted.promoted, 500);
    let again = deferred(&fetch(&mut conn, &keys, 10).await);
    assert!(again.len() >= 50, "{again:?}");
    let mut booked = Vec::new();
    for id in &again {
        booked.push(run_at(&mut conn, &keys, id).await);
    }

    let rest = SetLimits::Release.run(&keys, &mut conn).await.unwrap();
    assert_eq!((rest.released, rest.pending), (100, 0));
    for (id, at) in again.iter().zip(booked) {
        assert_eq!(run_at(&mut conn, &keys, id).await, at, "{id}");
        let slot: Option<u64> = conn.hget(keys.job(id), "limit_slot").await.unwrap();
        assert_eq!(slot, Some(at), "{id}");
    }
}

/// `fields` as `SetLimits::Fields` takes them.
fn fields(fields: &[(&str, &str)]) -> Vec<(String, String)> {
    fields
        .iter()
        .map(|(n, v)| (n.to_string(), v.to_string()))
        .collect()
}

/// Keys `k0`..`k<n-1>`, two jobs each, at an every-key rate of 1/60000: one
/// fetch starts the first job of each key and defers the other (`n`
/// deferred jobs, `n` keys in `deferkeys`).
async fn defer_one_job_of_each_key(conn: &mut RedisConnection, keys: &QueueKeys, n: usize) {
    for k in 0..n {
        let key = format!("k{k}");
        for job in ["a", "b"] {
            enqueue(conn, keys, &format!("{key}-{job}"), Some(&key)).await;
        }
    }
    set(conn, keys, &[("key_rate", "1/60000")]).await;
    assert_eq!(deferred(&fetch(conn, keys, 2 * n + 100).await).len(), n);
}

/// One `set_limits` call (not run to the end) changing the every-key rate to
/// 2/1000, which leaves the walk of `deferkeys` pending.
async fn every_key_change_left_pending(
    conn: &mut RedisConnection,
    keys: &QueueKeys,
) -> SetLimitsReply {
    let change = fields(&[("key_rate", "2/1000")]);
    let first = SetLimits::Fields(&change).run(keys, conn).await.unwrap();
    assert!(first.pending > 0, "{first:?}");
    first
}

/// A change of the every-key rate with 600 keys, each with one deferred
/// job. Before, one call marked all 600 keys (two writes each: 301,500
/// keys blocked Redis for a second); now a call marks one chunk of
/// `deferkeys` (at most 500 keys) and answers the rest pending, and the
/// calls that follow release every key's job.
#[tokio::test]
async fn an_every_key_change_marks_the_keys_a_chunk_per_call() {
    let (_server, mut conn, keys) = setup("limits-release-every").await;
    defer_one_job_of_each_key(&mut conn, &keys, 600).await;
    let first = every_key_change_left_pending(&mut conn, &keys).await;
    // Marked: the keys released, and those marked and still to release.
    let releasing = format!("{}:releasing", keys.limits());
    let still: Vec<String> = conn.zrange(&releasing, 0, -1).await.unwrap();
    let marked = first.released as usize + still.iter().filter(|k| !k.is_empty()).count();
    assert!(
        marked > 0 && marked <= 500,
        "{marked} keys marked by one call"
    );

    let rest = SetLimits::Release
        .run_to_end(&keys, &mut conn)
        .await
        .unwrap();
    assert_eq!(first.released + rest.released, 600);
    assert_eq!(rest.pending, 0);
    let now = redis_now(&mut conn).await;
    let due: u64 = conn.zcount(&keys.delayed, "-inf", now).await.unwrap();
    assert_eq!(due, 600);
    let left: u64 = conn
        .zcard(format!("{}:deferkeys", keys.limits()))
        .await
        .unwrap();
    assert_eq!(left, 0, "the keys' indexes are empty: they leave deferkeys");
}

/// The operator's release of one key (`Queue::release_deferred`): more
/// deferred jobs than one call releases (500) are released over several
/// calls, the first answering the rest as pending; another key's deferred
/// jobs stay where they are.
#[tokio::test]
async fn releasing_a_keys_deferred_jobs_takes_several_calls_and_only_that_key() {
    let (_server, mut conn, keys) = setup("limits-release-chunks").await;
    for i in 0..601 {
        enqueue(&mut conn, &keys, &format!("a{i}"), Some("a")).await;
    }
    for id in ["b0", "b1"] {
        enqueue(&mut conn, &keys, id, Some("b")).await;
    }
    set(&mut conn, &keys, &[("key_rate", "1/60000")]).await;
    let reply = fetch(&mut conn, &keys, 700).await;
    assert_eq!(claimed(&reply), ["a0", "b0"]);
    assert_eq!(deferred(&reply).len(), 601);
    let b1 = run_at(&mut conn, &keys, "b1").await;

    let first = SetLimits::ReleaseDeferred(Some("a"))
        .run(&keys, &mut conn)
        .await
        .unwrap();
    assert_eq!((first.released, first.pending), (500, 1));
    let rest = SetLimits::Release.run(&keys, &mut conn).await.unwrap();
    assert_eq!((rest.released, rest.pending), (100, 0));
    let now = redis_now(&mut conn).await;
    let due: u64 = conn.zcount(&keys.delayed, "-inf", now).await.unwrap();
    assert_eq!(due, 600);
    assert_eq!(run_at(&mut conn, &keys, "b1").await, b1);
}

/// Key 1/60000, A to E: A starts, B to E are booked one window apart. They
/// all come back late at once (their booking ten minutes past, as after a
/// pause or an outage) while A's start is in the window. Each was taken for
/// a job back early and deferred to A's start + 60 s, the same time for all
/// four (none extending the booking: they bounced together again, smallest
/// id first, and under sustained overload the last never ran). Now they
/// book on the key's chain, one window apart. Then all four come back on
/// time in one fetch (within a step of their bookings): only the first is
/// deferred to the window's own wait, the others book on.
#[tokio::test]
async fn deferred_jobs_back_late_book_on_the_chain_instead_of_bouncing_together() {
    let (_server, mut conn, keys) = setup("limits-back-late").await;
    let ids = ["A", "B", "C", "D", "E"];
    for id in ids {
        enqueue(&mut conn, &keys, id, Some("k")).await;
    }
    set(&mut conn, &keys, &[("key_rate", "1/60000")]).await;
    let reply = fetch(&mut conn, &keys, 10).await;
    assert_eq!(claimed(&reply), ["A"]);
    assert_eq!(deferred(&reply), ["B", "C", "D", "E"]);

    for back in [600_000, 0] {
        let now = redis_now(&mut conn).await;
        let booked = (now - back).to_string();
        for id in &ids[1..] {
            let () = conn
                .hset_multiple(
                    keys.job(id),
                    &[("limit_slot", &booked), ("run_at", &booked)],
                )
                .await
                .unwrap();
            let () = conn.zadd(&keys.delayed, id, now).await.unwrap();
        }
        let promoted = Promote {
            keys: &keys,
            limit: 10,
        }
        .run(&mut conn)
        .await
        .unwrap();
        assert_eq!(promoted.promoted, 4);
        assert_eq!(deferred(&fetch(&mut conn, &keys, 10).await), ids[1..]);
        let mut at = Vec::new();
        for id in &ids[1..] {
            at.push(run_at(&mut conn, &keys, id).await);
        }
        at.sort_unstable();
        for pair in at.windows(2) {
            assert!(
                pair[1] >= pair[0] + 60_000,
                "back {back} ms late: run_at {at:?}"
            );
        }
    }
}

/// A deferred job that expires at its claim (dead-lettered `expired`) leaves
/// its key's index, and the key leaves `deferkeys` with its last entry;
/// before, its entry stayed (every deferral of the key pushed the index's
/// TTL on: on a key always over its limit the index grew without bound),
/// and so did its `limit_slot`. An entry older than any booking (a job
/// purged long ago) is trimmed by the key's next deferral. A replayed job
/// loses a `limit_slot` left on it.
#[tokio::test]
async fn a_deferred_job_that_expires_at_its_claim_leaves_its_keys_index() {
    let (_server, mut conn, keys) = setup("limits-index-exits").await;
    for id in ["A", "B"] {
        enqueue(&mut conn, &keys, id, Some("k")).await;
    }
    set(&mut conn, &keys, &[("key_rate", "1/60000")]).await;
    let reply = fetch(&mut conn, &keys, 10).await;
    assert_eq!(deferred(&reply), ["B"]);
    let index = format!("{}:deferred:k", keys.limits());
    let deferkeys = format!("{}:deferkeys", keys.limits());
    let now = redis_now(&mut conn).await;
    let () = conn
        .hset(keys.job("B"), "expires_at", now - 1)
        .await
        .unwrap();
    // A's start leaves the window; B comes back and expires at its claim.
    let _: () = conn
        .del(format!("{}:started:k", keys.limits()))
        .await
        .unwrap();
    make_due(&mut conn, &keys, "B").await;
    let FetchReply::Rows(rows) = fetch(&mut conn, &keys, 10).await else {
        panic!("rows expected")
    };
    assert!(
        matches!(rows.as_slice(), [ClaimRow::Skipped(id, Skip::Expired)] if id.as_str() == "B"),
        "{rows:?}"
    );
    let entry: Option<f64> = conn.zscore(&index, "B").await.unwrap();
    assert_eq!(entry, None, "B left the index");
    let slot: Option<String> = conn.hget(keys.job("B"), "limit_slot").await.unwrap();
    assert_eq!(slot, None);
    // k's index is empty, but its booking lives: k stays in deferkeys (a
    // change of the every-key limits must still reach it and drop the
    // booking).
    let key: Option<f64> = conn.zscore(&deferkeys, "k").await.unwrap();
    let booked: bool = conn
        .exists(format!("{}:next:k", keys.limits()))
        .await
        .unwrap();
    assert!(booked);
    assert!(key.is_some(), "k left deferkeys while booked");

    // An entry deferred longer ago than any booking reaches is trimmed.
    let long_ago = redis_now(&mut conn).await - 604_800_000 - 60_000 - 1_000;
    let () = conn.zadd(&index, "purged", long_ago).await.unwrap();
    for id in ["C", "D"] {
        enqueue(&mut conn, &keys, id, Some("k")).await;
    }
    assert_eq!(deferred(&fetch(&mut conn, &keys, 10).await), ["D"]);
    let indexed: Vec<String> = conn.zrange(&index, 0, -1).await.unwrap();
    assert_eq!(indexed, ["D"]);

    // A dead job's `limit_slot` (left by an older version) goes at replay.
    let () = conn.hset(keys.job("B"), "limit_slot", now).await.unwrap();
    let replayed = Replay {
        keys: &keys,
        id: &"B".into(),
        reset_attempts: false,
    }
    .run(&mut conn)
    .await
    .unwrap();
    assert_eq!(replayed, ReplayReply::Replayed);
    let slot: Option<String> = conn.hget(keys.job("B"), "limit_slot").await.unwrap();
    assert_eq!(slot, None);
}

/// `limit_slot` is the limits' own job field: an enqueue may not set it as
/// an extra field (`validate` and `enqueue.lua` refuse it before any
/// write); before, a job enqueued with it was taken for one back from its
/// booking.
#[tokio::test]
async fn an_enqueue_may_not_set_limit_slot() {
    let (_server, mut conn, keys) = setup("limits-core-field").await;
    let extra = fields(&[("limit_slot", "0")]);
    let opts = crate::EnqueueOptions {
        extra_fields: extra.clone(),
        ..crate::EnqueueOptions::new().id("j")
    };
    let err = opts.validate(&keys.queue).unwrap_err();
    assert!(
        matches!(err, crate::QueueError::InvalidExtraField { .. }),
        "{err}"
    );
    let err = Enqueue {
        extra: &extra,
        ..Enqueue::test_job(&keys, &"j".into(), 3)
    }
    .run(&mut conn)
    .await
    .unwrap_err();
    assert!(err.to_string().contains("core job field"), "{err}");
    assert!(!conn.exists::<_, bool>(keys.job("j")).await.unwrap());
}

/// Key `k` at 1/60000: A starts, B is deferred (booking `next:k` one step
/// on), later B is claimed (the key's index is empty). The every-key rate
/// then becomes 2/1000, and of two new jobs C and D, D must wait at
/// most one new window. Before, the claim of B took `k` out of `deferkeys`
/// with its index's last entry while the booking still lived: the every-key
/// change's walk never reached `k`, its old booking stayed, and D was
/// deferred behind it (~60 s instead of 1 s).
#[tokio::test]
async fn an_every_key_change_drops_the_booking_of_a_key_whose_deferred_jobs_all_ran() {
    let (_server, mut conn, keys) = setup("limits-booking-after-claim").await;
    for id in ["A", "B"] {
        enqueue(&mut conn, &keys, id, Some("k")).await;
    }
    set(&mut conn, &keys, &[("key_rate", "1/60000")]).await;
    assert_eq!(deferred(&fetch(&mut conn, &keys, 10).await), ["B"]);
    let _: () = conn
        .del(format!("{}:started:k", keys.limits()))
        .await
        .unwrap();
    make_due(&mut conn, &keys, "B").await;
    assert_eq!(claimed(&fetch(&mut conn, &keys, 10).await), ["B"]);

    set(&mut conn, &keys, &[("key_rate", "2/1000")]).await;
    for id in ["C", "D"] {
        enqueue(&mut conn, &keys, id, Some("k")).await;
    }
    // B's start and C's fill the new window: D waits for it.
    let reply = fetch(&mut conn, &keys, 10).await;
    assert_eq!(deferred(&reply), ["D"], "{reply:?}");
    let now = redis_now(&mut conn).await;
    let at = run_at(&mut conn, &keys, "D").await;
    assert!(
        at <= now + 1000,
        "D deferred {} ms ahead under 2/1000",
        at.saturating_sub(now)
    );
}

/// An every-key walk under way whose cursor key holds a number ZSCAN does
/// not read (`1e2`, `0x10`, `12.0`, ` 7`: numbers to Lua) restarts the walk.
/// Before, the call wrote (the limit, the key's mark and booking) and then
/// failed at ZSCAN ("invalid cursor"), and so did every later call until an
/// every-key change dropped the cursor.
#[tokio::test]
async fn a_walk_cursor_zscan_cannot_read_restarts_the_walk() {
    let (_server, mut conn, keys) = setup("limits-walk-cursor").await;
    defer_one_job_of_each_key(&mut conn, &keys, 300).await;
    every_key_change_left_pending(&mut conn, &keys).await;
    let walk = format!("{}:walk", keys.limits());
    for bad in ["1e2", "0x10", "12.0", " 7"] {
        let () = conn.set(&walk, bad).await.unwrap();
        let one = fields(&[("key_rate:k1", "3/1000")]);
        SetLimits::Fields(&one)
            .run(&keys, &mut conn)
            .await
            .unwrap_or_else(|e| panic!("cursor {bad:?}: {e}"));
    }
    let rest = SetLimits::Release
        .run_to_end(&keys, &mut conn)
        .await
        .unwrap();
    assert_eq!(rest.pending, 0, "{rest:?}");
}

/// Cancels delayed job `id` (`cancel.lua`).
async fn cancel(conn: &mut RedisConnection, keys: &QueueKeys, id: &str) {
    let outcome = super::cancel::Cancel {
        keys,
        id: &id.into(),
        retention: Duration::from_secs(60),
    }
    .run(conn)
    .await
    .unwrap();
    assert!(
        matches!(outcome, crate::flow::CancelOutcome::Cancelled { .. }),
        "{id}: {outcome:?}"
    );
}

/// Key `acme` at 1/60000, jobs A–J: A starts, B–J are deferred +60 s to
/// +540 s and the booking is at +600 s. Cancelling B–J removed the jobs,
/// not the booking: the key's next job K was deferred behind the empty
/// chain (+600 s; 1,000 cancelled jobs: +16.7 h). The cancel takes each job
/// out of the key's index and, with the last, drops the booking: K waits
/// for A's start to leave the window, no more.
#[tokio::test]
async fn cancelling_a_keys_deferred_jobs_does_not_leave_its_next_jobs_behind_their_slots() {
    let (_server, mut conn, keys) = setup("limits-cancel-deferred").await;
    let ids = ["A", "B", "C", "D", "E", "F", "G", "H", "I", "J"];
    for id in ids {
        enqueue(&mut conn, &keys, id, Some("acme")).await;
    }
    set(&mut conn, &keys, &[("key_rate", "1/60000")]).await;
    let reply = fetch(&mut conn, &keys, 10).await;
    assert_eq!(claimed(&reply), ["A"]);
    assert_eq!(deferred(&reply), ids[1..]);
    for id in &ids[1..] {
        cancel(&mut conn, &keys, id).await;
    }
    assert_eq!(conn.zcard::<_, u64>(&keys.delayed).await.unwrap(), 0);
    let index = format!("{}:deferred:acme", keys.limits());
    assert!(
        !conn.exists::<_, bool>(&index).await.unwrap(),
        "index empty"
    );
    assert!(!conn
        .exists::<_, bool>(format!("{}:next:acme", keys.limits()))
        .await
        .unwrap());

    enqueue(&mut conn, &keys, "K", Some("acme")).await;
    assert_eq!(deferred(&fetch(&mut conn, &keys, 10).await), ["K"]);
    let now = redis_now(&mut conn).await;
    let at = run_at(&mut conn, &keys, "K").await;
    assert!(
        at <= now + 60_000,
        "K deferred {} ms ahead",
        at.saturating_sub(now)
    );
}

/// The same chain, its jobs and index gone without a cancel (deleted by
/// hand, evicted): the booking at +600 s is further ahead than the key's
/// indexed jobs (none) can fill, so the next job's deferral does not follow
/// it and starts the chain again; a booking the index accounts for is still
/// followed.
#[tokio::test]
async fn a_booking_its_indexed_jobs_cannot_fill_is_not_followed() {
    let (_server, mut conn, keys) = setup("limits-stale-booking").await;
    let ids = ["A", "B", "C", "D", "E", "F", "G", "H", "I", "J"];
    for id in ids {
        enqueue(&mut conn, &keys, id, Some("acme")).await;
    }
    set(&mut conn, &keys, &[("key_rate", "1/60000")]).await;
    assert_eq!(deferred(&fetch(&mut conn, &keys, 10).await), ids[1..]);
    for id in &ids[1..] {
        let _: () = conn.zrem(&keys.delayed, id).await.unwrap();
        let _: () = conn.del(keys.job(id)).await.unwrap();
    }
    let _: () = conn
        .del(format!("{}:deferred:acme", keys.limits()))
        .await
        .unwrap();

    for id in ["K", "L"] {
        enqueue(&mut conn, &keys, id, Some("acme")).await;
    }
    assert_eq!(deferred(&fetch(&mut conn, &keys, 10).await), ["K", "L"]);
    let now = redis_now(&mut conn).await;
    let (k, l) = (
        run_at(&mut conn, &keys, "K").await,
        run_at(&mut conn, &keys, "L").await,
    );
    assert!(
        k <= now + 60_000,
        "K deferred {} ms ahead",
        k.saturating_sub(now)
    );
    assert_eq!(l, k + 60_000, "L booked on K's new chain");
}

/// A rate of `0/W` or a concurrency of 0 was accepted: nothing of the queue
/// (or of the key) ever started, its jobs went round between delayed and
/// main for ever, and nothing reported it. `set_limits.lua` and the Rust
/// setters refuse it, pointing to a pause, before any write.
#[tokio::test]
async fn a_limit_of_zero_is_refused_before_any_write() {
    let (server, mut conn, keys) = setup("limits-zero").await;
    set(&mut conn, &keys, &[("key_rate", "1/1000")]).await;
    let before: Vec<(String, String)> = conn.hgetall(keys.limits()).await.unwrap();
    for zero in [
        ("rate", "0/1000"),
        ("concurrency", "0"),
        ("key_rate", "0/60000"),
        ("key_concurrency:acme", "0"),
    ] {
        let fields = fields(&[("key_rate:other", "2/1000"), zero]);
        let err = SetLimits::Fields(&fields)
            .run(&keys, &mut conn)
            .await
            .unwrap_err();
        assert!(err.to_string().contains("pause"), "{zero:?}: {err}");
    }
    let queue = crate::Queue::connect(&server.url()).await.unwrap();
    let err = queue
        .set_concurrency_limit(&keys.queue, crate::LimitScope::Queue, 0)
        .await
        .unwrap_err();
    assert!(
        matches!(&err, crate::QueueError::Config(m) if m.contains("pause")),
        "{err}"
    );
    let zero_rate = crate::RateLimit::new(0, Duration::from_secs(1));
    let err = queue
        .set_rate_limit(
            &keys.queue,
            crate::LimitScope::Key("acme".into()),
            zero_rate,
        )
        .await
        .unwrap_err();
    assert!(
        matches!(&err, crate::QueueError::Config(m) if m.contains("pause")),
        "{err}"
    );
    let after: Vec<(String, String)> = conn.hgetall(keys.limits()).await.unwrap();
    assert_eq!(after, before, "the limits hash is unchanged");
}

/// Adds `n` members `<prefix><i>` to zset `key`, each scored `score`.
async fn seed_zset(conn: &mut RedisConnection, key: &str, prefix: &str, n: usize, score: u64) {
    let members: Vec<(u64, String)> = (0..n).map(|i| (score, format!("{prefix}{i}"))).collect();
    let _: () = conn.zadd_multiple(key, &members).await.unwrap();
}

/// A key's running set holding many ids whose leases passed (a burst of
/// claims, then an idle queue: nothing swept them) is pruned a bounded
/// chunk per call: one claim used to remove them all in one script (with
/// 200,000 of them, a 0.5 s stall of Redis), and the count stays right
/// meanwhile (an id with no lease is not counted). Stop 47 review.
#[tokio::test]
async fn a_keys_stale_running_ids_are_pruned_a_chunk_per_call() {
    let (_server, mut conn, keys) = setup("limits-prune").await;
    set(&mut conn, &keys, &[("key_concurrency", "5")]).await;
    let running = format!("{}:running:acme", keys.limits());
    let past = redis_now(&mut conn).await - 60_000;
    seed_zset(&mut conn, &running, "old", 1_000, past).await;
    let mut claims = Vec::new();
    let mut left = Vec::new();
    for i in 1..=5 {
        let id = format!("j{i}");
        enqueue(&mut conn, &keys, &id, Some("acme")).await;
        // Under the cap of 5 whatever is left to prune: no stale id counts.
        claims.extend(claimed(&fetch(&mut conn, &keys, 1).await));
        left.push(conn.zcard::<_, u64>(&running).await.unwrap());
    }
    assert_eq!(claims, ["j1", "j2", "j3", "j4", "j5"]);
    assert!(
        (700..=1_000).contains(&left[0]),
        "one call pruned a bounded chunk: {left:?} left after each call"
    );
    let live: Vec<String> = conn.zrange(&running, 0, -1).await.unwrap();
    assert_eq!(
        live,
        ["j1", "j2", "j3", "j4", "j5"],
        "every stale id pruned over later calls ({left:?} left after each)"
    );
}

/// The expired entries of `<limits>:deferkeys`, and a key's index entries
/// past any booking, are dropped a bounded chunk per deferral: one deferral
/// after a long quiet spell used to drop them all in one script (500,000
/// keys: a 0.24 s stall). Stop 47 review.
#[tokio::test]
async fn expired_deferral_indexes_are_dropped_a_chunk_per_call() {
    let (_server, mut conn, keys) = setup("limits-deferkeys").await;
    set(&mut conn, &keys, &[("key_rate", "1/10000")]).await;
    let deferkeys = format!("{}:deferkeys", keys.limits());
    let index = format!("{}:deferred:A", keys.limits());
    let now = redis_now(&mut conn).await;
    seed_zset(&mut conn, &deferkeys, "gone", 1_000, now - 1_000).await;
    seed_zset(&mut conn, &index, "old", 1_000, now - 8 * 86_400_000).await;
    for id in ["a1", "a2"] {
        enqueue(&mut conn, &keys, id, Some("A")).await;
    }
    let reply = fetch(&mut conn, &keys, 2).await;
    assert_eq!(
        (claimed(&reply), deferred(&reply)),
        (vec!["a1".to_string()], vec!["a2".to_string()])
    );
    let keys_left: u64 = conn.zcard(&deferkeys).await.unwrap();
    let index_left: u64 = conn.zcard(&index).await.unwrap();
    assert!(
        (700..=1_001).contains(&keys_left) && (700..=1_001).contains(&index_left),
        "one deferral dropped a bounded chunk: {keys_left} keys and {index_left} index entries left"
    );
    assert!(conn
        .zscore::<_, _, Option<f64>>(&deferkeys, "A")
        .await
        .unwrap()
        .is_some());
    assert!(conn
        .zscore::<_, _, Option<f64>>(&index, "a2")
        .await
        .unwrap()
        .is_some());
}

/// A heartbeat that comes after its lease passed, before the watchdog
/// reclaimed the job, holds the lease again (the token still matches), and
/// the job counts again under its key's concurrency cap. The fetch that
/// found the lease expired had dropped it from the key's running set: before,
/// the revived job was not counted for the rest of its run, and a cap of 1
/// let a third job start beside it (review).
#[tokio::test]
async fn a_lease_revived_by_a_late_heartbeat_counts_again_under_its_keys_cap() {
    let (_server, mut conn, keys) = setup("limits-revived").await;
    set(&mut conn, &keys, &[("key_concurrency", "1")]).await;
    enqueue(&mut conn, &keys, "j1", Some("acme")).await;
    let short = Duration::from_millis(200);
    let reply = fetch_leased(&mut conn, &keys, 1, short).await;
    let FetchReply::Rows(rows) = reply else {
        panic!("rows expected")
    };
    let Some(ClaimRow::Claimed(j1)) = rows.into_iter().next() else {
        panic!("j1 claimed")
    };
    tokio::time::sleep(short + Duration::from_millis(100)).await;
    // j1's lease passed: its slot is free, and j2 takes it.
    enqueue(&mut conn, &keys, "j2", Some("acme")).await;
    assert_eq!(claimed(&fetch(&mut conn, &keys, 1).await), ["j2"]);
    // j1's worker was only late: its heartbeat holds the lease again.
    let extended = super::extend::Extend {
        keys: &keys,
        id: &j1.id,
        token: &j1.token,
        lease: LEASE,
    }
    .run(&mut conn)
    .await
    .unwrap();
    assert!(
        matches!(extended, super::extend::ExtendReply::Extended { .. }),
        "{extended:?}"
    );
    // j2 ends; j1 still runs: the key is at its cap.
    let _: () = conn.zrem(&keys.leases, "j2").await.unwrap();
    enqueue(&mut conn, &keys, "j3", Some("acme")).await;
    let reply = fetch(&mut conn, &keys, 1).await;
    assert_eq!(
        (claimed(&reply), deferred(&reply)),
        (Vec::<String>::new(), vec!["j3".to_string()]),
        "j1 counts under the cap of 1"
    );
}
