//! Scale-out measurements for docs/SCALE-OUT.md.
//!
//! * `throughput`: jobs per second end to end (batch enqueue + workers with a
//!   no-op handler, until every job is acked) on one `redis-server` and on a
//!   3-primary Redis Cluster, with several queues (one worker per queue, each
//!   with its own connections), the queues spread over the primaries by their
//!   hash tags.
//! * `durability`: latency of a single enqueue on a primary with one replica,
//!   without and with `wait_for_replicas(1, …)`, for `appendonly no`,
//!   `appendfsync everysec` and `appendfsync always`.
//!
//! ```text
//! cargo run --release -p queue-tests --bin cluster-bench -- \
//!     [--mode throughput|durability|all] [--queues 6] [--jobs 20000] \
//!     [--concurrency 32] [--runs 3] [--samples 3000]
//! ```
//!
//! Every server is started on free loopback ports by the testkit and
//! removed afterwards. Everything (servers and the benchmark process) shares
//! the machine's cores: read the numbers with that in mind.

use std::time::{Duration, Instant};

use queue_core::{
    BoxFuture, EnqueueOptions, Job, JobContext, JobError, Queue, Registration, Worker, WorkerConfig,
};
use queue_testkit::cluster::RedisCluster;
use queue_testkit::RedisServer;

macro_rules! noop {
    ($ty:ident, $queue:literal) => {
        struct $ty;
        impl Job for $ty {
            type Args = u64;
            const NAME: &'static str = "noop";
            const QUEUE: &'static str = $queue;
            fn run(_ctx: JobContext, _n: u64) -> BoxFuture<'static, Result<(), JobError>> {
                Box::pin(async { Ok(()) })
            }
        }
    };
}
// Ordered so that any prefix is spread evenly over the 3 primaries of a
// `redis-cli --cluster create` cluster (slots 0-5460, 5461-10922, 10923-16383):
// bench-2 4091, bench-3 8154, bench-0 12217, bench-6 3967, bench-7 8030,
// bench-4 12093, bench-11 10310, bench-8 11953.
noop!(Q0, "bench-2");
noop!(Q1, "bench-3");
noop!(Q2, "bench-0");
noop!(Q3, "bench-6");
noop!(Q4, "bench-7");
noop!(Q5, "bench-4");
noop!(Q6, "bench-11");
noop!(Q7, "bench-8");

const QUEUES: [&str; 8] = [
    "bench-2", "bench-3", "bench-0", "bench-6", "bench-7", "bench-4", "bench-11", "bench-8",
];

fn registration(i: usize) -> Registration {
    match i {
        0 => Registration::of::<Q0>(),
        1 => Registration::of::<Q1>(),
        2 => Registration::of::<Q2>(),
        3 => Registration::of::<Q3>(),
        4 => Registration::of::<Q4>(),
        5 => Registration::of::<Q5>(),
        6 => Registration::of::<Q6>(),
        _ => Registration::of::<Q7>(),
    }
}

struct Args {
    mode: String,
    queues: usize,
    jobs: usize,
    concurrency: usize,
    runs: usize,
    samples: usize,
}

fn parse_args() -> Args {
    let mut a = Args {
        mode: "all".into(),
        queues: 6,
        jobs: 20_000,
        concurrency: 32,
        runs: 3,
        samples: 3000,
    };
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let mut i = 0;
    while i < argv.len() {
        let val = argv.get(i + 1).cloned().unwrap_or_default();
        let num = || -> usize {
            val.parse()
                .unwrap_or_else(|_| panic!("{} needs a number", argv[i]))
        };
        match argv[i].as_str() {
            "--mode" => a.mode = val.clone(),
            "--queues" => a.queues = num().clamp(1, QUEUES.len()),
            "--jobs" => a.jobs = num(),
            "--concurrency" => a.concurrency = num(),
            "--runs" => a.runs = num().max(1),
            "--samples" => a.samples = num(),
            "-h" | "--help" => {
                eprintln!("cluster-bench [--mode throughput|durability|all] [--queues N<=8] [--jobs per queue] [--concurrency per worker] [--runs N] [--samples N]");
                std::process::exit(0);
            }
            other => panic!("unknown argument {other}"),
        }
        i += 2;
    }
    a
}

#[tokio::main]
async fn main() {
    queue_tests::init_tracing();
    let args = parse_args();
    println!(
        "cluster-bench on {} cores, redis-server {}",
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(0),
        redis_version()
    );
    if args.mode == "throughput" || args.mode == "all" {
        throughput(&args).await;
    }
    if args.mode == "durability" || args.mode == "all" {
        durability(&args).await;
    }
}

fn redis_version() -> String {
    std::process::Command::new("redis-server")
        .arg("--version")
        .output()
        .ok()
        .and_then(|o| {
            String::from_utf8_lossy(&o.stdout)
                .split_whitespace()
                .find_map(|w| w.strip_prefix("v=").map(str::to_string))
        })
        .unwrap_or_else(|| "?".into())
}

/// One end-to-end run: returns (enqueue jobs/s, end-to-end jobs/s).
async fn run_once(url: &str, args: &Args) -> (f64, f64) {
    let queues = &QUEUES[..args.queues];
    let total = (args.jobs * queues.len()) as i64;
    let queue = Queue::connect(url).await.expect("connect");
    let mut workers = Vec::new();
    for (i, q) in queues.iter().enumerate() {
        let cfg = WorkerConfig {
            concurrency: args.concurrency,
            fetch_batch: args.concurrency.min(64),
            block_timeout: Duration::from_millis(200),
            ..WorkerConfig::default()
        };
        let w = Worker::builder(url)
            .register(registration(i))
            .queues([*q])
            .config(cfg)
            .build()
            .await
            .expect("worker");
        let h = w.shutdown_handle();
        workers.push((h, tokio::spawn(w.run_until(std::future::pending()))));
    }
    let started = Instant::now();
    let mut producers = Vec::new();
    for q in queues {
        // Each producer has its own connection, as separate services would.
        let p = Queue::connect(url).await.expect("connect");
        let jobs = args.jobs;
        let q = q.to_string();
        producers.push(tokio::spawn(async move {
            let payload = rmp_serde::to_vec_named(&7u64).unwrap();
            let mut left = jobs;
            while left > 0 {
                let n = left.min(500);
                let items = (0..n)
                    .map(|_| (EnqueueOptions::new(), payload.clone()))
                    .collect();
                p.enqueue_raw_batch(&q, "noop", 1, 25, items)
                    .await
                    .expect("enqueue");
                left -= n;
            }
        }));
    }
    for p in producers {
        p.await.unwrap();
    }
    let enqueued = started.elapsed();
    loop {
        let mut done = 0;
        for q in queues {
            done += queue
                .stats(q)
                .await
                .map(|s| s.counter("completed"))
                .unwrap_or(0);
        }
        if done >= total {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let elapsed = started.elapsed();
    for (h, _) in &workers {
        h.shutdown();
    }
    for (_, j) in workers {
        j.await.unwrap().unwrap();
    }
    (
        total as f64 / enqueued.as_secs_f64(),
        total as f64 / elapsed.as_secs_f64(),
    )
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

async fn throughput(args: &Args) {
    println!(
        "\n## Throughput: {} queues x {} no-op jobs, one worker per queue (concurrency {}), batches of 500, median of {} runs\n",
        args.queues, args.jobs, args.concurrency, args.runs
    );
    println!("| topology | enqueue jobs/s | end-to-end jobs/s | runs (end-to-end) |");
    println!("|---|---|---|---|");
    let mut single = (Vec::new(), Vec::new());
    for _ in 0..args.runs {
        let server = RedisServer::start().expect("redis-server");
        let (e, t) = run_once(&server.url(), args).await;
        single.0.push(e);
        single.1.push(t);
    }
    println!(
        "| 1 redis-server | {:.0} | {:.0} | {:?} |",
        median(single.0.clone()),
        median(single.1.clone()),
        single.1.iter().map(|x| x.round()).collect::<Vec<_>>()
    );
    let mut cluster_runs = (Vec::new(), Vec::new());
    let mut spread = String::new();
    for _ in 0..args.runs {
        let cluster = RedisCluster::start(3).expect("cluster");
        if spread.is_empty() {
            let owners: Vec<String> = QUEUES[..args.queues]
                .iter()
                .map(|q| format!("{q}->node{}", cluster.master_of_queue(q).unwrap_or(99)))
                .collect();
            spread = owners.join(", ");
        }
        let (e, t) = run_once(&cluster.url(), args).await;
        cluster_runs.0.push(e);
        cluster_runs.1.push(t);
    }
    println!(
        "| Redis Cluster, 3 primaries | {:.0} | {:.0} | {:?} |",
        median(cluster_runs.0.clone()),
        median(cluster_runs.1.clone()),
        cluster_runs.1.iter().map(|x| x.round()).collect::<Vec<_>>()
    );
    println!("\nqueue placement on the cluster: {spread}");
}

async fn durability(args: &Args) {
    println!(
        "\n## Enqueue latency with a replica: {} sequential single enqueues per row (after 200 warm-up)\n",
        args.samples
    );
    println!("| persistence (primary and replica) | WAIT | p50 µs | p99 µs | mean µs | enqueues/s (one caller) |");
    println!("|---|---|---|---|---|---|");
    let configs: [(&str, &[&str]); 3] = [
        ("appendonly no", &[]),
        (
            "appendonly yes, appendfsync everysec",
            &["--appendonly", "yes", "--appendfsync", "everysec"],
        ),
        (
            "appendonly yes, appendfsync always",
            &["--appendonly", "yes", "--appendfsync", "always"],
        ),
    ];
    for (name, extra) in configs {
        let primary = RedisServer::start_with(extra).expect("primary");
        let port = primary.port().to_string();
        let mut rargs = vec!["--replicaof", "127.0.0.1", &port];
        rargs.extend_from_slice(extra);
        let replica = RedisServer::start_with(&rargs).expect("replica");
        let start = Instant::now();
        while !replica
            .command(&["INFO", "replication"])
            .map(|i| i.contains("master_link_status:up"))
            .unwrap_or(false)
        {
            assert!(start.elapsed() < Duration::from_secs(20), "replica link");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let queue = Queue::connect(&primary.url()).await.expect("connect");
        for wait in [false, true] {
            let payload = rmp_serde::to_vec_named(&7u64).unwrap();
            let mut lat = Vec::with_capacity(args.samples);
            for i in 0..(args.samples + 200) {
                let mut opts = EnqueueOptions::new();
                if wait {
                    opts = opts.wait_for_replicas(1, Duration::from_secs(1));
                }
                let t = Instant::now();
                queue
                    .enqueue_raw("lat", "noop", 1, 25, opts, &payload)
                    .await
                    .expect("enqueue");
                if i >= 200 {
                    lat.push(t.elapsed().as_secs_f64() * 1e6);
                }
            }
            let mean = lat.iter().sum::<f64>() / lat.len() as f64;
            lat.sort_by(|a, b| a.partial_cmp(b).unwrap());
            let p = |q: f64| lat[((lat.len() as f64 - 1.0) * q) as usize];
            println!(
                "| {name} | {} | {:.0} | {:.0} | {:.0} | {:.0} |",
                if wait { "1 replica" } else { "no" },
                p(0.5),
                p(0.99),
                mean,
                1e6 / mean
            );
        }
        drop(replica);
    }
}
