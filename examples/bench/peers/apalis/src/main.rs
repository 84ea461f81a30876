//! Peer driver: apalis + apalis-redis running the queue-bench workloads.
//!
//! Same job (a sequence number, the producer's wall clock in µs, padding),
//! same counts, same output (one JSON line) as `queue-bench`.
//!
//! ```text
//! apalis-bench --redis-url URL enqueue --n 100000 --producers 16 [--batch 100] [--payload 1024]
//! apalis-bench --redis-url URL process --n 100000 --concurrency 16
//! apalis-bench --redis-url URL e2e --n 100000 --producers 16 --concurrency 16 [--rate 2000]
//! ```

use std::collections::HashMap;
use std::process::Stdio;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use apalis::prelude::*;
use apalis_redis::RedisStorage;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::sync::Notify;

type Res<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Noop {
    seq: u64,
    t_us: u64,
    pad: String,
}

fn now_us() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_micros() as u64
}

struct Probe {
    target: u64,
    done: AtomicU64,
    latencies: Mutex<Vec<u64>>,
    end_us: AtomicU64,
    all_done: Notify,
}

static PROBE: OnceLock<Arc<Probe>> = OnceLock::new();

async fn noop(task: Noop) -> Result<(), BoxDynError> {
    if let Some(p) = PROBE.get() {
        let now = now_us();
        p.latencies.lock().unwrap().push(now.saturating_sub(task.t_us));
        if p.done.fetch_add(1, Ordering::Relaxed) + 1 == p.target {
            p.end_us.store(now_us(), Ordering::Relaxed);
            p.all_done.notify_one();
        }
    }
    Ok(())
}

/// The consumer ran all its jobs (apalis-redis can stop with an error first).
fn ok(r: &Value) -> bool {
    r["error"].is_null() && r["end_us"].as_u64().unwrap_or(0) > 0
}

fn summary_ms(mut v: Vec<u64>) -> Value {
    v.sort_unstable();
    let q = |q: f64| -> f64 {
        if v.is_empty() {
            return 0.0;
        }
        let i = ((q * v.len() as f64).ceil() as usize).clamp(1, v.len()) - 1;
        (v[i] as f64 / 1000.0 * 1000.0).round() / 1000.0
    };
    json!({"count": v.len(), "p50_ms": q(0.5), "p99_ms": q(0.99), "p999_ms": q(0.999), "max_ms": q(1.0)})
}

struct Opts(HashMap<String, String>);

impl Opts {
    fn get(&self, k: &str, default: f64) -> f64 {
        self.0.get(k).and_then(|v| v.parse().ok()).unwrap_or(default)
    }
}

fn storage(conn: redis::aio::ConnectionManager) -> RedisStorage<Noop> {
    let config = apalis_redis::Config::default().queue("bench");
    RedisStorage::new(conn).with_config(config)
}

async fn produce(url: &str, n: u64, producers: u64, batch: u64, payload: usize, rate: f64) -> Res<()> {
    let conn = apalis_redis::connect(url).await?;
    let pad = "x".repeat(payload);
    let start = tokio::time::Instant::now();
    let mut tasks = Vec::new();
    for i in 0..producers {
        let share = n / producers + u64::from(i < n % producers);
        let mut st = storage(conn.clone());
        let pad = pad.clone();
        let every = (rate > 0.0).then(|| Duration::from_secs_f64(batch as f64 * producers as f64 / rate));
        tasks.push(tokio::spawn(async move {
            let mut sent = 0;
            let mut k = 0u32;
            while sent < share {
                if let Some(every) = every {
                    tokio::time::sleep_until(start + every * k).await;
                }
                k += 1;
                let m = batch.min(share - sent);
                let t = now_us();
                if m == 1 {
                    st.push(Noop { seq: sent, t_us: t, pad: pad.clone() }).await?;
                } else {
                    let items = (0..m).map(|j| Noop { seq: sent + j, t_us: t, pad: pad.clone() }).collect();
                    st.push_bulk(items).await?;
                }
                sent += m;
            }
            Ok::<_, Box<dyn std::error::Error + Send + Sync>>(())
        }));
    }
    for t in tasks {
        t.await??;
    }
    Ok(())
}

/// apalis-redis 1.0.0 pushes every task into its scheduled set (run_at =
/// now), and its fetch script promotes *all* due tasks with one `unpack`,
/// which fails ("too many results to unpack") beyond ~8000 waiting tasks. So
/// before the process-only run, move the preloaded tasks to the active list
/// in chunks of 1000: what fetch_next would do, without the limit.
async fn promote_preloaded(url: &str) -> Res<()> {
    let mut c = apalis_redis::connect(url).await?;
    let script = redis::Script::new(
        r"local n = 0
        while true do
          local ids = redis.call('zrange', KEYS[1], 0, 999)
          if #ids == 0 then break end
          redis.call('rpush', KEYS[2], unpack(ids))
          redis.call('zrem', KEYS[1], unpack(ids))
          n = n + #ids
        end
        redis.call('del', KEYS[3])
        redis.call('lpush', KEYS[3], 1)
        return n",
    );
    let _: i64 = script
        .key("bench:scheduled")
        .key("bench:active")
        .key("bench:signal")
        .invoke_async(&mut c)
        .await?;
    Ok(())
}

async fn flush(url: &str) -> Res<()> {
    let mut c = apalis_redis::connect(url).await?;
    let _: () = redis::cmd("FLUSHALL").query_async(&mut c).await?;
    Ok(())
}

async fn consume(url: &str, n: u64, concurrency: usize, poll_ms: u64) -> Res<()> {
    let probe = Arc::new(Probe {
        target: n,
        done: AtomicU64::new(0),
        latencies: Mutex::new(Vec::with_capacity(n as usize)),
        end_us: AtomicU64::new(0),
        all_done: Notify::new(),
    });
    let _ = PROBE.set(probe.clone());
    let conn = apalis_redis::connect(url).await?;
    let config = apalis_redis::Config::default().queue("bench").batch_size(concurrency.max(10));
    let st: RedisStorage<Noop> = RedisStorage::new(conn).with_config(config);
    // Without a poll strategy an apalis-redis worker whose fetch came back
    // empty waits for its next wake-up (the 30 s heartbeat): tasks pushed
    // meanwhile sit in the queue. Poll every `--poll-ms` instead (default 10).
    let st = PollWith::new(st, IntervalStrategy::new(Duration::from_millis(poll_ms)));
    let worker = WorkerBuilder::new(format!("bench-{}", std::process::id()))
        .backend(st)
        .concurrency(concurrency)
        .parallelize(tokio::spawn)
        .build(noop);
    let start = now_us();
    let p = probe.clone();
    println!("READY {start}");
    // The n-th handler wakes run_until's signal; the worker then shuts down.
    let run = worker.run_until(async move {
        p.all_done.notified().await;
        Ok::<(), std::io::Error>(())
    });
    let error = match tokio::time::timeout(Duration::from_secs(3600), run).await {
        Ok(Err(e)) => Some(format!("apalis worker stopped with an error: {e:?}")),
        Err(_) => Some("apalis worker did not finish within an hour".to_string()),
        Ok(Ok(())) => None,
    };
    if let Some(e) = &error {
        eprintln!("{e}");
    }
    let lat = std::mem::take(&mut *probe.latencies.lock().unwrap());
    let done = probe.done.load(Ordering::Relaxed);
    println!(
        "{}",
        json!({"start_us": start, "end_us": probe.end_us.load(Ordering::Relaxed), "latency": summary_ms(lat),
               "processed": done, "error": error})
    );
    Ok(())
}

async fn spawn_consumer(url: &str, n: u64, concurrency: usize) -> Res<(tokio::process::Child, tokio::io::Lines<BufReader<tokio::process::ChildStdout>>, u64)> {
    let mut child = tokio::process::Command::new(std::env::current_exe()?)
        .args(["--redis-url", url, "consume", "--n", &n.to_string(), "--concurrency", &concurrency.to_string()])
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()?;
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let ready = lines.next_line().await?.ok_or("consumer exited")?;
    let start: u64 = ready.strip_prefix("READY ").ok_or("bad READY line")?.trim().parse()?;
    Ok((child, lines, start))
}

#[tokio::main]
async fn main() -> Res<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut url = "redis://127.0.0.1:6379/".to_string();
    let mut mode = String::new();
    let mut kv = HashMap::new();
    let mut it = args.into_iter();
    while let Some(a) = it.next() {
        if let Some(k) = a.strip_prefix("--") {
            let v = it.next().unwrap_or_default();
            if k == "redis-url" {
                url = v;
            } else {
                kv.insert(k.to_string(), v);
            }
        } else {
            mode = a;
        }
    }
    let o = Opts(kv);
    let n = o.get("n", 100_000.0) as u64;
    let producers = o.get("producers", 1.0) as u64;
    let batch = o.get("batch", 1.0) as u64;
    let payload = o.get("payload", 0.0) as usize;
    let rate = o.get("rate", 0.0);
    let concurrency = o.get("concurrency", 16.0) as usize;
    let version = "apalis 1.0.0 + apalis-redis 1.0.0";
    let out = match mode.as_str() {
        "consume" => return consume(&url, n, concurrency, o.get("poll-ms", 10.0) as u64).await,
        "enqueue" => {
            flush(&url).await?;
            let t = Instant::now();
            produce(&url, n, producers, batch, payload, 0.0).await?;
            let s = t.elapsed().as_secs_f64();
            json!({"workload": "enqueue", "n": n, "producers": producers, "batch": batch, "payload": payload,
                   "seconds": s, "jobs_per_s": (n as f64 / s).round()})
        }
        "process" => {
            flush(&url).await?;
            produce(&url, n, 4, 1000, payload, 0.0).await?;
            promote_preloaded(&url).await?;
            let (mut child, mut lines, start) = spawn_consumer(&url, n, concurrency).await?;
            let r: Value = serde_json::from_str(&lines.next_line().await?.ok_or("consumer died")?)?;
            child.wait().await?;
            let s = (r["end_us"].as_u64().unwrap_or(0).saturating_sub(start)) as f64 / 1e6;
            json!({"workload": "process", "n": n, "concurrency": concurrency, "payload": payload,
                   "seconds": s, "jobs_per_s": ok(&r).then(|| (n as f64 / s).round()),
                   "error": r["error"], "processed": r["processed"]})
        }
        "e2e" => {
            flush(&url).await?;
            let (mut child, mut lines, _) = spawn_consumer(&url, n, concurrency).await?;
            let t0 = now_us();
            produce(&url, n, producers, batch, payload, rate).await?;
            let r: Value = serde_json::from_str(&lines.next_line().await?.ok_or("consumer died")?)?;
            child.wait().await?;
            let s = (r["end_us"].as_u64().unwrap_or(0).saturating_sub(t0)) as f64 / 1e6;
            json!({"workload": if rate > 0.0 { "e2e-rate" } else { "e2e" }, "n": n, "producers": producers,
                   "batch": batch, "payload": payload, "rate": rate, "concurrency": concurrency,
                   "seconds": s, "jobs_per_s": ok(&r).then(|| (n as f64 / s).round()), "latency": r["latency"],
                   "error": r["error"], "processed": r["processed"]})
        }
        other => return Err(format!("unknown mode {other:?} (enqueue | process | e2e)").into()),
    };
    let mut out = out;
    out["system"] = json!("apalis");
    out["version"] = json!(version);
    println!("{out}");
    Ok(())
}
