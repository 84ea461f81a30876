//! Trace context across the queue (feature `opentelemetry`, docs/TRACING.md):
//! a job enqueued inside a producer's span is run by a worker (its own
//! connection and tasks; the context crosses only through the job hash in
//! Redis) whose `job` spans, one per attempt, are children of that span in
//! the producer's trace. A job enqueued outside any span starts its own trace.
//!
//! `cargo test -p queue-core --features opentelemetry --test trace_context`

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use opentelemetry::trace::{SpanId, TraceContextExt, TraceId, TracerProvider as _};
use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider, SpanData};
use queue_core::{
    Backoff, BoxFuture, EnqueueOptions, Job, JobContext, JobError, Queue, QueueKeys, Registration,
    Worker,
};
use queue_testkit::RedisServer;
use serde::{Deserialize, Serialize};
use tracing::Instrument;
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::layer::SubscriberExt;

static ATTEMPTS: AtomicU32 = AtomicU32::new(0);

#[derive(Serialize, Deserialize)]
struct Ping {
    n: u32,
}

/// Fails its first attempt (retryable), then succeeds.
struct PingJob;
impl Job for PingJob {
    type Args = Ping;
    const NAME: &'static str = "ping";
    const QUEUE: &'static str = "traced";
    const MAX_ATTEMPTS: u32 = 3;
    fn run(ctx: JobContext, _args: Ping) -> BoxFuture<'static, Result<(), JobError>> {
        Box::pin(async move {
            if ctx.job_id().as_str() == "traced-1" && ATTEMPTS.fetch_add(1, Ordering::SeqCst) == 0 {
                return Err(JobError::retryable("first attempt fails"));
            }
            Ok(())
        })
    }
}

fn attr(span: &SpanData, key: &str) -> Option<String> {
    span.attributes
        .iter()
        .find(|kv| kv.key.as_str() == key)
        .map(|kv| kv.value.to_string())
}

#[test]
fn producer_trace_continues_in_the_workers_job_spans() {
    let exporter = InMemorySpanExporter::default();
    let provider = SdkTracerProvider::builder()
        .with_simple_exporter(exporter.clone())
        .build();
    let subscriber = tracing_subscriber::registry()
        .with(tracing_opentelemetry::layer().with_tracer(provider.tracer("trace-context-test")));
    tracing::subscriber::set_global_default(subscriber).unwrap();

    let server = RedisServer::start().unwrap();
    let url = server.url();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let keys = QueueKeys::new("traced");

    // The producer: a web request's span around the enqueue.
    let (trace_id, request_span_id) = rt.block_on(async {
        let producer = Queue::connect(&url).await.unwrap();
        let request = tracing::info_span!("http_request", route = "/signup");
        let ids = {
            let sc = request.context().span().span_context().clone();
            (sc.trace_id(), sc.span_id())
        };
        async {
            producer
                .enqueue_with::<PingJob>(EnqueueOptions::new().id("traced-1"), &Ping { n: 1 })
                .await
                .unwrap();
        }
        .instrument(request)
        .await;
        producer
            .enqueue_with::<PingJob>(EnqueueOptions::new().id("plain-1"), &Ping { n: 2 })
            .await
            .unwrap();
        ids
    });
    assert_ne!(trace_id, TraceId::INVALID);
    let stored = server
        .command(&["HGET", &keys.job("traced-1"), "traceparent"])
        .unwrap();
    assert!(
        stored.contains(&format!("00-{trace_id:032x}-{request_span_id:016x}-01")),
        "traceparent in the job hash: {stored}"
    );
    let plain = server
        .command(&["HEXISTS", &keys.job("plain-1"), "traceparent"])
        .unwrap();
    assert_eq!(plain.trim(), ":0", "no span, no traceparent");

    // The worker: its own connection; runs both jobs (traced-1 twice).
    rt.block_on(async {
        let worker = Worker::builder(&url)
            .register(Registration::of::<PingJob>())
            .backoff(Backoff {
                base: Duration::from_millis(10),
                max: Duration::from_millis(50),
            })
            .build()
            .await
            .unwrap();
        let probe = Queue::connect(&url).await.unwrap();
        worker
            .run_until(async move {
                for _ in 0..300 {
                    if probe.stats("traced").await.unwrap().counter("completed") >= 2 {
                        return;
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                panic!("the jobs did not complete");
            })
            .await
            .unwrap();
    });
    provider.force_flush().unwrap();
    let spans = exporter.get_finished_spans().unwrap();
    let job_spans = |id: &str| -> Vec<SpanData> {
        spans
            .iter()
            .filter(|s| s.name == "job" && attr(s, "job_id").as_deref() == Some(id))
            .cloned()
            .collect()
    };

    let traced = job_spans("traced-1");
    assert_eq!(traced.len(), 2, "one job span per attempt: {traced:#?}");
    for s in &traced {
        assert_eq!(
            s.span_context.trace_id(),
            trace_id,
            "attempt in the producer's trace"
        );
        assert_eq!(
            s.parent_span_id, request_span_id,
            "attempt is a child of the enqueuing span"
        );
    }
    let mut attempts: Vec<_> = traced.iter().filter_map(|s| attr(s, "attempt")).collect();
    attempts.sort();
    assert_eq!(attempts, ["1", "2"]);

    let plain = job_spans("plain-1");
    assert_eq!(plain.len(), 1);
    assert_ne!(
        plain[0].span_context.trace_id(),
        trace_id,
        "an untraced job starts its own trace"
    );
    assert_eq!(plain[0].parent_span_id, SpanId::INVALID);
    rt.shutdown_background();
}
