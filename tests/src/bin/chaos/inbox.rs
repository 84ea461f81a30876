//! The `inbox` workload: jobs book one row each in PostgreSQL through the
//! transactional inbox while worker processes are SIGKILLed and crash on
//! purpose before the transaction, inside it, after the commit and before
//! the ack. Reports "DB effects applied twice" (0 with the inbox; the
//! `--no-inbox` control shows what the inbox prevents) and missing effects.
//!
//! ```text
//! cargo run --release -p queue-tests --bin chaos -- inbox --jobs 10000 --workers 4 --kills 50
//! cargo run --release -p queue-tests --bin chaos -- inbox --jobs 10000 --workers 4 --kills 50 --no-inbox
//! ```

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use futures::StreamExt;
use queue_core::Queue;
use queue_inbox::tokio_postgres::{self, NoTls};
use queue_inbox::Inbox;
use queue_testkit::postgres::{self, DropTable};
use queue_testkit::RedisServer;
use redis::AsyncCommands;

use crate::args::Args;
use crate::inbox_job::{booking, Booking, ALREADY_DONE, CRASH_POINTS, CRASH_PREFIX, QUEUE};
use crate::rng::Rng;

const USAGE: &str = "\
chaos inbox: exactly-once database effects through the transactional inbox

flags:
  --jobs N            jobs (default 10000)
  --workers N         worker processes (default 4)
  --concurrency N     jobs per worker process (default 8)
  --kills N           SIGKILLs of a random worker, spread over the run (default 50)
  --crash-rate F      probability of a self-crash at each handler crash point
                      (before_tx, in_tx, after_commit) and at the before_ack failpoint (default 0.002)
  --lease-ms N        lease per delivery (default 2000)
  --work-ms N         work inside the transaction, random in 0..=N ms (default 4)
  --no-inbox          the control: the same effect without the inbox
  --seed N            random seed (default: from the clock)
  --timeout-secs N    give up after this long (default 600)
  --json              print the report as one JSON object
";

struct Settings {
    jobs: u64,
    workers: usize,
    concurrency: usize,
    kills: u64,
    crash_rate: f64,
    lease_ms: u64,
    work_ms: u64,
    inbox: bool,
    seed: u64,
    timeout: Duration,
    json: bool,
}

fn settings(argv: &[String]) -> Result<Settings, String> {
    let a = Args::parse(
        argv,
        &["no-inbox", "json", "help"],
        &[
            "jobs",
            "workers",
            "concurrency",
            "kills",
            "crash-rate",
            "lease-ms",
            "work-ms",
            "seed",
            "timeout-secs",
        ],
    )?;
    if a.switch("help") {
        return Err(String::new());
    }
    let clock_seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(1);
    Ok(Settings {
        jobs: a.get("jobs", 10_000u64)?,
        workers: a.get("workers", 4usize)?.max(1),
        concurrency: a.get("concurrency", 8usize)?.max(1),
        kills: a.get("kills", 50u64)?,
        crash_rate: a.get("crash-rate", 0.002f64)?,
        lease_ms: a.get("lease-ms", 2000u64)?,
        work_ms: a.get("work-ms", 4u64)?,
        inbox: !a.switch("no-inbox"),
        seed: a.get("seed", clock_seed)?,
        timeout: Duration::from_secs(a.get("timeout-secs", 600u64)?),
        json: a.switch("json"),
    })
}

/// What the run found.
#[derive(Debug, Default)]
struct Report {
    inbox: bool,
    jobs: u64,
    completed: u64,
    effects: u64,
    duplicates: u64,
    missing: u64,
    dead: u64,
    already_done: u64,
    kills: u64,
    crashes: Vec<(&'static str, u64)>,
    seed: u64,
    elapsed: Duration,
    timed_out: bool,
}

impl Report {
    /// With the inbox: every job's effect exactly once. The control passes
    /// when nothing is missing (its duplicates are the point of it).
    fn passed(&self) -> bool {
        let complete =
            !self.timed_out && self.missing == 0 && self.dead == 0 && self.completed == self.jobs;
        complete && (!self.inbox || self.duplicates == 0)
    }

    fn json(&self) -> String {
        let crashes: Vec<String> = self
            .crashes
            .iter()
            .map(|(p, n)| format!("\"crash_{p}\":{n}"))
            .collect();
        format!(
            "{{\"workload\":\"inbox\",\"inbox\":{},\"jobs\":{},\"completed\":{},\"effects\":{},\
             \"duplicates\":{},\"missing\":{},\"dead\":{},\"already_done\":{},\"kills\":{},{},\
             \"seed\":{},\"elapsed_secs\":{:.1},\"passed\":{}}}",
            self.inbox,
            self.jobs,
            self.completed,
            self.effects,
            self.duplicates,
            self.missing,
            self.dead,
            self.already_done,
            self.kills,
            crashes.join(","),
            self.seed,
            self.elapsed.as_secs_f64(),
            self.passed()
        )
    }

    fn table(&self) -> String {
        let crashes: Vec<String> = self
            .crashes
            .iter()
            .map(|(p, n)| format!("{p} {n}"))
            .collect();
        format!(
            "inbox workload ({}), seed {}\n\
             jobs:                             {}\n\
             completed (acked):                {}\n\
             SIGKILLs:                         {}\n\
             self-crashes:                     {}\n\
             DB effects applied:               {}\n\
             DB effects applied twice:         {}\n\
             jobs with no DB effect:           {}\n\
             dead-lettered:                    {}\n\
             redeliveries acked as done:       {}\n\
             elapsed:                          {:.1} s{}\n\
             {}\n",
            if self.inbox {
                "through the inbox"
            } else {
                "CONTROL: no inbox"
            },
            self.seed,
            self.jobs,
            self.completed,
            self.kills,
            crashes.join(", "),
            self.effects,
            self.duplicates,
            self.missing,
            self.dead,
            self.already_done,
            self.elapsed.as_secs_f64(),
            if self.timed_out { " (TIMED OUT)" } else { "" },
            match (self.passed(), self.inbox) {
                (false, _) => "FAIL",
                (true, true) => "PASS: every job's DB effect exactly once",
                (true, false) => "CONTROL done: nothing missing; the duplicates above are what the inbox prevents",
            }
        )
    }
}

/// Entry point of `chaos inbox`. Returns the process exit code.
pub async fn main(argv: &[String]) -> i32 {
    let s = match settings(argv) {
        Ok(s) => s,
        Err(e) if e.is_empty() => {
            print!("{USAGE}");
            return 0;
        }
        Err(e) => {
            eprintln!("chaos inbox: {e}\n\n{USAGE}");
            return 2;
        }
    };
    let json = s.json;
    match run(s).await {
        Ok(r) => {
            if json {
                println!("{}", r.json());
            } else {
                print!("{}", r.table());
            }
            if r.passed() {
                0
            } else {
                1
            }
        }
        Err(e) => {
            eprintln!("chaos inbox: {e}");
            2
        }
    }
}

/// The worker processes, restarted when they die.
struct Workers {
    exe: PathBuf,
    args: Vec<String>,
    crash_rate: f64,
    children: Vec<Child>,
    aborted: u64,
}

impl Workers {
    fn spawn(&self) -> Result<Child, String> {
        Command::new(&self.exe)
            .arg("inbox-worker")
            .args(&self.args)
            .env("QUEUE_FAILPOINT", format!("before_ack:{}", self.crash_rate))
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

    /// Restarts every worker that exited (a self-crash), counting them.
    fn restart_exited(&mut self) -> Result<(), String> {
        for i in 0..self.children.len() {
            if let Ok(Some(_)) = self.children[i].try_wait() {
                self.aborted += 1;
                self.children[i] = self.spawn()?;
            }
        }
        Ok(())
    }

    /// SIGKILLs worker `i` and starts a new one in its place.
    fn kill(&mut self, i: usize) -> Result<(), String> {
        let _ = self.children[i].kill();
        let _ = self.children[i].wait();
        self.children[i] = self.spawn()?;
        Ok(())
    }

    fn stop_all(&mut self) {
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

async fn run(s: Settings) -> Result<Report, String> {
    let started = Instant::now();
    let mut rng = Rng::new(s.seed);
    let redis = RedisServer::start().map_err(|e| format!("cannot start redis-server: {e}"))?;
    let url = redis.url();
    let db = postgres::require().ok_or("no PostgreSQL (QUEUE_TEST_SKIP_POSTGRES is set)")?;
    let inbox_table = postgres::unique_name("chaos_inbox");
    let fx_table = postgres::unique_name("chaos_fx");
    let _guards = [
        DropTable::new(&db, &inbox_table),
        DropTable::new(&db, &fx_table),
    ];
    let pg = create_tables(&db, &inbox_table, &fx_table).await?;

    let queue = Queue::connect(&url).await.map_err(|e| e.to_string())?;
    enqueue_all(&queue, &s).await?;

    let mut workers = Workers {
        exe: std::env::current_exe().map_err(|e| e.to_string())?,
        args: worker_args(&s, &url, &db, &inbox_table, &fx_table),
        crash_rate: s.crash_rate,
        children: Vec::new(),
        aborted: 0,
    };
    for _ in 0..s.workers {
        let child = workers.spawn()?;
        workers.children.push(child);
    }

    let dog = crate::dog::Dog::start(&url, &[QUEUE]).await?;

    // Kill number k (1-based) when k/(kills+1) of the jobs have completed.
    let mut kills = 0;
    let mut timed_out = false;
    let (completed, dead) = loop {
        let stats = queue.stats(QUEUE).await.map_err(|e| e.to_string())?;
        let completed = stats.counter("completed").max(0) as u64;
        let dead = stats.dead;
        if completed + dead >= s.jobs && kills >= s.kills {
            break (completed, dead);
        }
        if started.elapsed() > s.timeout {
            timed_out = true;
            break (completed, dead);
        }
        let due = (kills + 1) * s.jobs / (s.kills + 1);
        if kills < s.kills && (completed >= due || completed + dead >= s.jobs) {
            let i = rng.range(0, workers.children.len() as u64) as usize;
            workers.kill(i)?;
            kills += 1;
        }
        workers.restart_exited()?;
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    workers.stop_all();
    dog.stop().await;

    // The effects in PostgreSQL, per job.
    let rows = pg
        .query(
            &format!("SELECT count(*), count(DISTINCT job_id) FROM \"{fx_table}\""),
            &[],
        )
        .await
        .map_err(|e| e.to_string())?;
    let effects = rows[0].get::<_, i64>(0).max(0) as u64;
    let distinct = rows[0].get::<_, i64>(1).max(0) as u64;
    let (crashes, already_done) = crash_counts(&url, workers.aborted).await?;
    Ok(Report {
        inbox: s.inbox,
        jobs: s.jobs,
        completed,
        effects,
        duplicates: effects - distinct,
        missing: s.jobs.saturating_sub(distinct),
        dead,
        already_done,
        kills,
        crashes,
        seed: s.seed,
        elapsed: started.elapsed(),
        timed_out,
    })
}

/// The inbox table (migrated) and the effect table; returns the connection.
async fn create_tables(
    db: &str,
    inbox_table: &str,
    fx_table: &str,
) -> Result<tokio_postgres::Client, String> {
    let (pg, conn) = tokio_postgres::connect(db, NoTls)
        .await
        .map_err(|e| format!("cannot connect to postgres: {e}"))?;
    tokio::spawn(conn);
    Inbox::with_table(inbox_table)
        .map_err(|e| e.to_string())?
        .migrate(&pg)
        .await
        .map_err(|e| e.to_string())?;
    pg.batch_execute(&format!(
        "CREATE TABLE \"{fx_table}\" (id bigserial PRIMARY KEY, job_id text NOT NULL, seq bigint NOT NULL)"
    ))
    .await
    .map_err(|e| format!("cannot create the effect table: {e}"))?;
    Ok(pg)
}

/// Enqueues the run's jobs, their work drawn from the seed.
async fn enqueue_all(queue: &Queue, s: &Settings) -> Result<(), String> {
    let enqueues = futures::stream::iter(0..s.jobs)
        .map(|seq| {
            let queue = queue.clone();
            let work_ms = rng_work(s.seed, seq, s.work_ms);
            async move {
                booking::enqueue_with_id(&queue, format!("job-{seq:06}"), Booking { seq, work_ms })
                    .await
            }
        })
        .buffer_unordered(64)
        .collect::<Vec<_>>()
        .await;
    if let Some(Err(e)) = enqueues.into_iter().find(|r| r.is_err()) {
        return Err(format!("enqueue failed: {e}"));
    }
    Ok(())
}

/// The test-worker command line for this run.
fn worker_args(
    s: &Settings,
    url: &str,
    db: &str,
    inbox_table: &str,
    fx_table: &str,
) -> Vec<String> {
    let mut worker_args = vec![
        "--redis-url".to_string(),
        url.to_string(),
        "--database-url".into(),
        db.to_string(),
        "--effects-table".into(),
        fx_table.to_string(),
        "--crash-rate".into(),
        s.crash_rate.to_string(),
        "--concurrency".into(),
        s.concurrency.to_string(),
        "--lease-ms".into(),
        s.lease_ms.to_string(),
    ];
    if s.inbox {
        worker_args.extend(["--inbox-table".to_string(), inbox_table.to_string()]);
    } else {
        worker_args.push("--no-inbox".into());
    }
    worker_args
}

/// Crashes per crash point (from the workers' ledger in Redis; `aborted`
/// children not counted there died before the ack) and the "already done" count.
async fn crash_counts(url: &str, aborted: u64) -> Result<(Vec<(&'static str, u64)>, u64), String> {
    let mut ledger = queue_tests::redis_conn(url).await;
    let mut keys: Vec<String> = CRASH_POINTS
        .iter()
        .map(|p| format!("{CRASH_PREFIX}{p}"))
        .collect();
    keys.push(ALREADY_DONE.to_string());
    let counts: Vec<Option<u64>> = ledger.mget(&keys).await.map_err(|e| e.to_string())?;
    let count = |i: usize| counts.get(i).copied().flatten().unwrap_or(0);
    let mut crashes: Vec<(&'static str, u64)> = CRASH_POINTS
        .iter()
        .enumerate()
        .map(|(i, p)| (*p, count(i)))
        .collect();
    let counted: u64 = crashes.iter().map(|(_, n)| n).sum();
    crashes.push(("before_ack", aborted.saturating_sub(counted)));
    Ok((crashes, count(CRASH_POINTS.len())))
}

/// The work of job `seq`, from the seed (so a run is reproducible).
fn rng_work(seed: u64, seq: u64, max_ms: u64) -> u32 {
    Rng::new(seed ^ seq.wrapping_mul(0x9E37_79B9_7F4A_7C15)).range(0, max_ms + 1) as u32
}
