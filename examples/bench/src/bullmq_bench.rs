//! The four scenarios of bullmq-bench (taskforcesh/bullmq-bench, as its suite
//! is described in ChasquiMQ's `benchmarks/baseline-bullmq.md`), run with
//! queue-core; `peers/bullmq/bench.cjs bb` runs the same ones with BullMQ.
//!
//! | scenario | warm-up | measured | how |
//! |---|---:|---:|---|
//! | `queue-add` | 1 000 | 1 000 × scale | one `enqueue` at a time, 10×10 payload |
//! | `queue-add-bulk` | 1 000 | 10 000 × scale | one `enqueue_many` of 50 at a time, 1×1 payload |
//! | `worker-generic` | 1 000 | 1 000 × scale | preloaded (bulks of 100), one worker, concurrency 1 |
//! | `worker-concurrent` | 1 000 | 10 000 × scale | preloaded, one worker, concurrency 100 |
//!
//! The stopwatch starts when the warm-up count is reached (adds: when that job
//! is added; workers: when that job's handler starts) and stops at the last
//! one, as bullmq-bench does. Everything runs in one process, like
//! bullmq-bench. Rate = measured jobs / time (bullmq-bench divides warm-up +
//! measured jobs by the time; the same for both systems, so ratios agree).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use queue_core::{JobContext, JobError, Queue, Worker, WorkerConfig};
use serde_json::{json, Map, Value};
use tokio::sync::Notify;

use crate::stats::{self, round3};
use crate::Res;

/// bullmq-bench's scenarios.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Scenario {
    /// Single adds, one in flight, 10×10 payload.
    QueueAdd,
    /// Bulks of 50, one in flight, 1×1 payload.
    QueueAddBulk,
    /// One worker, concurrency 1, preloaded jobs.
    WorkerGeneric,
    /// One worker, concurrency 100, preloaded jobs.
    WorkerConcurrent,
}

impl Scenario {
    fn name(self) -> &'static str {
        match self {
            Scenario::QueueAdd => "queue-add",
            Scenario::QueueAddBulk => "queue-add-bulk",
            Scenario::WorkerGeneric => "worker-generic",
            Scenario::WorkerConcurrent => "worker-concurrent",
        }
    }

    /// (warm-up jobs, measured jobs at scale 1, payload width, depth).
    fn shape(self) -> (u64, u64, usize, usize) {
        match self {
            Scenario::QueueAdd => (1000, 1000, 10, 10),
            Scenario::QueueAddBulk => (1000, 10_000, 1, 1),
            Scenario::WorkerGeneric => (1000, 1000, 1, 1),
            Scenario::WorkerConcurrent => (1000, 10_000, 1, 1),
        }
    }
}

/// A UUID-shaped random key (bullmq-bench's sample objects use `uuid.v4()`).
fn uuid_like(state: &mut u64) -> String {
    let mut next = || {
        // xorshift64*: enough for distinct keys, no dependency.
        *state ^= *state >> 12;
        *state ^= *state << 25;
        *state ^= *state >> 27;
        state.wrapping_mul(0x2545_F491_4F6C_DD1D)
    };
    let (a, b) = (next(), next());
    format!(
        "{:08x}-{:04x}-4{:03x}-{:04x}-{:012x}",
        a >> 32,
        (a >> 16) & 0xffff,
        a & 0xfff,
        0x8000 | (b >> 48 & 0x3fff),
        b & 0xffff_ffff_ffff
    )
}

/// bullmq-bench's sample payload: `width` keys, each the head of a chain of
/// `depth` nested objects keyed by UUIDs.
pub fn sample_data(width: usize, depth: usize) -> Value {
    let mut seed = stats::now_us() | 1;
    let mut top = Map::new();
    for _ in 0..width {
        let mut inner = Value::Object(Map::new());
        for _ in 1..depth {
            let mut m = Map::new();
            m.insert(uuid_like(&mut seed), inner);
            inner = Value::Object(m);
        }
        top.insert(uuid_like(&mut seed), inner);
    }
    Value::Object(top)
}

/// What the handler counts into (one scenario per process run).
struct Counter {
    warmup: u64,
    total: u64,
    count: AtomicU64,
    start: OnceLock<Instant>,
    end: OnceLock<Instant>,
    done: Notify,
}

static COUNTER: OnceLock<Arc<Counter>> = OnceLock::new();

#[queue_core::job(queue = "bb", max_attempts = 3)]
async fn sample(_ctx: JobContext, _args: Value) -> Result<(), JobError> {
    if let Some(c) = COUNTER.get() {
        let k = c.count.fetch_add(1, Ordering::Relaxed) + 1;
        if k == c.warmup {
            let _ = c.start.set(Instant::now());
        } else if k == c.total {
            let _ = c.end.set(Instant::now());
            c.done.notify_one();
        }
    }
    Ok(())
}

/// Runs one scenario; `scale` multiplies the measured job count.
pub async fn run(url: &str, scenario: Scenario, scale: u64) -> Res<Value> {
    crate::flush(url).await?;
    let (warmup, measured, width, depth) = scenario.shape();
    let measured = measured * scale.max(1);
    let total = warmup + measured;
    let data = sample_data(width, depth);
    let payload_bytes = rmp_serde::to_vec_named(&data)?.len();
    let queue = Queue::connect(url).await?;
    let mut admin = crate::admin(url).await?;
    let before = stats::snapshot(&mut admin).await?;
    let secs = match scenario {
        Scenario::QueueAdd | Scenario::QueueAddBulk => {
            let bulk = if scenario == Scenario::QueueAdd {
                1
            } else {
                50
            };
            let mut count = 0u64;
            let mut start = Instant::now();
            while count < total {
                let m = bulk.min(total - count);
                // The stopwatch starts once the warm-up jobs were added.
                if count <= warmup && warmup < count + m {
                    start = Instant::now();
                }
                if m == 1 {
                    queue.enqueue::<sample::Job>(&data).await?;
                } else {
                    let args: Vec<Value> = (0..m).map(|_| data.clone()).collect();
                    queue.enqueue_many::<sample::Job>(&args).await?;
                }
                count += m;
            }
            start.elapsed().as_secs_f64()
        }
        Scenario::WorkerGeneric | Scenario::WorkerConcurrent => {
            let mut count = 0;
            while count < total {
                let m = 100.min(total - count);
                let args: Vec<Value> = (0..m).map(|_| data.clone()).collect();
                queue.enqueue_many::<sample::Job>(&args).await?;
                count += m;
            }
            let counter = Arc::new(Counter {
                warmup,
                total,
                count: AtomicU64::new(0),
                start: OnceLock::new(),
                end: OnceLock::new(),
                done: Notify::new(),
            });
            COUNTER
                .set(counter.clone())
                .map_err(|_| "one worker scenario per process")?;
            let concurrency = if scenario == Scenario::WorkerGeneric {
                1
            } else {
                100
            };
            let worker = Worker::builder(url)
                .register(sample::handler())
                .config(WorkerConfig {
                    concurrency,
                    ..WorkerConfig::default()
                })
                .build()
                .await?;
            let stop = worker.shutdown_handle();
            let run = tokio::spawn(worker.run_until(std::future::pending::<()>()));
            tokio::time::timeout(Duration::from_secs(600), counter.done.notified())
                .await
                .map_err(|_| "worker scenario timed out")?;
            stop.shutdown();
            let _ = run.await?;
            match (counter.start.get(), counter.end.get()) {
                (Some(s), Some(e)) => e.duration_since(*s).as_secs_f64(),
                _ => return Err("worker scenario: no start or end".into()),
            }
        }
    };
    let after = stats::snapshot(&mut admin).await?;
    let scripts_usec = after.script_usec_since(&before);
    Ok(json!({
        "workload": "bb", "scenario": scenario.name(), "warmup": warmup, "n": measured,
        "payload_bytes": payload_bytes,
        "seconds": round3(secs), "jobs_per_s": (measured as f64 / secs).round(),
        // Whole run (preload and warm-up included), per warm-up + measured job.
        "redis_scripts_usec_per_job": round3(scripts_usec as f64 / total as f64),
        "evalsha_per_job": round3(after.script_calls_since(&before) as f64 / total as f64),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Depth of the deepest chain under `v` (an empty object is depth 1).
    fn depth(v: &Value) -> usize {
        match v {
            Value::Object(m) => 1 + m.values().map(depth).max().unwrap_or(0),
            _ => 0,
        }
    }

    #[test]
    fn sample_data_has_bullmq_bench_shape() {
        // 1x1: one UUID key holding an empty object, `{"<uuid>":{}}` (43 bytes of JSON).
        let tiny = sample_data(1, 1);
        assert_eq!(tiny.as_object().map(|m| m.len()), Some(1));
        assert_eq!(depth(&tiny), 2);
        assert_eq!(serde_json::to_string(&tiny).unwrap().len(), 43);
        // 10x10: ten chains, each ten objects deep, all keys distinct UUIDs.
        let big = sample_data(10, 10);
        let top = big.as_object().unwrap();
        assert_eq!(top.len(), 10);
        assert!(top.values().all(|v| depth(v) == 10));
        let text = serde_json::to_string(&big).unwrap();
        assert!((4000..4300).contains(&text.len()), "{} bytes", text.len());
    }

    #[test]
    fn uuid_like_keys_are_uuid_shaped_and_distinct() {
        let mut seed = 42;
        let keys: Vec<String> = (0..1000).map(|_| uuid_like(&mut seed)).collect();
        for k in &keys {
            let parts: Vec<usize> = k.split('-').map(str::len).collect();
            assert_eq!(parts, [8, 4, 4, 4, 12], "{k}");
            assert!(k.chars().all(|c| c == '-' || c.is_ascii_hexdigit()), "{k}");
        }
        let distinct: std::collections::HashSet<_> = keys.iter().collect();
        assert_eq!(distinct.len(), keys.len());
    }
}
