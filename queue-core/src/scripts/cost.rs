//! Script-level cost bench of the hot path (issue #12), run by hand against a
//! throwaway redis-server: Redis time per job of `enqueue.lua`, `fetch.lua`
//! and `ack.lua` and the `redis.call`s each makes per job (from `INFO
//! commandstats`), the ack cost with 16 vs 4 096 jobs in flight (`LREM` on
//! processing), and `MEMORY USAGE` of a completion record. Ignored by default:
//! `cargo test --release -p queue-core --lib cost -- --ignored --nocapture`.

use std::collections::BTreeMap;
use std::time::Duration;

use super::ack::{Ack, AckItem};
use super::enqueue::Enqueue;
use super::fetch::Fetch;
use crate::conn::RedisConnection;
use crate::job::JobId;
use crate::keys::QueueKeys;

const JOBS: usize = 4000;

/// Jobs per fetch and per ack call: 16, or `COST_BATCH` (1 shows the fixed
/// cost a script call pays, as at concurrency 1).
fn batch() -> usize {
    std::env::var("COST_BATCH")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|&n| n > 0)
        .unwrap_or(16)
}

/// `cmdstat_<name>` → (calls, usec) after the last `CONFIG RESETSTAT`.
async fn commandstats(conn: &mut RedisConnection) -> BTreeMap<String, (u64, u64)> {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(conn)
        .await
        .unwrap();
    let mut out = BTreeMap::new();
    for line in info.lines() {
        let Some((name, rest)) = line
            .strip_prefix("cmdstat_")
            .and_then(|l| l.split_once(':'))
        else {
            continue;
        };
        let field = |f: &str| -> u64 {
            rest.split(',')
                .find_map(|kv| kv.strip_prefix(f))
                .and_then(|v| v.parse().ok())
                .unwrap_or(0)
        };
        out.insert(name.to_string(), (field("calls="), field("usec=")));
    }
    out
}

async fn reset(conn: &mut RedisConnection) {
    let _: () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query_async(conn)
        .await
        .unwrap();
}

/// Script calls and their µs: `FCALL` (the library), `EVALSHA` (a
/// build from before it).
fn script_calls(stats: &BTreeMap<String, (u64, u64)>) -> (u64, u64) {
    ["fcall", "evalsha"]
        .iter()
        .filter_map(|n| stats.get(*n))
        .fold((0, 0), |(c, u), (c2, u2)| (c + c2, u + u2))
}

/// Commands sent by the client, not run by a script: left out of the
/// per-script breakdown.
fn is_outer(name: &str) -> bool {
    matches!(
        name,
        "fcall"
            | "evalsha"
            | "info"
            | "config"
            | "config|resetstat"
            | "function|load"
            | "script|load"
    )
}

/// Prints the script µs per job and the commands the scripts ran per job.
async fn report(conn: &mut RedisConnection, what: &str, jobs: usize) {
    let stats = commandstats(conn).await;
    let (calls, usec) = script_calls(&stats);
    let inner: Vec<String> = stats
        .iter()
        .filter(|(n, _)| !is_outer(n))
        .map(|(n, (c, u))| {
            format!(
                "{n} {:.2} ({:.2} us)",
                *c as f64 / jobs as f64,
                *u as f64 / jobs as f64
            )
        })
        .collect();
    let total: u64 = stats
        .iter()
        .filter(|(n, _)| !is_outer(n))
        .map(|(_, (c, _))| c)
        .sum();
    let inner_usec: u64 = stats
        .iter()
        .filter(|(n, _)| !is_outer(n))
        .map(|(_, (_, u))| u)
        .sum();
    println!(
        "{what}: {:.2} us/job ({calls} scripts; inside them {:.2} us/job in commands, the rest Lua), \
         redis.calls/job {:.2}: {}",
        usec as f64 / jobs as f64,
        inner_usec as f64 / jobs as f64,
        total as f64 / jobs as f64,
        inner.join(", ")
    );
}

async fn enqueue(conn: &mut RedisConnection, keys: &QueueKeys, id: &str) {
    let id = JobId::from(id);
    Enqueue {
        payload: b"p",
        ..Enqueue::test_job(keys, &id, 3)
    }
    .run_with_token(conn, &uuid::Uuid::new_v4().to_string())
    .await
    .unwrap();
}

/// `enqueue_many.lua` (what `Queue` sends) with generated ids, [`batch()`]
/// jobs per call, on a queue of its own.
async fn enqueue_many_cost(conn: &mut RedisConnection) {
    use super::enqueue_many::{run, ManyJob, Mode};
    let keys = QueueKeys::new("cost-many");
    let ids: Vec<JobId> = (0..JOBS)
        .map(|_| JobId::from(uuid::Uuid::new_v4().to_string()))
        .collect();
    let tokens: Vec<String> = (0..JOBS).map(|i| format!("t{i}")).collect();
    reset(conn).await;
    for (ids, tokens) in ids.chunks(batch()).zip(tokens.chunks(batch())) {
        let jobs: Vec<ManyJob<'_>> = ids
            .iter()
            .zip(tokens)
            .map(|(id, token)| ManyJob {
                job: Enqueue {
                    payload: b"p",
                    ..Enqueue::test_job(&keys, id, 3)
                },
                token,
                fresh: true,
            })
            .collect();
        run(conn, &keys, Mode::Each, &jobs).await.unwrap();
    }
    report(
        conn,
        &format!("enqueue_many (batches of {})", batch()),
        JOBS,
    )
    .await;
}

/// Fetches up to `n` waiting jobs in batches of [`batch()`]; the
/// deliveries oldest first.
async fn fetch_n(conn: &mut RedisConnection, keys: &QueueKeys, n: usize) -> Vec<AckItem> {
    let mut out = Vec::new();
    while out.len() < n {
        let base = uuid::Uuid::new_v4().to_string();
        let rows = Fetch {
            keys,
            lease: Duration::from_secs(300),
            token_base: &base,
            count: batch().min(n - out.len()),
            first_try: true, // a fresh base, as the worker's first try
        }
        .run(conn)
        .await
        .unwrap();
        if rows.is_empty() {
            break;
        }
        for row in rows {
            match row {
                super::claim::ClaimRow::Claimed(d) => out.push(AckItem::of(&d, None)),
                other => panic!("unexpected row {other:?}"),
            }
        }
    }
    out
}

async fn ack(conn: &mut RedisConnection, keys: &QueueKeys, items: &[AckItem]) {
    Ack {
        keys,
        worker: "",
        items,
        retention: Duration::from_secs(86_400),
        compact: false,
    }
    .run(conn)
    .await
    .unwrap();
}

/// Ack cost with `in_flight` jobs in processing: the oldest [`batch()`] are
/// acked per call while as many new deliveries join at the head.
async fn ack_in_flight(conn: &mut RedisConnection, in_flight: usize) {
    let keys = QueueKeys::new(&format!("flight{in_flight}"));
    for i in 0..in_flight + JOBS {
        enqueue(conn, &keys, &format!("j{i}")).await;
    }
    let mut flying = fetch_n(conn, &keys, in_flight).await;
    let (mut ack_calls, mut ack_usec, mut lrem_calls, mut lrem_usec) = (0u64, 0u64, 0u64, 0u64);
    for _ in 0..JOBS / batch() {
        let mut next = fetch_n(conn, &keys, batch()).await;
        flying.append(&mut next);
        let oldest: Vec<AckItem> = flying.drain(..batch()).collect();
        reset(conn).await;
        ack(conn, &keys, &oldest).await;
        let s = commandstats(conn).await;
        let (c, u) = script_calls(&s);
        ack_calls += c;
        ack_usec += u;
        let (c, u) = s.get("lrem").copied().unwrap_or_default();
        lrem_calls += c;
        lrem_usec += u;
    }
    println!(
        "ack with {in_flight} in flight: {:.2} us/job ({ack_calls} scripts of {}), LREM {:.2} us/call",
        ack_usec as f64 / (ack_calls as f64 * batch() as f64),
        batch(),
        lrem_usec as f64 / lrem_calls as f64
    );
}

#[tokio::test]
#[ignore = "a bench: run by hand with --ignored --nocapture"]
async fn hot_path_cost() {
    let (_server, mut conn) = crate::scripts::test_redis().await;
    let keys = QueueKeys::new("cost");
    reset(&mut conn).await;
    for i in 0..JOBS {
        enqueue(&mut conn, &keys, &format!("job-{i}")).await;
    }
    report(&mut conn, "enqueue", JOBS).await;
    enqueue_many_cost(&mut conn).await;
    reset(&mut conn).await;
    let items = fetch_n(&mut conn, &keys, JOBS).await;
    assert_eq!(items.len(), JOBS);
    report(&mut conn, &format!("fetch (batches of {})", batch()), JOBS).await;
    reset(&mut conn).await;
    for chunk in items.chunks(batch()) {
        ack(&mut conn, &keys, chunk).await;
    }
    report(&mut conn, &format!("ack (batches of {})", batch()), JOBS).await;
    let done: Option<u64> = redis::cmd("MEMORY")
        .arg("USAGE")
        .arg(keys.done("job-1"))
        .query_async(&mut conn)
        .await
        .unwrap();
    let fields: Vec<String> = redis::cmd("HKEYS")
        .arg(keys.done("job-1"))
        .query_async(&mut conn)
        .await
        .unwrap_or_default();
    println!(
        "completion record: MEMORY USAGE {} B, fields {fields:?}",
        done.unwrap_or(0)
    );
    for in_flight in [16, 4096] {
        ack_in_flight(&mut conn, in_flight).await;
    }
}
