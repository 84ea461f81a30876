//! Reliability of leases, step results, enqueue and connections when Redis
//! stops answering (issue #11 items 5, 6, 8, 9, 10, 11): each scenario runs
//! against its own redis-server, which it pauses (SIGSTOP), restarts or
//! slows down (`DEBUG SLEEP`).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use queue_core::{job, JobContext, JobError, Lock, LockOptions, Queue, Worker, WorkerConfig};
use queue_testkit::RedisServer;
use queue_tests::{fast_config, init_tracing, wait_until};
use serde::{Deserialize, Serialize};

const T: Duration = Duration::from_secs(30);

async fn setup() -> (RedisServer, String, Queue) {
    init_tracing();
    let server = RedisServer::start().expect("redis-server starts");
    let url = server.url();
    let queue = Queue::connect(&url).await.expect("connect");
    (server, url, queue)
}

/// A redis-server paused with SIGSTOP: it keeps its connections open and
/// answers nothing. Resumed (SIGCONT) on drop.
struct Paused(u32);

impl Paused {
    fn pause(server: &RedisServer) -> Paused {
        let pid = server.pid().expect("server runs");
        signal(pid, "STOP");
        Paused(pid)
    }
}

impl Drop for Paused {
    fn drop(&mut self) {
        signal(self.0, "CONT");
    }
}

fn signal(pid: u32, sig: &str) {
    let status = std::process::Command::new("kill")
        .arg(format!("-{sig}"))
        .arg(pid.to_string())
        .status()
        .expect("kill(1) runs");
    assert!(status.success(), "kill -{sig} {pid} failed");
}

// ---- item 5: lease loss is visible without Redis -------------------------

#[derive(Debug, Default, Serialize, Deserialize)]
struct Probe {}

static PROBE_STARTED: AtomicBool = AtomicBool::new(false);
/// Milliseconds into the handler at which `lease_lost()` turned true (0: not yet).
static PROBE_LOST_AT_MS: AtomicU64 = AtomicU64::new(0);

/// Watches `ctx.lease_lost()` for up to 30 s and records when it turns true.
#[job(queue = "lease-probe", max_attempts = 1, timeout = "60s")]
async fn probe(ctx: JobContext, _p: Probe) -> Result<(), JobError> {
    PROBE_STARTED.store(true, Ordering::SeqCst);
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(30) {
        if ctx.lease_lost() {
            PROBE_LOST_AT_MS.store(start.elapsed().as_millis().max(1) as u64, Ordering::SeqCst);
            return Err(JobError::retryable("lease lost"));
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    Ok(())
}

async fn start_worker(
    url: &str,
    builder: impl FnOnce(queue_core::WorkerBuilder) -> queue_core::WorkerBuilder,
    config: WorkerConfig,
) -> (
    queue_core::ShutdownHandle,
    tokio::task::JoinHandle<queue_core::Result<()>>,
) {
    let worker = builder(Worker::builder(url))
        .config(config)
        .build()
        .await
        .expect("worker builds");
    let handle = worker.shutdown_handle();
    (
        handle,
        tokio::spawn(worker.run_until(std::future::pending())),
    )
}

/// A heartbeat that cannot reach Redis never confirms an extend: the
/// handler must see `lease_lost()` once the local lease deadline passes,
/// before the watchdog could give the job to another worker.
#[tokio::test]
async fn lease_lost_turns_true_when_redis_stops_answering_the_heartbeat() {
    let (server, url, queue) = setup().await;
    let lease = Duration::from_millis(1000);
    let cfg = WorkerConfig {
        lease,
        heartbeat: Some(Duration::from_millis(200)),
        ..fast_config()
    };
    let (stop, join) = start_worker(&url, |b| b.register(probe::handler()), cfg).await;
    probe::enqueue(&queue, Probe {}).await.unwrap();
    wait_until(T, "probe started", || async {
        PROBE_STARTED.load(Ordering::SeqCst)
    })
    .await;
    // While the heartbeat works, the lease holds for several leases.
    tokio::time::sleep(lease * 3).await;
    assert_eq!(
        PROBE_LOST_AT_MS.load(Ordering::SeqCst),
        0,
        "a heartbeating lease is not lost"
    );
    let paused = Paused::pause(&server);
    let stopped_at = Instant::now();
    wait_until(T, "lease_lost() after Redis stopped answering", || async {
        PROBE_LOST_AT_MS.load(Ordering::SeqCst) > 0
    })
    .await;
    // The deadline (90 % of the lease after the last confirmed extend was
    // sent) is at most one lease after the pause; allow scheduling slack.
    assert!(
        stopped_at.elapsed() < lease * 4,
        "noticed {:?} after the pause",
        stopped_at.elapsed()
    );
    drop(paused);
    stop.shutdown();
    join.await.unwrap().unwrap();
}

/// `no_renew()`: the guard stops claiming the lock once its TTL ran out
/// (it used to say "held" forever).
#[tokio::test]
async fn a_lock_without_renewal_is_not_held_after_its_ttl() {
    let (_server, _url, queue) = setup().await;
    let ttl = Duration::from_millis(400);
    let guard = Lock::acquire(
        queue.connection(),
        "no-renew",
        LockOptions::default().ttl(ttl).no_renew(),
    )
    .await
    .unwrap()
    .expect("free");
    assert!(guard.is_held());
    tokio::time::sleep(ttl).await;
    assert!(!guard.is_held(), "its TTL ran out");
    tokio::time::timeout(Duration::from_secs(2), guard.lost())
        .await
        .expect("lost() completes at the deadline");
    // An explicit extend of a lock whose local deadline passed does not
    // revive the guard (someone else may have held it in between).
    let _ = guard.extend(ttl).await.unwrap();
    assert!(!guard.is_held());
}

/// Auto-renew against a paused Redis: the renewal hangs until the response
/// timeout (5 s), but the guard turns "not held" when its TTL runs out.
#[tokio::test]
async fn a_renewed_lock_is_not_held_once_its_ttl_passes_without_a_renewal() {
    let (server, _url, queue) = setup().await;
    let ttl = Duration::from_millis(600);
    let guard = Lock::acquire(
        queue.connection(),
        "paused",
        LockOptions::default().ttl(ttl),
    )
    .await
    .unwrap()
    .expect("free");
    let paused = Paused::pause(&server);
    let stopped_at = Instant::now();
    tokio::time::sleep(ttl).await;
    assert!(
        !guard.is_held(),
        "no renewal could be confirmed within the TTL"
    );
    tokio::time::timeout(ttl, guard.lost())
        .await
        .expect("lost() completes");
    assert!(stopped_at.elapsed() < Duration::from_secs(3));
    drop(paused);
}
