//! `worker`: runs the `send_welcome` jobs that `web` enqueues.
//!
//! ```text
//! cargo run -p queue-examples --bin worker -- --redis redis://127.0.0.1:6379/ --concurrency 4 \
//!     --metrics-listen 127.0.0.1:9465
//! ```
//!
//! Stops gracefully on SIGTERM or ctrl-c: no new fetches, in-flight jobs get
//! `--grace-ms` to finish, any still running stay leased and the watchdog
//! (`queue-watchdog run --queue emails`) returns them once their lease expires.
//! A worker killed outright (SIGKILL, crash, power loss) loses nothing either:
//! its leases expire and the watchdog returns the jobs. `WELCOME_WORK_MS` sets
//! the simulated work per job (default 300 ms).
//!
//! With `--metrics-listen ADDR` the worker serves Prometheus metrics at
//! `http://ADDR/metrics`: started, completed, failed, retried and
//! dead-lettered counters and the handler duration histogram, per queue and
//! job type (see `docs/OPERATIONS.md`).

use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder};
use queue_core::{Backoff, QueueError, Worker, WorkerConfig};
use queue_examples::send_welcome;
use tracing::{error, info};

/// Worker process of the examples: runs `send_welcome` jobs.
#[derive(Debug, Parser)]
#[command(name = "worker", about)]
struct Args {
    /// Redis URL.
    #[arg(long, env = "REDIS_URL", default_value = "redis://127.0.0.1:6379/")]
    redis: String,
    /// Jobs run at once.
    #[arg(long, default_value_t = 4)]
    concurrency: usize,
    /// Lease per delivery (ms): how soon the watchdog may return the jobs of a
    /// worker that died. The heartbeat renews it every third of it.
    #[arg(long, default_value_t = 30_000)]
    lease_ms: u64,
    /// On shutdown, how long (ms) in-flight jobs may take to finish.
    #[arg(long, default_value_t = 30_000)]
    grace_ms: u64,
    /// Base retry backoff (ms) after a retryable failure; doubles per attempt, jittered.
    #[arg(long, default_value_t = 1_000)]
    backoff_base_ms: u64,
    /// Serve Prometheus metrics on this address (`GET /metrics`), e.g. 127.0.0.1:9465.
    #[arg(long, value_name = "ADDR")]
    metrics_listen: Option<SocketAddr>,
}

/// Buckets of `queue_job_duration_seconds` (5 ms … 10 min), as the watchdog's.
const DURATION_BUCKETS: &[f64] = &[
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0,
];

/// Installs the Prometheus recorder and its HTTP listener (inside the runtime).
fn serve_metrics(addr: SocketAddr) -> Result<(), String> {
    PrometheusBuilder::new()
        .set_buckets_for_metric(
            Matcher::Full("queue_job_duration_seconds".into()),
            DURATION_BUCKETS,
        )
        .and_then(|b| b.with_http_listener(addr).install())
        .map_err(|e| format!("cannot serve metrics on {addr}: {e}"))
}

#[tokio::main]
async fn main() -> ExitCode {
    queue_examples::init_tracing("info");
    let args = Args::parse();
    if let Some(addr) = args.metrics_listen {
        if let Err(e) = serve_metrics(addr) {
            error!("{e}");
            return ExitCode::FAILURE;
        }
        info!(%addr, "serving Prometheus metrics at http://{addr}/metrics");
    }
    let result = match build(&args).await {
        Ok(worker) => {
            info!(pid = std::process::id(), "worker ready");
            worker.run().await
        }
        Err(e) => Err(e),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            error!("worker failed: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn build(args: &Args) -> Result<Worker, QueueError> {
    let config = WorkerConfig {
        concurrency: args.concurrency,
        lease: Duration::from_millis(args.lease_ms),
        grace: Duration::from_millis(args.grace_ms),
        backoff: Backoff {
            base: Duration::from_millis(args.backoff_base_ms),
            ..Backoff::default()
        },
        ..WorkerConfig::default()
    };
    Worker::builder(&args.redis)
        .register(send_welcome::handler())
        .config(config)
        .build()
        .await
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};

    use queue_examples::Welcome;

    use super::*;

    fn scrape(addr: SocketAddr) -> String {
        let mut s = std::net::TcpStream::connect(addr).expect("metrics listener");
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        write!(
            s,
            "GET /metrics HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
        )
        .unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).unwrap();
        out
    }

    /// The worker's arguments with `--metrics-listen` on a free port, its
    /// listener already serving. A port picked free can be taken before it
    /// is bound: the listener is then tried on a fresh one (4 tries). The
    /// recorder is only installed once the listener is bound, so a failed
    /// try leaves nothing installed.
    fn args_serving_metrics(redis: &str) -> (Args, SocketAddr) {
        let mut last = String::new();
        for _ in 0..4 {
            let port = queue_testkit::free_port().unwrap();
            let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
            let args = Args::parse_from([
                "worker",
                "--redis",
                redis,
                "--metrics-listen",
                &addr.to_string(),
                "--concurrency",
                "2",
            ]);
            match serve_metrics(addr) {
                Ok(()) => return (args, addr),
                Err(e) if e.contains("in use") => last = e,
                Err(e) => panic!("{e}"),
            }
        }
        panic!("no free port for the metrics listener after 4 tries: {last}")
    }

    /// `--metrics-listen`: after a job ran, /metrics shows the counters and
    /// the duration histogram with queue and job_type labels.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn metrics_listen_exports_job_metrics() {
        let server = queue_testkit::RedisServer::start().expect("redis-server");
        let (args, addr) = args_serving_metrics(&server.url());
        let queue = queue_core::Queue::connect(&server.url()).await.unwrap();
        send_welcome::enqueue(
            &queue,
            Welcome {
                email: "ada@example.com".into(),
                name: "Ada".into(),
            },
        )
        .await
        .unwrap();
        send_welcome::enqueue(
            &queue,
            Welcome {
                email: "no-at-sign".into(),
                name: "Bob".into(),
            },
        )
        .await
        .unwrap();
        let worker = build(&args).await.unwrap();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let run = tokio::spawn(worker.run_until(async move {
            let _ = stopped.await;
        }));
        // Polled with a generous deadline that fails the test by itself
        // (before, a 10 s loop that ended without failing, and the metric
        // asserts below failed instead).
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        loop {
            let s = queue.stats("emails").await.unwrap();
            if s.counter("completed") == 1 && s.dead == 1 {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "one job completed and one dead within 60 s: {s:?}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let _ = stop.send(());
        run.await.unwrap().unwrap();
        let body = tokio::task::spawn_blocking(move || scrape(addr))
            .await
            .unwrap();
        let ty = <send_welcome::Job as queue_core::Job>::NAME;
        for line in [
            format!("queue_jobs_enqueued_total{{queue=\"emails\",job_type=\"{ty}\"}} 2"),
            format!("queue_jobs_started_total{{queue=\"emails\",job_type=\"{ty}\"}} 2"),
            format!("queue_jobs_completed_total{{queue=\"emails\",job_type=\"{ty}\"}} 1"),
            format!("queue_jobs_failed_total{{queue=\"emails\",job_type=\"{ty}\"}} 1"),
            format!("queue_jobs_dead_lettered_total{{queue=\"emails\",job_type=\"{ty}\"}} 1"),
            format!("queue_job_duration_seconds_count{{queue=\"emails\",job_type=\"{ty}\"}} 2"),
            "# TYPE queue_job_duration_seconds histogram".to_string(),
        ] {
            assert!(body.contains(&line), "missing {line:?} in:\n{body}");
        }
        assert!(
            body.contains("queue_job_duration_seconds_bucket{queue=\"emails\",job_type="),
            "{body}"
        );
    }
}
