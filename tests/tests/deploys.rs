//! Rolling deploys (issue #11 item 7): a payload whose schema version is
//! newer than a worker's handler is left for an upgraded worker, without
//! using an attempt, and dead-lettered only when no live worker has
//! announced that version for `newer_version_wait`. A job type a worker has
//! no handler for (a type added to producers before the workers) is left
//! for a worker that has one the same way. An older version is
//! dead-lettered at once, as before.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use queue_core::{
    BoxFuture, EnqueueOptions, Job, JobContext, JobError, JobId, QueueKeys, Registration,
    WorkerConfig,
};
use queue_tests::env::{TestEnv, BOUND};
use queue_tests::handles::WorkerHandle;
use queue_tests::{fast_config, wait_until};
use redis::AsyncCommands;

const QUEUE: &str = "deploys";

/// Attempt numbers seen by the v2 handler, per job id.
static RAN_V2: Mutex<Vec<(String, u32)>> = Mutex::new(Vec::new());

/// The `render` job as deployed before the upgrade (schema version 1).
struct RenderV1;
impl Job for RenderV1 {
    type Args = String;
    const NAME: &'static str = "render";
    const QUEUE: &'static str = QUEUE;
    const SCHEMA_VERSION: u32 = 1;
    fn run(_ctx: JobContext, _args: String) -> BoxFuture<'static, Result<(), JobError>> {
        Box::pin(async { Err(JobError::permanent("the v1 handler must not run here")) })
    }
}

/// The same job type after the upgrade (schema version 2).
struct RenderV2;
impl Job for RenderV2 {
    type Args = String;
    const NAME: &'static str = "render";
    const QUEUE: &'static str = QUEUE;
    const SCHEMA_VERSION: u32 = 2;
    fn run(ctx: JobContext, _args: String) -> BoxFuture<'static, Result<(), JobError>> {
        Box::pin(async move {
            let seen = (ctx.job_id().to_string(), ctx.attempt());
            RAN_V2.lock().expect("ran").push(seen);
            Ok(())
        })
    }
}

/// Job ids the `thumbnail` handler ran, with their attempt numbers.
static RAN_THUMBNAIL: Mutex<Vec<(String, u32)>> = Mutex::new(Vec::new());

/// A job type added in the upgrade: workers deployed before it have no
/// handler for it.
struct Thumbnail;
impl Job for Thumbnail {
    type Args = String;
    const NAME: &'static str = "thumbnail";
    const QUEUE: &'static str = QUEUE;
    const SCHEMA_VERSION: u32 = 1;
    fn run(ctx: JobContext, _args: String) -> BoxFuture<'static, Result<(), JobError>> {
        Box::pin(async move {
            let seen = (ctx.job_id().to_string(), ctx.attempt());
            RAN_THUMBNAIL.lock().expect("ran").push(seen);
            Ok(())
        })
    }
}

/// A fast worker config that defers newer payloads for `wait`, offering
/// them again every 50 ms.
fn deploy_config(wait: Duration) -> WorkerConfig {
    WorkerConfig {
        newer_version_wait: wait,
        newer_version_delay: Duration::from_millis(50),
        ..fast_config()
    }
}

async fn start_worker(env: &TestEnv, reg: Registration, wait: Duration) -> WorkerHandle {
    start_worker_with(env, reg, deploy_config(wait)).await
}

async fn start_worker_with(env: &TestEnv, reg: Registration, config: WorkerConfig) -> WorkerHandle {
    let builder = queue_core::Worker::builder(&env.url)
        .register(reg)
        .config(config);
    WorkerHandle::start(builder).await
}

/// Enqueues one job of `J` that may be delivered only once.
async fn enqueue_once<J: Job<Args = String>>(env: &TestEnv) -> JobId {
    let opts = EnqueueOptions::new().max_attempts(1);
    let args = "page".to_string();
    env.queue
        .enqueue_with::<J>(opts, &args)
        .await
        .expect("enqueue")
        .id
}

/// One field of job `id`'s hash.
async fn job_field(env: &TestEnv, id: &JobId, field: &str) -> Option<String> {
    let key = QueueKeys::new(QUEUE).job(id.as_str());
    env.conn().await.hget(key, field).await.expect("HGET")
}

/// The `deferred` counter of the queue's stats hash.
async fn deferred(env: &TestEnv) -> u64 {
    let stats = QueueKeys::new(QUEUE).stats;
    let n: Option<u64> = env
        .conn()
        .await
        .hget(stats, "deferred")
        .await
        .expect("HGET");
    n.unwrap_or(0)
}

async fn dead(env: &TestEnv) -> Vec<String> {
    env.list(&QueueKeys::new(QUEUE).dead).await
}

/// Waits until job `id` is in the dead list; its dead-letter reason.
async fn wait_dead_reason(env: &TestEnv, id: &JobId) -> String {
    wait_until(BOUND, "job dead-lettered", || async {
        dead(env).await.contains(&id.to_string())
    })
    .await;
    job_field(env, id, "dead_reason").await.unwrap_or_default()
}

/// Waits until the job was given back `n` times or dead-lettered.
async fn wait_deferred_or_dead(env: &TestEnv, n: u64) {
    wait_until(BOUND, "job deferred or dead-lettered", || async {
        deferred(env).await >= n || !dead(env).await.is_empty()
    })
    .await;
}

/// Waits for three give-backs of job `id`, then checks that it was never
/// dead-lettered meanwhile and that at most the delivery in flight counts
/// as an attempt.
async fn assert_given_back_unburned(env: &TestEnv, id: &JobId) {
    wait_deferred_or_dead(env, 3).await;
    assert!(
        dead(env).await.is_empty(),
        "dead-lettered while waiting for a worker that can run it: {:?}",
        job_field(env, id, "dead_reason").await
    );
    let attempts = job_field(env, id, "attempts").await;
    assert!(
        matches!(attempts.as_deref(), Some("0" | "1")),
        "at most the delivery in flight counts: {attempts:?}"
    );
}

/// The (job id, attempt) runs a handler recorded in `ran` for job `id`.
fn runs_of(ran: &Mutex<Vec<(String, u32)>>, id: &JobId) -> Vec<(String, u32)> {
    ran.lock()
        .expect("ran")
        .iter()
        .filter(|(j, _)| j == id.as_str())
        .cloned()
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn newer_payload_waits_for_an_upgraded_worker_without_burning_attempts() {
    let env = TestEnv::start().await;
    let old = start_worker(&env, Registration::of::<RenderV1>(), BOUND).await;
    let id = enqueue_once::<RenderV2>(&env).await;

    // Only a v1 worker runs: the job keeps coming back, never dead-lettered,
    // and its one allowed attempt is not used.
    assert_given_back_unburned(&env, &id).await;

    // The upgraded worker starts and announces version 2; the old one stops
    // (a rolling deploy), and the upgraded one runs the job. While both
    // run, each give-back by the old worker doubles the job's delay (up to
    // a minute, by design: docs/OPERATIONS.md, rolling deploys), so which
    // of the two fetched it decided whether the job ran within seconds or
    // a minute: the test timed out under load.
    let new = start_worker(&env, Registration::of::<RenderV2>(), BOUND).await;
    wait_announced(&env, "render:2").await;
    old.stop().await;
    env.wait_completed(QUEUE, 1).await;
    assert_eq!(
        runs_of(&RAN_V2, &id),
        vec![(id.to_string(), 1)],
        "one run, on its first attempt"
    );
    assert_eq!(env.completion_attempts(QUEUE, id.clone()).await, 1);
    assert!(dead(&env).await.is_empty());
    let versions: HashMap<String, u64> = env
        .conn()
        .await
        .hgetall(QueueKeys::new(QUEUE).versions())
        .await
        .expect("HGETALL versions");
    assert!(versions.contains_key("render:1") && versions.contains_key("render:2"));
    new.stop().await;
}

/// Waits until a worker announced `field` (`type:version`) in the queue's
/// versions hash.
async fn wait_announced(env: &TestEnv, field: &str) {
    let key = QueueKeys::new(QUEUE).versions();
    for _ in 0..600 {
        let at: Option<u64> = env.conn().await.hget(&key, field).await.expect("HGET");
        if at.is_some() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("{field} never announced");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn newer_payload_is_dead_lettered_when_no_worker_announces_its_version() {
    let env = TestEnv::start().await;
    let wait = Duration::from_millis(400);
    let old = start_worker(&env, Registration::of::<RenderV1>(), wait).await;
    let id = enqueue_once::<RenderV2>(&env).await;

    let reason = wait_dead_reason(&env, &id).await;
    assert!(
        reason.contains("newer than this worker's handler")
            && reason.contains("no live worker has announced it"),
        "dead-letter reason: {reason}"
    );
    assert!(
        deferred(&env).await >= 1,
        "left for an upgraded worker first"
    );
    let attempts = job_field(&env, &id, "attempts").await;
    assert_eq!(attempts.as_deref(), Some("0"), "the attempt is not counted");
    old.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_announced_version_keeps_the_job_waiting_past_the_wait() {
    let env = TestEnv::start().await;
    // A v2 worker elsewhere (busy, or on another queue set) announced
    // `render:2` for the next minute, by the Redis clock.
    let versions = QueueKeys::new(QUEUE).versions();
    let (secs, _): (u64, u64) = redis::cmd("TIME")
        .query_async(&mut env.conn().await)
        .await
        .expect("TIME");
    let until_ms = (secs + 60) * 1000;
    let _: () = env
        .conn()
        .await
        .hset(&versions, "render:2", until_ms)
        .await
        .expect("HSET");
    let wait = Duration::from_millis(300);
    let old = start_worker(&env, Registration::of::<RenderV1>(), wait).await;
    let id = enqueue_once::<RenderV2>(&env).await;

    // Five give-backs, 50, 100, 200 and 400 ms apart (each twice the one
    // before), outlast the 300 ms wait.
    wait_deferred_or_dead(&env, 5).await;
    assert!(
        dead(&env).await.is_empty(),
        "dead-lettered while a live worker announced its version: {:?}",
        job_field(&env, &id, "dead_reason").await
    );

    // The announcement goes away (that worker stopped): the wait runs out.
    let _: () = env
        .conn()
        .await
        .hdel(&versions, "render:2")
        .await
        .expect("HDEL");
    let reason = wait_dead_reason(&env, &id).await;
    assert!(
        reason.contains("no live worker has announced it"),
        "{reason}"
    );
    old.stop().await;
}

/// A give-back is due sooner than the delayed set's head (here the set is
/// empty), so it wakes a promoter that sleeps far longer than this test, as
/// a retry does: the job is offered again when due, each time, not when the
/// promoter's longest sleep ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_give_back_wakes_the_sleeping_promoter() {
    let env = TestEnv::start().await;
    let config = WorkerConfig {
        promote_interval: Duration::from_secs(600),
        ..deploy_config(BOUND)
    };
    let old = start_worker_with(&env, Registration::of::<RenderV1>(), config).await;
    enqueue_once::<RenderV2>(&env).await;

    // Three give-backs: the second and third were promoted only because
    // the give-back before them woke the promoter.
    wait_deferred_or_dead(&env, 3).await;
    assert!(dead(&env).await.is_empty(), "dead-lettered while waiting");
    old.stop().await;
}

/// Producers upgraded first enqueue a job type the running workers have no
/// handler for: the job is given back (attempt not counted) until a worker
/// that has the type runs it, once, on attempt 1. Before, the first worker
/// that took it dead-lettered it at once as an unknown type.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_job_type_waits_for_a_worker_that_has_it_without_burning_attempts() {
    let env = TestEnv::start().await;
    let old = start_worker(&env, Registration::of::<RenderV1>(), BOUND).await;
    let id = enqueue_once::<Thumbnail>(&env).await;

    assert_given_back_unburned(&env, &id).await;

    // The upgraded worker has both types; it announces `thumbnail:1`.
    let builder = queue_core::Worker::builder(&env.url)
        .register(Registration::of::<RenderV2>())
        .register(Registration::of::<Thumbnail>())
        .config(deploy_config(BOUND));
    let new = WorkerHandle::start(builder).await;
    // The old worker stops once it did (see the test above: while both run,
    // each give-back by the old one doubles the job's delay).
    wait_announced(&env, "thumbnail:1").await;
    old.stop().await;
    env.wait_completed(QUEUE, 1).await;
    assert_eq!(
        runs_of(&RAN_THUMBNAIL, &id),
        vec![(id.to_string(), 1)],
        "one run, on its first attempt"
    );
    assert!(dead(&env).await.is_empty());
    new.stop().await;
}

/// A job type no live worker has announced (a typo in a producer, a rollout
/// abandoned) is dead-lettered once `newer_version_wait` has passed, with a
/// reason naming the type and what to do; its attempt is not counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_type_no_worker_announces_is_dead_lettered_after_the_wait() {
    let env = TestEnv::start().await;
    let wait = Duration::from_millis(400);
    let old = start_worker(&env, Registration::of::<RenderV1>(), wait).await;
    let id = enqueue_once::<Thumbnail>(&env).await;

    let reason = wait_dead_reason(&env, &id).await;
    for part in [
        "unknown job type `thumbnail` (version 1): no handler for it on the worker that took it",
        "no live worker has announced it",
        "register it on every worker that consumes the queue",
    ] {
        assert!(reason.contains(part), "{part:?} missing from: {reason}");
    }
    assert!(deferred(&env).await >= 1, "left for another worker first");
    let attempts = job_field(&env, &id, "attempts").await;
    assert_eq!(attempts.as_deref(), Some("0"), "the attempt is not counted");
    old.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn older_payload_is_dead_lettered_at_once() {
    let env = TestEnv::start().await;
    let new = start_worker(&env, Registration::of::<RenderV2>(), BOUND).await;
    let id = enqueue_once::<RenderV1>(&env).await;

    let reason = wait_dead_reason(&env, &id).await;
    assert!(reason.contains("unknown schema version 1"), "{reason}");
    assert_eq!(deferred(&env).await, 0);
    new.stop().await;
}
