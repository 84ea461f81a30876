//! `chaos aof-window`: how many acknowledged enqueues a SIGKILL of Redis loses
//! under a given persistence setting, and (with `--strace`) how many were
//! acknowledged but not yet fsynced when it died: what a power loss or an OS
//! crash at that moment would have lost.
//!
//! Producers enqueue as fast as they can and remember every id whose enqueue
//! returned Ok, with the time of the Ok. At a random moment Redis is
//! SIGKILLed, then restarted on the same directory (so it reloads its AOF).
//! Every acknowledged id is then looked up; the missing ones were lost.
//!
//! A SIGKILL only kills the process: what Redis wrote to the AOF file is in
//! the kernel's page cache and survives. With `--strace` the harness also
//! records Redis's `fdatasync`/`fsync` calls (`strace -f -ttt -T`): an
//! enqueue acknowledged after the start of the last fsync that completed
//! before the kill was, at the kill, possibly only in the page cache.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use queue_core::{ConnectionConfig, EnqueueOptions, Queue, QueueKeys};
use queue_testkit::RedisServer;

use crate::args::Args;
use crate::rng::Rng;

const QUEUE: &str = "aofwin";
const USAGE: &str = "flags: --persistence always|everysec|no|none  --seconds N  --producers N  --seed N  --strace  --json";

fn epoch() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

/// What one measurement found.
struct Measured {
    acked: u64,
    lost: u64,
    lost_window_ms: u64,
    rate: f64,
    fsync: Option<FsyncWindow>,
}

/// From the strace of Redis: fsync cadence and the exposure at the kill.
struct FsyncWindow {
    fsyncs: u64,
    max_gap_ms: u64,
    /// Acknowledged enqueues not covered by an fsync completed before the kill.
    unsynced_at_kill: u64,
    /// Time from the last covering fsync's start to the kill.
    unsynced_ms: u64,
}

pub async fn main(argv: &[String]) -> i32 {
    let args = match Args::parse(
        argv,
        &["json", "strace"],
        &["persistence", "seconds", "producers", "seed"],
    ) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("chaos aof-window: {e}\n{USAGE}");
            return 2;
        }
    };
    let persistence = args
        .string("persistence")
        .unwrap_or_else(|| "everysec".into());
    let seconds: f64 = args.get("seconds", 3.0).unwrap_or(3.0);
    let producers: usize = args.get("producers", 4).unwrap_or(4);
    let seed: u64 = args.get("seed", u64::from(std::process::id())).unwrap_or(1);
    let extra: Vec<&str> = match persistence.as_str() {
        "always" | "everysec" | "no" => {
            vec!["--appendonly", "yes", "--appendfsync", persistence.as_str()]
        }
        "none" => vec![],
        other => {
            eprintln!("chaos aof-window: unknown --persistence {other}\n{USAGE}");
            return 2;
        }
    };
    match run(&extra, seconds, producers, seed, args.switch("strace")).await {
        Ok(m) => {
            if args.switch("json") {
                let fs = match &m.fsync {
                    Some(f) => format!(
                        ",\"fsyncs\":{},\"max_fsync_gap_ms\":{},\"unsynced_at_kill\":{},\"unsynced_ms\":{}",
                        f.fsyncs, f.max_gap_ms, f.unsynced_at_kill, f.unsynced_ms
                    ),
                    None => String::new(),
                };
                println!(
                    "{{\"persistence\":\"{persistence}\",\"acknowledged\":{},\"lost\":{},\"lost_window_ms\":{},\"enqueues_per_s\":{:.0}{fs}}}",
                    m.acked, m.lost, m.lost_window_ms, m.rate
                );
            } else {
                println!("aof-window report");
                println!("  persistence                 {persistence}");
                println!(
                    "  acknowledged enqueues       {} ({:.0}/s from {producers} producers)",
                    m.acked, m.rate
                );
                println!("  lost after SIGKILL+restart  {}", m.lost);
                println!(
                    "  SIGKILL loss window         {} ms (oldest lost Ok before the kill)",
                    m.lost_window_ms
                );
                if let Some(f) = &m.fsync {
                    println!(
                        "  fsyncs traced               {} (longest gap {} ms)",
                        f.fsyncs, f.max_gap_ms
                    );
                    println!(
                        "  not yet fsynced at the kill {} acknowledged enqueues, the last {} ms (a power loss would lose them)",
                        f.unsynced_at_kill, f.unsynced_ms
                    );
                }
            }
            0
        }
        Err(e) => {
            eprintln!("chaos aof-window: {e}");
            2
        }
    }
}

/// Acknowledged enqueue ids with the time (epoch seconds) of their Ok.
type Acked = Arc<Mutex<Vec<(String, f64)>>>;

async fn run(
    extra: &[&str],
    seconds: f64,
    producers: usize,
    seed: u64,
    trace: bool,
) -> Result<Measured, String> {
    let server = RedisServer::start_with(extra).map_err(|e| e.to_string())?;
    let url = server.url();
    let mut tracer = if trace {
        let pid = server.pid().ok_or("redis-server has no pid")?;
        Some(Tracer::attach(pid, server.dir().join("fsync.strace"))?)
    } else {
        None
    };
    let server = Arc::new(Mutex::new(server));
    let acked: Acked = Arc::default();
    let start = Instant::now();
    let tasks = spawn_producers(&url, producers, &acked).await?;
    let mut rng = Rng::new(seed);
    let wait = seconds / 2.0 + rng.unit() * seconds / 2.0;
    tokio::time::sleep(Duration::from_secs_f64(wait)).await;
    let killed_at = on_server(&server, |s| {
        let t = epoch();
        s.kill();
        Ok(t)
    })
    .await?;
    for t in tasks {
        let _ = t.await;
    }
    let elapsed = start.elapsed().as_secs_f64();
    let fsyncs = match tracer.as_mut() {
        Some(t) => Some(t.finish()?),
        None => None,
    };
    on_server(&server, |s| s.restart().map_err(|e| e.to_string())).await?;

    let acked = acked.lock().expect("acked").clone();
    let (lost, oldest_lost) = count_lost(&url, &acked).await?;
    let lost_window_ms = oldest_lost
        .map(|o| ((killed_at - o).max(0.0) * 1000.0) as u64)
        .unwrap_or(0);
    let fsync = fsyncs.map(|trace| fsync_window(&trace, &acked, killed_at));
    Ok(Measured {
        acked: acked.len() as u64,
        lost,
        lost_window_ms,
        rate: acked.len() as f64 / elapsed.max(0.001),
        fsync,
    })
}

/// `producers` tasks enqueueing as fast as they can until an enqueue fails
/// (Redis died), each on its own connection, recording every Ok in `acked`.
async fn spawn_producers(
    url: &str,
    producers: usize,
    acked: &Acked,
) -> Result<Vec<tokio::task::JoinHandle<()>>, String> {
    let cfg = ConnectionConfig {
        response_timeout: Duration::from_secs(2),
        connection_timeout: Duration::from_secs(1),
    };
    let mut tasks = Vec::new();
    for p in 0..producers {
        let queue = Queue::connect_with(url, &cfg)
            .await
            .map_err(|e| e.to_string())?;
        let acked = acked.clone();
        tasks.push(tokio::spawn(async move {
            for n in 0u64.. {
                let id = format!("p{p}-{n}");
                let opts = EnqueueOptions::new().id(id.as_str());
                match queue.enqueue_raw(QUEUE, "blob", 1, 1, opts, b"\x90").await {
                    Ok(_) => acked.lock().expect("acked").push((id, epoch())),
                    Err(_) => return,
                }
            }
        }));
    }
    Ok(tasks)
}

/// Runs `f` on the server in a blocking task (kill and restart block).
async fn on_server<T: Send + 'static>(
    server: &Arc<Mutex<RedisServer>>,
    f: impl FnOnce(&mut RedisServer) -> Result<T, String> + Send + 'static,
) -> Result<T, String> {
    let server = server.clone();
    tokio::task::spawn_blocking(move || f(&mut server.lock().expect("server")))
        .await
        .map_err(|e| e.to_string())?
}

/// How many acknowledged ids have no job after the restart, and the Ok time
/// of the oldest of them.
async fn count_lost(url: &str, acked: &[(String, f64)]) -> Result<(u64, Option<f64>), String> {
    let keys = QueueKeys::new(QUEUE);
    let mut conn = redis::Client::open(url)
        .map_err(|e| e.to_string())?
        .get_multiplexed_async_connection()
        .await
        .map_err(|e| e.to_string())?;
    let mut lost = 0u64;
    let mut oldest_lost: Option<f64> = None;
    for chunk in acked.chunks(1000) {
        let mut pipe = redis::pipe();
        for (id, _) in chunk {
            pipe.cmd("EXISTS").arg(keys.job(id));
        }
        let exists: Vec<bool> = pipe
            .query_async(&mut conn)
            .await
            .map_err(|e| e.to_string())?;
        for ((_, at), present) in chunk.iter().zip(exists) {
            if !present {
                lost += 1;
                oldest_lost = Some(oldest_lost.map_or(*at, |o: f64| o.min(*at)));
            }
        }
    }
    Ok((lost, oldest_lost))
}

/// The fsync cadence and the exposure at the kill, from the strace.
fn fsync_window(trace: &Trace, acked: &[(String, f64)], killed_at: f64) -> FsyncWindow {
    // The last fsync that completed (strace saw it return, so before Redis
    // died) made durable every AOF write issued before it started. Redis
    // sends a reply right after the write holding its command (after the
    // fsync too, with `always`), so the Oks not covered are those from the
    // first AOF write that followed that fsync's start.
    let covering = trace
        .fsyncs
        .iter()
        .map(|(s, _)| *s)
        .fold(f64::MIN, f64::max);
    let first_ack = acked.first().map(|(_, t)| *t).unwrap_or(killed_at);
    let exposed_from = trace
        .aof_writes
        .iter()
        .copied()
        .filter(|w| *w > covering)
        .fold(f64::MAX, f64::min);
    let exposed_from = if covering == f64::MIN {
        first_ack
    } else {
        exposed_from
    };
    let mut starts: Vec<f64> = trace.fsyncs.iter().map(|(s, _)| *s).collect();
    starts.sort_by(f64::total_cmp);
    let max_gap = starts.windows(2).map(|w| w[1] - w[0]).fold(0.0, f64::max);
    let unsynced_at_kill = acked.iter().filter(|(_, t)| *t >= exposed_from).count() as u64;
    FsyncWindow {
        fsyncs: starts.len() as u64,
        max_gap_ms: (max_gap * 1000.0) as u64,
        unsynced_at_kill,
        unsynced_ms: if unsynced_at_kill == 0 {
            0
        } else {
            ((killed_at - exposed_from).max(0.0) * 1000.0) as u64
        },
    }
}

/// `strace` attached to redis-server, recording its fsync calls.
struct Tracer {
    child: Child,
    out: PathBuf,
}

impl Tracer {
    fn attach(pid: u32, out: PathBuf) -> Result<Tracer, String> {
        let child = Command::new("strace")
            .args([
                "-f",
                "-ttt",
                "-T",
                "-y",
                "-s",
                "0",
                "-e",
                "trace=fdatasync,fsync,write",
                "-o",
            ])
            .arg(&out)
            .args(["-p", &pid.to_string()])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("cannot run strace (is it installed and may it trace?): {e}"))?;
        // Give strace time to attach to every thread.
        std::thread::sleep(Duration::from_millis(500));
        Ok(Tracer { child, out })
    }

    /// Waits for strace to end (the traced process died) and parses its output.
    fn finish(&mut self) -> Result<Trace, String> {
        let deadline = Instant::now() + Duration::from_secs(5);
        while self.child.try_wait().map_err(|e| e.to_string())?.is_none() {
            if Instant::now() > deadline {
                let _ = self.child.kill();
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.wait();
        let text = std::fs::read_to_string(&self.out).map_err(|e| format!("strace output: {e}"))?;
        Ok(parse_strace(&text))
    }
}

/// What strace saw: (start, end) of each fsync call, and the start of each
/// write to an AOF file.
#[derive(Default)]
struct Trace {
    fsyncs: Vec<(f64, f64)>,
    aof_writes: Vec<f64>,
}

/// Parses `strace -f -ttt -T -y` lines, e.g.
/// `<tid> <epoch> fdatasync(8</dir/appendonly.aof.1.incr.aof>) = 0 <0.000123>`,
/// including `<unfinished ...>` / `<... fdatasync resumed>` pairs.
fn parse_strace(text: &str) -> Trace {
    let mut open: std::collections::HashMap<String, (bool, f64)> = Default::default();
    let mut trace = Trace::default();
    for line in text.lines() {
        let mut parts = line.split_whitespace();
        let (Some(tid), Some(ts)) = (parts.next(), parts.next()) else {
            continue;
        };
        let Ok(ts) = ts.parse::<f64>() else { continue };
        let dur = line
            .rsplit_once('<')
            .and_then(|(_, d)| d.trim_end_matches('>').parse::<f64>().ok())
            .unwrap_or(0.0);
        let is_sync = line.contains("sync(") || line.contains("sync resumed>");
        if line.contains("resumed>") {
            if let Some((true, start)) = open.remove(tid) {
                trace.fsyncs.push((start, ts + dur));
            }
        } else if line.contains("<unfinished") {
            if is_sync {
                open.insert(tid.to_string(), (true, ts));
            } else if line.contains("write(") && line.contains(".aof>") {
                trace.aof_writes.push(ts);
            }
        } else if is_sync {
            trace.fsyncs.push((ts, ts + dur));
        } else if line.contains("write(") && line.contains(".aof>") {
            trace.aof_writes.push(ts);
        }
    }
    trace
}
