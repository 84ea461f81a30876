//! `queue-bench`: throughput, latency, round trips, idle behaviour and memory
//! of queue-core, with the same workloads the peer drivers in `peers/` run.
//!
//! Every subcommand prints one JSON line per run (and appends it to `--out`).
//! Without `--redis-url` it starts its own `redis-server` (no persistence).
//! See `docs/BENCHMARKS.md` for the workloads and `scripts/bench.sh` for the suite.

mod bullmq_bench;
mod cost;
mod proto;
mod stats;

use futures::FutureExt;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use clap::{Parser, Subcommand};
use queue_core::{JobContext, JobError, Queue, Worker, WorkerConfig};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::sync::Notify;

use stats::{now_us, round3, Hist, RedisSnapshot};

type BoxError = Box<dyn std::error::Error + Send + Sync>;
type Res<T> = Result<T, BoxError>;

const QUEUE: &str = "bench";

/// The no-op job's payload: a sequence number, the producer's wall clock at
/// the enqueue call (µs), and padding for the payload-size variant.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Noop {
    pub seq: u64,
    pub t_us: u64,
    pub pad: String,
}

/// What the handler records into, set once per process by `consume`/`idle`.
struct Probe {
    target: u64,
    done: AtomicU64,
    first_start_us: AtomicU64,
    /// enqueue call (producer wall clock, µs) -> handler start (wall clock, µs).
    latency: Hist,
    /// `ctx.enqueued_at_ms()` (Redis TIME at enqueue, ms) -> handler start (ms).
    latency_redis_clock: Hist,
    all_done: Notify,
}

static PROBE: OnceLock<Arc<Probe>> = OnceLock::new();

/// Milliseconds each no-op handler sleeps (`--sleep-ms`; 0: none).
static SLEEP_MS: AtomicU64 = AtomicU64::new(0);

#[queue_core::job(queue = "bench", max_attempts = 3)]
async fn noop(ctx: JobContext, args: Noop) -> Result<(), JobError> {
    if let Some(p) = PROBE.get() {
        let now = now_us();
        let _ = p
            .first_start_us
            .compare_exchange(0, now, Ordering::Relaxed, Ordering::Relaxed);
        p.latency.record(now.saturating_sub(args.t_us));
        // Millisecond resolution (Redis TIME at enqueue, truncated to ms), kept in µs.
        p.latency_redis_clock
            .record((now / 1000).saturating_sub(ctx.enqueued_at_ms().max(0) as u64) * 1000);
        if p.done.fetch_add(1, Ordering::Relaxed) + 1 == p.target {
            p.all_done.notify_one();
        }
    }
    let sleep = SLEEP_MS.load(Ordering::Relaxed);
    if sleep > 0 {
        tokio::time::sleep(Duration::from_millis(sleep)).await;
    }
    Ok(())
}

#[derive(Debug, Parser)]
#[command(
    name = "queue-bench",
    about = "Benchmarks of queue-core (see docs/BENCHMARKS.md)"
)]
struct Cli {
    /// Redis to use. Default: start a private redis-server (--save "" --appendonly no).
    #[arg(long, global = true, env = "BENCH_REDIS_URL")]
    redis_url: Option<String>,
    /// Append each result (one JSON line) to this file.
    #[arg(long, global = true)]
    out: Option<PathBuf>,
    /// Free-form label stored in the result (e.g. the run number).
    #[arg(long, global = true, default_value = "")]
    label: String,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Debug, Clone, clap::Args)]
struct ProduceArgs {
    /// Jobs.
    #[arg(long, default_value_t = 100_000)]
    n: u64,
    /// Concurrent producer tasks (sharing one `Queue`, i.e. one multiplexed connection).
    #[arg(long, default_value_t = 1)]
    producers: usize,
    /// Jobs per `enqueue_many` call; 1: one `enqueue` call per job.
    #[arg(long, default_value_t = 1)]
    batch: usize,
    /// Padding bytes in each payload (0: no-op job of ~30 bytes).
    #[arg(long, default_value_t = 0)]
    payload: usize,
    /// Offered load in jobs/s across all producers; 0: as fast as possible.
    #[arg(long, default_value_t = 0.0)]
    rate: f64,
    /// Each producer in a task of its own on the runtime's workers (as a web
    /// server's request handlers are); default: all producers joined in the
    /// benchmark's own future.
    #[arg(long)]
    spawned: bool,
}

#[derive(Debug, Clone, clap::Parser)]
struct WorkerArgs {
    /// Worker concurrency (jobs run at once).
    #[arg(long, default_value_t = 16)]
    concurrency: usize,
    /// `WorkerConfig::fetch_batch`.
    #[arg(long, default_value_t = WorkerConfig::default().fetch_batch)]
    fetch_batch: usize,
    /// `WorkerConfig::completion_retention` in seconds (default: the library's, 24 h).
    #[arg(long)]
    retention_s: Option<u64>,
    /// Each handler sleeps this long (ms) before it returns (0: a no-op).
    #[arg(long, default_value_t = 0)]
    sleep_ms: u64,
    /// `WorkerConfig::compact_records` false: completion records as hashes
    /// (the default before stop 48; compact strings otherwise).
    #[arg(long)]
    hash_records: bool,
}

/// The flags' defaults (what the cost workloads run): parsed from no
/// arguments, so they are written once, on the flags.
impl Default for WorkerArgs {
    fn default() -> Self {
        <WorkerArgs as clap::Parser>::parse_from(["worker-args"])
    }
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// (a) Enqueue only: N jobs from `--producers` concurrent producers.
    Enqueue(ProduceArgs),
    /// (b) Process only: N pre-enqueued jobs, one worker process.
    Process {
        #[arg(long, default_value_t = 100_000)]
        n: u64,
        #[arg(long, default_value_t = 0)]
        payload: usize,
        #[command(flatten)]
        worker: WorkerArgs,
    },
    /// (c) End to end: a worker process and producers running together.
    E2e {
        #[command(flatten)]
        produce: ProduceArgs,
        #[command(flatten)]
        worker: WorkerArgs,
    },
    /// Steady memory: N jobs through one worker process, RSS sampled every second.
    Memory {
        #[arg(long, default_value_t = 1_000_000)]
        n: u64,
        #[command(flatten)]
        worker: WorkerArgs,
    },
    /// No busy polling: an idle worker's Redis calls over `--seconds`.
    Idle {
        #[arg(long, default_value_t = 10)]
        seconds: u64,
    },
    /// The ceiling: redis-benchmark on the same server for the commands one job needs.
    Ceiling {
        #[arg(long, default_value_t = 200_000)]
        requests: u64,
        /// Parallel connections of redis-benchmark.
        #[arg(long, default_value_t = 16)]
        clients: u32,
    },
    /// Prototype: queue-core's fetch/ack scripts driven by a minimal loop,
    /// acks one per job or batched (measures the gain of batched acks).
    Proto {
        #[arg(long, default_value_t = 100_000)]
        n: u64,
        /// Concurrent fetch loops.
        #[arg(long, default_value_t = 1)]
        fetchers: usize,
        /// Jobs per fetch (and per batched ack).
        #[arg(long, default_value_t = 16)]
        fetch_batch: usize,
        /// Ack many jobs per script call instead of one per job.
        #[arg(long)]
        batched_ack: bool,
    },
    /// bullmq-bench's scenarios (queue-add, queue-add-bulk, worker-generic,
    /// worker-concurrent), see `bullmq_bench.rs`.
    Bb {
        #[arg(long, value_enum)]
        scenario: bullmq_bench::Scenario,
        /// Multiplies the measured job count (warm-up stays 1 000).
        #[arg(long, default_value_t = 1)]
        scale: u64,
    },
    /// Redis time per job with `--in-flight` jobs in flight across
    /// `--workers` worker processes (handlers sleep to hold them).
    CostAck {
        #[arg(long, default_value_t = 20_000)]
        n: u64,
        #[arg(long, default_value_t = 16)]
        in_flight: usize,
        #[arg(long, default_value_t = 8)]
        workers: usize,
        /// Target jobs/s (sets the handlers' sleep: in_flight / rate).
        #[arg(long, default_value_t = 2000.0)]
        rate: f64,
    },
    /// Redis time per job with `--backlog` other jobs waiting (or delayed).
    CostBacklog {
        #[arg(long, default_value_t = 20_000)]
        n: u64,
        #[arg(long, default_value_t = 0)]
        backlog: u64,
        /// The measured jobs are due delayed jobs among `--backlog` delayed by 1 h.
        #[arg(long)]
        delayed: bool,
        /// Measured runs over the same backlog (one result line each).
        #[arg(long, default_value_t = 1)]
        runs: u64,
        /// Waiting: enqueue each run's jobs just before it, ahead of the
        /// backlog (recently written, as with no backlog), instead of before
        /// the backlog.
        #[arg(long)]
        fresh: bool,
        /// After loading, wait up to this many seconds for Redis to finish
        /// rehashing its keyspace (0: measure at once).
        #[arg(long, default_value_t = 0)]
        settle_s: u64,
    },
    /// Redis memory per waiting job and per completed job (completion record).
    CostMemory {
        #[arg(long, default_value_t = 100_000)]
        n: u64,
        #[arg(long)]
        retention_s: Option<u64>,
        /// The worker writes hash completion records (`WorkerConfig::compact_records`
        /// false; compact strings otherwise, the default).
        #[arg(long)]
        hash_records: bool,
    },
    /// Internal: the worker process of `process`, `e2e` and `memory`.
    #[command(hide = true)]
    Consume {
        #[arg(long)]
        n: u64,
        /// Jobs the producers enqueue while this worker runs (for the script breakdown).
        #[arg(long, default_value_t = 0)]
        expect_enqueue: u64,
        #[command(flatten)]
        worker: WorkerArgs,
    },
}

fn main() {
    let cli = Cli::parse();
    // The default is tokio's multi-threaded runtime, as most applications use.
    // BENCH_RUNTIME=current runs each process on one thread (see BENCHMARKS.md).
    let mut rt = match std::env::var("BENCH_RUNTIME").as_deref() {
        Ok("current") => tokio::runtime::Builder::new_current_thread(),
        _ => tokio::runtime::Builder::new_multi_thread(),
    };
    let rt = rt.enable_all().build().expect("tokio runtime");
    if let Err(e) = rt.block_on(run(cli)) {
        eprintln!("queue-bench: {e}");
        std::process::exit(1);
    }
}

async fn run(cli: Cli) -> Res<()> {
    // A private server unless told otherwise; kept alive for the whole run.
    let (url, _server) = match &cli.redis_url {
        Some(u) => (u.clone(), None),
        None => {
            let s = queue_testkit::RedisServer::start_with(&["--save", "", "--appendonly", "no"])?;
            (s.url(), Some(s))
        }
    };
    let result = match &cli.cmd {
        Cmd::Enqueue(p) => enqueue(&url, p).await?,
        Cmd::Process { n, payload, worker } => process(&url, *n, *payload, worker, &cli).await?,
        Cmd::E2e { produce, worker } => e2e(&url, produce, worker, &cli).await?,
        Cmd::Memory { n, worker } => memory(&url, *n, worker, &cli).await?,
        Cmd::Idle { seconds } => idle(&url, *seconds).await?,
        Cmd::Ceiling { requests, clients } => ceiling(&url, *requests, *clients).await?,
        Cmd::Proto {
            n,
            fetchers,
            fetch_batch,
            batched_ack,
        } => {
            flush(&url).await?;
            preload(&url, *n, 0).await?;
            proto::run(&url, *n, *fetchers, *fetch_batch, *batched_ack).await?
        }
        Cmd::Bb { scenario, scale } => bullmq_bench::run(&url, *scenario, *scale).await?,
        Cmd::CostAck {
            n,
            in_flight,
            workers,
            rate,
        } => cost::ack(&url, *n, *in_flight, *workers, *rate).await?,
        Cmd::CostBacklog {
            n,
            backlog,
            delayed,
            runs,
            fresh,
            settle_s,
        } => {
            let settle = Duration::from_secs(*settle_s);
            let results =
                cost::backlog(&url, *n, *backlog, *delayed, *runs, *fresh, settle).await?;
            for r in results {
                emit(&cli, r)?;
            }
            return Ok(());
        }
        Cmd::CostMemory {
            n,
            retention_s,
            hash_records,
        } => cost::memory(&url, *n, *retention_s, !*hash_records).await?,
        Cmd::Consume {
            n,
            expect_enqueue,
            worker,
        } => {
            consume(&url, *n, *expect_enqueue, worker).await?;
            return Ok(());
        }
    };
    emit(&cli, result)
}

fn emit(cli: &Cli, mut result: Value) -> Res<()> {
    result["system"] = json!("queue-core");
    result["label"] = json!(cli.label);
    let line = serde_json::to_string(&result)?;
    println!("{line}");
    if let Some(path) = &cli.out {
        use std::io::Write;
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)?;
        writeln!(f, "{line}")?;
    }
    Ok(())
}

/// A plain connection of our own for INFO, FLUSHALL and counters. A long
/// response timeout: FLUSHALL of a million jobs' keys takes seconds.
async fn admin(url: &str) -> Res<redis::aio::ConnectionManager> {
    let cfg = redis::aio::ConnectionManagerConfig::new()
        .set_response_timeout(Some(Duration::from_secs(120)));
    Ok(redis::Client::open(url)?
        .get_connection_manager_with_config(cfg)
        .await?)
}

async fn flush(url: &str) -> Res<()> {
    let mut c = admin(url).await?;
    let _: () = redis::cmd("FLUSHALL").query_async(&mut c).await?;
    // BENCH_EVENTS=N: the bench queue's event stream on, capped at ~N
    // entries (docs/EVENTS.md measures its cost this way).
    if let Ok(cap) = std::env::var("BENCH_EVENTS") {
        let keys = queue_core::QueueKeys::new(QUEUE);
        let _: () = redis::cmd("SET")
            .arg(keys.events_on())
            .arg(cap)
            .query_async(&mut c)
            .await?;
    }
    Ok(())
}

fn padding(bytes: usize) -> String {
    "x".repeat(bytes)
}

/// Enqueues `p.n` jobs from `p.producers` tasks; records each call's latency.
async fn produce(queue: &Queue, p: &ProduceArgs, call_latency: &Hist) -> Res<()> {
    let producers = p.producers.max(1) as u64;
    let batch = p.batch.max(1) as u64;
    let pad = padding(p.payload);
    let start = tokio::time::Instant::now();
    let mut tasks = Vec::new();
    for i in 0..producers {
        let share = p.n / producers + u64::from(i < p.n % producers);
        let first_seq = i * (p.n / producers) + i.min(p.n % producers);
        let queue = queue.clone();
        let pad = pad.clone();
        let rate = p.rate;
        // Each producer's share of the offered load: one call every `every`.
        let every =
            (rate > 0.0).then(|| Duration::from_secs_f64(batch as f64 * producers as f64 / rate));
        let producer = async move {
            let mut lat = Vec::new();
            let mut sent = 0u64;
            let mut k = 0u32;
            while sent < share {
                if let Some(every) = every {
                    tokio::time::sleep_until(start + every * k).await;
                }
                k += 1;
                let m = batch.min(share - sent);
                let t0 = now_us();
                if m == 1 {
                    let args = Noop {
                        seq: first_seq + sent,
                        t_us: t0,
                        pad: pad.clone(),
                    };
                    noop::enqueue(&queue, args).await?;
                } else {
                    let args: Vec<Noop> = (0..m)
                        .map(|j| Noop {
                            seq: first_seq + sent + j,
                            t_us: t0,
                            pad: pad.clone(),
                        })
                        .collect();
                    queue.enqueue_many::<noop::Job>(&args).await?;
                }
                lat.push(now_us() - t0);
                sent += m;
            }
            Ok::<_, BoxError>(lat)
        };
        tasks.push(match p.spawned {
            true => {
                let task = tokio::spawn(producer);
                async move { task.await? }.boxed()
            }
            false => producer.boxed(),
        });
    }
    for lat in futures::future::try_join_all(tasks).await? {
        for v in lat {
            call_latency.record(v);
        }
    }
    Ok(())
}

/// (a) Enqueue only.
async fn enqueue(url: &str, p: &ProduceArgs) -> Res<Value> {
    flush(url).await?;
    let queue = Queue::connect(url).await?;
    let mut conn = admin(url).await?;
    // Load the script outside the timed window.
    noop::enqueue(
        &queue,
        Noop {
            seq: 0,
            t_us: 0,
            pad: String::new(),
        },
    )
    .await?;
    flush(url).await?;
    let before = stats::snapshot(&mut conn).await?;
    let calls = Hist::new();
    let t = Instant::now();
    produce(&queue, p, &calls).await?;
    let secs = t.elapsed().as_secs_f64();
    let after = stats::snapshot(&mut conn).await?;
    let round_trips = p.n.div_ceil(p.batch.max(1) as u64);
    Ok(json!({
        "workload": "enqueue", "n": p.n, "producers": p.producers, "spawned": p.spawned, "batch": p.batch, "payload": p.payload,
        "rate": p.rate,
        "seconds": round3(secs), "jobs_per_s": (p.n as f64 / secs).round(),
        "enqueue_call_latency": calls.summary_ms(),
        "round_trips_per_job": round3(round_trips as f64 / p.n as f64),
        "cmds": after.queue_core_calls(&before, p.n, p.n, 0, secs),
        "redis_cpu_s": after.cpu_since(&before),
        "redis_cpu_util": round3(after.cpu_since(&before) / secs),
        "client_cpu_s": round3(stats::self_cpu_s()),
    }))
}

/// Pre-enqueues `n` jobs quickly (pipelined batches), outside any timing.
async fn preload(url: &str, n: u64, payload: usize) -> Res<()> {
    let queue = Queue::connect(url).await?;
    let p = ProduceArgs {
        n,
        producers: 4,
        batch: 1000,
        payload,
        rate: 0.0,
        spawned: false,
    };
    produce(&queue, &p, &Hist::new()).await
}

/// A running `consume` child process.
struct Child {
    child: tokio::process::Child,
    lines: tokio::io::Lines<BufReader<tokio::process::ChildStdout>>,
}

impl Child {
    async fn spawn(url: &str, n: u64, expect_enqueue: u64, w: &WorkerArgs) -> Res<(Child, u64)> {
        let mut cmd = tokio::process::Command::new(std::env::current_exe()?);
        cmd.arg("--redis-url").arg(url).arg("consume");
        cmd.arg("--n")
            .arg(n.to_string())
            .arg("--expect-enqueue")
            .arg(expect_enqueue.to_string());
        cmd.arg("--concurrency").arg(w.concurrency.to_string());
        cmd.arg("--fetch-batch").arg(w.fetch_batch.to_string());
        if let Some(r) = w.retention_s {
            cmd.arg("--retention-s").arg(r.to_string());
        }
        cmd.arg("--sleep-ms").arg(w.sleep_ms.to_string());
        if w.hash_records {
            cmd.arg("--hash-records");
        }
        cmd.stdout(Stdio::piped())
            .stdin(Stdio::null())
            .kill_on_drop(true);
        let mut child = cmd.spawn()?;
        let stdout = child.stdout.take().ok_or("no stdout")?;
        let mut c = Child {
            child,
            lines: BufReader::new(stdout).lines(),
        };
        let ready = c.line().await?;
        let start_us = ready
            .strip_prefix("READY ")
            .and_then(|v| v.trim().parse().ok())
            .ok_or_else(|| format!("consume: unexpected first line {ready:?}"))?;
        Ok((c, start_us))
    }

    /// Kills the child (SIGKILL) and reaps it.
    async fn stop(mut self) {
        let _ = self.child.kill().await;
    }

    fn pid(&self) -> u32 {
        self.child.id().unwrap_or(0)
    }

    async fn line(&mut self) -> Res<String> {
        match self.lines.next_line().await? {
            Some(l) => Ok(l),
            None => Err("consume child exited early (see its stderr)".into()),
        }
    }

    async fn result(mut self) -> Res<Value> {
        let line = self.line().await?;
        let v: Value = serde_json::from_str(&line)?;
        let status = self.child.wait().await?;
        if !status.success() {
            return Err(format!("consume child failed: {status}").into());
        }
        Ok(v)
    }
}

/// (b) Process only.
async fn process(url: &str, n: u64, payload: usize, w: &WorkerArgs, _cli: &Cli) -> Res<Value> {
    flush(url).await?;
    preload(url, n, payload).await?;
    let (child, start_us) = Child::spawn(url, n, 0, w).await?;
    let r = child.result().await?;
    let end_us = r["end_us"].as_u64().unwrap_or(0);
    let secs = (end_us.saturating_sub(start_us)) as f64 / 1e6;
    Ok(json!({
        "workload": "process", "n": n, "concurrency": w.concurrency, "fetch_batch": w.fetch_batch,
        "payload": payload, "retention_s": w.retention_s, "compact_records": !w.hash_records,
        "seconds": round3(secs), "jobs_per_s": (n as f64 / secs).round(),
        "cmds": r["cmds"], "redis_cpu_s": r["redis_cpu_s"], "redis_cpu_util": round3(r["redis_cpu_s"].as_f64().unwrap_or(0.0) / secs),
        "worker_cpu_s": r["worker_cpu_s"],
    }))
}

/// (c) End to end.
async fn e2e(url: &str, p: &ProduceArgs, w: &WorkerArgs, _cli: &Cli) -> Res<Value> {
    flush(url).await?;
    let queue = Queue::connect(url).await?;
    let (child, _) = Child::spawn(url, p.n, p.n, w).await?;
    let calls = Hist::new();
    let t0 = now_us();
    produce(&queue, p, &calls).await?;
    let produced_us = now_us();
    let r = child.result().await?;
    let end_us = r["end_us"].as_u64().unwrap_or(0);
    let secs = end_us.saturating_sub(t0) as f64 / 1e6;
    Ok(json!({
        "workload": if p.rate > 0.0 { "e2e-rate" } else { "e2e" },
        "n": p.n, "producers": p.producers, "spawned": p.spawned, "batch": p.batch, "payload": p.payload, "rate": p.rate,
        "concurrency": w.concurrency, "fetch_batch": w.fetch_batch, "retention_s": w.retention_s,
        "compact_records": !w.hash_records,
        "seconds": round3(secs), "jobs_per_s": (p.n as f64 / secs).round(),
        "enqueue_jobs_per_s": (p.n as f64 / ((produced_us - t0) as f64 / 1e6)).round(),
        "latency": r["latency"], "latency_redis_clock": r["latency_redis_clock"],
        "enqueue_call_latency": calls.summary_ms(),
        "cmds": r["cmds"], "redis_cpu_s": r["redis_cpu_s"], "redis_cpu_util": round3(r["redis_cpu_s"].as_f64().unwrap_or(0.0) / secs),
        "worker_cpu_s": r["worker_cpu_s"], "producer_cpu_s": round3(stats::self_cpu_s()),
    }))
}

/// Steady memory of one worker process running `n` jobs.
async fn memory(url: &str, n: u64, w: &WorkerArgs, _cli: &Cli) -> Res<Value> {
    flush(url).await?;
    let t = Instant::now();
    preload(url, n, 0).await?;
    let preload_s = t.elapsed().as_secs_f64();
    let mut conn = admin(url).await?;
    let mem_before: RedisSnapshot = stats::snapshot(&mut conn).await?;
    let (child, start_us) = Child::spawn(url, n, 0, w).await?;
    let pid = child.pid();
    let sampler = tokio::spawn(async move {
        let mut samples = Vec::new();
        let mut peak = 0;
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        loop {
            tick.tick().await;
            match stats::rss_kib(pid) {
                Some((rss, hwm)) => {
                    samples.push(rss);
                    peak = hwm;
                }
                None => break,
            }
        }
        (samples, peak)
    });
    let r = child.result().await?;
    let (samples, peak) = sampler.await?;
    let end_us = r["end_us"].as_u64().unwrap_or(0);
    let secs = end_us.saturating_sub(start_us) as f64 / 1e6;
    let mem_after = stats::snapshot(&mut conn).await?;
    let mib = |k: u64| round3(k as f64 / 1024.0);
    Ok(json!({
        "workload": "memory", "n": n, "concurrency": w.concurrency, "retention_s": w.retention_s,
        "preload_s": round3(preload_s),
        "seconds": round3(secs), "jobs_per_s": (n as f64 / secs).round(),
        "rss_mib": {
            "start": samples.first().copied().map(mib), "peak": mib(peak),
            "end": samples.iter().rev().nth(1).or(samples.last()).copied().map(mib),
            "samples": samples.iter().map(|k| mib(*k)).collect::<Vec<_>>(),
        },
        "worker_reported_rss_mib": r["rss_mib"],
        "redis_used_memory_mib": {
            "before_worker": round3(mem_before.used_memory as f64 / 1048576.0),
            "after_worker": round3(mem_after.used_memory as f64 / 1048576.0),
        },
    }))
}

/// No busy polling: counts an idle worker's calls over `seconds`.
async fn idle(url: &str, seconds: u64) -> Res<Value> {
    flush(url).await?;
    let mut conn = admin(url).await?;
    let worker = Worker::builder(url)
        .register(noop::handler())
        .build()
        .await?;
    let cfg = WorkerConfig::default();
    // Let the worker start (connect, first script loads) before counting.
    let stop = worker.shutdown_handle();
    let run = tokio::spawn(worker.run_until(std::future::pending::<()>()));
    tokio::time::sleep(Duration::from_millis(500)).await;
    let before = stats::snapshot(&mut conn).await?;
    tokio::time::sleep(Duration::from_secs(seconds)).await;
    let after = stats::snapshot(&mut conn).await?;
    stop.shutdown();
    let _ = run.await?;
    let d = |c: &str| after.calls_since(&before, c);
    let per_cmd: serde_json::Map<String, Value> = after
        .cmds
        .keys()
        .filter(|k| k.as_str() != "info" && d(k) > 0)
        .map(|k| (k.clone(), json!(d(k))))
        .collect();
    // The fetcher blocks in BLMOVE, the promoter in BLPOP on the wake list.
    let blocking = d("blmove") + d("blpop");
    let nonblocking = after.script_calls_since(&before);
    Ok(json!({
        "workload": "idle", "seconds": seconds,
        "block_timeout_s": cfg.block_timeout.as_secs_f64(), "promote_interval_ms": cfg.promote_interval.as_millis() as u64,
        "blmove": d("blmove"), "blpop": d("blpop"), "evalsha": nonblocking,
        "expected_blmove": (seconds as f64 / cfg.block_timeout.as_secs_f64()).round(),
        "calls_per_s": round3((blocking + nonblocking) as f64 / seconds as f64),
        "per_command": per_cmd,
    }))
}

/// The worker process: runs jobs until `n` are acked, then prints its result.
async fn consume(url: &str, n: u64, expect_enqueue: u64, w: &WorkerArgs) -> Res<()> {
    let probe = Arc::new(Probe {
        target: n,
        done: AtomicU64::new(0),
        first_start_us: AtomicU64::new(0),
        latency: Hist::new(),
        latency_redis_clock: Hist::new(),
        all_done: Notify::new(),
    });
    let _ = PROBE.set(probe.clone());
    SLEEP_MS.store(w.sleep_ms, Ordering::Relaxed);
    let mut conn = admin(url).await?;
    let stats_key = queue_core::QueueKeys::new(QUEUE).stats;
    let completed = |mut c: redis::aio::ConnectionManager| {
        let key = stats_key.clone();
        async move {
            let v: Option<u64> = redis::cmd("HGET")
                .arg(&key)
                .arg("completed")
                .query_async(&mut c)
                .await?;
            Ok::<u64, BoxError>(v.unwrap_or(0))
        }
    };
    let base = completed(conn.clone()).await?;
    let mut config = WorkerConfig {
        concurrency: w.concurrency,
        fetch_batch: w.fetch_batch,
        compact_records: !w.hash_records,
        ..WorkerConfig::default()
    };
    if let Some(r) = w.retention_s {
        config.completion_retention = Duration::from_secs(r);
    }
    let worker = Worker::builder(url)
        .register(noop::handler())
        .config(config)
        .build()
        .await?;
    let stop = worker.shutdown_handle();
    let before = stats::snapshot(&mut conn).await?;
    let cpu0 = stats::self_cpu_s();
    let start_us = now_us();
    let run = tokio::spawn(worker.run_until(std::future::pending::<()>()));
    println!("READY {start_us}");
    // Handlers count their starts; the run ends when Redis counted n acks.
    probe.all_done.notified().await;
    while completed(conn.clone()).await? < base + n {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let end_us = now_us();
    let after = stats::snapshot(&mut conn).await?;
    let secs = (end_us - start_us) as f64 / 1e6;
    let worker_cpu = stats::self_cpu_s() - cpu0;
    let rss = stats::rss_kib(std::process::id())
        .map(|(r, h)| json!({"end": r as f64 / 1024.0, "peak": h as f64 / 1024.0}));
    stop.shutdown();
    let _ = run.await?;
    let out = json!({
        "start_us": start_us, "end_us": end_us, "first_start_us": probe.first_start_us.load(Ordering::Relaxed),
        "latency": probe.latency.summary_ms(),
        "latency_redis_clock": probe.latency_redis_clock.summary_ms(),
        "cmds": after.queue_core_calls(&before, n, expect_enqueue, n, secs),
        "redis_cpu_s": after.cpu_since(&before),
        "worker_cpu_s": round3(worker_cpu),
        "rss_mib": rss,
    });
    println!("{out}");
    Ok(())
}

/// Runs redis-benchmark against the same server for the commands one job needs.
async fn ceiling(url: &str, requests: u64, clients: u32) -> Res<Value> {
    flush(url).await?;
    let (host, port) =
        host_port(url).ok_or("cannot parse --redis-url (want redis://host:port/)")?;
    let mut conn = admin(url).await?;
    let sha: String = redis::cmd("SCRIPT")
        .arg("LOAD")
        .arg("return 1")
        .query_async(&mut conn)
        .await?;
    let _: () = redis::cmd("RPUSH")
        .arg("ceil:ring")
        .arg("x")
        .query_async(&mut conn)
        .await?;
    let tests: Vec<(&str, Vec<String>, u32)> = vec![
        (
            "lpush",
            vec!["LPUSH".into(), "ceil:list".into(), "x".into()],
            1,
        ),
        (
            "lmove",
            vec![
                "LMOVE".into(),
                "ceil:ring".into(),
                "ceil:ring".into(),
                "RIGHT".into(),
                "LEFT".into(),
            ],
            1,
        ),
        (
            "evalsha",
            vec!["EVALSHA".into(), sha.clone(), "0".into()],
            1,
        ),
        (
            "evalsha_pipelined_16",
            vec!["EVALSHA".into(), sha.clone(), "0".into()],
            16,
        ),
    ];
    let mut rps = serde_json::Map::new();
    for (name, args, pipeline) in tests {
        let out = tokio::process::Command::new("redis-benchmark")
            .args([
                "-h",
                &host,
                "-p",
                &port.to_string(),
                "-c",
                &clients.to_string(),
            ])
            .args([
                "-n",
                &requests.to_string(),
                "-P",
                &pipeline.to_string(),
                "--csv",
            ])
            .args(&args)
            .output()
            .await?;
        let text = String::from_utf8_lossy(&out.stdout);
        // CSV: header line, then "<test>","<rps>",...
        let value = text
            .lines()
            .nth(1)
            .and_then(|l| l.split(',').nth(1))
            .map(|v| v.trim_matches('"').parse::<f64>().unwrap_or(0.0))
            .ok_or_else(|| format!("redis-benchmark {name}: unexpected output {text:?}"))?;
        rps.insert(name.to_string(), json!(value.round()));
    }
    let _: () = redis::cmd("FLUSHALL").query_async(&mut conn).await?;
    Ok(json!({
        "workload": "ceiling", "clients": clients, "requests": requests, "rps": rps,
        "redis_benchmark": String::from_utf8_lossy(&std::process::Command::new("redis-benchmark").arg("--version").output()?.stdout).trim(),
    }))
}

fn host_port(url: &str) -> Option<(String, u16)> {
    let rest = url.split("://").nth(1)?;
    let rest = rest.rsplit('@').next()?;
    let hp = rest.split('/').next()?;
    let (h, p) = hp.rsplit_once(':')?;
    Some((h.to_string(), p.parse().ok()?))
}
