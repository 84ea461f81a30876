//! The dashboard in a real browser: Debian's headless Chromium, driven over
//! the DevTools protocol (a small client below), against a real redis-server
//! seeded by real workers.
//!
//! The test clicks "Replay" on a dead letter and checks in Redis that the job
//! is back in main, checks that cross-site requests cannot replay, and takes
//! the screenshots used by docs/OPERATIONS.md: they are written to
//! `target/tmp/dashboard-*.png`, and to `docs/images/` when
//! `QUEUE_UPDATE_SCREENSHOTS=1`.
//!
//! Needs `/usr/bin/chromium` (`apt-get install chromium`; or set `CHROMIUM`).
//! Without it the test prints why and passes without running, unless
//! `QUEUE_REQUIRE_CHROMIUM=1`, which makes a missing browser a failure.

use std::time::{Duration, Instant};

use queue_core::{
    BoxFuture, EnqueueOptions, Job, JobContext, JobError, Queue, Registration, ShutdownHandle,
    Worker,
};
use queue_testkit::RedisServer;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use tokio::task::JoinHandle;

#[path = "support/browser.rs"]
mod browser;
use browser::{find_chromium, http, redis, start_dashboard, Browser};
#[path = "support/results_seed.rs"]
mod results_seed;

// ---------------------------------------------------------------- jobs ----

#[derive(Serialize, Deserialize)]
struct Mail {
    to: String,
}

/// Emails: fast, except `slow…` addresses (stay running, lease renewed by the
/// heartbeat) and addresses without `@` (dead-lettered).
struct SendWelcome;
impl Job for SendWelcome {
    type Args = Mail;
    const NAME: &'static str = "send_welcome";
    const QUEUE: &'static str = "emails";
    const MAX_ATTEMPTS: u32 = 5;
    fn run(_ctx: JobContext, args: Mail) -> BoxFuture<'static, Result<(), JobError>> {
        Box::pin(async move {
            if !args.to.contains('@') {
                return Err(JobError::permanent(format!(
                    "invalid address {:?}: no '@'",
                    args.to
                )));
            }
            let ms = if args.to.starts_with("slow") {
                600_000
            } else {
                30
            };
            tokio::time::sleep(Duration::from_millis(ms)).await;
            Ok(())
        })
    }
}

#[derive(Serialize, Deserialize)]
struct Report {
    name: String,
}

/// Reports: `q3` fails permanently.
struct Render;
impl Job for Render {
    type Args = Report;
    const NAME: &'static str = "render_report";
    const QUEUE: &'static str = "reports";
    const MAX_ATTEMPTS: u32 = 3;
    fn run(_ctx: JobContext, args: Report) -> BoxFuture<'static, Result<(), JobError>> {
        Box::pin(async move {
            if args.name.contains("q3") {
                return Err(JobError::permanent(
                    "template quarterly.html: column `revenue_eur` does not exist",
                ));
            }
            Ok(())
        })
    }
}

// ---------------------------------------------------------------- test ----

#[test]
fn dashboard_in_chromium_shows_queues_and_replays_a_dead_letter() {
    let Some(chromium) = find_chromium() else {
        let msg = "SKIPPED dashboard browser test: no chromium found (install Debian's `chromium` package, or set CHROMIUM=/path/to/chromium)";
        if std::env::var("QUEUE_REQUIRE_CHROMIUM").as_deref() == Ok("1") {
            panic!("{msg}; QUEUE_REQUIRE_CHROMIUM=1 makes this a failure");
        }
        eprintln!("{msg}");
        return;
    };
    // A durable configuration, so the doctor banner shows what operators should aim for.
    let server =
        RedisServer::start_with(&["--appendonly", "yes", "--appendfsync", "everysec"]).unwrap();
    let url = server.url();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let queue = rt.block_on(Queue::connect(&url)).unwrap();

    seed_reports(&rt, &queue, &url, &server);
    let (stop, worker_task, feeder) = seed_emails(&rt, &queue, &url);

    // The dashboard, on a port of its choosing.
    let (_dash, port) = start_dashboard(&url, &["--sample-ms", "500"]);
    let base = format!("http://127.0.0.1:{port}");

    mutations_need_the_dashboard_origin(port);

    let mut b = Browser::launch(&chromium);
    overview_shows_both_queues(&mut b, &base);
    emails_show_the_running_lease(&mut b, &base);
    replay_a_dead_letter(&mut b, &base, &server);
    another_origin_cannot_replay(&mut b, &base, port, &server);
    job_and_doctor_pages(&mut b, &base);

    feeder.abort();
    stop.shutdown();
    drop(worker_task);
    rt.shutdown_background();
}

fn seed_reports(rt: &tokio::runtime::Runtime, queue: &Queue, url: &str, server: &RedisServer) {
    // Reports: a worker dead-letters a permanent failure and an undecodable
    // payload, then stops; five reports wait in main and one delivery is lost
    // (its worker died: the lease expired and no watchdog runs here).
    rt.block_on(async {
        queue
            .enqueue_with::<Render>(
                EnqueueOptions::new().id("report-q3-2026"),
                &Report {
                    name: "q3-2026".into(),
                },
            )
            .await
            .unwrap();
        queue
            .enqueue_raw(
                "reports",
                "render_report",
                1,
                3,
                EnqueueOptions::new().id("report-legacy-7"),
                b"\xc1not msgpack",
            )
            .await
            .unwrap();
        let worker = Worker::builder(url)
            .register(Registration::of::<Render>())
            .build()
            .await
            .unwrap();
        let q = queue.clone();
        worker
            .run_until(async move {
                for _ in 0..200 {
                    if q.stats("reports").await.unwrap().dead == 2 {
                        return;
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                panic!("reports were not dead-lettered");
            })
            .await
            .unwrap();
        for m in [
            "2026-11-01",
            "2026-11-08",
            "2026-11-15",
            "2026-11-22",
            "2026-11-29",
        ] {
            queue
                .enqueue_with::<Render>(
                    EnqueueOptions::new().id(format!("report-weekly-{m}")),
                    &Report {
                        name: format!("weekly {m}"),
                    },
                )
                .await
                .unwrap();
        }
    });
    let now: i64 = {
        let t = redis(server, &["TIME"]);
        let secs: i64 = t.lines().nth(2).unwrap().trim().parse().unwrap();
        secs * 1000
    };
    let (delivered, lease) = ((now - 95_000).to_string(), (now - 35_000).to_string());
    redis(
        server,
        &[
            "HSET",
            "q:{reports}:job:report-monthly-11",
            "id",
            "report-monthly-11",
            "type",
            "render_report",
            "v",
            "1",
            "state",
            "active",
            "attempts",
            "1",
            "max_attempts",
            "3",
            "token",
            "dead-worker",
            "enqueued_at",
            &delivered,
            "delivered_at",
            &delivered,
            "lease_until",
            &lease,
            "payload",
            "x",
        ],
    );
    redis(
        server,
        &["LPUSH", "q:{reports}:processing", "report-monthly-11"],
    );
    redis(
        server,
        &["ZADD", "q:{reports}:leases", &lease, "report-monthly-11"],
    );
}

/// Returns the email worker's shutdown handle and task, and the feeder task.
fn seed_emails(
    rt: &tokio::runtime::Runtime,
    queue: &Queue,
    url: &str,
) -> (ShutdownHandle, JoinHandle<impl Sized>, JoinHandle<()>) {
    // Emails: a worker keeps running: one slow job holds a lease (renewed by
    // its heartbeat), one bad address is dead-lettered, one job is scheduled
    // for later, and a feeder enqueues at a changing rate for the chart.
    let worker = rt
        .block_on(
            Worker::builder(url)
                .register(Registration::of::<SendWelcome>())
                .concurrency(4)
                .lease(Duration::from_secs(30))
                .build(),
        )
        .unwrap();
    let stop = worker.shutdown_handle();
    let worker_task = rt.spawn(worker.run_until(std::future::pending()));
    rt.block_on(async {
        for (id, to) in [
            ("welcome-slow-ada", "slow-ada@example.com"),
            ("welcome-bob", "bob.example.com"),
        ] {
            queue
                .enqueue_with::<SendWelcome>(EnqueueOptions::new().id(id), &Mail { to: to.into() })
                .await
                .unwrap();
        }
        queue
            .enqueue_with::<SendWelcome>(
                EnqueueOptions::new()
                    .id("welcome-digest-later")
                    .delay(Duration::from_secs(3600)),
                &Mail {
                    to: "digest@example.com".into(),
                },
            )
            .await
            .unwrap();
    });
    let feeder = {
        let queue = queue.clone();
        rt.spawn(async move {
            for i in 0..2000u32 {
                let _ = queue
                    .enqueue_with::<SendWelcome>(
                        EnqueueOptions::new().id(format!("welcome-{i}")),
                        &Mail {
                            to: format!("user{i}@example.com"),
                        },
                    )
                    .await;
                let pause = if (i / 25) % 2 == 0 { 40 } else { 120 };
                tokio::time::sleep(Duration::from_millis(pause)).await;
            }
        })
    };
    rt.block_on(async {
        for _ in 0..200 {
            let s = queue.stats("emails").await.unwrap();
            if s.processing >= 1 && s.dead == 1 {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("emails were not seeded");
    });
    (stop, worker_task, feeder)
}

fn mutations_need_the_dashboard_origin(port: u16) {
    // Mutations need the page's header, a same origin and a known host.
    assert_eq!(
        http(
            port,
            "POST",
            "/api/queues/reports/dead/report-legacy-7/replay",
            &[]
        )
        .0,
        403
    );
    assert_eq!(
        http(
            port,
            "POST",
            "/api/queues/reports/dead/report-legacy-7/replay",
            &[
                ("X-Queue-Dashboard", "1"),
                ("Origin", "http://evil.example")
            ]
        )
        .0,
        403
    );
    assert_eq!(
        http(port, "GET", "/", &[("Host", "evil.example")]).0,
        421,
        "DNS-rebinding host refused"
    );
}

fn overview_shows_both_queues(b: &mut Browser, base: &str) {
    // Overview: both queues with their numbers, the live chart filling up.
    b.goto(&format!("{base}/"));
    b.wait_for(
        "the chart to have points",
        "Number(document.getElementById('chart').dataset.points) >= 48",
    );
    let cell =
        |b: &mut Browser, q: &str, k: &str| b.text(&format!("td[data-q=\"{q}\"][data-k=\"{k}\"]"));
    assert_eq!(cell(b, "reports", "main"), "5");
    assert_eq!(cell(b, "reports", "expired_leases"), "1");
    assert_eq!(cell(b, "reports", "dead"), "2");
    assert_eq!(cell(b, "emails", "dead"), "1");
    assert_ne!(cell(b, "reports", "oldest_waiting"), "–");
    b.wait_for(
        "the doctor banner",
        "document.getElementById('doctor-banner').innerText.includes('safe for critical queues')",
    );
    b.screenshot("dashboard-overview.png");
}

fn emails_show_the_running_lease(b: &mut Browser, base: &str) {
    // Emails: the slow job runs with its lease time left.
    b.goto(&format!("{base}/queues/emails"));
    let row = "#processing tr[data-id=\"welcome-slow-ada\"]";
    let status = b.text(&format!("{row} td.status"));
    assert_eq!(status, "running");
    let left = b.text(&format!("{row} td.lease"));
    assert!(
        left.ends_with('s') && !left.contains("expired"),
        "lease left: {left:?}"
    );
    b.wait_for(
        "the processing table to refresh",
        "window.dashboardState.polls >= 1",
    );
    b.screenshot("dashboard-processing.png");
}

fn replay_a_dead_letter(b: &mut Browser, base: &str, server: &RedisServer) {
    // Reports: the lost job and the dead letters with their reason.
    b.goto(&format!("{base}/queues/reports"));
    let lost = b.text("#processing tr[data-id=\"report-monthly-11\"]");
    assert!(lost.contains("lost: lease expired"), "{lost}");
    let dead = b.text("#dead tr[data-id=\"report-q3-2026\"]");
    assert!(
        dead.contains("column `revenue_eur` does not exist"),
        "{dead}"
    );
    assert!(b.text("#dead").contains("report-legacy-7"));
    b.screenshot("dashboard-dead-letters-before.png");

    // Click Replay: the job goes back to main.
    b.click("#dead tr[data-id=\"report-q3-2026\"] button.replay");
    b.wait_for(
        "the replay to be confirmed",
        "window.dashboardState.replayed.includes('report-q3-2026')",
    );
    assert!(b
        .text("#dead tr[data-id=\"report-q3-2026\"]")
        .contains("back in main"));
    let main = redis(server, &["LRANGE", "q:{reports}:main", "0", "-1"]);
    assert!(main.contains("report-q3-2026"), "not in main: {main}");
    let dead = redis(server, &["LRANGE", "q:{reports}:dead", "0", "-1"]);
    assert!(
        !dead.contains("report-q3-2026") && dead.contains("report-legacy-7"),
        "{dead}"
    );
    assert!(redis(server, &["HGET", "q:{reports}:job:report-q3-2026", "state"]).contains("queued"));
    b.screenshot("dashboard-dead-letters-after.png");
}

fn another_origin_cannot_replay(b: &mut Browser, base: &str, port: u16, server: &RedisServer) {
    // A page of another origin (localhost vs 127.0.0.1) cannot replay, with
    // or without the header (preflight refused / header missing).
    b.goto(&format!("http://localhost:{port}/"));
    let target = format!("{base}/api/queues/reports/dead/report-legacy-7/replay");
    let with_header = b.eval(&format!(
        "fetch({0}, {{method: 'POST', headers: {{'X-Queue-Dashboard': '1'}}}}).then(r => 'sent ' + r.status, e => 'blocked')",
        json!(target)
    ));
    assert_eq!(with_header, json!("blocked"));
    b.eval(&format!(
        "fetch({0}, {{method: 'POST', mode: 'no-cors'}}).then(() => 'sent', () => 'blocked')",
        json!(target)
    ));
    let dead = redis(server, &["LRANGE", "q:{reports}:dead", "0", "-1"]);
    assert!(
        dead.contains("report-legacy-7"),
        "a cross-site request replayed a job: {dead}"
    );
}

fn job_and_doctor_pages(b: &mut Browser, base: &str) {
    // Job detail: where it is, its history (dead-lettered then replayed), payload.
    b.goto(&format!("{base}/queues/reports/jobs/report-q3-2026"));
    let location = b.text("#location");
    assert!(location.starts_with("main (waiting"), "{location}");
    let history = b.text("ul.history");
    assert!(history.contains("enqueued"), "{history}");
    assert!(
        history.contains("replayed") && history.contains("revenue_eur"),
        "{history}"
    );
    assert!(b.text("pre.payload").contains("q3-2026"));
    b.screenshot("dashboard-job.png");

    // And a dead one, with its replay button.
    b.goto(&format!("{base}/queues/reports/jobs/report-legacy-7"));
    assert!(b.text("#location").starts_with("dead-letter list"));
    assert!(b.eval("!!document.querySelector('button.replay')") == json!(true));

    // The doctor page: the durable configuration passes, warnings listed.
    b.goto(&format!("{base}/doctor"));
    assert!(b.text("main").contains("Safe for critical queues"));
    let findings = b.text("#findings");
    assert!(findings.contains("appendfsync everysec"), "{findings}");
    assert!(findings.contains("no replica connected"), "{findings}");
    b.screenshot("dashboard-doctor.png");
}

/// The dashboard's HTTP surface without a browser: pages, JSON, metrics,
/// and the replay endpoint's protections.
#[test]
fn dashboard_http_endpoints_and_replay_protection() {
    let server = RedisServer::start().unwrap();
    let url = server.url();
    seed_a_dead_and_a_hostile_job(&server);
    let (_dash, port) = start_dashboard(&url, &["-q", "emails", "--metrics", "--sample-ms", "200"]);

    assert_eq!(http(port, "GET", "/healthz", &[]), (200, "ok".to_string()));
    let (status, page) = http(port, "GET", "/queues/emails", &[]);
    assert_eq!(status, 200);
    assert!(page.contains("data-id=\"d1\"") && page.contains("boom"));
    // User data is escaped, never markup.
    assert!(!page.contains("<script>alert"), "unescaped job type");
    assert!(page.contains("&lt;script&gt;alert(1)&lt;/script&gt;"));
    assert!(page.contains("/queues/emails/jobs/%3Cimg%3E"));
    let (status, _) = http(port, "GET", "/queues/emails/jobs/%3Cimg%3E", &[]);
    assert_eq!(status, 200);
    assert_eq!(http(port, "GET", "/queues/emails/jobs/nope", &[]).0, 404);

    let (status, body) = http(port, "GET", "/api/overview", &[]);
    assert_eq!(status, 200);
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["queues"][0]["queue"], "emails");
    assert_eq!(v["queues"][0]["dead"], 1);

    wait_for_the_gauges(port);
    replay_needs_header_origin_and_host(port, &server);
    odd_queue_names_and_offsets_are_refused_or_clamped(port, &server);
}

/// A `{queue}` that is not a queue name is refused (400) before anything is
/// read or written: `a}:job:x` named a job key of queue `a` (a pause wrote
/// `q:{a}:job:x}:paused`). An offset at the top of its range is clamped, not
/// an overflow (a panic in a debug build). Stop 47 review.
fn odd_queue_names_and_offsets_are_refused_or_clamped(port: u16, server: &RedisServer) {
    let page = [("X-Queue-Dashboard", "1")];
    let (status, body) = http(port, "POST", "/api/queues/a%7D%3Ajob%3Ax/pause", &page);
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("not a queue name"), "{body}");
    assert_eq!(
        redis(server, &["EXISTS", "q:{a}:job:x}:paused"]).trim(),
        ":0"
    );
    assert_eq!(http(port, "GET", "/queues/a%7Bb/dead", &[]).0, 400);
    let (status, _) = http(
        port,
        "GET",
        "/queues/emails/dead?contains=x&from=18446744073709551615",
        &[],
    );
    assert_eq!(status, 200);
}

/// `d1` dead in `emails`, and a waiting job whose id and type are markup.
fn seed_a_dead_and_a_hostile_job(server: &RedisServer) {
    for cmd in [
        &[
            "HSET",
            "q:{emails}:job:d1",
            "id",
            "d1",
            "state",
            "dead",
            "type",
            "send",
            "dead_reason",
            "boom",
            "dead_at",
            "1",
        ][..],
        &["LPUSH", "q:{emails}:dead", "d1"],
        &[
            "HSET",
            "q:{emails}:job:<img>",
            "id",
            "<img>",
            "state",
            "queued",
            "type",
            "<script>alert(1)</script>",
            "enqueued_at",
            "1",
        ],
        &["LPUSH", "q:{emails}:main", "<img>"],
    ] {
        server.command(cmd).unwrap();
    }
}

/// Polls `/metrics` until the depth and expired-lease gauges of `emails` show.
fn wait_for_the_gauges(port: u16) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (_, metrics) = http(port, "GET", "/metrics", &[]);
        if metrics.contains("queue_depth{queue=\"emails\",list=\"dead\"} 1")
            && metrics.contains("queue_expired_leases{queue=\"emails\"} 0")
        {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no depth or expired-lease gauge: {metrics}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The replay endpoint refuses requests without the header, from another
/// site, origin or host; the same origin replays `d1` once.
fn replay_needs_header_origin_and_host(port: u16, server: &RedisServer) {
    let replay = "/api/queues/emails/dead/d1/replay";
    assert_eq!(http(port, "POST", replay, &[]).0, 403, "no header");
    assert_eq!(
        http(
            port,
            "POST",
            replay,
            &[("X-Queue-Dashboard", "1"), ("Sec-Fetch-Site", "cross-site")]
        )
        .0,
        403
    );
    assert_eq!(
        http(
            port,
            "POST",
            replay,
            &[("X-Queue-Dashboard", "1"), ("Origin", "http://127.0.0.1:1")]
        )
        .0,
        403,
        "another port is another origin"
    );
    assert_eq!(
        http(
            port,
            "GET",
            "/api/overview",
            &[("Host", "attacker.example:80")]
        )
        .0,
        421
    );
    assert!(redis(server, &["LRANGE", "q:{emails}:dead", "0", "-1"]).contains("d1"));
    let origin = format!("http://127.0.0.1:{port}");
    let (status, body) = http(
        port,
        "POST",
        replay,
        &[
            ("X-Queue-Dashboard", "1"),
            ("Origin", &origin),
            ("Sec-Fetch-Site", "same-origin"),
        ],
    );
    assert_eq!(status, 200, "{body}");
    assert!(redis(server, &["LRANGE", "q:{emails}:main", "0", "-1"]).contains("d1"));
    // A second replay: not dead any more.
    assert_eq!(
        http(port, "POST", replay, &[("X-Queue-Dashboard", "1")]).0,
        409
    );
}

/// Flow control from the browser (docs/FLOW-CONTROL.md): click Pause on a
/// queue page (banner shown, pause flag in Redis), Resume (flag gone), and
/// Cancel on a waiting job's page (its completion record says cancelled).
#[test]
fn dashboard_in_chromium_pauses_resumes_and_cancels() {
    let Some(chromium) = find_chromium() else {
        let msg = "SKIPPED dashboard flow-control browser test: no chromium found";
        if std::env::var("QUEUE_REQUIRE_CHROMIUM").as_deref() == Ok("1") {
            panic!("{msg}; QUEUE_REQUIRE_CHROMIUM=1 makes this a failure");
        }
        eprintln!("{msg}");
        return;
    };
    let server = RedisServer::start().unwrap();
    let url = server.url();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let queue = rt.block_on(Queue::connect(&url)).unwrap();
    rt.block_on(queue.enqueue_with::<SendWelcome>(
        EnqueueOptions::new().id("welcome-grace"),
        &Mail {
            to: "grace@example.com".into(),
        },
    ))
    .unwrap();
    let keys = queue_core::QueueKeys::new("emails");
    let (_dash, port) = start_dashboard(&url, &["-q", "emails", "--sample-ms", "200"]);
    let base = format!("http://127.0.0.1:{port}");
    let paused = || {
        redis(&server, &["EXISTS", &keys.paused()])
            .trim()
            .to_string()
    };

    // The flow endpoints refuse requests that are not from the page.
    assert_eq!(http(port, "POST", "/api/queues/emails/pause", &[]).0, 403);
    let cancel = "/api/queues/emails/jobs/welcome-grace/cancel";
    let foreign = [
        ("X-Queue-Dashboard", "1"),
        ("Origin", "http://evil.example"),
    ];
    assert_eq!(http(port, "POST", cancel, &foreign).0, 403);
    assert_eq!(paused(), ":0");

    let mut b = Browser::launch(&chromium);
    b.goto(&format!("{base}/queues/emails"));
    assert!(b.eval("!document.getElementById('paused-banner')") == json!(true));
    b.click("button.flow[data-action=\"pause\"]");
    b.wait_for(
        "the paused banner after the reload",
        "!!document.getElementById('paused-banner') && !!(window.dashboardState && window.dashboardState.ready)",
    );
    assert!(b.text("#paused-banner").contains("Paused since"));
    assert_eq!(paused(), ":1");
    b.screenshot("dashboard-paused.png");

    b.click("#paused-banner button.flow[data-action=\"resume\"]");
    b.wait_for(
        "the Pause button after the reload",
        "!document.getElementById('paused-banner') && !!document.querySelector('button.flow[data-action=\"pause\"]')",
    );
    assert_eq!(paused(), ":0");

    b.goto(&format!("{base}/queues/emails/jobs/welcome-grace"));
    b.click("button.cancel");
    b.wait_for(
        "the cancel to be confirmed",
        "window.dashboardState.cancelled.includes('welcome-grace')",
    );
    assert!(b.text("button.cancel + .result").contains("cancelled"));
    let record = redis(&server, &["HGET", &keys.done("welcome-grace"), "status"]);
    assert!(record.contains("cancelled"), "{record}");
    assert_eq!(redis(&server, &["LLEN", &keys.main]).trim(), ":0");
}

/// docs/RESULTS.md: the job page shows a running job's `ctx.progress`, and
/// a completed job's typed result as JSON.
#[test]
fn the_job_page_shows_progress_and_typed_results() {
    let server = RedisServer::start().unwrap();
    results_seed::seed_progress_result_and_expiry(&server);
    let (_dash, port) = start_dashboard(&server.url(), &["-q", "emails"]);
    let (status, page) = http(port, "GET", "/queues/emails/jobs/p1", &[]);
    assert_eq!(status, 200);
    assert!(
        page.contains(r#"<p class="progress" id="progress">Progress: 50 — half way (at 2025-"#),
        "{page}"
    );
    let (status, page) = http(port, "GET", "/queues/emails/jobs/r1", &[]);
    assert_eq!(status, 200);
    assert!(page.contains("{&quot;n&quot;:7} (MessagePack)"), "{page}");
}

/// Calls of `cmd` since the server started (`INFO commandstats`; 0 before
/// the first).
fn calls(server: &RedisServer, cmd: &str) -> u64 {
    queue_testkit::command_stat(&redis(server, &["INFO", "commandstats"]), cmd, "calls")
}

/// Without `--queue` and with no queue found yet, a page request serves the
/// sampler's (empty) list: the sampler's discovery is the only SCAN. Before,
/// every request to `/` or `/api/overview` ran a discovery of its own (two
/// SCAN passes of the whole keyspace) while none was found: 5.8 s of Redis
/// CPU per request on 2M keys, for each open tab every refresh.
#[test]
fn overview_requests_never_scan_the_keyspace() {
    let server = RedisServer::start().unwrap();
    let (_dash, port) = start_dashboard(&server.url(), &["--sample-ms", "200"]);
    // The sampler's first discovery (two SCAN passes, one call each on an
    // empty keyspace).
    let deadline = Instant::now() + Duration::from_secs(10);
    while calls(&server, "scan") < 2 {
        assert!(Instant::now() < deadline, "the sampler never discovered");
        std::thread::sleep(Duration::from_millis(50));
    }
    let before = calls(&server, "scan");
    for _ in 0..5 {
        let (status, body) = http(port, "GET", "/api/overview", &[]);
        assert_eq!(status, 200, "{body}");
        assert_eq!(http(port, "GET", "/", &[]).0, 200);
    }
    // At most one discovery of the sampler's (every 10 s) in between.
    let scans = calls(&server, "scan") - before;
    assert!(scans <= 2, "{scans} SCAN calls for 10 page requests");
}

/// The overview reads no group list: nothing on it shows `grouped`. Before,
/// each poll of `/api/overview` (every 2 s per open tab) read up to 10,000
/// group lists per queue, one `LLEN` each.
#[test]
fn overview_polls_read_no_group_list() {
    const GROUPS: usize = 60;
    let server = RedisServer::start().unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let queue = Queue::connect(&server.url()).await.unwrap();
        for g in 0..GROUPS {
            let opts = EnqueueOptions::new().group(format!("tenant-{g}"));
            queue
                .enqueue_raw("emails", "send", 1, 3, opts, b"\x80")
                .await
                .unwrap();
        }
    });
    // A sampler that samples once a minute: the polls are what is measured.
    let (_dash, port) = start_dashboard(&server.url(), &["-q", "emails", "--sample-ms", "60000"]);
    let before = calls(&server, "llen");
    for _ in 0..3 {
        let (status, body) = http(port, "GET", "/api/overview", &[]);
        assert_eq!(status, 200, "{body}");
        let v: Value = serde_json::from_str(&body).unwrap();
        assert_eq!(v["queues"][0]["queue"], "emails");
    }
    // A few per snapshot (main, processing, dead, the ring), never one per group.
    let llens = calls(&server, "llen") - before;
    assert!(
        llens < GROUPS as u64,
        "{llens} LLEN calls for 3 overview polls"
    );
}

/// Without `--queue`, until the sampler's first discovery (a SCAN of the
/// whole keyspace) ends, the overview and `/api/overview` say discovery is
/// in progress, not "no queue" (the SCAN is held at a proxy, so "in
/// progress" lasts as long as the test needs); once it ends they list the
/// queue. Before, the page said "No queue found" and the API answered an
/// empty list that read as "there are no queues" for as long as the first
/// discovery took (minutes on a large Redis).
#[test]
fn the_overview_says_discovery_is_in_progress_until_it_ends() {
    let server = RedisServer::start().unwrap();
    let keys = queue_core::QueueKeys::new("emails");
    redis(&server, &["HSET", &keys.job("j1"), "state", "queued"]);
    redis(&server, &["LPUSH", &keys.main, "j1"]);
    let gate = queue_testkit::proxy::CommandGate::start(server.port(), "SCAN").unwrap();
    let (_dash, port) = start_dashboard(&gate.url(), &["--sample-ms", "200"]);
    let deadline = Instant::now() + Duration::from_secs(30);
    while gate.held() == 0 {
        assert!(Instant::now() < deadline, "the sampler never discovered");
        std::thread::sleep(Duration::from_millis(20));
    }

    let (status, body) = http(port, "GET", "/api/overview", &[]);
    assert_eq!(status, 200, "{body}");
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["discovery"]["state"], "in_progress", "{v}");
    assert_eq!(v["queues"], json!([]), "{v}");
    let (status, page) = http(port, "GET", "/", &[]);
    assert_eq!(status, 200);
    assert!(page.contains("Discovering queues"), "{page}");
    assert!(!page.contains("No queue found"), "{page}");
    let (_, found) = http(port, "GET", "/search?id=j1", &[]);
    assert!(found.contains("queue discovery in progress"), "{found}");

    gate.open();
    let v = loop {
        let (_, body) = http(port, "GET", "/api/overview", &[]);
        let v: Value = serde_json::from_str(&body).unwrap();
        if v["discovery"]["state"] == "done" {
            break v;
        }
        assert!(Instant::now() < deadline, "the discovery never ended: {v}");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(v["queues"][0]["queue"], "emails", "{v}");
    let (_, page) = http(port, "GET", "/", &[]);
    assert!(!page.contains("Discovering queues"), "{page}");
    assert!(page.contains(r#"<tr data-queue="emails">"#), "{page}");
}

/// A job of a large payload (here ~340 KB of JSON) and a large field: the
/// job page shows the first 64 KiB of the payload and 4 KiB of the field,
/// each with a note naming the command that prints the job whole. Before, the
/// whole payload was rendered (a payload of megabytes made a page of
/// megabytes, escaped, for the browser of whoever looked).
#[test]
fn the_job_page_shows_a_bounded_part_of_a_large_payload() {
    let server = RedisServer::start().unwrap();
    let words: Vec<String> = (0..20_000).map(|i| format!("word-{i:08}")).collect();
    let payload = rmp_serde::to_vec_named(&words).unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let queue = Queue::connect(&server.url()).await.unwrap();
        queue
            .enqueue_raw(
                "emails",
                "send",
                1,
                3,
                EnqueueOptions::new().id("big"),
                &payload,
            )
            .await
            .unwrap();
    });
    let note = "n".repeat(10_000);
    redis(&server, &["HSET", "q:{emails}:job:big", "note", &note]);
    let (_dash, port) = start_dashboard(&server.url(), &["-q", "emails"]);
    let (status, page) = http(port, "GET", "/queues/emails/jobs/big", &[]);
    assert_eq!(status, 200);
    assert!(
        page.contains("word-00000000"),
        "the payload's start is shown"
    );
    assert!(!page.contains("word-00019999"), "the payload's end is not");
    assert!(
        page.contains("more bytes not shown: <code>queue-watchdog jobs show big -q emails</code>"),
        "{}",
        &page[page.len().saturating_sub(2000)..]
    );
    assert!(page.contains(&"n".repeat(4096)) && !page.contains(&"n".repeat(4097)));
    assert!(page.len() < 150_000, "page of {} bytes", page.len());
}
