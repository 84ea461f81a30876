//! `demo`: enqueue through the web example, crash a worker, watch nothing get lost.
//!
//! ```text
//! bash scripts/demo.sh              # from the repository root: builds, then runs this
//! target/debug/demo --help          # after `cargo build -p queue-examples -p queue-watchdog --bins`
//! ```
//!
//! It builds nothing itself: it runs the `web`, `worker` and `queue-watchdog`
//! binaries found next to its own executable, in this order:
//!
//! 1. `REDIS_URL`, or else a throwaway `redis-server` on a free loopback port;
//! 2. `web` on a free port, then 2 `worker` processes with a short lease;
//! 3. real HTTP `POST /welcome` requests: 40 jobs, some flaky (they fail once
//!    and are retried), one with an invalid address (dead-lettered), one sent
//!    twice with the same `Idempotency-Key` (the second is a duplicate);
//! 4. once every worker is running a job, SIGKILL one of them;
//! 5. `queue-watchdog run` with a short orphan grace, and a replacement worker;
//! 6. poll `GET /stats` until every job completed or was dead-lettered, check
//!    each job with `GET /jobs/{id}`, print a summary and stop everything with
//!    SIGTERM.
//!
//! Exit code 0 only when every enqueued job ended completed or dead-lettered.
//! Each child's output is in `<logs>/<name>.log` (default `target/debug/demo-logs/`).

mod children;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::Parser;
use queue_examples::WELCOME_QUEUE;
use serde_json::json;

use children::Child;
use queue_examples::http::Client;

/// Crash-recovery demo: web enqueues, workers run, one is SIGKILLed, the watchdog recovers.
#[derive(Debug, Parser)]
#[command(name = "demo", about)]
struct Args {
    /// Jobs to POST.
    #[arg(long, default_value_t = 40)]
    jobs: usize,
    /// Worker processes at the start (one of them is killed).
    #[arg(long, default_value_t = 2)]
    workers: usize,
    /// Jobs each worker runs at once.
    #[arg(long, default_value_t = 4)]
    concurrency: usize,
    /// Workers' lease (ms): how long the killed worker's jobs stay taken.
    #[arg(long, default_value_t = 2_000)]
    lease_ms: u64,
    /// Simulated work per job (ms).
    #[arg(long, default_value_t = 300)]
    work_ms: u64,
    /// Give up waiting for the jobs after this many seconds.
    #[arg(long, default_value_t = 45)]
    timeout_secs: u64,
    /// Use this Redis instead of starting a throwaway redis-server.
    #[arg(long, env = "REDIS_URL")]
    redis: Option<String>,
    /// Directory for the children's logs (default: `demo-logs` next to this binary).
    #[arg(long)]
    logs: Option<PathBuf>,
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::parse();
    match run(args).await {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("demo failed: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn run(args: Args) -> Result<bool, String> {
    if args.workers == 0 || args.concurrency == 0 || args.jobs < 2 {
        return Err("need at least 1 worker, concurrency 1 and 2 jobs".into());
    }
    let log = Narrator {
        start: Instant::now(),
    };
    let bins = Bins::locate()?;
    let logs = prepare_logs(&args, &bins)?;

    // Kept until the end of `run`: dropping it kills the throwaway server.
    let (server, url) = match &args.redis {
        Some(url) => (None, url.clone()),
        None => {
            let server = queue_testkit::RedisServer::start().map_err(|e| e.to_string())?;
            let url = server.url();
            (Some(server), url)
        }
    };
    let origin = if server.is_some() {
        "throwaway redis-server"
    } else {
        "REDIS_URL"
    };
    log.say(format!("redis     {url} ({origin})"));
    log.say(format!("logs      {}/", logs.display()));

    let port = queue_testkit::free_port().map_err(|e| format!("no free port: {e}"))?;
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let web_args = strings(&["--listen", &addr.to_string(), "--redis", &url]);
    let mut web = Child::spawn("web", &bins.web, &web_args, &[], &logs)?;
    let client = Client::new(addr);
    let baseline = wait_for_web(&client, &mut web).await?;
    log.say(format!("web       http://{addr} (pid {})", web.pid));

    let worker_args = strings(&[
        "--redis",
        &url,
        "--concurrency",
        &args.concurrency.to_string(),
        "--lease-ms",
        &args.lease_ms.to_string(),
        "--grace-ms",
        "5000",
        "--backoff-base-ms",
        "200",
    ]);
    let worker_env = [("WELCOME_WORK_MS", args.work_ms.to_string())];
    let spawn_worker = |n: usize| {
        Child::spawn(
            &format!("worker-{n}"),
            &bins.worker,
            &worker_args,
            &worker_env,
            &logs,
        )
    };
    let mut workers = Vec::new();
    for n in 1..=args.workers {
        workers.push(spawn_worker(n)?);
    }
    let pids: Vec<String> = workers.iter().map(|w| w.pid.to_string()).collect();
    log.say(format!(
        "workers   {} processes x concurrency {}, lease {} ms (pids {})",
        args.workers,
        args.concurrency,
        args.lease_ms,
        pids.join(", ")
    ));

    let ids = post_jobs(&client, &log, args.jobs).await?;

    let busy = wait_until_every_worker_is_busy(&client, &mut workers, &args).await?;
    let mut victim = workers.remove(0);
    victim.kill().await?;
    log.say(format!(
        "SIGKILL   {} (pid {}) mid-job: {} jobs were in flight across {} workers",
        victim.name, victim.pid, busy.processing, args.workers
    ));

    let watchdog = Child::spawn("watchdog", &bins.watchdog, &watchdog_args(&url), &[], &logs)?;
    let replacement = spawn_worker(args.workers + 1)?;
    log.say(format!(
        "started   queue-watchdog (pid {}) and replacement {} (pid {})",
        watchdog.pid, replacement.name, replacement.pid
    ));
    workers.push(replacement);
    let mut running = workers;
    running.push(watchdog);
    running.push(web);

    let limit = Duration::from_secs(args.timeout_secs);
    let finished = wait_for_jobs(&client, &log, &mut running, &baseline, ids.len(), limit).await?;
    let outcome = check_each_job(&client, &ids).await?;
    let last = stats(&client).await?;
    print_summary(&log, &baseline, &last, &outcome, finished);

    stop_all(&log, &mut running).await;
    let ok = outcome.lost.is_empty();
    log.say(if ok {
        "OK: every enqueued job ended completed or dead-lettered; all processes stopped"
    } else {
        "FAILED: some jobs did not end completed or dead-lettered"
    });
    Ok(ok)
}

/// The children's log directory, emptied first unless the user chose it.
fn prepare_logs(args: &Args, bins: &Bins) -> Result<PathBuf, String> {
    let logs = args
        .logs
        .clone()
        .unwrap_or_else(|| bins.dir.join("demo-logs"));
    if args.logs.is_none() {
        let _ = std::fs::remove_dir_all(&logs);
    }
    std::fs::create_dir_all(&logs).map_err(|e| format!("cannot create {}: {e}", logs.display()))?;
    Ok(logs)
}

/// Waits until every worker runs a job: a worker holds at most
/// `concurrency` jobs, so more than that times (workers - 1) in processing
/// means every worker is running one.
async fn wait_until_every_worker_is_busy(
    client: &Client,
    workers: &mut [Child],
    args: &Args,
) -> Result<Snapshot, String> {
    let threshold = (args.workers as u64 - 1) * args.concurrency as u64;
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        for w in workers.iter_mut() {
            w.ensure_running()?;
        }
        let s = stats(client).await?;
        if s.processing > threshold {
            return Ok(s);
        }
        if Instant::now() > deadline {
            return Err("the workers never picked up the jobs; see their logs".into());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn watchdog_args(url: &str) -> Vec<String> {
    strings(&[
        "run",
        "--redis",
        url,
        "--queue",
        WELCOME_QUEUE,
        "--interval-ms",
        "200",
        "--orphan-grace-ms",
        "1000",
        "--backoff-base-ms",
        "200",
        "--backoff-max-ms",
        "2000",
    ])
}

/// SIGTERMs every child, then waits for each, saying which did not exit cleanly.
async fn stop_all(log: &Narrator, running: &mut [Child]) {
    for child in running.iter() {
        child.terminate();
    }
    for child in running.iter_mut() {
        match child.wait(Duration::from_secs(15)).await {
            Ok(status) if status.success() => {}
            Ok(status) => log.say(format!(
                "{} exited with {status}; see {}",
                child.name,
                child.log.display()
            )),
            Err(e) => log.say(e),
        }
    }
}

/// Prints lines prefixed with the time since the demo started.
struct Narrator {
    start: Instant,
}

impl Narrator {
    fn say(&self, line: impl std::fmt::Display) {
        println!("[{:>5.1}s] {line}", self.start.elapsed().as_secs_f64());
    }
}

/// The sibling binaries.
struct Bins {
    dir: PathBuf,
    web: PathBuf,
    worker: PathBuf,
    watchdog: PathBuf,
}

impl Bins {
    fn locate() -> Result<Bins, String> {
        let exe =
            std::env::current_exe().map_err(|e| format!("cannot find this executable: {e}"))?;
        let dir = exe.parent().map(Path::to_path_buf).unwrap_or_default();
        let find = |name: &str| {
            let path = dir.join(format!("{name}{}", std::env::consts::EXE_SUFFIX));
            if path.is_file() {
                Ok(path)
            } else {
                Err(format!(
                    "{} is missing: build the binaries first with \
                     `cargo build -p queue-examples -p queue-watchdog --bins` (scripts/demo.sh does)",
                    path.display()
                ))
            }
        };
        Ok(Bins {
            web: find("web")?,
            worker: find("worker")?,
            watchdog: find("queue-watchdog")?,
            dir,
        })
    }
}

fn strings(args: &[&str]) -> Vec<String> {
    args.iter().map(|s| s.to_string()).collect()
}

/// The recipient of job `i` of `n`: one invalid address, every eighth flaky.
fn recipient(i: usize, n: usize) -> String {
    if i == n / 2 {
        format!("user{i}.example.com")
    } else if i % 8 == 5 {
        format!("flaky{i}@example.com")
    } else {
        format!("user{i}@example.com")
    }
}

/// POSTs `n` jobs, the first with an `Idempotency-Key` that is then sent again.
async fn post_jobs(client: &Client, log: &Narrator, n: usize) -> Result<Vec<String>, String> {
    // A business key unique to this run, so a shared REDIS_URL can run the demo again.
    let key = format!("signup-{}", &queue_core::JobId::random().as_str()[..8]);
    let body = |i: usize| json!({"email": recipient(i, n), "name": format!("User {i}")});
    let mut ids = Vec::with_capacity(n);
    for i in 0..n {
        let r = client
            .post_json("/welcome", (i == 0).then_some(key.as_str()), &body(i))
            .await?;
        let id = r.body["job_id"].as_str().filter(|_| r.status == 202);
        let id =
            id.ok_or_else(|| format!("POST /welcome #{i} answered {}: {}", r.status, r.body))?;
        ids.push(id.to_string());
    }
    let flaky = (0..n)
        .filter(|&i| recipient(i, n).contains("flaky"))
        .count();
    log.say(format!(
        "POST      /welcome x {n}: all 202 with a job id ({flaky} flaky addresses, 1 invalid)"
    ));
    let again = client.post_json("/welcome", Some(&key), &body(0)).await?;
    let same = again.body["job_id"].as_str() == Some(ids[0].as_str());
    if again.status != 200 || again.body["duplicate"] != json!(true) || !same {
        return Err(format!(
            "re-POST with the same Idempotency-Key answered {}: {}",
            again.status, again.body
        ));
    }
    log.say(format!(
        "POST      /welcome again with Idempotency-Key {key}: 200 duplicate (job is {}), nothing enqueued",
        again.body["state"].as_str().unwrap_or("?")
    ));
    Ok(ids)
}

/// What `GET /stats` says.
#[derive(Debug, Clone, Default)]
struct Snapshot {
    main: u64,
    processing: u64,
    delayed: u64,
    counters: BTreeMap<String, i64>,
}

impl Snapshot {
    fn counter(&self, name: &str) -> i64 {
        self.counters.get(name).copied().unwrap_or(0)
    }

    /// How much `name` grew since `base`.
    fn since(&self, base: &Snapshot, name: &str) -> i64 {
        self.counter(name) - base.counter(name)
    }
}

async fn stats(client: &Client) -> Result<Snapshot, String> {
    let r = client.get("/stats").await?;
    if r.status != 200 {
        return Err(format!("GET /stats answered {}: {}", r.status, r.body));
    }
    let n = |k: &str| r.body[k].as_u64().unwrap_or(0);
    let counters = r.body["counters"]
        .as_object()
        .map(|m| {
            m.iter()
                .map(|(k, v)| (k.clone(), v.as_i64().unwrap_or(0)))
                .collect()
        })
        .unwrap_or_default();
    Ok(Snapshot {
        main: n("main"),
        processing: n("processing"),
        delayed: n("delayed"),
        counters,
    })
}

/// Waits until `GET /stats` answers (the web is up and reaches Redis).
async fn wait_for_web(client: &Client, web: &mut Child) -> Result<Snapshot, String> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        web.ensure_running()?;
        match stats(client).await {
            Ok(s) => return Ok(s),
            Err(e) if Instant::now() > deadline => return Err(format!("web never answered: {e}")),
            Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
}

/// Polls until completed + dead-lettered covers every posted job; false on timeout.
async fn wait_for_jobs(
    client: &Client,
    log: &Narrator,
    running: &mut [Child],
    base: &Snapshot,
    posted: usize,
    limit: Duration,
) -> Result<bool, String> {
    let deadline = Instant::now() + limit;
    let mut last_line = String::new();
    let mut last_print = Instant::now();
    loop {
        for child in running.iter_mut() {
            child.ensure_running()?;
        }
        let s = stats(client).await?;
        let (done, dead) = (s.since(base, "completed"), s.since(base, "dead"));
        let line = format!(
            "progress  main {:>2}  processing {:>2}  delayed {:>2} | completed {:>2}  dead {}  recovered {}",
            s.main,
            s.processing,
            s.delayed,
            done,
            dead,
            s.since(base, "reclaimed")
        );
        let finished = done + dead >= posted as i64;
        if line != last_line && (finished || last_print.elapsed() >= Duration::from_secs(1)) {
            log.say(&line);
            last_print = Instant::now();
            last_line = line;
        }
        if finished {
            return Ok(true);
        }
        if Instant::now() > deadline {
            log.say(format!("timed out after {limit:?} waiting for the jobs"));
            return Ok(false);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Every posted job's final state, from `GET /jobs/{id}`.
#[derive(Debug, Default)]
struct Outcome {
    completed: usize,
    /// (id, dead reason)
    dead: Vec<(String, String)>,
    /// (id, what the web said)
    lost: Vec<(String, String)>,
}

async fn check_each_job(client: &Client, ids: &[String]) -> Result<Outcome, String> {
    let mut out = Outcome::default();
    for id in ids {
        let r = client.get(&format!("/jobs/{id}")).await?;
        match (r.status, r.body["state"].as_str()) {
            (200, Some("completed")) => out.completed += 1,
            (200, Some("dead")) => {
                let reason = r.body["fields"]["dead_reason"].as_str().unwrap_or("?");
                out.dead.push((id.clone(), reason.to_string()));
            }
            _ => out
                .lost
                .push((id.clone(), format!("{} {}", r.status, r.body))),
        }
    }
    Ok(out)
}

fn print_summary(
    log: &Narrator,
    base: &Snapshot,
    last: &Snapshot,
    outcome: &Outcome,
    finished: bool,
) {
    let row = |label: &str, n: i64, note: &str| println!("  {label:<24}{n:>4}   {note}");
    log.say(format!("summary   queue \"{WELCOME_QUEUE}\", this run"));
    row(
        "enqueued",
        last.since(base, "enqueued"),
        "POST /welcome answered 202",
    );
    row(
        "completed",
        last.since(base, "completed"),
        "acked by a worker",
    );
    row(
        "retried",
        last.since(base, "retried"),
        "retryable failures, rescheduled with backoff",
    );
    row(
        "dead-lettered",
        last.since(base, "dead"),
        "permanent failures or attempts exhausted",
    );
    row(
        "recovered by watchdog",
        last.since(base, "reclaimed"),
        "expired leases returned to the queue",
    );
    row(
        "lost",
        outcome.lost.len() as i64,
        "neither completed nor dead-lettered",
    );
    let checked = outcome.completed + outcome.dead.len() + outcome.lost.len();
    println!(
        "  checked each job with GET /jobs/{{id}}: {} completed, {} dead-lettered of {checked}",
        outcome.completed,
        outcome.dead.len()
    );
    for (id, reason) in &outcome.dead {
        println!("  dead letter {id}: {reason}");
    }
    for (id, state) in &outcome.lost {
        println!("  NOT FINISHED {id}: {state}");
    }
    if last.since(base, "reclaimed") == 0 {
        println!(
            "  note: the watchdog recovered nothing (the killed worker had finished its jobs)"
        );
    }
    if !finished {
        println!("  note: timed out before every job finished");
    }
}
