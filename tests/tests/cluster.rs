//! The queue on a Redis Cluster: three local primaries (3 `redis-server`s with
//! `cluster-enabled yes`, joined with `redis-cli --cluster create`).
//!
//! Queues are placed on different primaries through their hash tag, and the
//! whole life of a job (enqueue, fetch, ack, retry, dead-letter, replay,
//! reclaim after a SIGKILLed worker) runs on each shard; a queue's slot is
//! migrated between primaries while producers and workers run; a primary is
//! lost (replica failover, and restart from its AOF) while workers run.
//!
//! The ledger the test job writes lives on a separate single `redis-server`,
//! so side effects are counted independently of the cluster's fate.
//! Tests run one at a time (each starts its own cluster).

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use queue_core::{
    testing, BoxFuture, EnqueueOptions, Job, JobContext, JobError, LimitScope, Queue, QueueError,
    QueueKeys, RateLimit, RedisConnection, Registration, Watchdog,
};
use queue_testkit::cluster::{ClusterOptions, RedisCluster};
use queue_testkit::proxy::ReplyDropper;
use queue_testkit::RedisServer;
use queue_tests::env::{completed, task_for as job, wait_completed, wait_ledger, worker_on};
use queue_tests::handles::stop_all;
use queue_tests::{
    fast_config, fast_watchdog, init_tracing, task, wait_until, Ledger, Task, WatchdogHandle,
    WorkerHandle, WorkerProcess,
};
use redis::cmd;

const T: Duration = Duration::from_secs(60);
const WORKER_BIN: &str = env!("CARGO_BIN_EXE_test-worker");

/// The test job on another queue (same handler, same ledger).
macro_rules! task_on {
    ($ty:ident, $queue:literal) => {
        struct $ty;
        impl Job for $ty {
            type Args = Task;
            const NAME: &'static str = "task";
            const QUEUE: &'static str = $queue;
            const MAX_ATTEMPTS: u32 = 3;
            const TIMEOUT: Option<Duration> = Some(Duration::from_secs(60));
            fn run(ctx: JobContext, t: Task) -> BoxFuture<'static, Result<(), JobError>> {
                <task::Job as Job>::run(ctx, t)
            }
        }
    };
}
// `{emails}` -> slot 3728, `{tasks}` -> 9114, `{billing}` -> 12682: one per
// primary of a 3-primary cluster made by `redis-cli --cluster create`.
task_on!(EmailsTask, "emails");
task_on!(BillingTask, "billing");

const QUEUES: [&str; 3] = ["emails", "tasks", "billing"];

fn registrations() -> Vec<Registration> {
    vec![
        Registration::of::<EmailsTask>(),
        task::handler(),
        Registration::of::<BillingTask>(),
    ]
}

/// One cluster test at a time: each starts 3 to 6 redis-servers, and the
/// failover timings should not compete with another cluster for 2 cores.
async fn serial() -> tokio::sync::MutexGuard<'static, ()> {
    static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
    SERIAL.lock().await
}

/// A cluster test's world: the cluster, the ledger on a separate server, a
/// `Queue` on the cluster. Holds the one-test-at-a-time lock (dropped last).
struct ClusterEnv {
    cluster: RedisCluster,
    _ledger: RedisServer,
    lurl: String,
    url: String,
    queue: Queue,
    _serial: tokio::sync::MutexGuard<'static, ()>,
}

impl ClusterEnv {
    async fn start(opts: ClusterOptions) -> ClusterEnv {
        init_tracing();
        let serial = serial().await;
        let cluster = RedisCluster::start_with(opts).expect("cluster starts");
        let ledger = RedisServer::start().unwrap();
        let url = cluster.url();
        let queue = Queue::connect(&url).await.unwrap();
        ClusterEnv {
            cluster,
            lurl: ledger.url(),
            _ledger: ledger,
            url,
            queue,
            _serial: serial,
        }
    }

    /// Three primaries, no replicas.
    async fn three() -> ClusterEnv {
        Self::start(ClusterOptions::default()).await
    }

    /// `n` in-process workers of `concurrency` for the three queues.
    async fn start_workers(&self, n: usize, concurrency: usize) -> Vec<WorkerHandle> {
        let mut out = Vec::new();
        for _ in 0..n {
            let mut cfg = fast_config();
            cfg.concurrency = concurrency;
            out.push(WorkerHandle::start(worker_on(&self.url, registrations(), cfg)).await);
        }
        out
    }

    /// A watchdog loop on `queues`.
    async fn spawn_watchdog(&self, queues: &[&str]) -> WatchdogHandle {
        let dog = Watchdog::connect(&self.url, queues.iter().copied(), fast_watchdog())
            .await
            .unwrap();
        WatchdogHandle::spawn(dog)
    }

    /// Puts `slot` half-way from primary `from` to `to` (IMPORTING / MIGRATING)
    /// and moves only `keys`; returns MIGRATE's answer.
    fn half_migrate(&self, slot: u16, from: usize, to: usize, keys: &[&str]) -> String {
        let c = &self.cluster;
        let (from_id, to_id) = (c.node_id(from).unwrap(), c.node_id(to).unwrap());
        let s = slot.to_string();
        c.cli(to, &["CLUSTER", "SETSLOT", &s, "IMPORTING", &from_id])
            .unwrap();
        c.cli(from, &["CLUSTER", "SETSLOT", &s, "MIGRATING", &to_id])
            .unwrap();
        self.migrate_keys(from, to, keys)
    }

    /// Moves `keys` (of a slot half-way between them) from primary `from`
    /// to `to`; returns MIGRATE's answer.
    fn migrate_keys(&self, from: usize, to: usize, keys: &[&str]) -> String {
        let to_port = self.cluster.node(to).port().to_string();
        let mut args = vec!["MIGRATE", "127.0.0.1", &to_port, "", "0", "5000", "KEYS"];
        args.extend_from_slice(keys);
        self.cluster.cli(from, &args).unwrap()
    }
}

/// `batch` jobs of `task` on `q` with ids `<prefix>-<n>` for `n` in `range`,
/// each sleeping `sleep_ms`, in one pipeline (`opts` shapes each job's
/// options); returns the acknowledged ids.
async fn enqueue_batch(
    env: &ClusterEnv,
    q: &str,
    prefix: &str,
    range: std::ops::Range<u64>,
    sleep_ms: u64,
    opts: impl Fn(EnqueueOptions) -> EnqueueOptions,
) -> Vec<String> {
    let batch: Vec<(EnqueueOptions, Vec<u8>)> = range
        .map(|n| {
            let t = Task {
                sleep_ms,
                ..job(&env.lurl, n)
            };
            (
                opts(EnqueueOptions::new().id(format!("{prefix}-{n}"))),
                rmp_serde::to_vec_named(&t).unwrap(),
            )
        })
        .collect();
    let out = env
        .queue
        .enqueue_raw_batch(q, "task", 1, 3, batch)
        .await
        .expect("batch enqueued");
    out.into_iter().map(|e| e.id.to_string()).collect()
}

async fn enqueue_on(
    queue: &Queue,
    q: &str,
    opts: EnqueueOptions,
    t: &Task,
) -> queue_core::Result<queue_core::Enqueued> {
    let payload = rmp_serde::to_vec_named(t).unwrap();
    queue.enqueue_raw(q, "task", 1, 3, opts, &payload).await
}

/// Per queue: 20 single enqueues, a batch of 30 in one pipeline, a job
/// that fails twice then succeeds, one that fails permanently, one that
/// exhausts its attempts (max 3), and a stable id enqueued twice.
async fn enqueue_lifecycle_mix(env: &ClusterEnv, q: &str, seq: &mut u64) {
    let (queue, lurl) = (&env.queue, &env.lurl);
    for _ in 0..20 {
        *seq += 1;
        let e = enqueue_on(queue, q, EnqueueOptions::new(), &job(lurl, *seq))
            .await
            .unwrap();
        assert!(e.is_new());
    }
    let payloads: Vec<(EnqueueOptions, Vec<u8>)> = (0..30)
        .map(|_| {
            *seq += 1;
            (
                EnqueueOptions::new(),
                rmp_serde::to_vec_named(&job(lurl, *seq)).unwrap(),
            )
        })
        .collect();
    let out = queue
        .enqueue_raw_batch(q, "task", 1, 3, payloads)
        .await
        .unwrap();
    assert!(out.iter().all(|e| e.is_new()));
    let retry = Task {
        fail_first: 2,
        ..job(lurl, 0)
    };
    let permanent = Task {
        permanent: true,
        ..job(lurl, 0)
    };
    let exhausted = Task {
        fail_first: 3,
        ..job(lurl, 0)
    };
    for (name, t) in [
        ("retry-ok", &retry),
        ("permanent", &permanent),
        ("exhausted", &exhausted),
    ] {
        let opts = EnqueueOptions::new().id(format!("{q}-{name}"));
        enqueue_on(queue, q, opts, t).await.unwrap();
    }
    let again = enqueue_on(
        queue,
        q,
        EnqueueOptions::new().id(format!("{q}-retry-ok")),
        &retry,
    )
    .await
    .unwrap();
    assert!(!again.is_new(), "stable id dedupes on the cluster too");
    let s = queue.stats(q).await.unwrap();
    assert_eq!(s.main, 53, "{q}: {s:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_queues_on_three_primaries_run_the_whole_lifecycle() {
    let env = ClusterEnv::three().await;
    let (cluster, queue, lurl) = (&env.cluster, &env.queue, &env.lurl);

    // Hash tags spread the three queues over the three primaries.
    let owners: Vec<usize> = QUEUES
        .iter()
        .map(|q| cluster.master_of_queue(q).expect("slot owner"))
        .collect();
    let distinct: HashSet<_> = owners.iter().collect();
    assert_eq!(
        distinct.len(),
        3,
        "queues on distinct primaries: {owners:?}"
    );
    assert!(queue.connection().is_cluster());

    let mut seq = 0;
    for q in QUEUES {
        enqueue_lifecycle_mix(&env, q, &mut seq).await;
    }
    // Each queue's keys live on its own primary.
    for (q, owner) in QUEUES.iter().zip(&owners) {
        let n = cluster
            .cli(*owner, &["LLEN", &QueueKeys::new(q).main])
            .unwrap();
        assert_eq!(n.trim(), "53", "{q} on node {owner}");
    }

    let workers = env.start_workers(1, 8).await;
    for q in QUEUES {
        wait_until(T, "51 completions and 2 dead letters per queue", || async {
            let s = queue.stats(q).await.unwrap();
            s.counter("completed") == 51 && s.dead == 2
        })
        .await;
    }
    // Replay the exhausted job: attempt 4 succeeds.
    for q in QUEUES {
        let dead = queue.dead_letters(q, 0, 10).await.unwrap();
        let ids: HashSet<&str> = dead.iter().map(|j| j.id.as_str()).collect();
        assert_eq!(
            ids,
            HashSet::from([
                format!("{q}-permanent").as_str(),
                format!("{q}-exhausted").as_str()
            ]),
            "{q}"
        );
        assert!(queue
            .replay_dead(q, format!("{q}-exhausted"), false)
            .await
            .unwrap());
    }
    for q in QUEUES {
        wait_completed(queue, q, 52).await;
    }
    stop_all(workers).await;

    let ledger_view = Ledger::read(lurl).await;
    for q in QUEUES {
        let s = queue.stats(q).await.unwrap();
        assert_eq!(
            (s.main, s.processing, s.delayed, s.dead),
            (0, 0, 0, 1),
            "{q}"
        );
        assert_eq!(
            s.counter("retried"),
            4,
            "{q}: 2 for retry-ok, 2 for exhausted"
        );
        let rec = queue
            .completion(q, format!("{q}-retry-ok"))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(rec.get("attempts").map(String::as_str), Some("3"));
        let dead = queue
            .job(q, format!("{q}-permanent"))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(
            dead.field("dead_reason"),
            Some("permanent error: planned permanent failure")
        );
    }
    // 3 x 50 plain jobs + retry-ok x 3 + exhausted x 3: one effect each.
    assert_eq!(ledger_view.effects.len(), 150 + 6);
    assert!(ledger_view.duplicates().is_empty());
    assert_eq!(ledger_view.total_effects(), 156);

    // The watchdog works per queue, each on its own shard.
    let watchdog = Watchdog::connect(&env.url, QUEUES, fast_watchdog())
        .await
        .unwrap();
    assert!(watchdog.run_once().await.unwrap().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkilled_worker_process_jobs_are_reclaimed_on_the_cluster() {
    let env = ClusterEnv::three().await;
    let (queue, lurl, url) = (&env.queue, &env.lurl, &env.url);
    const N: usize = 6;
    let mut ids = Vec::new();
    for seq in 0..N as u64 {
        let t = Task {
            sleep_ms: 60_000,
            sleep_attempts: 1,
            ..job(lurl, seq)
        };
        ids.push(task::enqueue(queue, t).await.unwrap());
    }
    // `test-worker` takes the cluster URL like any other.
    let mut proc = WorkerProcess::start(WORKER_BIN, url, N, 800, 5000);
    wait_ledger(lurl, "all jobs started in the worker process", |l| {
        l.started.len() == N
    })
    .await;
    proc.kill();
    let s = queue.stats("tasks").await.unwrap();
    assert_eq!(
        s.processing, N as u64,
        "the dead worker's jobs stay in processing"
    );

    let wd = env.spawn_watchdog(&["tasks"]).await;
    let mut proc = WorkerProcess::start(WORKER_BIN, url, N, 800, 5000);
    wait_completed(queue, "tasks", N as i64).await;
    proc.signal("TERM");
    let _ = proc.child.wait();
    let report = wd.stop().await;
    assert_eq!(report.reclaimed, N as u64);
    let l = Ledger::read(lurl).await;
    for id in &ids {
        assert_eq!(l.started.get(id.as_str()), Some(&2), "{id} started twice");
        assert_eq!(l.effects.get(id.as_str()), Some(&1), "{id} effect once");
    }
    assert_eq!(
        queue.stats("tasks").await.unwrap().counter("reclaimed"),
        N as i64
    );
}

/// Producer loop: enqueues `prefix-<n>` with stable ids until `stop`,
/// retrying an id on error until Redis accepts it. Returns the acknowledged
/// ids and the errors seen.
fn spawn_producer(
    queue: Queue,
    q: &'static str,
    prefix: &'static str,
    ledger: String,
    opts: EnqueueOptions,
    pace: Duration,
    stop: Arc<AtomicBool>,
) -> tokio::task::JoinHandle<(Vec<String>, Vec<String>)> {
    tokio::spawn(async move {
        let mut acked = Vec::new();
        let mut errors = Vec::new();
        let mut n = 0u64;
        while !stop.load(Ordering::SeqCst) {
            n += 1;
            let id = format!("{prefix}-{n}");
            let t = Task {
                sleep_ms: 5,
                ..job(&ledger, n)
            };
            let deadline = Instant::now() + Duration::from_secs(30);
            loop {
                match enqueue_on(&queue, q, opts.clone().id(id.as_str()), &t).await {
                    Ok(_) => {
                        acked.push(id.clone());
                        break;
                    }
                    Err(e) => {
                        errors.push(e.to_string());
                        assert!(
                            Instant::now() < deadline,
                            "enqueue of {id} never succeeded: {e}"
                        );
                        tokio::time::sleep(Duration::from_millis(20)).await;
                    }
                }
            }
            tokio::time::sleep(pace).await;
        }
        (acked, errors)
    })
}

/// Waits until every acknowledged id has a side effect in the ledger and
/// `queues` are drained (nothing waiting, running or delayed: redeliveries
/// are done), then returns (lost, duplicated) ids.
async fn settle(
    lurl: &str,
    acked: &[String],
    queue: &Queue,
    queues: &[&str],
    limit: Duration,
) -> (Vec<String>, Vec<String>) {
    let start = Instant::now();
    loop {
        let l = Ledger::read(lurl).await;
        let lost: Vec<String> = acked
            .iter()
            .filter(|id| !l.effects.contains_key(id.as_str()))
            .cloned()
            .collect();
        let mut drained = true;
        for q in queues {
            match queue.stats(q).await {
                Ok(s) if s.main + s.processing + s.delayed == 0 => {}
                _ => drained = false,
            }
        }
        if (lost.is_empty() && drained) || start.elapsed() > limit {
            let dups = acked
                .iter()
                .filter(|id| l.effects.get(id.as_str()).copied().unwrap_or(0) > 1)
                .cloned()
                .collect();
            return (lost, dups);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn live_slot_migration_while_producing_and_consuming_loses_no_job() {
    let env = ClusterEnv::three().await;
    let (cluster, queue, lurl) = (&env.cluster, &env.queue, &env.lurl);
    let slot = cluster.keyslot("{tasks}");
    let from = cluster.master_of_slot(slot).unwrap();
    let to = (from + 1) % 3;

    // A backlog, so the slot holds a few thousand keys while it moves.
    let mut acked = enqueue_batch(&env, "tasks", "backlog", 0..1500, 5, |o| o).await;

    let workers = env.start_workers(2, 8).await;
    let wd = env.spawn_watchdog(&["tasks"]).await;
    let stop = Arc::new(AtomicBool::new(false));
    let producer = spawn_producer(
        queue.clone(),
        "tasks",
        "live",
        lurl.clone(),
        EnqueueOptions::new(),
        Duration::from_millis(2),
        stop.clone(),
    );
    wait_until(T, "workers are consuming", || async {
        completed(queue, "tasks").await > 100
    })
    .await;

    // Move the queue's slot to another primary, 20 keys per MIGRATE with a
    // pause, so producers and workers hit the migrating slot many times.
    let started = Instant::now();
    let keys_moved = tokio::task::block_in_place(|| {
        cluster.migrate_slot(slot, to, 20, Duration::from_millis(10))
    })
    .expect("slot migrates");
    let migration = started.elapsed();
    assert_eq!(cluster.master_of_slot(slot), Some(to), "slot moved");
    assert!(keys_moved > 100, "moved {keys_moved} keys");

    // Keep going on the new owner for a moment, then stop producing.
    let before = completed(queue, "tasks").await;
    wait_until(T, "progress after the migration", || async {
        completed(queue, "tasks").await > before + 200
    })
    .await;
    stop.store(true, Ordering::SeqCst);
    let (live_acked, errors) = producer.await.unwrap();
    acked.extend(live_acked);

    let (lost, dups) = settle(lurl, &acked, queue, &["tasks"], T).await;
    let report = wd.stop().await;
    stop_all(workers).await;

    // A connection made after the change goes straight to the new owner.
    let fresh = Queue::connect(&cluster.url_via(from)).await.unwrap();
    let s = fresh.stats("tasks").await.unwrap();
    let n = cluster
        .cli(to, &["HGET", &QueueKeys::new("tasks").stats, "completed"])
        .unwrap();
    assert_eq!(n.trim(), s.counter("completed").to_string());
    println!(
        "live migration of slot {slot} (node {from} -> {to}): {keys_moved} keys in {:?}; \
         {} jobs acknowledged, {} producer errors, lost {}, duplicated {}, watchdog {report:?}",
        migration,
        acked.len(),
        errors.len(),
        lost.len(),
        dups.len()
    );
    assert!(lost.is_empty(), "lost jobs: {lost:?}");
    assert_eq!(
        (s.main, s.processing, s.delayed, s.dead),
        (0, 0, 0, 0),
        "{s:?}"
    );
    // Every script on the slot gets TRYAGAIN until the migration ends (the
    // client retries it), so a migration longer than the lease lets the
    // watchdog return the jobs in flight: at-least-once, bounded by them.
    // With batched acks (#12) "in flight" is the 2 x 8 running jobs plus
    // the completed ones whose batched ack was caught by the migration (a
    // slot is freed at completion, before its ack lands): at most as many
    // again per worker.
    assert!(dups.len() <= 2 * 16, "duplicated side effects: {dups:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_follow_ask_redirects_while_a_slot_migrates() {
    let env = ClusterEnv::three().await;
    let (cluster, queue, lurl) = (&env.cluster, &env.queue, &env.lurl);
    let slot = cluster.keyslot("{tasks}");
    let from = cluster.master_of_slot(slot).unwrap();
    let to = (from + 1) % 3;
    for id in ["moved", "stays"] {
        enqueue_on(queue, "tasks", EnqueueOptions::new().id(id), &job(lurl, 1))
            .await
            .unwrap();
    }
    // Slot half-migrated: only job `moved`'s hash is on the new primary.
    let moved_key = QueueKeys::new("tasks").job("moved");
    let out = env.half_migrate(slot, from, to, &[&moved_key]);
    assert_eq!(out.trim(), "OK");
    let asked = cluster
        .cli(from, &["HGET", &moved_key, "state"])
        .unwrap_or_else(|e| e.to_string());
    assert!(asked.contains("ASK"), "the source answers ASK: {asked}");

    // Single-key reads: the client follows ASK to the importing primary.
    let moved = queue
        .job("tasks", "moved")
        .await
        .unwrap()
        .expect("found via ASK");
    assert_eq!(moved.state(), Some("queued"));
    let stays = queue
        .job("tasks", "stays")
        .await
        .unwrap()
        .expect("still on the source");
    assert_eq!(stays.state(), Some("queued"));
    assert!(queue.completion("tasks", "moved").await.unwrap().is_none());

    // Finish the migration: a client that knew the old owner gets MOVED once
    // and then talks to the new one; everything runs.
    tokio::task::block_in_place(|| cluster.migrate_slot(slot, to, 100, Duration::ZERO))
        .expect("migration completes");
    assert_eq!(queue.stats("tasks").await.unwrap().main, 2);
    let workers = env.start_workers(1, 4).await;
    wait_completed(queue, "tasks", 2).await;
    stop_all(workers).await;
}

/// `errorstat_TRYAGAIN` of node `i`: scripts refused on a migrating slot.
fn tryagain_count(cluster: &RedisCluster, i: usize) -> u64 {
    let info = cluster.cli(i, &["INFO", "errorstats"]).unwrap_or_default();
    info.lines()
        .find_map(|l| l.strip_prefix("errorstat_TRYAGAIN:count="))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or(0)
}

/// A script that starts on a migrating slot must not stop halfway: an
/// undeclared key (a job hash) that has already moved makes Redis abort the
/// script at that command, after its earlier writes. Here the promote script
/// would `ZREM` a due job from the delayed set and then fail on its moved
/// hash, leaving the job in no list at all. `set_limits.lua` (a change of a
/// key's limits), with all its declared keys present, wrote the new limit
/// and stopped at the key's booking (undeclared, missing): the limit
/// changed, its release not made; it is refused whole now.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scripts_never_half_run_on_a_migrating_slot() {
    let env = ClusterEnv::three().await;
    let (cluster, queue, lurl, url) = (&env.cluster, &env.queue, &env.lurl, &env.url);
    let slot = cluster.keyslot("{tasks}");
    let from = cluster.master_of_slot(slot).unwrap();
    let to = (from + 1) % 3;

    // A queue with a waiting job, a dead letter and a due delayed job.
    let due = |id: &str| EnqueueOptions::new().id(id).delay(Duration::from_millis(1));
    enqueue_on(
        queue,
        "tasks",
        EnqueueOptions::new().id("waiting"),
        &job(lurl, 1),
    )
    .await
    .unwrap();
    enqueue_on(queue, "tasks", due("victim"), &job(lurl, 2))
        .await
        .unwrap();
    queue
        .enqueue_raw(
            "tasks",
            "task",
            1,
            3,
            EnqueueOptions::new().id("bad"),
            &[0xc1],
        )
        .await
        .unwrap();
    let mut cfg = fast_config();
    cfg.concurrency = 1;
    let tasks_worker = || worker_on(url, [task::handler()], cfg.clone()).queues(["tasks"]);
    {
        // Let one worker dead-letter the undecodable job, then stop it.
        let w = WorkerHandle::start(tasks_worker()).await;
        wait_until(T, "dead letter", || async {
            queue.stats("tasks").await.unwrap().dead == 1
        })
        .await;
        w.stop().await;
    }
    // Re-create the due delayed job and a waiting job (the worker ran them).
    enqueue_on(queue, "tasks", due("victim2"), &job(lurl, 3))
        .await
        .unwrap();
    enqueue_on(
        queue,
        "tasks",
        EnqueueOptions::new().id("waiting2"),
        &job(lurl, 4),
    )
    .await
    .unwrap();

    // A per-key limit, and a release left pending by a caller that died
    // (its key's index gone): the keys `set_limits.lua` declares, and those
    // it reads before its first write, are all on the source.
    let keys = QueueKeys::new("tasks");
    let per_hour = |n| RateLimit {
        max: n,
        per: Duration::from_secs(3600),
    };
    let acme = || LimitScope::Key("acme".into());
    queue
        .set_rate_limit("tasks", acme(), per_hour(1))
        .await
        .unwrap();
    let (releasing, deferkeys) = (
        format!("{}:releasing", keys.limits()),
        format!("{}:deferkeys", keys.limits()),
    );
    for (key, member) in [(&releasing, "gone"), (&deferkeys, "gone")] {
        cluster.cli(from, &["ZADD", key, "1", member]).unwrap();
    }
    cluster.cli(from, &["LPUSH", &keys.wake, "1"]).unwrap();

    // Start migrating the slot and move only the victim's hash.
    let refused_before = tryagain_count(cluster, from);
    env.half_migrate(slot, from, to, &[&keys.job("victim2")]);

    // A change of the key's limit is refused whole (TRYAGAIN until the
    // client gives up): the limit is as it was.
    let field = "key_rate:acme";
    let refused = queue.set_rate_limit("tasks", acme(), per_hour(2)).await;
    assert!(
        refused.is_err(),
        "refused on the migrating slot: {refused:?}"
    );
    let kept = cluster.cli(from, &["HGET", &keys.limits(), field]).unwrap();
    assert_eq!(kept.trim(), "1/3600000", "the limit is unchanged");

    // A worker's promoter runs meanwhile: wait until the source primary has
    // refused the worker's scripts on the migrating slot a few times
    // (instead of a fixed sleep).
    let w = WorkerHandle::start(tasks_worker()).await;
    wait_until(T, "scripts refused with TRYAGAIN", || async {
        tryagain_count(cluster, from) >= refused_before + 3
    })
    .await;
    // Finish the migration; everything must still run.
    tokio::task::block_in_place(|| cluster.migrate_slot(slot, to, 100, Duration::ZERO))
        .expect("migration completes");
    wait_ledger(lurl, "victim2 runs", |l| l.effects.contains_key("victim2")).await;
    w.stop().await;
    // After the migration the change goes through, and ends the release.
    queue
        .set_rate_limit("tasks", acme(), per_hour(2))
        .await
        .unwrap();
    let limits = queue.limits("tasks").await.unwrap();
    assert_eq!(limits.keys["acme"].rate, Some(per_hour(2)));

    batch_and_group_scripts_run_whole_or_not_at_all(&env).await;
}

/// The second part of `scripts_never_half_run_on_a_migrating_slot`, on
/// `billing`: scripts that reach a batch's keys or a group's list without
/// declaring them. Before they declared the guard key:
/// 1. a replay of a dead batch member, on the source after the batch's keys
///    moved, put the job back in main and off the dead list, then failed at
///    the batch (non-local key): the batch still counted it dead;
/// 2. a replay of a grouped job sent to the target with `ASKING` (every key
///    it declares moved) created the group's list, the ring and the history
///    there while the source still held them: the next `MIGRATE` failed
///    with BUSYKEY and the reshard was stuck;
/// 3. a permanent failure of a batch member dead-lettered it and dropped it
///    from processing, then failed at the batch: the batch never counted it.
///
/// Each is now refused whole (TRYAGAIN, also after an ASK) while the slot
/// migrates, and runs once it moved.
async fn batch_and_group_scripts_run_whole_or_not_at_all(env: &ClusterEnv) {
    use queue_core::{testing::Claimed, testing::Failed, Batch, ConnectionConfig, JobSpec};
    let (cluster, lurl, q) = (&env.cluster, &env.lurl, "billing");
    let keys = QueueKeys::new(q);
    let slot = cluster.keyslot("{billing}");
    let from = cluster.master_of_slot(slot).unwrap();
    let to = (from + 1) % 3;
    // A refused call gives up after 2 s of TRYAGAIN (instead of 5).
    let cfg = ConnectionConfig {
        response_timeout: Duration::from_secs(2),
        ..ConnectionConfig::default()
    };
    let mut conn = RedisConnection::connect(&env.url, &cfg).await.unwrap();
    let queue = Queue::from_connection(conn.clone());
    let on = |i: usize, args: &[&str]| cluster.cli(i, args).unwrap().trim().to_string();

    // Batch b1 of j1 and j2, and g1 of group `acme`, all three running;
    // j1 and g1 fail for good (dead, b1 counts j1), j2 keeps running.
    let member = |id: &str| JobSpec::new::<BillingTask>(&job(lurl, 1)).unwrap().id(id);
    Batch::new(&queue)
        .id("b1")
        .add(member("j1"))
        .add(member("j2"))
        .enqueue()
        .await
        .unwrap();
    let in_acme = |id: &str| EnqueueOptions::new().id(id).group("acme");
    enqueue_on(&queue, q, in_acme("g1"), &job(lurl, 2))
        .await
        .unwrap();
    let rows = testing::fetch(&mut conn, q, T, "base-b", 3).await.unwrap();
    let token = |id: &str| {
        rows.iter()
            .find_map(|r| match r {
                Claimed::Claimed { id: got, token, .. } if got.as_str() == id => {
                    Some(token.clone())
                }
                _ => None,
            })
            .unwrap_or_else(|| panic!("{id} is claimed: {rows:?}"))
    };
    let (j1, j2, g1) = (token("j1"), token("j2"), token("g1"));
    for (id, token) in [("j1", &j1), ("g1", &g1)] {
        let out = testing::fail(&mut conn, q, id, token, false, Duration::ZERO)
            .await
            .unwrap();
        assert!(matches!(out, Failed::Dead(_)), "{id}: {out:?}");
    }
    // Every key the scripts declare exists: g2 waits in acme's list, w in
    // main, `later` in the delayed set, and the promoter's wake list.
    enqueue_on(&queue, q, in_acme("g2"), &job(lurl, 3))
        .await
        .unwrap();
    enqueue_on(&queue, q, EnqueueOptions::new().id("w"), &job(lurl, 4))
        .await
        .unwrap();
    let later = EnqueueOptions::new()
        .id("later")
        .delay(Duration::from_secs(3600));
    enqueue_on(&queue, q, later, &job(lurl, 5)).await.unwrap();
    on(from, &["LPUSH", &keys.wake, "1"]);

    // The slot starts migrating; only the batch's keys move.
    let bkey = keys.batch("b1");
    let (members, done) = (format!("{bkey}:members"), format!("{bkey}:done"));
    let refused_before = tryagain_count(cluster, from);
    let out = env.half_migrate(slot, from, to, &[&bkey, &members, &done]);
    assert_eq!(out.trim(), "OK");
    let lrange = |key: &str| on(from, &["LRANGE", key, "0", "-1"]);
    let (dead, main, processing) = (
        lrange(&keys.dead),
        lrange(&keys.main),
        lrange(&keys.processing),
    );
    assert_eq!((dead.as_str(), main.as_str()), ("g1\nj1", "w"));

    // 1. The replay of j1 is refused whole: j1 is still dead-lettered.
    let replayed = queue.replay_dead(q, "j1", false).await;
    assert!(
        replayed.is_err(),
        "refused on the migrating slot: {replayed:?}"
    );
    assert_eq!(lrange(&keys.dead), dead, "j1 is still on the dead list");
    assert_eq!(lrange(&keys.main), main, "and not in main");
    assert_eq!(on(from, &["HGET", &keys.job("j1"), "state"]), "dead");

    // 3. The permanent failure of j2 is refused whole: still running.
    let failed = testing::fail(&mut conn, q, "j2", &j2, false, Duration::ZERO).await;
    assert!(failed.is_err(), "refused on the migrating slot: {failed:?}");
    assert_eq!(lrange(&keys.processing), processing, "j2 still runs");
    assert_eq!(lrange(&keys.dead), dead, "j2 is not dead-lettered");
    assert_eq!(on(from, &["HGET", &keys.job("j2"), "state"]), "active");
    assert!(
        tryagain_count(cluster, from) >= refused_before + 2,
        "both refused with TRYAGAIN"
    );

    // 2. Every key the replay of g1 declares moves too (the source answers
    // ASK): the target refuses it, and creates nothing.
    let job_g1 = keys.job("g1");
    let out = env.migrate_keys(from, to, &[&keys.dead, &keys.main, &job_g1, &keys.stats]);
    assert_eq!(out.trim(), "OK");
    let refused_before = tryagain_count(cluster, to);
    let replayed = queue.replay_dead(q, "g1", false).await;
    assert!(
        replayed.is_err(),
        "refused on the migrating slot: {replayed:?}"
    );
    let slot_s = slot.to_string();
    let mut on_target: Vec<String> = on(to, &["CLUSTER", "GETKEYSINSLOT", &slot_s, "100"])
        .lines()
        .map(String::from)
        .collect();
    on_target.sort();
    let mut moved: Vec<String> = [
        &bkey,
        &members,
        &done,
        &keys.dead,
        &keys.main,
        &job_g1,
        &keys.stats,
    ]
    .map(String::clone)
    .to_vec();
    moved.sort();
    assert_eq!(on_target, moved, "only the moved keys are on the target");
    assert!(
        tryagain_count(cluster, to) > refused_before,
        "refused with TRYAGAIN"
    );

    // The migration completes (no key on both sides), and all three run.
    tokio::task::block_in_place(|| cluster.migrate_slot(slot, to, 100, Duration::ZERO))
        .expect("migration completes");
    assert!(queue.replay_dead(q, "j1", false).await.unwrap());
    assert!(queue.replay_dead(q, "g1", false).await.unwrap());
    let out = testing::fail(&mut conn, q, "j2", &j2, false, Duration::ZERO)
        .await
        .unwrap();
    assert!(matches!(out, Failed::Dead(_)), "j2: {out:?}");
    let b1 = queue.batch(q, "b1").await.unwrap().expect("batch b1");
    assert_eq!(
        (b1.state.as_str(), b1.dead),
        ("sealed", 1),
        "j2 counted dead, j1 waiting again"
    );
    let acme: Vec<String> = cmd("LRANGE")
        .arg(keys.group("acme"))
        .arg(0)
        .arg(-1)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(acme, ["g1", "g2"], "g1 waits in its group again");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wait_for_replicas_is_answered_by_the_queues_own_shard_and_a_primary_loss_fails_over() {
    let mut env = ClusterEnv::start(ClusterOptions {
        masters: 3,
        replicas_per_master: 1,
        ..ClusterOptions::default()
    })
    .await;
    let (queue, lurl) = (env.queue.clone(), env.lurl.clone());
    let owner = env.cluster.master_of_queue("tasks").unwrap();
    let replica = env.cluster.replicas_of(owner);
    assert_eq!(replica.len(), 1, "one replica for the tasks primary");
    let replica = replica[0];
    let wait = |opts: EnqueueOptions| opts.wait_for_replicas(1, Duration::from_millis(300));

    // WAIT goes with the batch to the queue's primary: with that primary's
    // replica down, `tasks` is NotReplicated while `emails` (another shard,
    // replica up) is confirmed.
    env.cluster.kill_node(replica);
    let err = enqueue_on(
        &queue,
        "tasks",
        wait(EnqueueOptions::new().id("unconfirmed")),
        &job(&lurl, 0),
    )
    .await
    .unwrap_err();
    assert!(
        matches!(
            err,
            QueueError::NotReplicated {
                acked: 0,
                wanted: 1,
                ..
            }
        ),
        "{err}"
    );
    enqueue_on(
        &queue,
        "emails",
        wait(EnqueueOptions::new()),
        &job(&lurl, 0),
    )
    .await
    .expect("emails' shard has its replica");
    tokio::task::block_in_place(|| {
        env.cluster.restart_node(replica).unwrap();
        env.cluster.wait_ok(T).unwrap();
    });

    // 400 jobs, each batch confirmed by the replica.
    let mut acked = vec!["unconfirmed".to_string()];
    for b in 0..8 {
        acked.extend(enqueue_batch(&env, "tasks", "r", b * 50..(b + 1) * 50, 10, wait).await);
    }

    let workers = env.start_workers(2, 4).await;
    let wd = env.spawn_watchdog(&["tasks"]).await;
    wait_until(T, "processing under way", || async {
        completed(&queue, "tasks").await > 50
    })
    .await;

    // Lose the primary: its replica takes over after the node timeout.
    let killed_at = Instant::now();
    env.cluster.kill_node(owner);
    tokio::task::block_in_place(|| env.cluster.wait_master(replica, T)).expect("replica promoted");
    let promoted = killed_at.elapsed();
    let (lost, dups) = settle(&lurl, &acked, &queue, &["tasks"], T).await;
    let recovered = killed_at.elapsed();
    let report = wd.stop().await;
    stop_all(workers).await;
    let s = queue.stats("tasks").await.unwrap();
    println!(
        "primary of `tasks` SIGKILLed: replica promoted after {promoted:?}, all {} jobs done after \
         {recovered:?}; lost {}, duplicated side effects {} ({dups:?}); watchdog {report:?}",
        acked.len(),
        lost.len(),
        dups.len()
    );
    assert!(lost.is_empty(), "lost: {lost:?}");
    assert_eq!((s.main, s.delayed, s.dead), (0, 0, 0), "{s:?}");
    assert_eq!(env.cluster.master_of_queue("tasks"), Some(replica));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_primary_restarted_from_its_aof_loses_nothing_and_other_shards_keep_working() {
    let mut env = ClusterEnv::start(ClusterOptions {
        extra_args: ["--appendonly", "yes", "--appendfsync", "always"]
            .map(String::from)
            .to_vec(),
        ..ClusterOptions::default()
    })
    .await;
    let (queue, lurl) = (env.queue.clone(), env.lurl.clone());
    let owner = env.cluster.master_of_queue("tasks").unwrap();

    let mut acked: HashMap<&str, Vec<String>> = HashMap::new();
    for q in ["tasks", "emails"] {
        acked.insert(q, enqueue_batch(&env, q, q, 0..300, 20, |o| o).await);
    }
    let workers = env.start_workers(2, 4).await;
    let wd = env.spawn_watchdog(&["tasks", "emails"]).await;
    wait_until(T, "processing under way", || async {
        completed(&queue, "tasks").await > 30
    })
    .await;

    env.cluster.kill_node(owner);
    let down_at = Instant::now();
    // While `tasks`' primary is down, `emails` (another primary) progresses.
    let emails_before = completed(&queue, "emails").await;
    wait_until(T, "emails progress during the outage", || async {
        completed(&queue, "emails").await > emails_before + 20
    })
    .await;
    // The outage lasts at least 1.5 s (its length is the scenario, not a wait).
    tokio::time::sleep(Duration::from_millis(1500).saturating_sub(down_at.elapsed())).await;
    let outage = down_at.elapsed();
    tokio::task::block_in_place(|| {
        env.cluster.restart_node(owner).unwrap();
        env.cluster.wait_ok(T).unwrap();
    });
    let all: Vec<String> = acked.values().flatten().cloned().collect();
    let (lost, dups) = settle(&lurl, &all, &queue, &["tasks", "emails"], T).await;
    let recovered = down_at.elapsed();
    wd.stop().await;
    stop_all(workers).await;
    println!(
        "primary of `tasks` down for {outage:?} then restarted from its AOF: all {} jobs done \
         {recovered:?} after the kill; lost {}, duplicated side effects {}",
        all.len(),
        lost.len(),
        dups.len()
    );
    assert!(lost.is_empty(), "lost: {lost:?}");
    for q in ["tasks", "emails"] {
        let s = queue.stats(q).await.unwrap();
        assert_eq!(
            (s.main, s.processing, s.delayed, s.dead),
            (0, 0, 0, 0),
            "{q}: {s:?}"
        );
    }
}

/// A cross-queue flow on the cluster: the parent on `orders`, its children
/// on `emails` and `billing` (other hash tags, other slots, other primaries).
/// Every relay script touches one slot (a cross-slot script would fail with
/// CROSSSLOT); the parent runs once and reads both children's results, and
/// a producer that waited for the parent before it existed gets its record.
/// `batches show` reads each child's state on its own queue's primary.
#[tokio::test]
async fn a_cross_queue_flow_is_relayed_between_primaries() {
    use queue_core::{Flow, JobSpec};
    use queue_tests::workflow_jobs::{self as wf, WfCallback, WfMember};
    use redis::AsyncCommands;
    let env = ClusterEnv::three().await;
    let owners: HashSet<usize> = [wf::ORDERS, wf::EMAILS, wf::BILLING]
        .iter()
        .map(|q| env.cluster.master_of_queue(q).expect("slot owner"))
        .collect();
    assert!(owners.len() >= 2, "the queues span primaries: {owners:?}");
    let member = WfMember {
        ledger: env.lurl.clone(),
        ..WfMember::default()
    };
    let cb = WfCallback {
        ledger: env.lurl.clone(),
    };
    Flow::new(
        JobSpec::new::<wf::wf_order_close::Job>(&cb)
            .unwrap()
            .id("o-1:close"),
    )
    .child(
        JobSpec::new::<wf::wf_email::Job>(&member)
            .unwrap()
            .id("o-1:email"),
    )
    .child(
        JobSpec::new::<wf::wf_bill::Job>(&member)
            .unwrap()
            .id("o-1:charge"),
    )
    .enqueue(&env.queue)
    .await
    .unwrap();
    // `batches show` reads each child on its own queue's primary (one
    // read-only script per queue: no CROSSSLOT).
    let detail = queue_core::admin::Admin::new(env.queue.clone())
        .batch_detail(wf::ORDERS, "o-1:close")
        .await
        .unwrap()
        .unwrap();
    let shown: Vec<(&str, &str, Option<&str>)> = detail
        .members
        .iter()
        .map(|m| (m.id.as_str(), m.outcome.as_str(), m.queue.as_deref()))
        .collect();
    assert_eq!(
        shown,
        [
            ("o-1:charge", "queued", Some(wf::BILLING)),
            ("o-1:email", "queued", Some(wf::EMAILS)),
        ]
    );
    // A producer waits for the parent before it exists (docs/RESULTS.md):
    // result_wait.lua reaches the batch hash in the parent's slot only.
    let waiter = {
        let queue = env.queue.clone();
        tokio::spawn(async move {
            queue
                .wait_completion(wf::ORDERS, &"o-1:close".into(), T)
                .await
        })
    };
    let worker = WorkerHandle::start(worker_on(&env.url, wf::all(), fast_config())).await;
    let mut ledger = queue_tests::redis_conn(&env.lurl).await;
    wait_until(T, "the parent ran", || {
        let mut l = ledger.clone();
        async move {
            let n: Option<String> = l.hget("ledger:wf:callbacks", "o-1:close").await.unwrap();
            n.is_some()
        }
    })
    .await;
    worker.stop().await;
    let children: String = ledger
        .hget("ledger:wf:children", "o-1:close")
        .await
        .unwrap();
    assert_eq!(children, "2,0");
    let runs: String = ledger
        .hget("ledger:wf:callbacks", "o-1:close")
        .await
        .unwrap();
    assert_eq!(runs, "1");
    let record = waiter
        .await
        .unwrap()
        .expect("the waiter gets the parent's record");
    assert_eq!(record.get("status").map(Vec::as_slice), Some(&b"done"[..]));
    let summary = env
        .queue
        .batch(wf::ORDERS, "o-1:close")
        .await
        .unwrap()
        .unwrap();
    assert_eq!((summary.state.as_str(), summary.succeeded), ("fired", 2));
    for q in [wf::EMAILS, wf::BILLING] {
        let stats = env.queue.stats(q).await.unwrap();
        assert_eq!(stats.counter("relayed"), 1, "{q}");
        assert_eq!(stats.counter("relay_dead"), 0, "{q}");
    }
}

/// Scenario: the reply of a script call is lost on its way back from the
/// primary of `{tasks}` (a proxy in front of it, announced as its address,
/// closes the connection instead). The cluster client reconnects and sends
/// the same call again by itself, so the call runs twice. A first-try fetch
/// of one of two jobs must still deliver one job (before: the resend skipped
/// the receipt, moved and claimed the second job with the same tokens, and
/// the first stayed active under a lease nobody held), and an enqueue with
/// a generated id must still queue its id once (before: the resend skipped
/// the dedupe reads and pushed the id a second time, DESIGN rule 5).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_the_cluster_client_resends_after_a_lost_reply_runs_once() {
    let env = ClusterEnv::three().await;
    let primary = env.cluster.master_of_queue("tasks").expect("slot owner");
    let proxy = ReplyDropper::start(env.cluster.node(primary).port()).unwrap();
    env.cluster
        .announce_port(primary, proxy.port(), T)
        .expect("the proxy is the primary's address");
    let other = (primary + 1) % env.cluster.len();
    let mut conn = RedisConnection::connect(&env.cluster.url_via(other), &Default::default())
        .await
        .unwrap();
    let queue = Queue::from_connection(conn.clone());
    let keys = QueueKeys::new("tasks");
    let payload = rmp_serde::to_vec_named(&job(&env.lurl, 1)).unwrap();
    for id in ["first", "second"] {
        let opts = EnqueueOptions::new().id(id);
        queue
            .enqueue_raw("tasks", "task", 1, 1, opts, &payload)
            .await
            .unwrap();
    }

    proxy.drop_next_reply();
    let rows = testing::fetch_first_try(&mut conn, "tasks", T, "base-1", 1)
        .await
        .expect("answered after the lost reply");
    assert_eq!(proxy.dropped(), 1, "the fetch's reply was lost");
    assert_eq!(rows.len(), 1, "{rows:?}");
    let leased: u64 = cmd("ZCARD")
        .arg(&keys.leases)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(leased, 1, "one fetch of one job leases one job");
    let queued: u64 = cmd("LLEN")
        .arg(&keys.main)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(queued, 1, "the other job still waits");

    proxy.drop_next_reply();
    let e = queue
        .enqueue_raw("tasks", "task", 1, 1, EnqueueOptions::new(), &payload)
        .await
        .expect("answered after the lost reply");
    assert_eq!(proxy.dropped(), 2, "the enqueue's reply was lost");
    let at: Vec<u64> = cmd("LPOS")
        .arg(&keys.main)
        .arg(e.id.as_str())
        .arg("COUNT")
        .arg(0)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(at.len(), 1, "the generated id is queued once: {at:?}");
}

/// One primary loses the function library (`FUNCTION FLUSH` on it; a
/// restart without persistence) while the others keep it: the calls of a
/// queue on that primary find it missing, and one load — `FUNCTION LOAD`
/// without `REPLACE`, sent to every primary — loads it there, while the
/// others answer "already exists" (success: nothing compiled again, nothing
/// in their replication streams); every call answers. Before, each call that
/// found it missing sent `FUNCTION LOAD REPLACE` to every primary: the
/// library compiled again on each of them, once per call.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_primary_that_lost_the_library_gets_it_back_from_one_load() {
    let env = ClusterEnv::three().await;
    assert_eq!(env.queue.stats("tasks").await.unwrap().main, 0);
    let primary = env.cluster.master_of_queue("tasks").expect("slot owner");
    env.cluster.cli(primary, &["FUNCTION", "FLUSH"]).unwrap();
    for i in 0..env.cluster.len() {
        env.cluster.cli(i, &["CONFIG", "RESETSTAT"]).unwrap();
    }
    let payload = rmp_serde::to_vec_named(&job(&env.lurl, 1)).unwrap();
    let sends = (0..20).map(|n| {
        let (queue, payload) = (env.queue.clone(), payload.clone());
        async move {
            let opts = EnqueueOptions::new().id(format!("after-flush-{n}"));
            queue
                .enqueue_raw("tasks", "task", 1, 3, opts, &payload)
                .await
        }
    });
    for sent in futures::future::join_all(sends).await {
        assert!(sent.expect("enqueued after the load").is_new());
    }
    for i in 0..env.cluster.len() {
        let info = env.cluster.cli(i, &["INFO", "commandstats"]).unwrap();
        let stat = |field| queue_testkit::command_stat(&info, "function|load", field);
        let loaded = stat("calls") - stat("failed_calls");
        let expected = u64::from(i == primary);
        assert_eq!(
            loaded, expected,
            "node {i} (the flushed primary is {primary}): {loaded} successful loads"
        );
    }
}
