//! The orchestrator: starts Redis, worker processes and watchdogs, enqueues,
//! kills, stalls and restarts things, then checks the ledger.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use queue_core::{
    Backoff, ConnectionConfig, EnqueueOptions, EnqueueOutcome, Queue, QueueKeys, ReclaimReport,
    Watchdog, WatchdogConfig,
};
use queue_testkit::RedisServer;
use redis::aio::ConnectionManager;

use crate::args::Args;
use crate::job::{self, chaos_job, Work, JOB_TYPE, MAX_ATTEMPTS, QUEUE};
use crate::report::Report;
use crate::rng::Rng;

/// Crash points armed in some worker processes, with the probability of
/// aborting each time a point is reached.
const FAILPOINTS: [(&str, f64); 4] = [
    ("after_blmove", 0.5),
    ("after_claim", 0.02),
    ("before_ack", 0.02),
    ("before_fail", 0.5),
];

const USAGE: &str = "\
chaos: crash and fault harness for the job queue

usage: chaos [flags]                 run the harness (orchestrator)
       chaos worker [flags]          a worker process (started by the orchestrator)
       chaos aof-window [flags]      measure acknowledged enqueues lost when Redis is SIGKILLed

flags:
  --jobs N               jobs to enqueue (default 10000)
  --workers N            worker processes (default 4)
  --concurrency N        jobs per worker process (default 8)
  --kills N              SIGKILLs at random moments (default 50)
  --failpoint-crashes N  workers armed with a crash point, in turn (default max(4, kills/2))
  --stalls N             SIGSTOP a worker past its lease, then SIGCONT (default max(1, kills/10))
  --seed N               random seed (default: from the clock)
  --lease-ms N           lease per delivery (default 2000)
  --watchdogs N          watchdogs running at once, in-process (default 2)
  --rate N               enqueues per second, in bursts; 0 = as fast as possible (default 500)
  --work-ms N            handler work, random in 0..=N ms (default 4)
  --fail-rate F          share of jobs failing (retryable) once (default 0.03)
  --poison-rate F        share of corrupt / unknown-version payloads (default 0.005)
  --dup-rate F           share of enqueues repeated with the same id (default 0.02)
  --redis-url URL        use this server instead of starting one (its chaos keys are deleted first)
  --ledger-url URL       ledger server (default: a second server the harness starts, or --redis-url)
  --appendonly           start Redis with appendonly yes / appendfsync always and restart it mid-run
  --redis-down-ms N      how long Redis stays down in that restart (default 1000)
  --timeout-secs N       give up after this long (default 600)
  --json                 print the report as one JSON object instead of a table
  --keep-logs            keep worker logs even when the run passes
";

/// The plan for one job.
#[derive(Debug, Clone)]
enum Plan {
    Good(Work),
    /// Bytes that are not MessagePack of `Work`.
    Corrupt,
    /// A valid payload under a schema version no handler knows.
    FutureVersion,
}

fn job_id(seq: u64) -> String {
    format!("job-{seq:06}")
}

struct Settings {
    jobs: u64,
    workers: usize,
    concurrency: usize,
    kills: u64,
    failpoint_crashes: u64,
    stalls: u64,
    seed: u64,
    lease_ms: u64,
    watchdogs: usize,
    rate: u64,
    work_ms: u64,
    fail_rate: f64,
    poison_rate: f64,
    dup_rate: f64,
    redis_url: Option<String>,
    ledger_url: Option<String>,
    appendonly: bool,
    redis_down_ms: u64,
    timeout: Duration,
    json: bool,
    keep_logs: bool,
}

fn settings(argv: &[String]) -> Result<Settings, String> {
    let a = Args::parse(
        argv,
        &["appendonly", "json", "keep-logs", "help"],
        &[
            "jobs",
            "workers",
            "concurrency",
            "kills",
            "failpoint-crashes",
            "stalls",
            "seed",
            "lease-ms",
            "watchdogs",
            "rate",
            "work-ms",
            "fail-rate",
            "poison-rate",
            "dup-rate",
            "redis-url",
            "ledger-url",
            "redis-down-ms",
            "timeout-secs",
        ],
    )?;
    if a.switch("help") {
        return Err(String::new());
    }
    let kills = a.get("kills", 50u64)?;
    let clock_seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(1);
    let s = Settings {
        jobs: a.get("jobs", 10_000u64)?,
        workers: a.get("workers", 4usize)?,
        concurrency: a.get("concurrency", 8usize)?,
        kills,
        failpoint_crashes: a.get("failpoint-crashes", (kills / 2).max(4))?,
        stalls: a.get("stalls", (kills / 10).max(1))?,
        seed: a.get("seed", clock_seed % 1_000_000_007)?,
        lease_ms: a.get("lease-ms", 2000u64)?,
        watchdogs: a.get("watchdogs", 2usize)?,
        rate: a.get("rate", 500u64)?,
        work_ms: a.get("work-ms", 4u64)?,
        fail_rate: a.get("fail-rate", 0.03f64)?,
        poison_rate: a.get("poison-rate", 0.005f64)?,
        dup_rate: a.get("dup-rate", 0.02f64)?,
        redis_url: a.string("redis-url"),
        ledger_url: a.string("ledger-url"),
        appendonly: a.switch("appendonly"),
        redis_down_ms: a.get("redis-down-ms", 1000u64)?,
        timeout: Duration::from_secs(a.get("timeout-secs", 600u64)?),
        json: a.switch("json"),
        keep_logs: a.switch("keep-logs"),
    };
    if s.jobs == 0 || s.workers == 0 || s.concurrency == 0 || s.watchdogs == 0 {
        return Err("--jobs, --workers, --concurrency and --watchdogs must be at least 1".into());
    }
    if s.lease_ms < 300 {
        return Err("--lease-ms must be at least 300".into());
    }
    Ok(s)
}

/// Counters the producer task shares with the orchestrator.
#[derive(Default)]
struct Produced {
    enqueued: AtomicU64,
    errors: AtomicU64,
    duplicates: AtomicU64,
    duplicates_created: AtomicU64,
    done: AtomicBool,
    problems: Mutex<Vec<String>>,
}

/// One worker process slot: the orchestrator keeps `--workers` of them alive.
struct Slot {
    index: usize,
    child: Option<Child>,
    failpoint: Option<&'static str>,
    restart_at: Option<Instant>,
    stopped_until: Option<Instant>,
}

/// What the chaos loop did.
#[derive(Default)]
struct Chaos {
    kills: u64,
    stalls: u64,
    crashes: BTreeMap<String, u64>,
    other_exits: u64,
    starts: u64,
    redis_restarts: u64,
}

struct Env {
    exe: PathBuf,
    url: String,
    ledger_url: String,
    logs: PathBuf,
    concurrency: usize,
    lease_ms: u64,
}

impl Slot {
    fn spawn(&mut self, env: &Env, failpoint: Option<&'static str>) -> Result<(), String> {
        let log_path = env.logs.join(format!("worker-{}.log", self.index));
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)
            .map_err(|e| format!("cannot open {}: {e}", log_path.display()))?;
        let log2 = log.try_clone().map_err(|e| e.to_string())?;
        let mut cmd = Command::new(&env.exe);
        cmd.arg("worker")
            .args(["--redis-url", &env.url, "--ledger-url", &env.ledger_url])
            .args(["--concurrency", &env.concurrency.to_string()])
            .args(["--lease-ms", &env.lease_ms.to_string()])
            .env_remove("QUEUE_FAILPOINT")
            .env(
                "RUST_LOG",
                std::env::var("CHAOS_WORKER_LOG").unwrap_or_else(|_| "warn".into()),
            )
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(log2);
        if let Some(point) = failpoint {
            let p = FAILPOINTS
                .iter()
                .find(|(n, _)| *n == point)
                .map(|(_, p)| *p)
                .unwrap_or(1.0);
            cmd.env("QUEUE_FAILPOINT", format!("{point}:{p}"));
        }
        let child = cmd
            .spawn()
            .map_err(|e| format!("cannot start a worker process: {e}"))?;
        self.child = Some(child);
        self.failpoint = failpoint;
        self.restart_at = None;
        self.stopped_until = None;
        Ok(())
    }

    fn running(&self) -> bool {
        self.child.is_some() && self.stopped_until.is_none()
    }
}

fn signal(pid: u32, sig: &str) {
    let _ = Command::new("kill")
        .arg(format!("-{sig}"))
        .arg(pid.to_string())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
}

/// Entry point of the orchestrator mode. Returns the process exit code.
pub async fn main(argv: &[String]) -> i32 {
    let s = match settings(argv) {
        Ok(s) => s,
        Err(e) if e.is_empty() => {
            print!("{USAGE}");
            return 0;
        }
        Err(e) => {
            eprintln!("chaos: {e}\n\n{USAGE}");
            return 2;
        }
    };
    match run(s).await {
        Ok(report) => {
            if report.0 {
                println!("{}", report.1.json());
            } else {
                print!("{}", report.1.table());
            }
            if report.1.passed() {
                0
            } else {
                1
            }
        }
        Err(e) => {
            eprintln!("chaos: {e}");
            2
        }
    }
}

async fn run(s: Settings) -> Result<(bool, Report), String> {
    let started = Instant::now();
    let mut rng = Rng::new(s.seed);

    let servers = Servers::start(&s)?;
    let conn_cfg = ConnectionConfig {
        response_timeout: Duration::from_secs(2),
        connection_timeout: Duration::from_secs(1),
    };
    let (queue, ledger) = connect_fresh(&servers, &conn_cfg).await?;

    // The plan: which jobs are poison, fail once, how long they work.
    let plan = Arc::new(make_plan(&s, &mut rng));
    let poison = plan.iter().filter(|p| !matches!(p, Plan::Good(_))).count() as u64;

    let logs = std::env::temp_dir().join(format!("chaos-{}-{}", std::process::id(), s.seed));
    std::fs::create_dir_all(&logs).map_err(|e| format!("cannot create {}: {e}", logs.display()))?;
    let env = Env {
        exe: std::env::current_exe().map_err(|e| e.to_string())?,
        url: servers.url.clone(),
        ledger_url: servers.ledger_url.clone(),
        logs: logs.clone(),
        concurrency: s.concurrency,
        lease_ms: s.lease_ms,
    };

    let watchdogs = Watchdogs::start(&s, &servers.url, &conn_cfg).await?;

    // The producer.
    let produced = Arc::new(Produced::default());
    let producer = tokio::spawn(produce(
        queue.clone(),
        plan.clone(),
        s.rate,
        s.dup_rate,
        s.seed ^ 0x5EED,
        produced.clone(),
    ));

    let mut chaos = ChaosLoop::new(&s, rng, servers.can_restart_redis);
    let timed_out = chaos
        .drive(&s, &env, &queue, &produced, &servers.queue_server, started)
        .await?;

    chaos.wind_down().await;
    producer.abort();
    let _ = producer.await;
    if let Some(h) = chaos.redis_restart.take() {
        let _ = h.await;
    }
    let wd_total = watchdogs.stop().await;

    let mut report = new_report(&s, &produced, &chaos.done, wd_total, poison, timed_out);
    verify(&queue, ledger, &plan, &mut report).await?;
    crate::check::after_run(&queue, &mut report).await;
    report.wall_time_s = started.elapsed().as_secs_f64();
    if report.passed() && !s.keep_logs {
        let _ = std::fs::remove_dir_all(&logs);
    } else {
        report
            .problems
            .push(format!("worker logs: {}", logs.display()));
    }
    Ok((s.json, report))
}

/// The queue's server (maybe with AOF, restartable) and the ledger's (never
/// restarted), started by the harness unless given by URL.
struct Servers {
    url: String,
    ledger_url: String,
    queue_server: Arc<Mutex<Option<RedisServer>>>,
    _ledger_server: Option<RedisServer>,
    can_restart_redis: bool,
}

impl Servers {
    fn start(s: &Settings) -> Result<Servers, String> {
        let mut owned_queue_server = None;
        let url = match &s.redis_url {
            Some(u) => u.clone(),
            None => {
                let extra: &[&str] = if s.appendonly {
                    &["--appendonly", "yes", "--appendfsync", "always"]
                } else {
                    &[]
                };
                let server =
                    RedisServer::start_with(extra).map_err(|e| format!("redis-server: {e}"))?;
                let u = server.url();
                owned_queue_server = Some(server);
                u
            }
        };
        let mut ledger_server = None;
        let ledger_url = match (&s.ledger_url, &s.redis_url) {
            (Some(u), _) => u.clone(),
            (None, Some(u)) => u.clone(),
            (None, None) => {
                let server =
                    RedisServer::start().map_err(|e| format!("redis-server (ledger): {e}"))?;
                let u = server.url();
                ledger_server = Some(server);
                u
            }
        };
        Ok(Servers {
            url,
            ledger_url,
            can_restart_redis: s.appendonly && owned_queue_server.is_some(),
            queue_server: Arc::new(Mutex::new(owned_queue_server)),
            _ledger_server: ledger_server,
        })
    }
}

/// Connects to the queue and the ledger and deletes what an earlier run left.
async fn connect_fresh(
    servers: &Servers,
    conn_cfg: &ConnectionConfig,
) -> Result<(Queue, ConnectionManager), String> {
    let queue = Queue::connect_with(&servers.url, conn_cfg)
        .await
        .map_err(|e| e.to_string())?;
    let ledger = redis::Client::open(servers.ledger_url.as_str())
        .map_err(|e| e.to_string())?
        .get_connection_manager()
        .await
        .map_err(|e| format!("ledger: {e}"))?;
    delete_keys(&mut queue.connection(), &format!("q:{{{QUEUE}}}:*")).await?;
    delete_keys(&mut ledger.clone(), "chaos:ledger:*").await?;
    Ok((queue, ledger))
}

/// Which jobs are poison, which fail once, how long each works.
fn make_plan(s: &Settings, rng: &mut Rng) -> Vec<Plan> {
    (0..s.jobs)
        .map(|seq| {
            if rng.chance(s.poison_rate) {
                if rng.chance(0.5) {
                    Plan::Corrupt
                } else {
                    Plan::FutureVersion
                }
            } else {
                Plan::Good(Work {
                    seq,
                    work_ms: rng.range(0, s.work_ms + 1) as u32,
                    fail_once: rng.chance(s.fail_rate),
                })
            }
        })
        .collect()
}

/// The in-process watchdogs, all running at once until stopped.
struct Watchdogs {
    stop: tokio::sync::watch::Sender<bool>,
    dogs: Vec<tokio::task::JoinHandle<ReclaimReport>>,
}

impl Watchdogs {
    async fn start(s: &Settings, url: &str, conn_cfg: &ConnectionConfig) -> Result<Self, String> {
        let (stop, stop_rx) = tokio::sync::watch::channel(false);
        let mut dogs = Vec::new();
        for _ in 0..s.watchdogs {
            let cfg = WatchdogConfig {
                interval: Duration::from_millis(100),
                orphan_grace: Duration::from_millis(s.lease_ms),
                backoff: Backoff {
                    base: Duration::from_millis(50),
                    max: Duration::from_millis(500),
                },
                connection: conn_cfg.clone(),
                ..WatchdogConfig::default()
            };
            let wd = Watchdog::connect(url, [QUEUE], cfg)
                .await
                .map_err(|e| e.to_string())?;
            let mut rx = stop_rx.clone();
            dogs.push(tokio::spawn(async move {
                wd.run_until(async move {
                    let _ = rx.wait_for(|stop| *stop).await;
                })
                .await
            }));
        }
        Ok(Watchdogs { stop, dogs })
    }

    /// Stops them all and sums their reports.
    async fn stop(self) -> ReclaimReport {
        let _ = self.stop.send(true);
        let mut total = ReclaimReport::default();
        for d in self.dogs {
            if let Ok(r) = d.await {
                total.reclaimed += r.reclaimed;
                total.adopted += r.adopted;
                total.dead_lettered += r.dead_lettered;
            }
        }
        total
    }
}

/// The chaos loop's state: worker slots, what it did so far, and the points
/// of progress (completed + dead-lettered jobs) at which the next kill,
/// stall and Redis restart happen, so they spread over the whole run
/// whatever the machine's speed.
struct ChaosLoop {
    rng: Rng,
    slots: Vec<Slot>,
    done: Chaos,
    kill_at: std::iter::Peekable<std::vec::IntoIter<u64>>,
    stall_at: std::iter::Peekable<std::vec::IntoIter<u64>>,
    restart_redis_at: Option<u64>,
    redis_restart: Option<tokio::task::JoinHandle<Result<(), String>>>,
    progress: u64,
    lease: Duration,
}

impl ChaosLoop {
    fn new(s: &Settings, mut rng: Rng, can_restart_redis: bool) -> Self {
        let slots: Vec<Slot> = (0..s.workers)
            .map(|index| Slot {
                index,
                child: None,
                failpoint: None,
                restart_at: Some(Instant::now()),
                stopped_until: None,
            })
            .collect();
        let lo = (s.jobs / 50).max(1);
        let hi = (s.jobs * 9 / 10).max(lo + 1);
        let kill_at = rng.sorted_points(s.kills, lo, hi).into_iter().peekable();
        let stall_at = rng.sorted_points(s.stalls, lo, hi).into_iter().peekable();
        let restart_redis_at = if can_restart_redis {
            Some(rng.range(s.jobs * 3 / 10, s.jobs * 6 / 10 + 1))
        } else {
            None
        };
        ChaosLoop {
            rng,
            slots,
            done: Chaos::default(),
            kill_at,
            stall_at,
            restart_redis_at,
            redis_restart: None,
            progress: 0,
            lease: Duration::from_millis(s.lease_ms),
        }
    }

    /// Runs the loop until the run settled (or timed out: returns true).
    async fn drive(
        &mut self,
        s: &Settings,
        env: &Env,
        queue: &Queue,
        produced: &Produced,
        queue_server: &Arc<Mutex<Option<RedisServer>>>,
        started: Instant,
    ) -> Result<bool, String> {
        let mut last_print = Instant::now();
        loop {
            tokio::time::sleep(Duration::from_millis(25)).await;
            let now = Instant::now();
            self.reap(now);
            self.restart_slots(now, env, s.failpoint_crashes)?;
            self.resume_stalled(now);
            self.finish_redis_restart().await?;

            let stats = queue.stats(QUEUE).await.ok();
            if let Some(st) = &stats {
                self.progress = (st.counter("completed") + st.counter("dead")).max(0) as u64;
            }
            self.kill_due(now);
            self.stall_due(now);
            self.restart_redis_due(queue_server, s.redis_down_ms);

            if last_print.elapsed() >= Duration::from_secs(2) {
                last_print = Instant::now();
                self.print_progress(s, started, produced, stats.as_ref());
            }
            let settled = stats
                .as_ref()
                .is_some_and(|st| st.main + st.processing + st.delayed == 0);
            if produced.done.load(Ordering::SeqCst) && settled && self.nothing_pending() {
                return Ok(false);
            }
            if started.elapsed() > s.timeout {
                return Ok(true);
            }
        }
    }

    /// Reaps worker processes that exited on their own (failpoint aborts,
    /// startup failures while Redis is down).
    fn reap(&mut self, now: Instant) {
        for slot in &mut self.slots {
            let Some(child) = slot.child.as_mut() else {
                continue;
            };
            if let Ok(Some(status)) = child.try_wait() {
                match (status.signal(), slot.failpoint) {
                    (Some(6), Some(point)) => {
                        *self.done.crashes.entry(point.to_string()).or_default() += 1
                    }
                    _ => self.done.other_exits += 1,
                }
                slot.child = None;
                slot.stopped_until = None;
                slot.restart_at = Some(now + Duration::from_millis(self.rng.range(50, 300)));
            }
        }
    }

    /// Restarts dead slots. Until `failpoint_crashes` crashes happened, half
    /// of the starts arm the crash point that fired least so far.
    fn restart_slots(
        &mut self,
        now: Instant,
        env: &Env,
        failpoint_crashes: u64,
    ) -> Result<(), String> {
        for i in 0..self.slots.len() {
            let slot = &self.slots[i];
            if slot.child.is_some() || slot.restart_at.is_none_or(|t| now < t) {
                continue;
            }
            let mut pending: BTreeMap<&str, u64> = FAILPOINTS
                .iter()
                .map(|(p, _)| (*p, self.done.crashes.get(*p).copied().unwrap_or(0)))
                .collect();
            for other in self.slots.iter().filter(|o| o.child.is_some()) {
                if let Some(p) = other.failpoint {
                    *pending.entry(p).or_default() += 1;
                }
            }
            let failpoint =
                if pending.values().sum::<u64>() < failpoint_crashes && self.rng.chance(0.5) {
                    FAILPOINTS
                        .iter()
                        .map(|(p, _)| *p)
                        .min_by_key(|p| pending[p])
                } else {
                    None
                };
            self.slots[i].spawn(env, failpoint)?;
            self.done.starts += 1;
        }
        Ok(())
    }

    /// Resumes stalled workers whose stall is over.
    fn resume_stalled(&mut self, now: Instant) {
        for slot in &mut self.slots {
            if slot.stopped_until.is_some_and(|t| now >= t) {
                if let Some(child) = &slot.child {
                    signal(child.id(), "CONT");
                }
                slot.stopped_until = None;
            }
        }
    }

    /// Collects a finished Redis restart.
    async fn finish_redis_restart(&mut self) -> Result<(), String> {
        if self.redis_restart.as_ref().is_some_and(|h| h.is_finished()) {
            let h = self.redis_restart.take().expect("checked");
            h.await.map_err(|e| e.to_string())??;
            self.done.redis_restarts += 1;
        }
        Ok(())
    }

    /// A random slot that runs (not stalled), if any.
    fn pick_running(&mut self) -> Option<usize> {
        let live: Vec<usize> = self
            .slots
            .iter()
            .filter(|s| s.running())
            .map(|s| s.index)
            .collect();
        if live.is_empty() {
            return None;
        }
        Some(live[self.rng.range(0, live.len() as u64) as usize])
    }

    /// SIGKILLs a random running worker at each kill point reached.
    fn kill_due(&mut self, now: Instant) {
        while self.kill_at.peek().is_some_and(|&p| p <= self.progress) {
            let Some(i) = self.pick_running() else { break };
            self.kill_at.next();
            if let Some(mut child) = self.slots[i].child.take() {
                let _ = child.kill();
                let _ = child.wait();
                self.done.kills += 1;
            }
            self.slots[i].restart_at = Some(now + Duration::from_millis(self.rng.range(50, 500)));
        }
    }

    /// SIGSTOPs a random running worker past its lease at each stall point reached.
    fn stall_due(&mut self, now: Instant) {
        while self.stall_at.peek().is_some_and(|&p| p <= self.progress) {
            let Some(i) = self.pick_running() else { break };
            self.stall_at.next();
            if let Some(child) = &self.slots[i].child {
                signal(child.id(), "STOP");
                self.slots[i].stopped_until =
                    Some(now + self.lease + Duration::from_millis(self.rng.range(500, 1500)));
                self.done.stalls += 1;
            }
        }
    }

    /// SIGKILLs Redis and restarts it after `down_ms` once its point is reached.
    fn restart_redis_due(&mut self, queue_server: &Arc<Mutex<Option<RedisServer>>>, down_ms: u64) {
        if !(self.restart_redis_at.is_some_and(|p| p <= self.progress)
            && self.redis_restart.is_none())
        {
            return;
        }
        self.restart_redis_at = None;
        let server = queue_server.clone();
        let down = Duration::from_millis(down_ms);
        self.redis_restart = Some(tokio::task::spawn_blocking(move || {
            let mut guard = server
                .lock()
                .map_err(|_| "redis server lock poisoned".to_string())?;
            let server = guard.as_mut().ok_or("no owned redis server")?;
            server.kill();
            std::thread::sleep(down);
            server.restart().map_err(|e| format!("redis restart: {e}"))
        }));
    }

    fn print_progress(
        &self,
        s: &Settings,
        started: Instant,
        produced: &Produced,
        stats: Option<&queue_core::QueueStats>,
    ) {
        let (main, processing, delayed) = stats
            .map(|s| (s.main, s.processing, s.delayed))
            .unwrap_or_default();
        eprintln!(
            "[{:>6.1}s] done {}/{} (enqueued {}) | main {main} processing {processing} delayed {delayed} | kills {}/{} crashes {} stalls {} redis restarts {}{}",
            started.elapsed().as_secs_f64(),
            self.progress,
            s.jobs,
            produced.enqueued.load(Ordering::SeqCst),
            self.done.kills,
            s.kills,
            self.done.crashes.values().sum::<u64>(),
            self.done.stalls,
            self.done.redis_restarts,
            if stats.is_none() { " | redis unreachable" } else { "" },
        );
    }

    /// No kill, stall or Redis restart still to come or under way.
    fn nothing_pending(&mut self) -> bool {
        self.redis_restart.is_none()
            && self.restart_redis_at.is_none()
            && self.kill_at.peek().is_none()
            && self.stall_at.peek().is_none()
            && self.slots.iter().all(|s| s.stopped_until.is_none())
    }

    /// Resumes stalled workers, SIGTERMs everyone (graceful) and waits up to
    /// 15 s for them to exit (then SIGKILL).
    async fn wind_down(&mut self) {
        for slot in &mut self.slots {
            if let Some(child) = &slot.child {
                if slot.stopped_until.take().is_some() {
                    signal(child.id(), "CONT");
                }
                signal(child.id(), "TERM");
            }
        }
        let deadline = Instant::now() + Duration::from_secs(15);
        for slot in &mut self.slots {
            if let Some(mut child) = slot.child.take() {
                while Instant::now() < deadline {
                    if let Ok(Some(_)) = child.try_wait() {
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                let _ = child.kill();
                let _ = child.wait();
            }
        }
    }
}

/// The report's figures known before verification.
fn new_report(
    s: &Settings,
    produced: &Produced,
    chaos: &Chaos,
    wd_total: ReclaimReport,
    poison: u64,
    timed_out: bool,
) -> Report {
    let mut report = Report {
        seed: s.seed,
        jobs: s.jobs,
        workers: s.workers as u64,
        concurrency: s.concurrency as u64,
        lease_ms: s.lease_ms,
        watchdogs: s.watchdogs as u64,
        appendonly: s.appendonly,
        enqueued: produced.enqueued.load(Ordering::SeqCst),
        poison,
        enqueue_errors: produced.errors.load(Ordering::SeqCst),
        duplicate_enqueues: produced.duplicates.load(Ordering::SeqCst),
        duplicate_enqueues_created: produced.duplicates_created.load(Ordering::SeqCst),
        kills: chaos.kills,
        failpoint_crashes: chaos.crashes.clone(),
        stalls: chaos.stalls,
        other_exits: chaos.other_exits,
        worker_starts: chaos.starts,
        redis_restarts: chaos.redis_restarts,
        reclaimed: wd_total.reclaimed,
        adopted: wd_total.adopted,
        watchdog_dead_lettered: wd_total.dead_lettered,
        timed_out,
        ..Report::default()
    };
    for (name, _) in FAILPOINTS {
        report
            .failpoint_crashes
            .entry(name.to_string())
            .or_default();
    }
    report.problems.extend(
        produced
            .problems
            .lock()
            .map(|p| p.clone())
            .unwrap_or_default(),
    );
    report
}

/// Deletes keys matching `pattern` (a fresh run on a reused server).
async fn delete_keys<C: redis::aio::ConnectionLike>(
    conn: &mut C,
    pattern: &str,
) -> Result<(), String> {
    let mut cursor: u64 = 0;
    loop {
        let (next, keys): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(pattern)
            .arg("COUNT")
            .arg(1000)
            .query_async(conn)
            .await
            .map_err(|e| e.to_string())?;
        if !keys.is_empty() {
            let _: () = redis::cmd("DEL")
                .arg(&keys)
                .query_async(conn)
                .await
                .map_err(|e| e.to_string())?;
        }
        if next == 0 {
            return Ok(());
        }
        cursor = next;
    }
}

/// Enqueues every planned job in bursts at about `rate` per second; a job
/// whose enqueue fails is retried with the same stable id until it returns Ok.
/// Now and then an earlier id is enqueued again: that must never create a job.
async fn produce(
    queue: Queue,
    plan: Arc<Vec<Plan>>,
    rate: u64,
    dup_rate: f64,
    seed: u64,
    out: Arc<Produced>,
) {
    let mut rng = Rng::new(seed);
    let start = Instant::now();
    let n = plan.len() as u64;
    let mut seq = 0u64;
    while seq < n {
        let burst = rng.range(1, 21);
        for _ in 0..burst {
            if seq >= n {
                break;
            }
            loop {
                match enqueue(&queue, seq, &plan[seq as usize]).await {
                    Ok(_) => break,
                    Err(e) => {
                        out.errors.fetch_add(1, Ordering::SeqCst);
                        if !matches!(e, queue_core::QueueError::Redis { .. }) {
                            if let Ok(mut p) = out.problems.lock() {
                                if p.len() < 10 {
                                    p.push(format!(
                                        "enqueue of {} failed with a non-Redis error: {e}",
                                        job_id(seq)
                                    ));
                                }
                            }
                        }
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                }
            }
            out.enqueued.fetch_add(1, Ordering::SeqCst);
            seq += 1;
            if rng.chance(dup_rate) {
                let j = rng.range(0, seq);
                if let Ok(outcome) = enqueue(&queue, j, &plan[j as usize]).await {
                    out.duplicates.fetch_add(1, Ordering::SeqCst);
                    if outcome == EnqueueOutcome::Created {
                        out.duplicates_created.fetch_add(1, Ordering::SeqCst);
                        if let Ok(mut p) = out.problems.lock() {
                            p.push(format!(
                                "a second enqueue of {} created a new job",
                                job_id(j)
                            ));
                        }
                    }
                }
            }
        }
        if rate > 0 {
            let target = start + Duration::from_secs_f64(seq as f64 / rate as f64);
            let jitter = Duration::from_millis(rng.range(0, 20));
            tokio::time::sleep_until((target + jitter).into()).await;
        }
    }
    out.done.store(true, Ordering::SeqCst);
}

async fn enqueue(queue: &Queue, seq: u64, plan: &Plan) -> queue_core::Result<EnqueueOutcome> {
    let id = job_id(seq);
    let enqueued = match plan {
        Plan::Good(w) => chaos_job::enqueue_with_id(queue, id, w.clone()).await?,
        Plan::Corrupt => {
            let opts = EnqueueOptions::new().id(id);
            queue
                .enqueue_raw(
                    QUEUE,
                    JOB_TYPE,
                    1,
                    MAX_ATTEMPTS,
                    opts,
                    &[0xc1, 0xff, 0x13, 0x37],
                )
                .await?
        }
        Plan::FutureVersion => {
            let bytes = rmp_serde::to_vec_named(&Work {
                seq,
                ..Work::default()
            })
            .expect("encode");
            let opts = EnqueueOptions::new().id(id);
            queue
                .enqueue_raw(QUEUE, JOB_TYPE, 99, MAX_ATTEMPTS, opts, &bytes)
                .await?
        }
    };
    Ok(enqueued.outcome)
}

/// Reads the queue and the ledger and fills in the outcome of every job.
async fn verify(
    queue: &Queue,
    mut ledger: ConnectionManager,
    plan: &[Plan],
    r: &mut Report,
) -> Result<(), String> {
    let keys = QueueKeys::new(QUEUE);
    let mut conn = queue.connection();
    let counts = LedgerCounts::read(&ledger).await?;
    let dead: Vec<String> = redis::cmd("LRANGE")
        .arg(&keys.dead)
        .arg(0)
        .arg(-1)
        .query_async(&mut conn)
        .await
        .map_err(verify_error)?;
    let dead: HashSet<String> = dead.into_iter().collect();
    let stats = queue.stats(QUEUE).await.map_err(|e| e.to_string())?;

    let ids: Vec<String> = (0..plan.len() as u64).map(job_id).collect();
    let mut notes = Notes::default();
    for (chunk_no, chunk) in ids.chunks(500).enumerate() {
        let rows = job_rows(queue, &mut conn, &keys, chunk).await?;
        let charges = charges_of(&mut ledger, chunk).await?;
        for (i, id) in chunk.iter().enumerate() {
            let seen = Seen {
                done: &rows[2 * i],
                job: &rows[2 * i + 1],
                charge: &charges[i],
                effects: counts.effects.get(id).copied().unwrap_or(0),
                dead: dead.contains(id),
            };
            check_job(id, &plan[chunk_no * 500 + i], &seen, r, &mut notes);
        }
    }
    r.logical_effects = counts.effects.values().sum();
    r.handler_runs = counts.runs.values().sum();
    r.jobs_run_more_than_once = counts.runs.values().filter(|&&n| n > 1).count() as u64;
    r.effect_calls = counts.calls.values().sum();
    r.jobs_called_more_than_once = counts.calls.values().filter(|&&n| n > 1).count() as u64;
    let acked = stats.counter("completed").max(0) as u64;
    r.double_acks = acked.saturating_sub(r.completed);
    if r.double_acks > 0 {
        notes.add(format!("{acked} acks for {} completed jobs", r.completed));
    }
    r.skipped_done = stats.counter("skipped_done").max(0) as u64;
    r.retried = stats.counter("retried").max(0) as u64;
    r.problems.extend(notes.0);
    Ok(())
}

fn verify_error(e: redis::RedisError) -> String {
    format!("verify: {e}")
}

/// The ledger's counters per job id: handler runs, effect calls, effects made.
struct LedgerCounts {
    runs: HashMap<String, u64>,
    calls: HashMap<String, u64>,
    effects: HashMap<String, u64>,
}

impl LedgerCounts {
    async fn read(ledger: &ConnectionManager) -> Result<Self, String> {
        let hash = |key: &'static str| {
            let mut ledger = ledger.clone();
            async move {
                redis::cmd("HGETALL")
                    .arg(key)
                    .query_async::<HashMap<String, u64>>(&mut ledger)
                    .await
                    .map_err(verify_error)
            }
        };
        Ok(LedgerCounts {
            runs: hash(job::LEDGER_RUNS).await?,
            calls: hash(job::LEDGER_CALLS).await?,
            effects: hash(job::LEDGER_EFFECTS).await?,
        })
    }
}

/// Per id of `chunk`, two rows: its completion record's (status, result) and
/// its job hash's (state, dead_reason). The record is read through
/// `Queue::completion`, which reads both of its forms (a hash, or the compact
/// string, the default; a hash with `CHAOS_COMPACT_RECORDS=0`).
async fn job_rows(
    queue: &Queue,
    conn: &mut queue_core::RedisConnection,
    keys: &QueueKeys,
    chunk: &[String],
) -> Result<Vec<(Option<String>, Option<String>)>, String> {
    let mut pipe = redis::pipe();
    for id in chunk {
        pipe.cmd("HMGET")
            .arg(keys.job(id))
            .arg("state")
            .arg("dead_reason");
    }
    let jobs: Vec<(Option<String>, Option<String>)> =
        pipe.query_async(conn).await.map_err(verify_error)?;
    let mut rows = Vec::with_capacity(2 * chunk.len());
    for (id, job) in chunk.iter().zip(jobs) {
        let rec = queue
            .completion(QUEUE, id.as_str())
            .await
            .map_err(|e| e.to_string())?
            .unwrap_or_default();
        rows.push((rec.get("status").cloned(), rec.get("result").cloned()));
        rows.push(job);
    }
    Ok(rows)
}

/// The charge id the ledger recorded for each id of `chunk`.
async fn charges_of(
    ledger: &mut ConnectionManager,
    chunk: &[String],
) -> Result<Vec<Option<String>>, String> {
    let mut pipe = redis::pipe();
    for id in chunk {
        pipe.cmd("GET").arg(format!(
            "{}{}",
            job::LEDGER_CHARGE_PREFIX,
            job::effect_key(id)
        ));
    }
    pipe.query_async(ledger).await.map_err(verify_error)
}

/// The first 20 problems found.
#[derive(Default)]
struct Notes(Vec<String>);

impl Notes {
    fn add(&mut self, p: String) {
        if self.0.len() < 20 {
            self.0.push(p);
        }
    }
}

/// What the end state says about one job.
struct Seen<'a> {
    /// Completion record: (status, result).
    done: &'a (Option<String>, Option<String>),
    /// Job hash: (state, dead_reason).
    job: &'a (Option<String>, Option<String>),
    /// The charge the ledger recorded.
    charge: &'a Option<String>,
    /// Side effects made.
    effects: u64,
    /// In the dead-letter list.
    dead: bool,
}

/// Classifies one job: completed, dead-lettered, still pending or lost, and
/// whether that is what its plan allows.
fn check_job(id: &str, plan: &Plan, seen: &Seen<'_>, r: &mut Report, notes: &mut Notes) {
    let (done_status, result) = seen.done;
    let (state, dead_reason) = seen.job;
    let effect_count = seen.effects;
    let good = matches!(plan, Plan::Good(_));
    if effect_count > 1 {
        r.duplicates += 1;
        notes.add(format!("{id}: side effect made {effect_count} times"));
    }
    if done_status.is_some() {
        r.completed += 1;
        if !good {
            r.poison_mishandled += 1;
            notes.add(format!("{id}: a poison payload completed"));
        } else if effect_count == 0 {
            r.completed_without_effect += 1;
            notes.add(format!(
                "{id}: completed but its side effect never happened"
            ));
        } else if result != seen.charge {
            r.result_mismatches += 1;
            notes.add(format!(
                "{id}: completion result {result:?} is not its side effect {:?}",
                seen.charge
            ));
        }
    } else if seen.dead {
        r.dead_lettered += 1;
        check_dead(id, plan, dead_reason.clone().unwrap_or_default(), r, notes);
    } else if let Some(state) = state {
        r.pending += 1;
        notes.add(format!("{id}: still {state} at exit"));
    } else {
        r.lost += 1;
        notes.add(format!(
            "{id}: LOST (no completion record, not dead-lettered, no job hash)"
        ));
    }
}

/// A dead-lettered job: only poison belongs there, with the matching reason.
fn check_dead(id: &str, plan: &Plan, reason: String, r: &mut Report, notes: &mut Notes) {
    match plan {
        Plan::Good(_) => {
            r.dead_unexpected += 1;
            notes.add(format!("{id}: dead-lettered: {reason}"));
        }
        Plan::Corrupt if !reason.contains("does not decode") => {
            r.poison_mishandled += 1;
            notes.add(format!(
                "{id}: corrupt payload dead-lettered with reason {reason:?}"
            ));
        }
        Plan::FutureVersion
            if !reason.contains("99 is newer than this worker's handler")
                || !reason.contains("no live worker has announced it") =>
        {
            r.poison_mishandled += 1;
            notes.add(format!(
                "{id}: unknown version dead-lettered with reason {reason:?}"
            ));
        }
        _ => {}
    }
}
