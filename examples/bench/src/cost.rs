//! "Cost does not grow with the work" (issue #12): Redis time per job with
//! few vs many jobs in flight (`cost-ack`), with a large backlog of waiting
//! or delayed jobs vs none (`cost-backlog`), and Redis memory per waiting job
//! and per completion record (`cost-memory`).
//!
//! Redis time comes from `INFO commandstats` deltas: script-call usec
//! (`FCALL` of the function library, `EVALSHA` of older builds; a script's time includes the commands it runs) and, to show where a cost
//! would grow, the usec of the commands the scripts run inside Redis
//! (`LREM` of the ack, `LMOVE` of the fetch, `ZRANGEBYSCORE` of the promote):
//! Redis also counts those on their own.

use std::time::{Duration, Instant};

use queue_core::{EnqueueOptions, Queue, QueueKeys};
use serde_json::{json, Map, Value};

use crate::stats::{self, round3, RedisSnapshot};
use crate::{noop, Child, Noop, Res, WorkerArgs, QUEUE};

/// Per job: calls and usec of every command between two snapshots.
fn per_command(after: &RedisSnapshot, before: &RedisSnapshot, jobs: u64) -> Value {
    let mut m = Map::new();
    for k in after.cmds.keys() {
        let calls = after.calls_since(before, k);
        if calls == 0 || k == "info" {
            continue;
        }
        let usec = after.usec_since(before, k);
        m.insert(
            k.clone(),
            json!({
                "calls_per_job": round3(calls as f64 / jobs.max(1) as f64),
                "usec_per_job": round3(usec as f64 / jobs.max(1) as f64),
                "usec_per_call": round3(usec as f64 / calls as f64),
            }),
        );
    }
    Value::Object(m)
}

/// Scripts' Redis time per job (script-call usec / jobs: EVALSHA, EVAL, FCALL).
fn scripts_usec(after: &RedisSnapshot, before: &RedisSnapshot, jobs: u64) -> f64 {
    let us = after.script_usec_since(before);
    round3(us as f64 / jobs.max(1) as f64)
}

async fn completed(conn: &mut redis::aio::ConnectionManager) -> Res<u64> {
    let v: Option<u64> = redis::cmd("HGET")
        .arg(QueueKeys::new(QUEUE).stats)
        .arg("completed")
        .query_async(conn)
        .await?;
    Ok(v.unwrap_or(0))
}

/// Enqueues `n` no-op jobs in pipelined batches of 1 000 from 4 tasks,
/// each with `delay` (none: waiting).
async fn load(url: &str, n: u64, delay: Option<Duration>) -> Res<()> {
    let queue = Queue::connect(url).await?;
    let tasks = (0..4u64).map(|t| {
        let queue = queue.clone();
        async move {
            let share = n / 4 + u64::from(t < n % 4);
            let mut sent = 0;
            while sent < share {
                let m = 1000.min(share - sent);
                let args: Vec<Noop> = (0..m)
                    .map(|j| Noop {
                        seq: t * share + sent + j,
                        t_us: stats::now_us(),
                        pad: String::new(),
                    })
                    .collect();
                let opts = || match delay {
                    Some(d) => EnqueueOptions::new().delay(d),
                    None => EnqueueOptions::new(),
                };
                queue
                    .enqueue_batch::<noop::Job, _>(args.iter().map(|a| (opts(), a)))
                    .await?;
                sent += m;
            }
            Ok::<_, crate::BoxError>(())
        }
    });
    futures::future::try_join_all(tasks).await?;
    Ok(())
}

/// (a) `in_flight` jobs in flight across `workers` worker processes
/// (concurrency `in_flight / workers` each); each handler sleeps
/// `in_flight / rate` so that both sizes run at about `rate` jobs/s. Measured
/// between 25% and 85% of `n` completions (steady state, no ramp or drain).
pub async fn ack(url: &str, n: u64, in_flight: usize, workers: usize, rate: f64) -> Res<Value> {
    crate::flush(url).await?;
    load(url, n, None).await?;
    let mut admin = crate::admin(url).await?;
    let keys = QueueKeys::new(QUEUE);
    let sleep_ms = (in_flight as f64 * 1000.0 / rate).round() as u64;
    let w = WorkerArgs {
        concurrency: (in_flight / workers.max(1)).max(1),
        sleep_ms,
        ..WorkerArgs::default()
    };
    let mut children = Vec::new();
    for _ in 0..workers {
        // Never reaches its target: stopped (killed) once the window is measured.
        children.push(Child::spawn(url, u64::MAX / 2, 0, &w).await?.0);
    }
    let (lo, hi) = (n / 4, n * 85 / 100);
    let deadline = Instant::now() + Duration::from_secs(900);
    let wait_for = |target: u64, admin: &mut redis::aio::ConnectionManager| {
        let mut admin = admin.clone();
        async move {
            loop {
                let c = completed(&mut admin).await?;
                if c >= target {
                    return Ok::<u64, crate::BoxError>(c);
                }
                if Instant::now() > deadline {
                    return Err("cost-ack: timed out".into());
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
    };
    let c0 = wait_for(lo, &mut admin).await?;
    let before = stats::snapshot(&mut admin).await?;
    let t = Instant::now();
    // Sample the processing list (jobs in flight) while the window runs.
    let mut samples = Vec::new();
    let c1 = loop {
        let len: u64 = redis::cmd("LLEN")
            .arg(&keys.processing)
            .query_async(&mut admin)
            .await?;
        samples.push(len);
        let c = completed(&mut admin).await?;
        if c >= hi {
            break c;
        }
        if Instant::now() > deadline {
            return Err("cost-ack: timed out".into());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let secs = t.elapsed().as_secs_f64();
    let after = stats::snapshot(&mut admin).await?;
    for c in children {
        c.stop().await;
    }
    let jobs = c1 - c0;
    let lrem_calls = after.calls_since(&before, "lrem");
    let lrem_us = after.usec_since(&before, "lrem");
    samples.sort_unstable();
    Ok(json!({
        "workload": "cost-ack", "n": n, "in_flight": in_flight, "workers": workers,
        "concurrency_per_worker": w.concurrency, "handler_sleep_ms": sleep_ms,
        "measured_jobs": jobs, "seconds": round3(secs), "jobs_per_s": (jobs as f64 / secs).round(),
        "processing_len": {"median": samples.get(samples.len() / 2), "min": samples.first(), "max": samples.last()},
        "redis_scripts_usec_per_job": scripts_usec(&after, &before, jobs),
        "evalsha_per_job": round3(after.script_calls_since(&before) as f64 / jobs.max(1) as f64),
        "lrem_usec_per_ack": round3(lrem_us as f64 / lrem_calls.max(1) as f64),
        "redis_cpu_usec_per_job": round3(after.cpu_since(&before) * 1e6 / jobs.max(1) as f64),
        "per_command": per_command(&after, &before, jobs),
    }))
}

/// (b) One worker process (concurrency 16) runs `n` jobs while `backlog`
/// other jobs wait (`delayed`: `n` jobs due now among `backlog` delayed by an
/// hour, so each measured job is promoted first), `runs` times. The backlog
/// is loaded once: waiting, it is `backlog + n * runs` jobs and each run takes
/// the `n` oldest; delayed, each run adds its `n` due jobs. `fresh`
/// (waiting only): each run enqueues its `n` jobs just before it and moves
/// them to the front of the waiting list, ahead of the backlog. The jobs a
/// run takes are then as recently written as with no backlog, and only the
/// size of the list and of the keyspace differs (a control: the growth it
/// was written to test for turned out to be the keyspace rehash, below).
/// `settle`: after loading, wait up to this long for Redis to finish
/// rehashing its keyspace (a load that takes the key count past a power of
/// two starts an incremental rehash, during which every key lookup also moves
/// a bucket); each result line carries the keyspace's slots before its run.
pub async fn backlog(
    url: &str,
    n: u64,
    backlog: u64,
    delayed: bool,
    runs: u64,
    fresh: bool,
    settle: Duration,
) -> Res<Vec<Value>> {
    crate::flush(url).await?;
    let t = Instant::now();
    if delayed {
        load(url, backlog, Some(Duration::from_secs(3600))).await?;
    } else if backlog > 0 && !fresh {
        // The worker takes the oldest jobs first: the measured ones.
        load(url, n * runs, None).await?;
        load(url, backlog, None).await?;
    } else if backlog > 0 {
        load(url, backlog, None).await?;
    }
    let load_s = t.elapsed().as_secs_f64();
    let mut admin = crate::admin(url).await?;
    let t = Instant::now();
    while t.elapsed() < settle && keyspace_slots(&mut admin).await?.1 {
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let settled_s = t.elapsed().as_secs_f64();
    let w = WorkerArgs::default();
    let mut out = Vec::new();
    for rep in 1..=runs.max(1) {
        if delayed {
            load(url, n, Some(Duration::from_millis(1))).await?;
        } else if backlog == 0 {
            load(url, n, None).await?;
        } else if fresh {
            load(url, n, None).await?;
            to_front(&mut admin, n).await?;
        }
        let mem = stats::snapshot(&mut admin).await?.used_memory;
        let (slots, rehashing) = keyspace_slots(&mut admin).await?;
        let before = stats::snapshot(&mut admin).await?;
        let (child, start_us) = Child::spawn(url, n, 0, &w).await?;
        let r = child.result().await?;
        let after = stats::snapshot(&mut admin).await?;
        let secs = r["end_us"].as_u64().unwrap_or(0).saturating_sub(start_us) as f64 / 1e6;
        let d = |c: &str| after.calls_since(&before, c);
        let us = |c: &str| after.usec_since(&before, c);
        out.push(json!({
            "workload": "cost-backlog", "kind": if delayed { "delayed" } else { "waiting" },
            "n": n, "backlog": backlog, "fresh": fresh, "rep": rep, "load_s": round3(load_s),
            "settle_s": settle.as_secs(), "settled_s": round3(settled_s),
            "keyspace_slots": slots, "rehashing": rehashing,
            "load1": std::fs::read_to_string("/proc/loadavg").ok().and_then(|l| l.split(' ').next().map(str::to_string)),
            "redis_used_memory_mib": round3(mem as f64 / 1048576.0),
            "seconds": round3(secs), "jobs_per_s": (n as f64 / secs).round(),
            "redis_scripts_usec_per_job": scripts_usec(&after, &before, n),
            "redis_cpu_usec_per_job": round3(after.cpu_since(&before) * 1e6 / n as f64),
            // The fetch's move off the waiting list (fetch.lua LMOVE, or BLMOVE).
            "move_usec_per_job": round3((us("lmove") + us("blmove")) as f64 / n as f64),
            // The promote's reads of the delayed set (ZRANGEBYSCORE, ZRANGE), per promoted job.
            "promote_zset_usec_per_promoted": if delayed {
                json!(round3((us("zrangebyscore") + us("zrange")) as f64 / n as f64))
            } else { Value::Null },
            "promote_scripts": d("zrangebyscore"),
            "per_command": per_command(&after, &before, n),
        }));
    }
    Ok(out)
}

/// The slots of db 0's main hash table and whether it is being rehashed (its
/// two tables' slots are counted then, so the sum is no power of two), from
/// `MEMORY STATS` (redis 7.0: overhead = keys × (dictEntry 24 + robj 16) +
/// slots × 8).
async fn keyspace_slots(admin: &mut redis::aio::ConnectionManager) -> Res<(u64, bool)> {
    let stats: Vec<redis::Value> = redis::cmd("MEMORY").arg("STATS").query_async(admin).await?;
    let keys: u64 = redis::cmd("DBSIZE").query_async(admin).await?;
    let text = |v: &redis::Value| match v {
        redis::Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
        redis::Value::SimpleString(s) => s.clone(),
        _ => String::new(),
    };
    let mut overhead = 0;
    for pair in stats.chunks(2) {
        if let [name, redis::Value::Array(db)] = pair {
            if text(name) == "db.0" {
                for f in db.chunks(2) {
                    if let [k, redis::Value::Int(v)] = f {
                        if text(k) == "overhead.hashtable.main" {
                            overhead = u64::try_from(*v).unwrap_or(0);
                        }
                    }
                }
            }
        }
    }
    let slots = overhead.saturating_sub(keys * 40) / 8;
    Ok((slots, slots > 0 && !slots.is_power_of_two()))
}

/// Moves the `n` jobs enqueued last (the head of the waiting list) to the
/// end a worker takes from, oldest first, ahead of everything else waiting.
async fn to_front(admin: &mut redis::aio::ConnectionManager, n: u64) -> Res<()> {
    let main = QueueKeys::new(QUEUE).main;
    let last = i64::try_from(n).unwrap_or(i64::MAX) - 1;
    let ids: Vec<String> = redis::cmd("LRANGE")
        .arg(&main)
        .arg(0)
        .arg(last)
        .query_async(admin)
        .await?;
    redis::pipe()
        .atomic()
        .cmd("LTRIM")
        .arg(&main)
        .arg(ids.len())
        .arg(-1)
        .ignore()
        .cmd("RPUSH")
        .arg(&main)
        .arg(&ids)
        .ignore()
        .query_async::<()>(admin)
        .await?;
    Ok(())
}

/// (c) Redis memory per waiting job (`n` enqueued) and per completed job
/// (after one worker ran them all, default retention unless `retention_s`).
pub async fn memory(
    url: &str,
    n: u64,
    retention_s: Option<u64>,
    compact_records: bool,
) -> Res<Value> {
    crate::flush(url).await?;
    let mut admin = crate::admin(url).await?;
    let keys = QueueKeys::new(QUEUE);
    let used = |s: &RedisSnapshot| s.used_memory as f64;
    let m0 = stats::snapshot(&mut admin).await?;
    load(url, n, None).await?;
    let m1 = stats::snapshot(&mut admin).await?;
    let id: String = redis::cmd("LINDEX")
        .arg(&keys.main)
        .arg(0)
        .query_async(&mut admin)
        .await?;
    let usage = |key: String, admin: &mut redis::aio::ConnectionManager| {
        let mut admin = admin.clone();
        async move {
            let v: Option<u64> = redis::cmd("MEMORY")
                .arg("USAGE")
                .arg(&key)
                .arg("SAMPLES")
                .arg(0)
                .query_async(&mut admin)
                .await?;
            Ok::<_, crate::BoxError>(v)
        }
    };
    let job_hash = usage(keys.job(&id), &mut admin).await?;
    let w = WorkerArgs {
        retention_s,
        hash_records: !compact_records,
        ..WorkerArgs::default()
    };
    let (child, _) = Child::spawn(url, n, 0, &w).await?;
    child.result().await?;
    let m2 = stats::snapshot(&mut admin).await?;
    let record = usage(keys.done(&id), &mut admin).await?;
    let dbsize: u64 = redis::cmd("DBSIZE").query_async(&mut admin).await?;
    Ok(json!({
        "workload": "cost-memory", "n": n, "retention_s": retention_s, "compact_records": compact_records,
        "bytes_per_waiting_job": ((used(&m1) - used(&m0)) / n as f64).round(),
        "bytes_per_completed_job": ((used(&m2) - used(&m0)) / n as f64).round(),
        "memory_usage_job_hash": job_hash, "memory_usage_completion_record": record,
        "keys_after": dbsize,
    }))
}
