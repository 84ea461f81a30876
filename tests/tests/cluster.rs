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
    BoxFuture, EnqueueOptions, Job, JobContext, JobError, Queue, QueueError, Registration,
    Watchdog, Worker,
};
use queue_testkit::cluster::{ClusterOptions, RedisCluster};
use queue_testkit::RedisServer;
use queue_tests::{
    fast_config, fast_watchdog, init_tracing, task, wait_until, Ledger, Task, WorkerProcess,
};

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

async fn start_workers(
    url: &str,
    n: usize,
    concurrency: usize,
) -> Vec<(
    queue_core::ShutdownHandle,
    tokio::task::JoinHandle<queue_core::Result<()>>,
)> {
    let mut out = Vec::new();
    for _ in 0..n {
        let mut cfg = fast_config();
        cfg.concurrency = concurrency;
        let mut b = Worker::builder(url).config(cfg);
        for r in registrations() {
            b = b.register(r);
        }
        let w = b.build().await.expect("worker builds");
        let h = w.shutdown_handle();
        out.push((h, tokio::spawn(w.run_until(std::future::pending()))));
    }
    out
}

async fn stop_workers(
    workers: Vec<(
        queue_core::ShutdownHandle,
        tokio::task::JoinHandle<queue_core::Result<()>>,
    )>,
) {
    for (h, _) in &workers {
        h.shutdown();
    }
    for (_, j) in workers {
        j.await.unwrap().unwrap();
    }
}

/// Runs a watchdog until the returned flag is set.
fn spawn_watchdog(
    watchdog: Watchdog,
) -> (
    tokio::sync::oneshot::Sender<()>,
    tokio::task::JoinHandle<queue_core::ReclaimReport>,
) {
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let join = tokio::spawn(async move {
        watchdog
            .run_until(async {
                let _ = rx.await;
            })
            .await
    });
    (tx, join)
}

fn job(ledger: &str, seq: u64) -> Task {
    Task {
        ledger: ledger.to_string(),
        seq,
        ..Task::default()
    }
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

async fn completed(queue: &Queue, q: &str) -> i64 {
    queue
        .stats(q)
        .await
        .map(|s| s.counter("completed"))
        .unwrap_or(-1)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_queues_on_three_primaries_run_the_whole_lifecycle() {
    init_tracing();
    let _serial = serial().await;
    let cluster = RedisCluster::start(3).expect("cluster starts");
    let ledger = RedisServer::start().unwrap();
    let lurl = ledger.url();
    let url = cluster.url();

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

    let queue = Queue::connect(&url).await.unwrap();
    assert!(queue.connection().is_cluster());

    // Per queue: 20 single enqueues, a batch of 30 in one pipeline, a job
    // that fails twice then succeeds, one that fails permanently, one that
    // exhausts its attempts (max 3), and a stable id enqueued twice.
    let mut seq = 0;
    for q in QUEUES {
        for _ in 0..20 {
            seq += 1;
            let e = enqueue_on(&queue, q, EnqueueOptions::new(), &job(&lurl, seq))
                .await
                .unwrap();
            assert!(e.is_new());
        }
        let payloads: Vec<(EnqueueOptions, Vec<u8>)> = (0..30)
            .map(|_| {
                seq += 1;
                (
                    EnqueueOptions::new(),
                    rmp_serde::to_vec_named(&job(&lurl, seq)).unwrap(),
                )
            })
            .collect();
        let out = queue
            .enqueue_raw_batch(q, "task", 1, 3, payloads)
            .await
            .unwrap();
        assert!(out.iter().all(|e| e.is_new()));
        let mut retry = job(&lurl, 0);
        retry.fail_first = 2;
        enqueue_on(
            &queue,
            q,
            EnqueueOptions::new().id(format!("{q}-retry-ok")),
            &retry,
        )
        .await
        .unwrap();
        let mut permanent = job(&lurl, 0);
        permanent.permanent = true;
        enqueue_on(
            &queue,
            q,
            EnqueueOptions::new().id(format!("{q}-permanent")),
            &permanent,
        )
        .await
        .unwrap();
        let mut exhausted = job(&lurl, 0);
        exhausted.fail_first = 3;
        enqueue_on(
            &queue,
            q,
            EnqueueOptions::new().id(format!("{q}-exhausted")),
            &exhausted,
        )
        .await
        .unwrap();
        let again = enqueue_on(
            &queue,
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
    // Each queue's keys live on its own primary.
    for (q, owner) in QUEUES.iter().zip(&owners) {
        let n = cluster
            .cli(*owner, &["LLEN", &format!("q:{{{q}}}:main")])
            .unwrap();
        assert_eq!(n.trim(), "53", "{q} on node {owner}");
    }

    let workers = start_workers(&url, 1, 8).await;
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
        wait_until(T, "replayed job completes", || async {
            completed(&queue, q).await == 52
        })
        .await;
    }
    stop_workers(workers).await;

    let ledger_view = Ledger::read(&lurl).await;
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
    let watchdog = Watchdog::connect(&url, QUEUES, fast_watchdog())
        .await
        .unwrap();
    assert!(watchdog.run_once().await.unwrap().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkilled_worker_process_jobs_are_reclaimed_on_the_cluster() {
    init_tracing();
    let _serial = serial().await;
    let cluster = RedisCluster::start(3).expect("cluster starts");
    let ledger = RedisServer::start().unwrap();
    let lurl = ledger.url();
    let url = cluster.url();
    let queue = Queue::connect(&url).await.unwrap();
    const N: usize = 6;
    let mut ids = Vec::new();
    for seq in 0..N as u64 {
        let t = Task {
            sleep_ms: 60_000,
            sleep_attempts: 1,
            ..job(&lurl, seq)
        };
        ids.push(task::enqueue(&queue, t).await.unwrap());
    }
    // `test-worker` takes the cluster URL like any other.
    let mut proc = WorkerProcess::start(WORKER_BIN, &url, N, 800, 5000);
    wait_until(T, "all jobs started in the worker process", || async {
        Ledger::read(&lurl).await.started.len() == N
    })
    .await;
    proc.kill();
    let s = queue.stats("tasks").await.unwrap();
    assert_eq!(
        s.processing, N as u64,
        "the dead worker's jobs stay in processing"
    );

    let watchdog = Watchdog::connect(&url, ["tasks"], fast_watchdog())
        .await
        .unwrap();
    let (wd_stop, wd) = spawn_watchdog(watchdog);
    let mut proc = WorkerProcess::start(WORKER_BIN, &url, N, 800, 5000);
    wait_until(T, "all reclaimed jobs complete", || async {
        completed(&queue, "tasks").await == N as i64
    })
    .await;
    proc.signal("TERM");
    let _ = proc.child.wait();
    let _ = wd_stop.send(());
    let report = wd.await.unwrap();
    assert_eq!(report.reclaimed, N as u64);
    let l = Ledger::read(&lurl).await;
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
    init_tracing();
    let _serial = serial().await;
    let cluster = RedisCluster::start(3).expect("cluster starts");
    let ledger = RedisServer::start().unwrap();
    let lurl = ledger.url();
    let url = cluster.url();
    let slot = cluster.keyslot("{tasks}");
    let from = cluster.master_of_slot(slot).unwrap();
    let to = (from + 1) % 3;

    let queue = Queue::connect(&url).await.unwrap();
    // A backlog, so the slot holds a few thousand keys while it moves.
    let backlog: Vec<(EnqueueOptions, Vec<u8>)> = (0..1500)
        .map(|n| {
            let t = Task {
                sleep_ms: 5,
                ..job(&lurl, n)
            };
            (
                EnqueueOptions::new().id(format!("backlog-{n}")),
                rmp_serde::to_vec_named(&t).unwrap(),
            )
        })
        .collect();
    let out = queue
        .enqueue_raw_batch("tasks", "task", 1, 3, backlog)
        .await
        .unwrap();
    let mut acked: Vec<String> = out.into_iter().map(|e| e.id.to_string()).collect();

    let workers = start_workers(&url, 2, 8).await;
    let watchdog = Watchdog::connect(&url, ["tasks"], fast_watchdog())
        .await
        .unwrap();
    let (wd_stop, wd) = spawn_watchdog(watchdog);
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
        completed(&queue, "tasks").await > 100
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
    let before = completed(&queue, "tasks").await;
    wait_until(T, "progress after the migration", || async {
        completed(&queue, "tasks").await > before + 200
    })
    .await;
    stop.store(true, Ordering::SeqCst);
    let (live_acked, errors) = producer.await.unwrap();
    acked.extend(live_acked);

    let (lost, dups) = settle(&lurl, &acked, &queue, &["tasks"], T).await;
    let _ = wd_stop.send(());
    let report = wd.await.unwrap();
    stop_workers(workers).await;

    // A connection made after the change goes straight to the new owner.
    let fresh = Queue::connect(&cluster.url_via(from)).await.unwrap();
    let s = fresh.stats("tasks").await.unwrap();
    let n = cluster
        .cli(to, &["HGET", "q:{tasks}:stats", "completed"])
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
    assert!(dups.len() <= 16, "duplicated side effects: {dups:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_follow_ask_redirects_while_a_slot_migrates() {
    init_tracing();
    let _serial = serial().await;
    let cluster = RedisCluster::start(3).expect("cluster starts");
    let ledger = RedisServer::start().unwrap();
    let lurl = ledger.url();
    let url = cluster.url();
    let slot = cluster.keyslot("{tasks}");
    let from = cluster.master_of_slot(slot).unwrap();
    let to = (from + 1) % 3;
    let queue = Queue::connect(&url).await.unwrap();
    for id in ["moved", "stays"] {
        enqueue_on(
            &queue,
            "tasks",
            EnqueueOptions::new().id(id),
            &job(&lurl, 1),
        )
        .await
        .unwrap();
    }
    // Slot half-migrated: only job `moved`'s hash is on the new primary.
    let (from_id, to_id) = (cluster.node_id(from).unwrap(), cluster.node_id(to).unwrap());
    let s = slot.to_string();
    cluster
        .cli(to, &["CLUSTER", "SETSLOT", &s, "IMPORTING", &from_id])
        .unwrap();
    cluster
        .cli(from, &["CLUSTER", "SETSLOT", &s, "MIGRATING", &to_id])
        .unwrap();
    let to_port = cluster.node(to).port().to_string();
    let out = cluster
        .cli(
            from,
            &[
                "MIGRATE",
                "127.0.0.1",
                &to_port,
                "q:{tasks}:job:moved",
                "0",
                "5000",
            ],
        )
        .unwrap();
    assert_eq!(out.trim(), "OK");
    let asked = cluster
        .cli(from, &["HGET", "q:{tasks}:job:moved", "state"])
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
    let workers = start_workers(&url, 1, 4).await;
    wait_until(T, "both jobs complete", || async {
        completed(&queue, "tasks").await == 2
    })
    .await;
    stop_workers(workers).await;
}

/// A script that starts on a migrating slot must not stop halfway: an
/// undeclared key (a job hash) that has already moved makes Redis abort the
/// script at that command, after its earlier writes. Here the promote script
/// would `ZREM` a due job from the delayed set and then fail on its moved
/// hash, leaving the job in no list at all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scripts_never_half_run_on_a_migrating_slot() {
    init_tracing();
    let _serial = serial().await;
    let cluster = RedisCluster::start(3).expect("cluster starts");
    let ledger = RedisServer::start().unwrap();
    let lurl = ledger.url();
    let url = cluster.url();
    let slot = cluster.keyslot("{tasks}");
    let from = cluster.master_of_slot(slot).unwrap();
    let to = (from + 1) % 3;
    let queue = Queue::connect(&url).await.unwrap();

    // A queue with a waiting job, a dead letter and a due delayed job.
    enqueue_on(
        &queue,
        "tasks",
        EnqueueOptions::new().id("waiting"),
        &job(&lurl, 1),
    )
    .await
    .unwrap();
    enqueue_on(
        &queue,
        "tasks",
        EnqueueOptions::new()
            .id("victim")
            .delay(Duration::from_millis(1)),
        &job(&lurl, 2),
    )
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
    {
        // Let one worker dead-letter the undecodable job, then stop it.
        let w = Worker::builder(&url)
            .register(task::handler())
            .config(cfg.clone())
            .queues(["tasks"])
            .build()
            .await
            .unwrap();
        let h = w.shutdown_handle();
        let j = tokio::spawn(w.run_until(std::future::pending()));
        wait_until(T, "dead letter", || async {
            queue.stats("tasks").await.unwrap().dead == 1
        })
        .await;
        h.shutdown();
        j.await.unwrap().unwrap();
    }
    // Re-create the due delayed job and a waiting job (the worker ran them).
    enqueue_on(
        &queue,
        "tasks",
        EnqueueOptions::new()
            .id("victim2")
            .delay(Duration::from_millis(1)),
        &job(&lurl, 3),
    )
    .await
    .unwrap();
    enqueue_on(
        &queue,
        "tasks",
        EnqueueOptions::new().id("waiting2"),
        &job(&lurl, 4),
    )
    .await
    .unwrap();

    // Start migrating the slot and move only the victim's hash.
    let from_id = cluster.node_id(from).unwrap();
    let to_id = cluster.node_id(to).unwrap();
    let s = slot.to_string();
    cluster
        .cli(to, &["CLUSTER", "SETSLOT", &s, "IMPORTING", &from_id])
        .unwrap();
    cluster
        .cli(from, &["CLUSTER", "SETSLOT", &s, "MIGRATING", &to_id])
        .unwrap();
    let to_port = cluster.node(to).port().to_string();
    cluster
        .cli(
            from,
            &[
                "MIGRATE",
                "127.0.0.1",
                &to_port,
                "q:{tasks}:job:victim2",
                "0",
                "5000",
            ],
        )
        .unwrap();

    // A worker's promoter runs meanwhile.
    let w = Worker::builder(&url)
        .register(task::handler())
        .config(cfg)
        .queues(["tasks"])
        .build()
        .await
        .unwrap();
    let h = w.shutdown_handle();
    let j = tokio::spawn(w.run_until(std::future::pending()));
    tokio::time::sleep(Duration::from_millis(500)).await;
    // Finish the migration; everything must still run.
    tokio::task::block_in_place(|| cluster.migrate_slot(slot, to, 100, Duration::ZERO))
        .expect("migration completes");
    wait_until(Duration::from_secs(20), "victim2 runs", || async {
        Ledger::read(&lurl).await.effects.contains_key("victim2")
    })
    .await;
    h.shutdown();
    j.await.unwrap().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wait_for_replicas_is_answered_by_the_queues_own_shard_and_a_primary_loss_fails_over() {
    init_tracing();
    let _serial = serial().await;
    let mut cluster = RedisCluster::start_with(ClusterOptions {
        masters: 3,
        replicas_per_master: 1,
        ..ClusterOptions::default()
    })
    .expect("cluster with replicas starts");
    let ledger = RedisServer::start().unwrap();
    let lurl = ledger.url();
    let url = cluster.url();
    let queue = Queue::connect(&url).await.unwrap();
    let owner = cluster.master_of_queue("tasks").unwrap();
    let replica = cluster.replicas_of(owner);
    assert_eq!(replica.len(), 1, "one replica for the tasks primary");
    let replica = replica[0];
    let wait = |opts: EnqueueOptions| opts.wait_for_replicas(1, Duration::from_millis(300));

    // WAIT goes with the batch to the queue's primary: with that primary's
    // replica down, `tasks` is NotReplicated while `emails` (another shard,
    // replica up) is confirmed.
    cluster.kill_node(replica);
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
        cluster.restart_node(replica).unwrap();
        cluster.wait_ok(T).unwrap();
    });

    // 400 jobs, each batch confirmed by the replica.
    let mut acked = vec!["unconfirmed".to_string()];
    for b in 0..8 {
        let batch: Vec<(EnqueueOptions, Vec<u8>)> = (0..50)
            .map(|i| {
                let n = b * 50 + i;
                let t = Task {
                    sleep_ms: 10,
                    ..job(&lurl, n)
                };
                (
                    wait(EnqueueOptions::new().id(format!("r-{n}"))),
                    rmp_serde::to_vec_named(&t).unwrap(),
                )
            })
            .collect();
        let out = queue
            .enqueue_raw_batch("tasks", "task", 1, 3, batch)
            .await
            .expect("replicated batch");
        acked.extend(out.into_iter().map(|e| e.id.to_string()));
    }

    let workers = start_workers(&url, 2, 4).await;
    let watchdog = Watchdog::connect(&url, ["tasks"], fast_watchdog())
        .await
        .unwrap();
    let (wd_stop, wd) = spawn_watchdog(watchdog);
    wait_until(T, "processing under way", || async {
        completed(&queue, "tasks").await > 50
    })
    .await;

    // Lose the primary: its replica takes over after the node timeout.
    let killed_at = Instant::now();
    cluster.kill_node(owner);
    tokio::task::block_in_place(|| cluster.wait_master(replica, T)).expect("replica promoted");
    let promoted = killed_at.elapsed();
    let (lost, dups) = settle(&lurl, &acked, &queue, &["tasks"], T).await;
    let recovered = killed_at.elapsed();
    let _ = wd_stop.send(());
    let report = wd.await.unwrap();
    stop_workers(workers).await;
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
    assert_eq!(cluster.master_of_queue("tasks"), Some(replica));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_primary_restarted_from_its_aof_loses_nothing_and_other_shards_keep_working() {
    init_tracing();
    let _serial = serial().await;
    let mut cluster = RedisCluster::start_with(ClusterOptions {
        extra_args: ["--appendonly", "yes", "--appendfsync", "always"]
            .map(String::from)
            .to_vec(),
        ..ClusterOptions::default()
    })
    .expect("cluster starts");
    let ledger = RedisServer::start().unwrap();
    let lurl = ledger.url();
    let url = cluster.url();
    let queue = Queue::connect(&url).await.unwrap();
    let owner = cluster.master_of_queue("tasks").unwrap();

    let mut acked: HashMap<&str, Vec<String>> = HashMap::new();
    for q in ["tasks", "emails"] {
        let batch: Vec<(EnqueueOptions, Vec<u8>)> = (0..300)
            .map(|n| {
                let t = Task {
                    sleep_ms: 20,
                    ..job(&lurl, n)
                };
                (
                    EnqueueOptions::new().id(format!("{q}-{n}")),
                    rmp_serde::to_vec_named(&t).unwrap(),
                )
            })
            .collect();
        let out = queue
            .enqueue_raw_batch(q, "task", 1, 3, batch)
            .await
            .unwrap();
        acked.insert(q, out.into_iter().map(|e| e.id.to_string()).collect());
    }
    let workers = start_workers(&url, 2, 4).await;
    let watchdog = Watchdog::connect(&url, ["tasks", "emails"], fast_watchdog())
        .await
        .unwrap();
    let (wd_stop, wd) = spawn_watchdog(watchdog);
    wait_until(T, "processing under way", || async {
        completed(&queue, "tasks").await > 30
    })
    .await;

    cluster.kill_node(owner);
    let down_at = Instant::now();
    // While `tasks`' primary is down, `emails` (another primary) progresses.
    let emails_before = completed(&queue, "emails").await;
    wait_until(T, "emails progress during the outage", || async {
        completed(&queue, "emails").await > emails_before + 20
    })
    .await;
    tokio::time::sleep(Duration::from_millis(1500).saturating_sub(down_at.elapsed())).await;
    let outage = down_at.elapsed();
    tokio::task::block_in_place(|| {
        cluster.restart_node(owner).unwrap();
        cluster.wait_ok(T).unwrap();
    });
    let all: Vec<String> = acked.values().flatten().cloned().collect();
    let (lost, dups) = settle(&lurl, &all, &queue, &["tasks", "emails"], T).await;
    let recovered = down_at.elapsed();
    let _ = wd_stop.send(());
    wd.await.unwrap();
    stop_workers(workers).await;
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
