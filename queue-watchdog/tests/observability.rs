//! The metrics an on-call engineer alerts on: a real watchdog
//! (`queue-watchdog run --metrics-listen`) is scraped over HTTP after jobs
//! completed, were retried, were dead-lettered and were lost by a dead worker,
//! and every metric name used by docs/observability/alerts.yml and
//! docs/observability/grafana-dashboard.json must be exported (the rules by
//! the watchdog alone; the dashboard's worker row by a worker's exporter).

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use queue_core::{job, Backoff, JobContext, JobError, Queue, QueueKeys, Worker};
use queue_testkit::RedisServer;
use serde::{Deserialize, Serialize};

mod support;
use metrics_run::{scrape, MetricsWatchdog};
#[path = "support/metrics_run.rs"]
mod metrics_run;

const QUEUE: &str = "obs";

#[derive(Serialize, Deserialize)]
struct Task {
    mode: String,
}

/// `ok` succeeds, `retry-once` fails its first attempt, `fail` is permanent.
#[job(queue = "obs", max_attempts = 3)]
async fn task(ctx: JobContext, args: Task) -> Result<(), JobError> {
    match args.mode.as_str() {
        "retry-once" if ctx.attempt() == 1 => Err(JobError::retryable("first attempt fails")),
        "fail" => Err(JobError::permanent("cannot be done")),
        _ => Ok(()),
    }
}

fn docs() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../docs/observability")
}

/// The queue metric names (`queue_…`) a PromQL expression uses.
fn metric_names(expr: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let bytes = expr.as_bytes();
    let mut i = 0;
    while let Some(at) = expr[i..].find("queue_") {
        let start = i + at;
        let boundary =
            start == 0 || !(bytes[start - 1].is_ascii_alphanumeric() || bytes[start - 1] == b'_');
        let end = expr[start..]
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .map_or(expr.len(), |n| start + n);
        if boundary {
            names.insert(expr[start..end].to_string());
        }
        i = end;
    }
    names
}

/// Every `expr` of the dashboard (panel targets and template queries).
fn dashboard_exprs() -> Vec<String> {
    let text = std::fs::read_to_string(docs().join("grafana-dashboard.json")).unwrap();
    let json: serde_json::Value = serde_json::from_str(&text).expect("dashboard is JSON");
    fn walk(v: &serde_json::Value, out: &mut Vec<String>) {
        match v {
            serde_json::Value::Object(map) => {
                for (k, v) in map {
                    match (k.as_str(), v) {
                        ("expr" | "definition", serde_json::Value::String(s)) => {
                            out.push(s.clone())
                        }
                        _ => walk(v, out),
                    }
                }
            }
            serde_json::Value::Array(items) => items.iter().for_each(|v| walk(v, out)),
            _ => {}
        }
    }
    let mut out = Vec::new();
    walk(&json, &mut out);
    out
}

/// (alert name, expr) of each rule in alerts.yml (`expr:` on one line or a
/// folded `>-` block).
fn alert_rules() -> Vec<(String, String)> {
    let text = std::fs::read_to_string(docs().join("alerts.yml")).unwrap();
    let mut rules: Vec<(String, String)> = Vec::new();
    let mut in_block = None::<usize>;
    for line in text.lines() {
        let trimmed = line.trim_start();
        let indent = line.len() - trimmed.len();
        if let Some(block_indent) = in_block {
            if indent > block_indent && !trimmed.is_empty() {
                let expr = &mut rules.last_mut().unwrap().1;
                expr.push(' ');
                expr.push_str(trimmed);
                continue;
            }
            in_block = None;
        }
        if let Some(name) = trimmed.strip_prefix("- alert: ") {
            rules.push((name.trim().to_string(), String::new()));
        } else if let Some(expr) = trimmed.strip_prefix("expr: ") {
            let rule = rules.last_mut().expect("expr after an alert");
            if expr.trim() == ">-" {
                in_block = Some(indent);
            } else {
                rule.1 = expr.trim().to_string();
            }
        }
    }
    rules
}

/// True when the exposition has a sample of `name` (any labels).
fn exported(body: &str, name: &str) -> bool {
    body.lines().any(|l| {
        l.strip_prefix(name)
            .is_some_and(|rest| rest.starts_with(['{', ' ']))
    })
}

/// A job in processing whose lease expired, as a worker killed mid-job leaves it.
async fn lost_delivery(queue: &Queue, id: &str) {
    let keys = QueueKeys::new(QUEUE);
    let payload = rmp_serde::to_vec_named(&Task { mode: "ok".into() }).unwrap();
    let mut conn = queue.connection();
    redis::pipe()
        .cmd("HSET")
        .arg(keys.job(id))
        .arg(&[
            ("id", id),
            ("state", "active"),
            ("type", task::NAME),
            ("v", "1"),
        ])
        .arg(&[
            ("attempts", "1"),
            ("max_attempts", "3"),
            ("token", "t-dead-worker"),
        ])
        .arg("enqueued_at")
        .arg(1)
        .arg("payload")
        .arg(payload)
        .cmd("LPUSH")
        .arg(&keys.processing)
        .arg(id)
        .cmd("ZADD")
        .arg(&keys.leases)
        .arg(1)
        .arg(id)
        .query_async::<()>(&mut conn)
        .await
        .unwrap();
}

/// The worker's own exporter, as a worker process installs it.
fn worker_recorder() -> PrometheusHandle {
    PrometheusBuilder::new()
        .set_buckets_for_metric(
            Matcher::Full("queue_job_duration_seconds".into()),
            &[0.01, 0.1, 1.0],
        )
        .unwrap()
        .install_recorder()
        .unwrap()
}

#[test]
fn the_watchdog_exports_every_metric_the_dashboard_and_the_alert_rules_use() {
    let server = RedisServer::start().unwrap();
    let url = server.url();
    let watchdog = metrics_run::run_with_metrics(&[
        "run",
        "--redis",
        &url,
        "-q",
        QUEUE,
        "--interval-ms",
        "200",
        "--backoff-base-ms",
        "1",
    ]);
    let addr = watchdog.addr.clone();
    let worker_metrics = worker_recorder();

    // Completed, retried then completed, dead-lettered, lost by a dead worker
    // then returned by the watchdog and completed.
    run_jobs(&url);
    let body = scrape_until_mirrored(&addr);
    for gauge in [
        "queue_expired_leases{queue=\"obs\"} 0",
        "queue_delayed_due{queue=\"obs\"} 0",
        "queue_depth{queue=\"obs\",list=\"dead\"} 1",
        "queue_stats_total{queue=\"obs\",counter=\"purged\"} 0",
        "# TYPE queue_stats_total counter",
        "# TYPE queue_expired_leases gauge",
    ] {
        assert!(body.contains(gauge), "missing {gauge:?} in\n{body}");
    }
    assert!(exported(
        &body,
        "queue_watchdog_last_sample_timestamp_seconds"
    ));

    // Every metric the alert rules use is exported by the watchdog alone.
    let rules = alert_rules();
    let names: Vec<&str> = rules.iter().map(|(n, _)| n.as_str()).collect();
    for wanted in [
        "QueueJobsLost",
        "QueueExpiredLeasesNotReturned",
        "QueueWatchdogDown",
        "QueueOldestAgeGrowing",
        "QueueDeadLetters",
        "QueueDeadLetterRate",
        "QueueFailureRate",
        "QueueDelayedNotPromoted",
    ] {
        assert!(
            names.contains(&wanted),
            "alerts.yml has no {wanted}: {names:?}"
        );
    }
    let mut missing = Vec::new();
    for (alert, expr) in &rules {
        assert!(!expr.is_empty(), "{alert} has no expr");
        let used = metric_names(expr);
        assert!(
            !used.is_empty() || expr.contains("up{job=\"queue-watchdog\"}"),
            "{alert} uses no queue metric: {expr}"
        );
        for name in used {
            if !exported(&body, &name) {
                missing.push(format!("alerts.yml {alert}: {name}"));
            }
        }
    }

    // The dashboard: watchdog series, and the worker row's per-type series
    // from the worker's exporter.
    let worker_body = worker_metrics.render();
    let exprs = dashboard_exprs();
    assert!(exprs.len() >= 10, "dashboard expressions: {exprs:?}");
    for expr in &exprs {
        for name in metric_names(expr) {
            if !exported(&body, &name) && !exported(&worker_body, &name) {
                missing.push(format!("dashboard: {name} (in {expr})"));
            }
        }
    }
    assert!(
        missing.is_empty(),
        "metric names used but not exported:\n{}\n\nwatchdog exports:\n{body}\nworker exports:\n{worker_body}",
        missing.join("\n")
    );
}

/// Runs the scenario's jobs with an in-process worker until they settle.
fn run_jobs(url: &str) {
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let queue = Queue::connect(url).await.unwrap();
        lost_delivery(&queue, "lost-1").await;
        for mode in ["ok", "retry-once", "fail"] {
            task::enqueue(&queue, Task { mode: mode.into() })
                .await
                .unwrap();
        }
        let worker = Worker::builder(url)
            .register(task::handler())
            .backoff(Backoff {
                base: Duration::from_millis(10),
                max: Duration::from_millis(50),
            })
            .build()
            .await
            .unwrap();
        support::run_worker_until(worker, queue, QUEUE, |s| {
            s.counter("completed") >= 3 && s.counter("dead") >= 1
        })
        .await;
    });
}

/// The exposition line of the counter mirror of `counter` at `n`.
fn mirror_line(counter: &str, n: u64) -> String {
    format!("queue_stats_total{{queue=\"{QUEUE}\",counter=\"{counter}\"}} {n}\n")
}

/// Scrapes until the body holds every `(counter, n)` of `want` in the
/// counter mirror; `Err` with the last body when it never does within 30 s.
fn scrape_until_counts(addr: &str, want: &[(&str, u64)]) -> Result<String, String> {
    let lines: Vec<String> = want.iter().map(|(c, n)| mirror_line(c, *n)).collect();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let body = scrape(addr).unwrap_or_default();
        if lines.iter().all(|l| body.contains(l)) {
            return Ok(body);
        }
        if Instant::now() >= deadline {
            return Err(body);
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Scrapes the watchdog until its counter mirror shows the scenario's counts.
fn scrape_until_mirrored(addr: &str) -> String {
    // The watchdog's mirror of the Redis counters catches up within a few passes.
    let want = [
        ("completed", 3),
        ("retried", 1),
        ("failed", 2),
        ("dead", 1),
        ("reclaimed", 1),
        ("enqueued", 3),
    ];
    scrape_until_counts(addr, &want).unwrap_or_else(|body| {
        panic!("the watchdog's counter mirror never showed {want:?}:\n{body}")
    })
}

/// Scrapes until the mirror of `counter` reads `want`; `Err` with the last
/// body when it never does within 30 s.
fn scrape_until_counter(addr: &str, counter: &str, want: u64) -> Result<String, String> {
    scrape_until_counts(addr, &[(counter, want)])
}

/// A redis-server, a `queue-watchdog run` on [`QUEUE`] exporting metrics,
/// and a producer: the counter-mirror scenarios.
struct MirrorScene {
    _watchdog: MetricsWatchdog,
    _server: RedisServer,
    addr: String,
    rt: tokio::runtime::Runtime,
    queue: Queue,
}

impl MirrorScene {
    fn start() -> Self {
        let server = RedisServer::start().unwrap();
        let (watchdog, addr) = watchdog_with_metrics(&server.url());
        let rt = tokio::runtime::Runtime::new().unwrap();
        let queue = rt.block_on(Queue::connect(&server.url())).unwrap();
        MirrorScene {
            _watchdog: watchdog,
            _server: server,
            addr,
            rt,
            queue,
        }
    }

    /// Enqueues `n` jobs that succeed.
    fn enqueue(&self, n: usize) {
        self.rt.block_on(async {
            for _ in 0..n {
                task::enqueue(&self.queue, Task { mode: "ok".into() })
                    .await
                    .unwrap();
            }
        })
    }

    /// Runs `cmd` against the queue's stats hash (its key the first argument).
    fn on_stats(&self, cmd: &str, args: &[&str]) {
        self.rt.block_on(async {
            let mut c = self.queue.connection();
            redis::cmd(cmd)
                .arg(QueueKeys::new(QUEUE).stats)
                .arg(args)
                .query_async::<()>(&mut c)
                .await
                .unwrap();
        })
    }
}

/// `queue-watchdog run` on [`QUEUE`] every 100 ms with its metrics on a
/// port it bound: (the process, killed on drop; the address to scrape).
fn watchdog_with_metrics(url: &str) -> (MetricsWatchdog, String) {
    let watchdog = metrics_run::run_with_metrics(&[
        "run",
        "--redis",
        url,
        "-q",
        QUEUE,
        "--interval-ms",
        "100",
    ]);
    let addr = watchdog.addr.clone();
    (watchdog, addr)
}

/// Redis lost the queue's counters (restart without persistence,
/// `DEL q:{Q}:stats`: a drop below half of the last value read): the exported counter goes on from
/// where it was by what Redis counts since (a reset seen as a new start),
/// never down. Before, it was set with `Counter::absolute`, a fetch-max in
/// metrics 0.24: it stayed at the old value until Redis climbed past it.
#[test]
fn the_counter_mirror_moves_on_after_redis_lost_its_counters() {
    let scene = MirrorScene::start();
    scene.enqueue(5);
    if let Err(body) = scrape_until_counter(&scene.addr, "enqueued", 5) {
        panic!("the mirror never showed 5 enqueued:\n{body}");
    }
    scene.on_stats("DEL", &[]);
    scene.enqueue(1);
    if let Err(body) = scrape_until_counter(&scene.addr, "enqueued", 6) {
        panic!("after the stats key was deleted and 1 job enqueued, the counter did not move on to 6 (stuck at the old value?):\n{body}");
    }
}

/// A failover to a replica a few writes behind: Redis reads lower than the
/// mirror, by less than half. Nothing is exported until Redis passes the old
/// value again, then only what is above it. Before, any drop was a reset and
/// the whole lower value was added again (10 → 18 here; a counter of 10 M
/// jumped by 10 M, and `increase(…[15m]) > 0` alerts fired after every
/// failover).
#[test]
fn the_counter_mirror_adds_nothing_when_redis_regresses_a_little() {
    let scene = MirrorScene::start();
    scene.enqueue(10);
    if let Err(body) = scrape_until_counter(&scene.addr, "enqueued", 10) {
        panic!("the mirror never showed 10 enqueued:\n{body}");
    }
    // The lagging replica's hash: enqueued 8. `purged` (0 so far) moves in
    // the same write, so the mirror showing it proves the watchdog read the 8.
    scene.on_stats("HSET", &["enqueued", "8", "purged", "1"]);
    let body = scrape_until_counter(&scene.addr, "purged", 1)
        .unwrap_or_else(|body| panic!("the watchdog never read the regressed hash:\n{body}"));
    assert!(
        body.contains(&mirror_line("enqueued", 10)),
        "a drop from 10 to 8 must export nothing (it added 8 before):\n{body}"
    );
    scene.enqueue(3);
    if let Err(body) = scrape_until_counter(&scene.addr, "enqueued", 11) {
        panic!("Redis at 11 after the regression to 8: the mirror must show 11 (10 + what is above 10):\n{body}");
    }
}

#[test]
fn metric_names_are_read_from_promql() {
    let names = metric_names(
        "max by (queue) (rate(queue_stats_total{counter=\"dead\"}[5m])) / my_queue_x + queue_depth",
    );
    assert_eq!(
        names.into_iter().collect::<Vec<_>>(),
        ["queue_depth", "queue_stats_total"]
    );
}
