//! The test environment: [`TestEnv`] (a throwaway `redis-server`, a `Queue`
//! on it and the ledger the test jobs write), and the steps the integration
//! tests are written in: enqueue, start a worker or a watchdog, wait with a
//! bound for a condition (completions, stats, the ledger, expired leases by
//! the Redis clock, clients blocked in BLMOVE), and seed or inspect keys built
//! with [`QueueKeys`].
//!
//! The free functions take a `Queue` or a URL, so the Cluster and Sentinel
//! tests (which have no single server) use the same steps.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use queue_core::{
    JobId, Queue, QueueKeys, QueueStats, ReclaimReport, Registration, Watchdog, Worker,
    WorkerBuilder, WorkerConfig,
};
use queue_testkit::RedisServer;
use redis::aio::MultiplexedConnection;
use redis::{AsyncCommands, FromRedisValue};

use crate::handles::{add_report, WatchdogHandle, WorkerHandle};
use crate::{
    bill, fast_config, fast_watchdog, forget_ledger_conn, init_tracing, redis_conn, task,
    wait_until, Bill, Ledger, Task,
};

/// How long any wait of this module may take before the test fails: generous,
/// because the machine running the tests may be loaded.
pub const BOUND: Duration = Duration::from_secs(60);

/// A throwaway `redis-server` with a `Queue` connected to it. The test jobs'
/// ledger is on the same server unless [`TestEnv::with_separate_ledger`].
pub struct TestEnv {
    /// The server (kill, restart or reconfigure it freely).
    pub server: RedisServer,
    /// Its URL.
    pub url: String,
    /// A producer handle on it.
    pub queue: Queue,
    /// Where the test jobs write their ledger.
    pub ledger_url: String,
    ledger_server: Option<RedisServer>,
}

impl TestEnv {
    /// A server without persistence.
    pub async fn start() -> TestEnv {
        Self::start_with(&[]).await
    }

    /// A server with extra `redis-server` arguments.
    pub async fn start_with(args: &[&str]) -> TestEnv {
        init_tracing();
        let server = RedisServer::start_with(args).expect("redis-server starts");
        let url = server.url();
        // A ledger connection cached for an earlier server on this port is
        // dead (and of another test's runtime).
        forget_ledger_conn(&url);
        let queue = Queue::connect(&url).await.expect("connect");
        TestEnv {
            server,
            ledger_url: url.clone(),
            url,
            queue,
            ledger_server: None,
        }
    }

    /// Moves the ledger to a server of its own, so that it survives what the
    /// test does to the queue's server (outages, maxmemory).
    pub fn with_separate_ledger(mut self) -> TestEnv {
        let ledger = RedisServer::start().expect("ledger redis-server starts");
        self.ledger_url = ledger.url();
        forget_ledger_conn(&self.ledger_url);
        self.ledger_server = Some(ledger);
        self
    }

    /// A `task` payload writing to this environment's ledger.
    pub fn task(&self, seq: u64) -> Task {
        task_for(&self.ledger_url, seq)
    }

    /// A `bill` payload of `cents` writing to this environment's ledger.
    pub fn bill(&self, cents: u64) -> Bill {
        Bill {
            ledger: self.ledger_url.clone(),
            cents,
            ..Bill::default()
        }
    }

    /// Enqueues one `task`.
    pub async fn enqueue(&self, t: Task) -> JobId {
        task::enqueue(&self.queue, t).await.expect("enqueue")
    }

    /// Enqueues `n` tasks with sequence numbers `0..n`, each shaped by `shape`.
    pub async fn enqueue_tasks(&self, n: u64, shape: impl Fn(Task) -> Task) -> Vec<JobId> {
        let mut ids = Vec::new();
        for seq in 0..n {
            ids.push(self.enqueue(shape(self.task(seq))).await);
        }
        ids
    }

    /// Enqueues one `bill`.
    pub async fn enqueue_bill(&self, b: Bill) -> JobId {
        bill::enqueue(&self.queue, b).await.expect("enqueue bill")
    }

    /// A worker builder for the test job of `queue` (`bill` on `billing`,
    /// `task` otherwise).
    pub fn worker(&self, queue: &str, config: WorkerConfig) -> WorkerBuilder {
        let handler = match queue {
            "billing" => bill::handler(),
            _ => task::handler(),
        };
        Worker::builder(&self.url).register(handler).config(config)
    }

    /// Starts a worker for the `task` job.
    pub async fn spawn_worker(&self, config: WorkerConfig) -> WorkerHandle {
        WorkerHandle::start(self.worker("tasks", config)).await
    }

    /// Starts a worker for one job type of the test's own.
    pub async fn spawn_worker_for(&self, job: Registration, config: WorkerConfig) -> WorkerHandle {
        WorkerHandle::start(Worker::builder(&self.url).register(job).config(config)).await
    }

    /// Starts a worker for the `bill` job.
    pub async fn spawn_billing_worker(&self, config: WorkerConfig) -> WorkerHandle {
        WorkerHandle::start(self.worker("billing", config)).await
    }

    /// Starts a worker ([`fast_config`]) for `queue`'s test job, waits for
    /// `n` completions on `queue`, and stops it.
    pub async fn run_until_completed(&self, queue: &str, n: i64) {
        self.run_until_completed_with(queue, n, fast_config()).await;
    }

    /// [`TestEnv::run_until_completed`] with a worker configuration.
    pub async fn run_until_completed_with(&self, queue: &str, n: i64, config: WorkerConfig) {
        let worker = WorkerHandle::start(self.worker(queue, config)).await;
        wait_completed(&self.queue, queue, n).await;
        worker.stop().await;
    }

    /// A watchdog ([`fast_watchdog`]) on `queue`.
    pub async fn watchdog(&self, queue: &str) -> Watchdog {
        Watchdog::connect(&self.url, [queue], fast_watchdog())
            .await
            .expect("watchdog connects")
    }

    /// A watchdog loop on `queue`, stopped on drop.
    pub async fn spawn_watchdog(&self, queue: &str) -> WatchdogHandle {
        WatchdogHandle::spawn(self.watchdog(queue).await)
    }

    /// Runs watchdog passes on `queue` until they returned (`reclaimed`) at
    /// least `n` jobs in total; returns the summed report.
    pub async fn reclaim(&self, queue: &str, n: u64) -> ReclaimReport {
        let watchdog = self.watchdog(queue).await;
        let total = Arc::new(Mutex::new(ReclaimReport::default()));
        wait_until(BOUND, "watchdog reclaim", || {
            let (watchdog, total) = (&watchdog, total.clone());
            async move {
                let r = watchdog.run_once().await.expect("watchdog pass");
                let mut t = total.lock().expect("report");
                add_report(&mut t, r);
                t.reclaimed >= n
            }
        })
        .await;
        let t = *total.lock().expect("report");
        t
    }

    /// `queue`'s statistics.
    pub async fn stats(&self, queue: &str) -> QueueStats {
        self.queue.stats(queue).await.expect("stats")
    }

    /// Waits for `n` completions on `queue`.
    pub async fn wait_completed(&self, queue: &str, n: i64) {
        wait_completed(&self.queue, queue, n).await;
    }

    /// Waits until `queue`'s statistics satisfy `cond`.
    pub async fn wait_stats(&self, queue: &str, what: &str, cond: impl Fn(&QueueStats) -> bool) {
        wait_stats(&self.queue, queue, what, cond).await;
    }

    /// The ledger the test jobs wrote.
    pub async fn ledger(&self) -> Ledger {
        Ledger::read(&self.ledger_url).await
    }

    /// Waits until the ledger satisfies `cond`.
    pub async fn wait_ledger(&self, what: &str, cond: impl Fn(&Ledger) -> bool) {
        wait_ledger(&self.ledger_url, what, cond).await;
    }

    /// A connection to the queue's server.
    pub async fn conn(&self) -> MultiplexedConnection {
        redis_conn(&self.url).await
    }

    /// A hash of the ledger (`ledger:charges`, `ledger:receipts`, …).
    pub async fn ledger_hash<V: FromRedisValue>(&self, key: &str) -> HashMap<String, V> {
        let mut c = redis_conn(&self.ledger_url).await;
        c.hgetall(key).await.expect("HGETALL")
    }

    /// The `attempts` of job `id`'s completion record (panics if it has none).
    pub async fn completion_attempts(&self, queue: &str, id: impl Into<JobId>) -> u32 {
        let rec = self.queue.completion(queue, id).await.expect("completion");
        let rec = rec.expect("completion record");
        rec.get("attempts")
            .and_then(|a| a.parse().ok())
            .expect("attempts in the completion record")
    }

    /// One field of a ledger hash (`HGET`).
    pub async fn ledger_field(&self, key: &str, field: &str) -> Option<String> {
        let mut c = redis_conn(&self.ledger_url).await;
        c.hget(key, field).await.expect("HGET")
    }

    /// The ids in one of `queue`'s lists (`QueueKeys::main`, `processing`, `dead`).
    pub async fn list(&self, key: &str) -> Vec<String> {
        self.conn().await.lrange(key, 0, -1).await.expect("LRANGE")
    }

    /// The lease expiry (ms, Redis clock) of job `id`, if it has a lease.
    pub async fn lease_of(&self, queue: &str, id: &str) -> Option<f64> {
        let leases = QueueKeys::new(queue).leases;
        self.conn().await.zscore(leases, id).await.expect("ZSCORE")
    }

    /// Sets job `id`'s lease expiry to `at_ms` (0: expired long ago).
    pub async fn set_lease(&self, queue: &str, id: &str, at_ms: u64) {
        let leases = QueueKeys::new(queue).leases;
        let _: () = self
            .conn()
            .await
            .zadd(leases, id, at_ms)
            .await
            .expect("ZADD");
    }

    /// Does what a worker that dies between BLMOVE and its claim leaves
    /// behind: moves the oldest id of `queue` from main to processing.
    /// Returns the id moved.
    pub async fn orphan(&self, queue: &str) -> Option<String> {
        let keys = QueueKeys::new(queue);
        redis::cmd("LMOVE")
            .arg(&keys.main)
            .arg(&keys.processing)
            .arg("RIGHT")
            .arg("LEFT")
            .query_async(&mut self.conn().await)
            .await
            .expect("LMOVE")
    }

    /// Writes job `id`'s hash with `fields` by hand and pushes it on `queue`'s
    /// main list, as if restored from an old snapshot or pushed by an operator.
    pub async fn seed_job(&self, queue: &str, id: &str, fields: &[(&str, &str)]) {
        let keys = QueueKeys::new(queue);
        let mut c = self.conn().await;
        let _: () = c.hset_multiple(keys.job(id), fields).await.expect("HSET");
        let _: () = c.lpush(&keys.main, id).await.expect("LPUSH");
    }

    /// The delivery token and lease expiry (ms, Redis clock) of job `id`'s
    /// current delivery, once it has both (a claim wrote them).
    pub async fn delivery_of(&self, queue: &str, id: &str) -> Option<(String, f64)> {
        let job = QueueKeys::new(queue).job(id);
        let token: Option<String> = self.conn().await.hget(job, "token").await.expect("HGET");
        Some((token?, self.lease_of(queue, id).await?))
    }

    /// Waits for job `id`'s first delivery: its token and lease expiry.
    pub async fn wait_delivery(&self, queue: &str, id: &str) -> (String, f64) {
        let found = Arc::new(Mutex::new(None));
        wait_until(BOUND, "a delivery of the job", || async {
            let d = self.delivery_of(queue, id).await;
            let seen = d.is_some();
            *found.lock().expect("delivery") = d;
            seen
        })
        .await;
        let d = found.lock().expect("delivery").take();
        d.expect("a delivery")
    }

    /// The Redis clock (`TIME`), in ms.
    pub async fn redis_now_ms(&self) -> u64 {
        let (secs, micros): (u64, u64) = redis::cmd("TIME")
            .query_async(&mut self.conn().await)
            .await
            .expect("TIME");
        secs * 1000 + micros / 1000
    }

    /// Waits until the Redis clock reads `at_ms` or later.
    pub async fn wait_redis_clock(&self, at_ms: u64) {
        wait_until(BOUND, "the Redis clock", || async {
            self.redis_now_ms().await >= at_ms
        })
        .await;
    }

    /// Waits until no lease of `queue` lies in the future of the Redis clock
    /// (every delivery's lease has expired: a watchdog pass reclaims them all).
    pub async fn wait_leases_expired(&self, queue: &str) {
        let leases = QueueKeys::new(queue).leases;
        wait_until(BOUND, "leases expired by the Redis clock", || async {
            let now_ms = self.redis_now_ms().await;
            let live: u64 = self
                .conn()
                .await
                .zcount(&leases, format!("({now_ms}"), "+inf")
                .await
                .expect("ZCOUNT");
            live == 0
        })
        .await;
    }

    /// Calls of Redis command `command` (lower case: `fcall`, `hexists`)
    /// since the server started or the last `CONFIG RESETSTAT`
    /// (`INFO commandstats`; a command run inside a script counts under its
    /// own name too).
    pub async fn command_calls(&self, command: &str) -> u64 {
        let info: String = redis::cmd("INFO")
            .arg("commandstats")
            .query_async(&mut self.conn().await)
            .await
            .expect("INFO commandstats");
        queue_testkit::command_stat(&info, command, "calls")
    }

    /// Waits until a fetcher other than `except` is blocked in BLMOVE on an
    /// empty queue; returns its client id. Each
    /// fetcher blocks on a connection of its own, so passing the id returned
    /// last waits for another fetcher's turn.
    pub async fn wait_blocked_client(&self, except: Option<u64>) -> u64 {
        self.wait_blocked_in("blmove", except).await
    }

    /// Waits until a client other than `except` is blocked in `cmd`
    /// (lowercase, as `CLIENT LIST` names it: `blmove` for a fetcher,
    /// `blpop` for a result waiter or a promoter); returns its client id.
    pub async fn wait_blocked_in(&self, cmd: &str, except: Option<u64>) -> u64 {
        let found = Arc::new(Mutex::new(None));
        wait_until(BOUND, &format!("a client blocked in {cmd}"), || async {
            let ids = blocked_clients_in(&self.url, cmd).await;
            let other = ids.into_iter().find(|id| Some(*id) != except);
            *found.lock().expect("found") = other;
            other.is_some()
        })
        .await;
        let id = found
            .lock()
            .expect("found")
            .expect("found a blocked client");
        id
    }
}

/// Ids of the clients blocked right now in `BLMOVE` on the server at `url`:
/// workers' fetchers waiting on an empty queue (`CLIENT LIST`: flag `b` and
/// `cmd=blmove`). Promoters block too (`BLPOP` on the queue's wake list);
/// they are not fetchers and are not counted.
pub async fn blocked_clients(url: &str) -> Vec<u64> {
    blocked_clients_in(url, "blmove").await
}

/// Ids of the clients blocked right now in `cmd` (`CLIENT LIST`: flag `b`
/// and `cmd=<cmd>`) on the server at `url`.
pub async fn blocked_clients_in(url: &str, cmd: &str) -> Vec<u64> {
    let want = format!("cmd={cmd}");
    let list: String = redis::cmd("CLIENT")
        .arg("LIST")
        .query_async(&mut redis_conn(url).await)
        .await
        .expect("CLIENT LIST");
    list.lines()
        .filter(|l| {
            let mut fields = l.split(' ');
            let blocked = fields
                .clone()
                .any(|f| f.strip_prefix("flags=").is_some_and(|f| f.contains('b')));
            blocked && fields.any(|f| f == want)
        })
        .filter_map(|l| l.split(' ').find_map(|f| f.strip_prefix("id=")))
        .filter_map(|id| id.parse().ok())
        .collect()
}

/// A `task` payload with sequence number `seq` writing to the ledger at `ledger`.
pub fn task_for(ledger: &str, seq: u64) -> Task {
    Task {
        ledger: ledger.to_string(),
        seq,
        ..Task::default()
    }
}

/// A worker builder with `registrations` and `config` on `url`.
pub fn worker_on(
    url: &str,
    registrations: impl IntoIterator<Item = Registration>,
    config: WorkerConfig,
) -> WorkerBuilder {
    let mut b = Worker::builder(url).config(config);
    for r in registrations {
        b = b.register(r);
    }
    b
}

/// `completed` counter of queue `name` (-1 while stats cannot be read).
pub async fn completed(queue: &Queue, name: &str) -> i64 {
    queue
        .stats(name)
        .await
        .map(|s| s.counter("completed"))
        .unwrap_or(-1)
}

/// Waits for `n` completions on queue `name`.
pub async fn wait_completed(queue: &Queue, name: &str, n: i64) {
    wait_until(BOUND, &format!("{n} completions on {name}"), || async {
        completed(queue, name).await == n
    })
    .await;
}

/// Waits until queue `name`'s statistics satisfy `cond` (a failed read counts as not yet).
pub async fn wait_stats(queue: &Queue, name: &str, what: &str, cond: impl Fn(&QueueStats) -> bool) {
    wait_until(BOUND, what, || async {
        queue.stats(name).await.map(|s| cond(&s)).unwrap_or(false)
    })
    .await;
}

/// Waits until the ledger at `url` satisfies `cond`.
pub async fn wait_ledger(url: &str, what: &str, cond: impl Fn(&Ledger) -> bool) {
    wait_until(BOUND, what, || async { cond(&Ledger::read(url).await) }).await;
}
