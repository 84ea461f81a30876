//! One trace across the queue, printed by OpenTelemetry's stdout exporter:
//! an `http_request` span enqueues a job; the worker's `job` span (the
//! attempt; its ack is logged inside it) continues that trace as a child.
//! See docs/TRACING.md.
//!
//! ```text
//! cargo run -p queue-core --features opentelemetry --example otel_stdout
//! ```
//!
//! Uses `REDIS_URL` when set, otherwise starts a throwaway `redis-server`.
//! For a collector instead of stdout, swap the exporter for
//! `opentelemetry-otlp`'s `SpanExporter` (same provider setup).

use std::time::Duration;

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_sdk::trace::SdkTracerProvider;
use queue_core::{BoxFuture, Job, JobContext, JobError, Queue, Registration, Worker};
use serde::{Deserialize, Serialize};
use tracing::Instrument;
use tracing_subscriber::layer::SubscriberExt;

#[derive(Serialize, Deserialize)]
struct Welcome {
    to: String,
}

struct SendWelcome;
impl Job for SendWelcome {
    type Args = Welcome;
    const NAME: &'static str = "send_welcome";
    const QUEUE: &'static str = "emails";
    fn run(_ctx: JobContext, args: Welcome) -> BoxFuture<'static, Result<(), JobError>> {
        Box::pin(async move {
            tracing::info!(to = %args.to, "sending the welcome email");
            Ok(())
        })
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let provider = SdkTracerProvider::builder()
        .with_simple_exporter(opentelemetry_stdout::SpanExporter::default())
        .build();
    let subscriber = tracing_subscriber::registry()
        .with(tracing_opentelemetry::layer().with_tracer(provider.tracer("otel_stdout")));
    tracing::subscriber::set_global_default(subscriber)?;

    let _server;
    let url = match std::env::var("REDIS_URL") {
        Ok(url) => url,
        Err(_) => {
            let server = queue_testkit::RedisServer::start()?;
            let url = server.url();
            _server = server;
            url
        }
    };
    let queue = Queue::connect(&url).await?;

    // The web tier: a request span around the enqueue. The job hash gets
    // this span's `traceparent`.
    let request = tracing::info_span!("http_request", route = "/signup");
    let id = queue
        .enqueue::<SendWelcome>(&Welcome {
            to: "ada@example.com".into(),
        })
        .instrument(request)
        .await?;
    println!("enqueued {id}");

    // The worker: its `job` span is a child of `http_request`.
    let worker = Worker::builder(&url)
        .register(Registration::of::<SendWelcome>())
        .build()
        .await?;
    let probe = queue.clone();
    worker
        .run_until(async move {
            for _ in 0..200 {
                match probe.stats("emails").await {
                    Ok(s) if s.counter("completed") >= 1 => return,
                    _ => tokio::time::sleep(Duration::from_millis(50)).await,
                }
            }
        })
        .await?;
    provider.force_flush()?;
    provider.shutdown()?;
    Ok(())
}
