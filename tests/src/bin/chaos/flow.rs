//! The `flow` workload (docs/WORKFLOWS.md): batches of members with a
//! complete callback each, run by worker processes that are SIGKILLed
//! throughout. Reports callbacks fired (each exactly once: one job enqueued
//! per batch callback, 0 missing), callbacks that saw a wrong count (a
//! member counted twice or the batch fired early), and member re-runs.
//! With `--cross-queue` the members are on `emails` and `billing` and the
//! batches and callbacks on `orders` (every count goes through the relay,
//! docs/WORKFLOWS.md "Relay"); it also reports notices relayed and lost
//! (left in a relay list or set aside as dead: must be 0).
//!
//! ```text
//! cargo run --release -p queue-tests --bin chaos -- flow --batches 200 --members 50 --workers 4 --kills 20
//! cargo run --release -p queue-tests --bin chaos -- flow --cross-queue --batches 200 --members 50 --workers 4 --kills 20
//! ```

use std::collections::HashMap;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use queue_core::{Batch, JobSpec, Queue, QueueKeys, Worker, WorkerConfig};
use queue_testkit::RedisServer;
use queue_tests::workflow_jobs::{
    wf_bill, wf_callback, wf_email, wf_member, wf_order_close, WfCallback, WfMember, WF_QUEUES,
};
use redis::AsyncCommands;

use crate::args::Args;
use crate::rng::Rng;

const USAGE: &str = "\
chaos flow: batch callbacks fire exactly once while workers are SIGKILLed

flags:
  --batches N        batches (default 200)
  --members N        members per batch (default 50)
  --workers N        worker processes (default 4)
  --kills N          SIGKILLs of a random worker, spread over the run (default 20)
  --lease-ms N       lease per delivery (default 1000)
  --seed N           random seed (default: from the clock)
  --timeout-secs N   give up after this long (default 600)
  --cross-queue      members on `emails` / `billing`, batches and callbacks on `orders`
  --json             print the report as one JSON object
";

/// `flow-worker <url> <concurrency> <lease-ms>`: runs the workflow test jobs.
pub async fn worker_main(argv: &[String]) -> i32 {
    let url = argv.first().cloned().unwrap_or_default();
    let num = |i: usize, d: u64| argv.get(i).and_then(|s| s.parse().ok()).unwrap_or(d);
    let config = WorkerConfig {
        concurrency: num(1, 8) as usize,
        lease: Duration::from_millis(num(2, 1000)),
        block_timeout: Duration::from_millis(200),
        ..WorkerConfig::default()
    };
    let worker = queue_tests::workflow_jobs::all()
        .into_iter()
        .fold(Worker::builder(&url), |b, r| b.register(r))
        .config(config)
        .build()
        .await;
    match worker {
        Ok(w) => i32::from(w.run().await.is_err()),
        Err(e) => {
            eprintln!("flow-worker: {e}");
            2
        }
    }
}

pub async fn main(argv: &[String]) -> i32 {
    let parsed = Args::parse(
        argv,
        &["json", "help", "cross-queue"],
        &[
            "batches",
            "members",
            "workers",
            "kills",
            "lease-ms",
            "seed",
            "timeout-secs",
        ],
    );
    let a = match parsed {
        Ok(a) if !a.switch("help") => a,
        Ok(_) => {
            eprintln!("{USAGE}");
            return 2;
        }
        Err(e) => {
            eprintln!("chaos flow: {e}\n\n{USAGE}");
            return 2;
        }
    };
    match run(&a).await {
        Ok(r) => {
            if a.switch("json") {
                println!("{}", r.json());
            } else {
                println!("{}", r.text());
            }
            i32::from(!r.passed())
        }
        Err(e) => {
            eprintln!("chaos flow: {e}");
            2
        }
    }
}

struct Report {
    batches: u64,
    members: u64,
    fired: u64,
    callback_jobs: u64,
    miscounted: u64,
    member_reruns: u64,
    kills: u64,
    cross_queue: bool,
    relayed: u64,
    lost: u64,
    /// Per batch: its `fired_at` minus the last member's `finished_at`
    /// (both Redis clock, ms): the median and the maximum.
    fire_latency_ms: (i64, i64),
    seconds: f64,
}

impl Report {
    fn passed(&self) -> bool {
        self.fired == self.batches
            && self.callback_jobs == self.batches
            && self.miscounted == 0
            && self.lost == 0
    }

    fn json(&self) -> String {
        format!(
            "{{\"workload\":\"flow\",\"cross_queue\":{},\"batches\":{},\"members\":{},\"callbacks_fired\":{},\"callback_jobs_enqueued\":{},\"miscounted\":{},\"member_reruns\":{},\"relayed\":{},\"lost\":{},\"fire_latency_ms_p50\":{},\"fire_latency_ms_max\":{},\"kills\":{},\"seconds\":{:.1},\"passed\":{}}}",
            self.cross_queue, self.batches, self.members, self.fired, self.callback_jobs, self.miscounted,
            self.member_reruns, self.relayed, self.lost, self.fire_latency_ms.0, self.fire_latency_ms.1,
            self.kills, self.seconds, self.passed()
        )
    }

    fn text(&self) -> String {
        format!(
            "flow workload: {} batches x {} members, {} kills, {:.1} s\n  callbacks fired: {} of {} \
             (callback jobs enqueued: {})\n  callbacks that saw a wrong count: {}\n  member re-runs \
             (killed mid-run, counted once): {}\n  relay notices applied: {}, lost: {}\n  last member -> batch fired: median {} ms, max {} ms\n  {}",
            self.batches, self.members, self.kills, self.seconds, self.fired, self.batches,
            self.callback_jobs, self.miscounted, self.member_reruns, self.relayed, self.lost,
            self.fire_latency_ms.0, self.fire_latency_ms.1,
            if self.passed() { "PASSED" } else { "FAILED" }
        )
    }
}

async fn enqueue_all(
    queue: &Queue,
    url: &str,
    batches: u64,
    members: u64,
    cross_queue: bool,
    rng: &mut Rng,
) -> Result<(), String> {
    for b in 0..batches {
        let cb = WfCallback {
            ledger: url.to_string(),
        };
        let callback = if cross_queue {
            JobSpec::new::<wf_order_close::Job>(&cb)
        } else {
            JobSpec::new::<wf_callback::Job>(&cb)
        };
        let mut batch = Batch::new(queue)
            .id(format!("b{b}"))
            .on_complete(callback.map_err(|e| e.to_string())?);
        for m in 0..members {
            let member = WfMember {
                ledger: url.to_string(),
                sleep_ms: rng.range(0, 20),
                ..WfMember::default()
            };
            let spec = match (cross_queue, m % 2) {
                (false, _) => JobSpec::new::<wf_member::Job>(&member),
                (true, 0) => JobSpec::new::<wf_email::Job>(&member),
                (true, _) => JobSpec::new::<wf_bill::Job>(&member),
            }
            .map_err(|e| e.to_string())?;
            batch = batch.add(spec.id(format!("b{b}-{m}")));
        }
        batch.enqueue().await.map_err(|e| e.to_string())?;
    }
    Ok(())
}

fn spawn(exe: &std::path::Path, url: &str, lease_ms: u64) -> Result<Child, String> {
    Command::new(exe)
        .args(["flow-worker", url, "8", &lease_ms.to_string()])
        .env(
            "RUST_LOG",
            std::env::var("CHAOS_WORKER_LOG").unwrap_or_else(|_| "error".into()),
        )
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("cannot start a worker process: {e}"))
}

async fn run(a: &Args) -> Result<Report, String> {
    let started = Instant::now();
    let batches: u64 = a.get("batches", 200)?;
    let members: u64 = a.get("members", 50)?;
    let workers: usize = a.get("workers", 4)?;
    let kills: u64 = a.get("kills", 20)?;
    let lease_ms: u64 = a.get("lease-ms", 1000)?;
    let timeout = Duration::from_secs(a.get("timeout-secs", 600)?);
    let clock = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(1, |d| d.as_nanos() as u64);
    let mut rng = Rng::new(a.get("seed", clock)?);
    let redis = RedisServer::start().map_err(|e| format!("cannot start redis-server: {e}"))?;
    let url = redis.url();
    let queue = Queue::connect(&url).await.map_err(|e| e.to_string())?;
    let cross_queue = a.switch("cross-queue");
    enqueue_all(&queue, &url, batches, members, cross_queue, &mut rng).await?;
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let mut children = (0..workers)
        .map(|_| spawn(&exe, &url, lease_ms))
        .collect::<Result<Vec<_>, _>>()?;
    let dog = crate::dog::Dog::start(&url, &WF_QUEUES).await?;
    let mut c = queue_tests::redis_conn(&url).await;
    let total = batches * members;
    let mut done_kills = 0;
    let fired = loop {
        let effects: u64 = c
            .hlen("ledger:wf:effects")
            .await
            .map_err(|e| e.to_string())?;
        let fired: u64 = c
            .hlen("ledger:wf:callbacks")
            .await
            .map_err(|e| e.to_string())?;
        if (fired >= batches && done_kills >= kills) || started.elapsed() > timeout {
            break fired;
        }
        // Kill number k (1-based) when k/(kills+1) of the members ran.
        if done_kills < kills && effects >= (done_kills + 1) * total / (kills + 1) {
            let i = rng.range(0, children.len() as u64) as usize;
            let _ = children[i].kill();
            let _ = children[i].wait();
            children[i] = spawn(&exe, &url, lease_ms)?;
            done_kills += 1;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    for ch in &mut children {
        let _ = ch.kill();
        let _ = ch.wait();
    }
    // The last notices may be applied but not yet removed (a worker killed
    // between the relay's two steps): the watchdog's next passes remove them.
    let drain_until = Instant::now() + Duration::from_secs(5);
    while Instant::now() < drain_until {
        let mut left = 0u64;
        for q in WF_QUEUES {
            let n: u64 = c
                .llen(QueueKeys::new(q).relay())
                .await
                .map_err(|e| e.to_string())?;
            left += n;
        }
        if left == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    dog.stop().await;
    let summary: HashMap<String, String> = c
        .hgetall("ledger:wf:summary")
        .await
        .map_err(|e| e.to_string())?;
    let want = format!("{members}/{members}/0/0");
    let effects: HashMap<String, u64> = c
        .hgetall("ledger:wf:effects")
        .await
        .map_err(|e| e.to_string())?;
    let mut enqueued: u64 = 0;
    let (mut relayed, mut lost) = (0u64, 0u64);
    for q in WF_QUEUES {
        let keys = QueueKeys::new(q);
        let n: Option<u64> = c
            .hget(&keys.stats, "enqueued")
            .await
            .map_err(|e| e.to_string())?;
        enqueued += n.unwrap_or(0);
        let r: Option<u64> = c
            .hget(&keys.stats, "relayed")
            .await
            .map_err(|e| e.to_string())?;
        relayed += r.unwrap_or(0);
        let left: u64 = c.llen(keys.relay()).await.map_err(|e| e.to_string())?;
        let dead: u64 = c.llen(keys.relay_dead()).await.map_err(|e| e.to_string())?;
        lost += left + dead;
    }
    let fire_latency_ms = fire_latency(&mut c, &queue, batches, members, cross_queue).await?;
    Ok(Report {
        batches,
        members,
        fired,
        callback_jobs: enqueued.saturating_sub(total),
        miscounted: summary.values().filter(|v| **v != want).count() as u64,
        member_reruns: effects.values().filter(|n| **n > 1).count() as u64,
        kills: done_kills,
        cross_queue,
        relayed,
        lost,
        fire_latency_ms,
        seconds: started.elapsed().as_secs_f64(),
    })
}

/// Median and maximum over the batches of `fired_at` minus the latest
/// member `finished_at` (completion records; Redis clock, ms).
async fn fire_latency(
    c: &mut redis::aio::MultiplexedConnection,
    queue: &Queue,
    batches: u64,
    members: u64,
    cross_queue: bool,
) -> Result<(i64, i64), String> {
    let home = if cross_queue {
        queue_tests::workflow_jobs::ORDERS
    } else {
        queue_tests::workflow_jobs::WF_QUEUE
    };
    let mut lat = Vec::with_capacity(batches as usize);
    for b in 0..batches {
        let fired: Option<i64> = c
            .hget(QueueKeys::new(home).batch(&format!("b{b}")), "fired_at")
            .await
            .map_err(|e| e.to_string())?;
        let mut last = None;
        for m in 0..members {
            let q = match (cross_queue, m % 2) {
                (false, _) => queue_tests::workflow_jobs::WF_QUEUE,
                (true, 0) => queue_tests::workflow_jobs::EMAILS,
                (true, _) => queue_tests::workflow_jobs::BILLING,
            };
            let at =
                queue_tests::record_number(queue, q, &format!("b{b}-{m}"), "finished_at").await;
            last = last.max(at);
        }
        if let (Some(f), Some(l)) = (fired, last) {
            lat.push(f - l);
        }
    }
    lat.sort_unstable();
    Ok((
        lat.get(lat.len() / 2).copied().unwrap_or(0),
        lat.last().copied().unwrap_or(0),
    ))
}
