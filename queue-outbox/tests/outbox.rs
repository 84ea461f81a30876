//! The outbox against a real PostgreSQL (`DATABASE_URL`, default
//! `postgres://postgres@127.0.0.1:5432/test`) and a throwaway redis-server.
//!
//! Each test uses its own outbox table (dropped at the end, even on panic) and
//! its own Redis, so tests run in parallel. With no PostgreSQL they fail,
//! unless `QUEUE_TEST_SKIP_POSTGRES=1` is set (then they pass as skipped).

use std::collections::{BTreeMap, HashSet};
use std::ops::ControlFlow;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use queue_core::{
    job, EnqueueOptions, EnqueueOutcome, Job, JobContext, JobError, Queue, QueueKeys, Worker,
    WorkerConfig,
};
use queue_outbox::tokio_postgres::Client;
use queue_outbox::{
    connect_postgres, Outbox, OutboxError, OutboxOutcome, ReconcileOptions, ReconcileRow,
    ReconcileStatus, Relay, RelayReport, RelayStep,
};
use queue_testkit::postgres::{self, DropTable};
use queue_testkit::RedisServer;
use serde::{Deserialize, Serialize};

const T: Duration = Duration::from_secs(20);

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Mail {
    pub to: String,
    pub n: u32,
}

fn mail(n: u32) -> Mail {
    Mail {
        to: format!("user{n}@example.com"),
        n,
    }
}

#[job(queue = "outbox_mail", max_attempts = 4)]
async fn send_mail(_ctx: JobContext, _args: Mail) -> Result<(), JobError> {
    Ok(())
}

#[job(queue = "outbox_mail", max_attempts = 2)]
async fn bounce(_ctx: JobContext, _args: Mail) -> Result<(), JobError> {
    Err(JobError::permanent("mailbox does not exist"))
}

/// A queue no worker of these tests serves: its jobs stay queued.
#[job(queue = "outbox_idle")]
async fn idle(_ctx: JobContext, _args: Mail) -> Result<(), JobError> {
    Ok(())
}

const MAIL_Q: &str = "outbox_mail";
const IDLE_Q: &str = "outbox_idle";

fn init_tracing() {
    static ONCE: OnceLock<()> = OnceLock::new();
    ONCE.get_or_init(|| {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(
                tracing_subscriber::EnvFilter::try_from_default_env()
                    .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
            )
            .with_test_writer()
            .try_init();
    });
}

/// One test's world. Field order is drop order: clients close before the
/// table is dropped.
struct Env {
    client: Client,
    queue: Queue,
    outbox: Outbox,
    db_url: String,
    redis: RedisServer,
    _table: DropTable,
}

impl Env {
    fn table(&self) -> &str {
        self.outbox.table()
    }

    async fn relay(&self) -> Relay {
        Relay::connect(self.outbox.clone(), &self.db_url, self.queue.clone())
            .await
            .expect("relay connects")
    }

    /// Stages `args` under `id` in its own committed transaction.
    async fn stage<J: Job>(&mut self, id: &str, args: &J::Args) {
        let tx = self.client.transaction().await.unwrap();
        let staged = self
            .outbox
            .enqueue_in_tx::<J>(&tx, args, Some(id.into()))
            .await
            .unwrap();
        assert!(staged.is_new(), "{id} staged");
        tx.commit().await.unwrap();
    }

    /// Stages rows Redis refuses on their own: the job key of each holds a
    /// string, so the enqueue script refuses the call before any write.
    async fn stage_refused(&mut self, ids: &[&str]) {
        for (n, id) in (0u32..).zip(ids) {
            self.stage::<send_mail::Job>(id, &mail(n)).await;
            let key = QueueKeys::new(MAIL_Q).job(id);
            self.redis.command(&["SET", &key, "corrupt"]).unwrap();
        }
    }

    /// Stages `id` and then gives its `extra` column `array_sql` by hand.
    async fn stage_with_extra(&mut self, id: &str, array_sql: &str) {
        self.stage::<send_mail::Job>(id, &mail(0)).await;
        self.execute(&format!(
            "UPDATE $T SET extra = {array_sql} WHERE job_id = '{id}'"
        ))
        .await;
    }

    /// Every row reconciliation lists now (no age bound); it must not fail.
    async fn reconcile_all(&self) -> Vec<ReconcileRow> {
        self.outbox
            .reconcile(&self.client, &self.queue, Duration::ZERO)
            .await
            .expect("reconcile succeeds")
    }

    async fn scalar(&self, sql_with_t: &str) -> i64 {
        let sql = sql_with_t.replace("$T", &format!("\"{}\"", self.table()));
        self.client.query_one(&sql, &[]).await.unwrap().get(0)
    }

    /// Runs a statement on the outbox table (`$T` stands for its quoted name).
    async fn execute(&self, sql_with_t: &str) {
        let sql = sql_with_t.replace("$T", &format!("\"{}\"", self.table()));
        self.client.execute(&sql, &[]).await.unwrap();
    }

    async fn unpublished(&self) -> i64 {
        self.scalar("SELECT count(*) FROM $T WHERE published_at IS NULL")
            .await
    }

    /// (published, attempts, last_error) of the row of `job_id`.
    async fn row(&self, job_id: &str) -> (bool, i32, Option<String>) {
        let sql = format!(
            "SELECT published_at IS NOT NULL, attempts, last_error FROM \"{}\" WHERE job_id = $1",
            self.table()
        );
        let r = self.client.query_one(&sql, &[&job_id]).await.unwrap();
        (r.get(0), r.get(1), r.get(2))
    }

    /// Blocks of the outbox's TOAST table (where large payloads live) read
    /// so far by every session, this one's included (its pending counts are
    /// flushed first).
    async fn toast_blocks_read(&self) -> i64 {
        self.client
            .batch_execute("SELECT pg_stat_force_next_flush()")
            .await
            .unwrap();
        self.scalar(
            "SELECT COALESCE(toast_blks_read, 0) + COALESCE(toast_blks_hit, 0) \
             FROM pg_statio_user_tables WHERE relid = '$T'::regclass",
        )
        .await
    }

    async fn enqueued(&self, queue: &str) -> i64 {
        self.queue.stats(queue).await.unwrap().counter("enqueued")
    }
}

async fn setup() -> Option<Env> {
    init_tracing();
    let db_url = postgres::require()?;
    let table = postgres::unique_name("outbox");
    let guard = DropTable::new(&db_url, &table);
    let client = connect_postgres(&db_url).await.expect("postgres connects");
    let outbox = Outbox::with_table(&table).expect("valid table name");
    outbox.migrate(&client).await.expect("migrate");
    let redis = RedisServer::start().expect("redis-server starts");
    let queue = Queue::connect(&redis.url()).await.expect("redis connects");
    Some(Env {
        client,
        queue,
        outbox,
        db_url,
        redis,
        _table: guard,
    })
}

/// The statuses of reconciled rows, in order.
fn statuses(rows: &[ReconcileRow]) -> Vec<&str> {
    rows.iter().map(|r| r.status.as_str()).collect()
}

fn break_at(name: &'static str) -> impl FnMut(&RelayStep<'_>) -> ControlFlow<()> {
    move |step| {
        if step.name() == name {
            ControlFlow::Break(())
        } else {
            ControlFlow::Continue(())
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn committed_rows_are_published_with_their_id_and_payload() {
    let Some(mut env) = setup().await else { return };
    let tx = env.client.transaction().await.unwrap();
    let keyed = env
        .outbox
        .enqueue_in_tx::<send_mail::Job>(&tx, &mail(1), Some("welcome-1".into()))
        .await
        .unwrap();
    let random = env
        .outbox
        .enqueue_in_tx::<send_mail::Job>(&tx, &mail(2), None)
        .await
        .unwrap();
    tx.commit().await.unwrap();
    assert_eq!(keyed.id.as_str(), "welcome-1");
    assert_eq!(
        (keyed.outcome, keyed.queue.as_str()),
        (OutboxOutcome::Inserted, MAIL_Q)
    );
    assert_eq!(random.id.as_str().len(), 36, "a UUID when no id is given");
    assert_eq!(
        env.queue.stats(MAIL_Q).await.unwrap().main,
        0,
        "nothing in Redis before the relay"
    );

    let mut relay = env.relay().await;
    let report = relay.publish_batch(100).await.unwrap();
    // RelayReport is #[non_exhaustive]: built from Default, fields set.
    let mut expected = RelayReport::default();
    expected.selected = 2;
    expected.published = 2;
    assert_eq!(report, expected);
    for (id, args) in [(&keyed.id, mail(1)), (&random.id, mail(2))] {
        let job = env
            .queue
            .job(MAIL_Q, id)
            .await
            .unwrap()
            .expect("job in redis");
        assert_eq!(
            job.payload,
            rmp_serde::to_vec_named(&args).unwrap(),
            "same payload bytes"
        );
        assert_eq!(job.field("type"), Some(send_mail::Job::NAME));
        assert_eq!(job.field("v"), Some("1"));
        assert_eq!(job.field("max_attempts"), Some("4"));
        assert_eq!(job.state(), Some("queued"));
        let (published, attempts, err) = env.row(id.as_str()).await;
        assert!(published);
        assert_eq!((attempts, err), (1, None));
    }
    let stats = env.queue.stats(MAIL_Q).await.unwrap();
    assert_eq!((stats.main, stats.counter("enqueued")), (2, 2));

    // Nothing left: the next batch is empty and sends nothing.
    assert_eq!(
        relay.publish_batch(100).await.unwrap(),
        RelayReport::default()
    );
    assert_eq!(env.enqueued(MAIL_Q).await, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rolled_back_rows_are_never_published() {
    let Some(mut env) = setup().await else { return };
    // Explicit rollback.
    let tx = env.client.transaction().await.unwrap();
    env.outbox
        .enqueue_in_tx::<send_mail::Job>(&tx, &mail(1), Some("rolled-back".into()))
        .await
        .unwrap();
    tx.rollback().await.unwrap();
    // A transaction dropped without commit (an error path with `?`).
    {
        let tx = env.client.transaction().await.unwrap();
        env.outbox
            .enqueue_in_tx::<send_mail::Job>(&tx, &mail(2), Some("dropped".into()))
            .await
            .unwrap();
    }
    // The business write fails after the enqueue: the whole transaction is void.
    let tx = env.client.transaction().await.unwrap();
    env.outbox
        .enqueue_in_tx::<send_mail::Job>(&tx, &mail(3), Some("failed-tx".into()))
        .await
        .unwrap();
    assert!(tx.execute("SELECT 1/0", &[]).await.is_err());
    // PostgreSQL answers COMMIT of a failed transaction with a rollback.
    let _ = tx.commit().await;

    let mut relay = env.relay().await;
    assert_eq!(
        relay.publish_batch(100).await.unwrap(),
        RelayReport::default()
    );
    assert_eq!(env.scalar("SELECT count(*) FROM $T").await, 0);
    assert_eq!(env.enqueued(MAIL_Q).await, 0);
    for id in ["rolled-back", "dropped", "failed-tx"] {
        assert!(
            env.queue.job(MAIL_Q, id).await.unwrap().is_none(),
            "{id} never reached Redis"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_business_key_is_staged_once_and_published_once() {
    let Some(mut env) = setup().await else { return };
    env.stage::<send_mail::Job>("order-9", &mail(1)).await;
    let tx = env.client.transaction().await.unwrap();
    let again = env
        .outbox
        .enqueue_in_tx::<send_mail::Job>(&tx, &mail(2), Some("order-9".into()))
        .await
        .unwrap();
    tx.commit().await.unwrap();
    assert_eq!(again.outcome, OutboxOutcome::Duplicate);
    assert!(!again.is_new());
    // The same id on another queue is another job.
    env.stage::<idle::Job>("order-9", &mail(3)).await;

    let mut relay = env.relay().await;
    let report = relay.publish_batch(100).await.unwrap();
    assert_eq!((report.published, report.duplicates), (2, 0));
    let job = env.queue.job(MAIL_Q, "order-9").await.unwrap().unwrap();
    assert_eq!(
        job.payload,
        rmp_serde::to_vec_named(&mail(1)).unwrap(),
        "the first row's payload"
    );
    assert!(env.queue.job(IDLE_Q, "order-9").await.unwrap().is_some());

    // Still a duplicate after it was published (the row stays until pruned).
    let tx = env.client.transaction().await.unwrap();
    let later = env
        .outbox
        .enqueue_in_tx::<send_mail::Job>(&tx, &mail(4), Some("order-9".into()))
        .await
        .unwrap();
    tx.commit().await.unwrap();
    assert_eq!(later.outcome, OutboxOutcome::Duplicate);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_job_ids_are_refused_before_anything_is_written() {
    let Some(mut env) = setup().await else { return };
    let tx = env.client.transaction().await.unwrap();
    for bad in ["", "line\nbreak", &"x".repeat(513)] {
        let err = env
            .outbox
            .enqueue_in_tx::<send_mail::Job>(&tx, &mail(1), Some(bad.into()))
            .await
            .unwrap_err();
        assert!(
            matches!(err, OutboxError::InvalidJob { .. }),
            "{bad:?}: {err}"
        );
        assert_eq!(err.queue(), Some(MAIL_Q));
    }
    // The transaction is still usable: nothing was sent to PostgreSQL.
    env.outbox
        .enqueue_in_tx::<send_mail::Job>(&tx, &mail(2), None)
        .await
        .unwrap();
    tx.commit().await.unwrap();
    assert_eq!(env.scalar("SELECT count(*) FROM $T").await, 1);
}

/// Extra field names the enqueue scripts refuse (a core field such as
/// `state`, an empty name, a name given twice) are refused when staged, like
/// a bad id: before, the row was inserted and the relay could never publish
/// it (it was retried for ever, then rejected only by its error text).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn extra_field_names_the_scripts_refuse_are_refused_when_staged() {
    let Some(mut env) = setup().await else { return };
    let tx = env.client.transaction().await.unwrap();
    let twice = EnqueueOptions {
        extra_fields: vec![
            ("group".to_string(), "a".to_string()),
            ("group".to_string(), "b".to_string()),
        ],
        ..EnqueueOptions::new()
    };
    for opts in [
        EnqueueOptions::new().extra_field("state", "x"),
        EnqueueOptions::new().extra_field("", "x"),
        twice,
    ] {
        let err = env
            .outbox
            .enqueue_in_tx_with::<send_mail::Job>(&tx, opts, &mail(1))
            .await
            .unwrap_err();
        assert!(matches!(err, OutboxError::InvalidJob { .. }), "{err}");
        assert_eq!(err.queue(), Some(MAIL_Q));
    }
    tx.commit().await.unwrap();
    assert_eq!(env.scalar("SELECT count(*) FROM $T").await, 0);
}

/// Crash point (a): the job reached Redis, the relay died before its commit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crash_after_redis_enqueue_is_resent_as_a_duplicate() {
    let Some(mut env) = setup().await else { return };
    for n in 0..3 {
        env.stage::<send_mail::Job>(&format!("a-{n}"), &mail(n))
            .await;
    }
    let mut relay = env.relay().await;

    // Dies after the second row was enqueued.
    let mut seen = 0;
    let err = relay
        .publish_batch_with_hook(100, |step| {
            if let RelayStep::AfterEnqueue(row, enqueued) = step {
                assert_eq!(enqueued.outcome, EnqueueOutcome::Created, "{}", row.job_id);
                seen += 1;
                if seen == 2 {
                    return ControlFlow::Break(());
                }
            }
            ControlFlow::Continue(())
        })
        .await
        .unwrap_err();
    match &err {
        OutboxError::Interrupted {
            step,
            job_id,
            queue,
        } => {
            assert_eq!(*step, "after_enqueue");
            assert_eq!(job_id.as_ref().map(|i| i.as_str()), Some("a-1"));
            assert_eq!(queue.as_deref(), Some(MAIL_Q));
        }
        other => panic!("unexpected {other}"),
    }
    assert_eq!(env.enqueued(MAIL_Q).await, 2, "two jobs reached Redis");
    assert_eq!(env.unpublished().await, 3, "none was marked published");

    // Dies with every row enqueued and marked, just before COMMIT.
    let err = relay
        .publish_batch_with_hook(100, break_at("before_commit"))
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            OutboxError::Interrupted {
                step: "before_commit",
                ..
            }
        ),
        "{err}"
    );
    assert_eq!(env.enqueued(MAIL_Q).await, 3);
    assert_eq!(env.unpublished().await, 3, "the marks were rolled back");

    // The next run re-sends everything; Redis writes nothing new.
    let report = relay.publish_batch(100).await.unwrap();
    assert_eq!((report.published, report.duplicates), (3, 3));
    let stats = env.queue.stats(MAIL_Q).await.unwrap();
    assert_eq!(
        (stats.main, stats.counter("enqueued")),
        (3, 3),
        "exactly one job per row"
    );
    assert_eq!(env.unpublished().await, 0);
    // Crashed batches leave no trace in the row: their updates rolled back.
    assert_eq!(env.row("a-0").await, (true, 1, None));
}

/// Crash point (a) when the job already ran: the re-send finds its completion record.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crash_after_enqueue_and_job_completed_is_not_run_again() {
    let Some(mut env) = setup().await else { return };
    env.stage::<send_mail::Job>("done-1", &mail(1)).await;
    let mut relay = env.relay().await;
    relay
        .publish_batch_with_hook(100, break_at("before_commit"))
        .await
        .unwrap_err();

    let (stop, join) = spawn_worker(&env).await;
    wait_for(T, "the job completes", || async {
        env.queue
            .completion(MAIL_Q, "done-1")
            .await
            .unwrap()
            .is_some()
    })
    .await;
    stop.shutdown();
    join.await.unwrap().unwrap();

    let mut steps = Vec::new();
    let report = relay
        .publish_batch_with_hook(100, |step| {
            if let RelayStep::AfterEnqueue(_, enqueued) = step {
                steps.push(enqueued.outcome.clone());
            }
            ControlFlow::Continue(())
        })
        .await
        .unwrap();
    assert_eq!(steps, vec![EnqueueOutcome::AlreadyCompleted]);
    assert_eq!((report.published, report.duplicates), (1, 1));
    let stats = env.queue.stats(MAIL_Q).await.unwrap();
    assert_eq!(
        (
            stats.main,
            stats.counter("enqueued"),
            stats.counter("completed")
        ),
        (0, 1, 1)
    );
}

/// Crash point (b): the relay died before sending anything.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crash_before_redis_enqueue_leaves_the_row_for_the_next_run() {
    let Some(mut env) = setup().await else { return };
    env.stage::<send_mail::Job>("b-1", &mail(1)).await;
    let mut relay = env.relay().await;
    let err = relay
        .publish_batch_with_hook(100, break_at("before_enqueue"))
        .await
        .unwrap_err();
    assert_eq!(err.job_id().map(|i| i.as_str()), Some("b-1"));
    assert!(env.queue.job(MAIL_Q, "b-1").await.unwrap().is_none());
    assert_eq!(env.row("b-1").await, (false, 0, None));

    // Another relay (a restarted process) picks it up.
    let mut other = env.relay().await;
    let report = other.publish_batch(100).await.unwrap();
    assert_eq!((report.published, report.duplicates), (1, 0));
    assert_eq!(env.enqueued(MAIL_Q).await, 1);
}

/// The relay's PostgreSQL session dies mid-batch (as when its process is
/// killed): the server rolls back, the relay reconnects and re-sends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_session_killed_mid_batch_rolls_back_and_relay_reconnects() {
    let Some(mut env) = setup().await else { return };
    for n in 0..4 {
        env.stage::<send_mail::Job>(&format!("k-{n}"), &mail(n))
            .await;
    }
    let app = postgres::unique_name("relay");
    let sep = if env.db_url.contains('?') { '&' } else { '?' };
    let relay_url = format!("{}{sep}application_name={app}", env.db_url);
    let mut relay = Relay::connect(env.outbox.clone(), &relay_url, env.queue.clone())
        .await
        .unwrap();

    // The hook is synchronous: kill the session from another connection
    // while the relay waits (a multi-threaded runtime allows the block).
    let killer = &env.client;
    let kill_sql = "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity \
                    WHERE application_name = $1";
    let err = relay
        .publish_batch_with_hook(100, |step| {
            if let RelayStep::BeforeCommit { .. } = step {
                let killed: i64 = tokio::task::block_in_place(|| {
                    tokio::runtime::Handle::current()
                        .block_on(killer.query_one(kill_sql, &[&app]))
                        .expect("pg_terminate_backend")
                        .get(0)
                });
                assert_eq!(killed, 1, "the relay's backend was terminated");
            }
            ControlFlow::Continue(())
        })
        .await
        .unwrap_err();
    assert!(matches!(err, OutboxError::Postgres { .. }), "{err}");
    assert_eq!(env.enqueued(MAIL_Q).await, 4);
    assert_eq!(
        env.unpublished().await,
        4,
        "the killed session's marks were rolled back"
    );

    // Same relay: it notices the closed connection and reconnects.
    let report = relay.publish_batch(100).await.unwrap();
    assert_eq!((report.published, report.duplicates), (4, 4));
    assert_eq!(env.queue.stats(MAIL_Q).await.unwrap().main, 4);
    assert_eq!(env.unpublished().await, 0);
}

/// Crash point (c): Redis is down during the relay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_down_keeps_the_row_unpublished_with_its_error_then_publishes() {
    let Some(mut env) = setup().await else { return };
    for n in 0..3 {
        env.stage::<send_mail::Job>(&format!("c-{n}"), &mail(n))
            .await;
    }
    let mut relay = env.relay().await;
    env.redis.kill();

    let report = relay
        .publish_batch(100)
        .await
        .expect("a redis error is reported, not raised");
    assert_eq!(
        (report.selected, report.published, report.failed),
        (3, 0, 1),
        "{report:?}"
    );
    assert!(report.stopped && report.error.is_some(), "{report:?}");
    let (published, attempts, last_error) = env.row("c-0").await;
    assert!(!published);
    assert_eq!(attempts, 1);
    let last_error = last_error.expect("last_error recorded");
    assert!(
        last_error.contains(MAIL_Q) && last_error.contains("c-0"),
        "{last_error}"
    );
    assert_eq!(
        env.row("c-1").await,
        (false, 0, None),
        "the batch stopped at the first error"
    );
    assert_eq!(env.unpublished().await, 3);

    env.redis.restart().expect("redis restarts");
    let start = Instant::now();
    let mut published = 0;
    while published < 3 {
        assert!(
            start.elapsed() < T,
            "rows not published after redis came back"
        );
        let report = relay.publish_batch(100).await.unwrap();
        published += report.published;
        if report.failed > 0 {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    assert_eq!(env.unpublished().await, 0);
    let stats = env.queue.stats(MAIL_Q).await.unwrap();
    assert_eq!((stats.main, stats.counter("enqueued")), (3, 3));
    let (published, attempts, last_error) = env.row("c-0").await;
    assert!(published && attempts >= 2);
    assert!(
        last_error.is_some(),
        "the last error is kept for the record"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_relays_publish_each_of_200_rows_once() {
    let Some(mut env) = setup().await else { return };
    for chunk in 0..4u32 {
        let tx = env.client.transaction().await.unwrap();
        for n in chunk * 50..(chunk + 1) * 50 {
            env.outbox
                .enqueue_in_tx::<send_mail::Job>(&tx, &mail(n), Some(format!("r-{n}").into()))
                .await
                .unwrap();
        }
        tx.commit().await.unwrap();
    }

    async fn drain(mut relay: Relay) -> RelayReport {
        let mut total = RelayReport::default();
        loop {
            let r = relay.publish_batch(10).await.unwrap();
            total.published += r.published;
            total.duplicates += r.duplicates;
            total.failed += r.failed;
            if r.selected == 0 {
                return total;
            }
        }
    }
    let a = tokio::spawn(drain(env.relay().await));
    let b = tokio::spawn(drain(env.relay().await));
    let (a, b) = (a.await.unwrap(), b.await.unwrap());
    eprintln!(
        "relay a published {}, relay b published {}",
        a.published, b.published
    );

    assert_eq!(a.published + b.published, 200);
    assert_eq!(
        (a.duplicates, b.duplicates, a.failed, b.failed),
        (0, 0, 0, 0),
        "no row was sent twice"
    );
    let stats = env.queue.stats(MAIL_Q).await.unwrap();
    assert_eq!((stats.main, stats.counter("enqueued")), (200, 200));
    assert_eq!(env.unpublished().await, 0);
    assert_eq!(env.scalar("SELECT max(attempts)::bigint FROM $T").await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rows_locked_by_another_relay_are_skipped_not_waited_for() {
    let Some(mut env) = setup().await else { return };
    for n in 0..20 {
        env.stage::<send_mail::Job>(&format!("s-{n:02}"), &mail(n))
            .await;
    }
    // Another relay holds the five oldest rows.
    let table = format!("\"{}\"", env.table());
    let holder = env.client.transaction().await.unwrap();
    let locked = holder
        .query(
            &format!("SELECT id FROM {table} ORDER BY id LIMIT 5 FOR UPDATE"),
            &[],
        )
        .await
        .unwrap();
    assert_eq!(locked.len(), 5);

    let mut relay = Relay::connect(env.outbox.clone(), &env.db_url, env.queue.clone())
        .await
        .unwrap();
    let report = tokio::time::timeout(Duration::from_secs(10), relay.publish_batch(100))
        .await
        .expect("the relay does not wait for locked rows")
        .unwrap();
    assert_eq!((report.selected, report.published), (15, 15));
    assert!(env.queue.job(MAIL_Q, "s-00").await.unwrap().is_none());
    assert!(env.queue.job(MAIL_Q, "s-05").await.unwrap().is_some());

    holder.rollback().await.unwrap();
    let report = relay.publish_batch(100).await.unwrap();
    assert_eq!(
        (report.selected, report.published, report.duplicates),
        (5, 5, 0)
    );
    assert_eq!(env.enqueued(MAIL_Q).await, 20);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reconcile_lists_unfinished_jobs_but_not_completed_ones() {
    let Some(mut env) = setup().await else { return };
    env.stage::<send_mail::Job>("done-1", &mail(1)).await; // completes
    env.stage::<idle::Job>("stuck-1", &mail(2)).await; // stays queued
    env.stage::<bounce::Job>("dead-1", &mail(3)).await; // dead-lettered
    env.stage::<idle::Job>("lost-1", &mail(4)).await; // vanishes from Redis
    let mut relay = env.relay().await;
    assert_eq!(relay.publish_batch(100).await.unwrap().published, 4);

    let (stop, join) = spawn_worker(&env).await;
    wait_for(T, "one completion and one dead letter", || async {
        let s = env.queue.stats(MAIL_Q).await.unwrap();
        s.counter("completed") == 1 && s.dead == 1
    })
    .await;
    stop.shutdown();
    join.await.unwrap().unwrap();

    // A job lost by Redis (e.g. a restart without persistence).
    let keys = queue_core::QueueKeys::new(IDLE_Q);
    env.redis.command(&["DEL", &keys.job("lost-1")]).unwrap();
    env.redis
        .command(&["LREM", &keys.main, "0", "lost-1"])
        .unwrap();

    // Rows no relay has seen yet.
    env.stage::<send_mail::Job>("unpub-old", &mail(5)).await;
    env.stage::<send_mail::Job>("unpub-new", &mail(6)).await;
    // Everything but unpub-new is two hours old.
    env.execute(
        "UPDATE $T SET created_at = now() - interval '2 hours' WHERE job_id <> 'unpub-new'",
    )
    .await;

    let rows = env
        .outbox
        .reconcile(&env.client, &env.queue, Duration::from_secs(3600))
        .await
        .unwrap();
    let found: BTreeMap<&str, &ReconcileStatus> = rows
        .iter()
        .map(|r| (r.job_id.as_str(), &r.status))
        .collect();
    assert_eq!(
        found,
        BTreeMap::from([
            ("dead-1", &ReconcileStatus::Dead),
            ("lost-1", &ReconcileStatus::Missing),
            ("stuck-1", &ReconcileStatus::Queued),
            ("unpub-old", &ReconcileStatus::Unpublished),
        ]),
        "{rows:#?}"
    );
    let dead = rows.iter().find(|r| r.job_id.as_str() == "dead-1").unwrap();
    assert!(
        dead.job_error
            .as_deref()
            .unwrap_or("")
            .contains("mailbox does not exist"),
        "{dead:?}"
    );
    assert_eq!(dead.job_attempts, Some(1));
    assert!(dead.published_at.is_some());
    let stuck = rows
        .iter()
        .find(|r| r.job_id.as_str() == "stuck-1")
        .unwrap();
    assert_eq!(
        (stuck.queue.as_str(), stuck.job_attempts),
        (IDLE_Q, Some(0))
    );
    assert!(stuck.age >= Duration::from_secs(7100) && stuck.age < Duration::from_secs(7300));
    let unpub = rows
        .iter()
        .find(|r| r.job_id.as_str() == "unpub-old")
        .unwrap();
    assert!(unpub.published_at.is_none() && unpub.job_attempts.is_none());
    let ids: Vec<i64> = rows.iter().map(|r| r.row_id).collect();
    assert!(ids.windows(2).all(|w| w[0] < w[1]), "oldest row first");

    // Window and limit.
    let recent_only =
        ReconcileOptions::new(Duration::from_secs(3600)).max_age(Duration::from_secs(1800));
    let none = env
        .outbox
        .reconcile_with(&env.client, &env.queue, &recent_only)
        .await
        .unwrap();
    assert!(none.is_empty(), "{none:?}");
    let two = ReconcileOptions::new(Duration::from_secs(3600)).limit(2);
    let first_two = env
        .outbox
        .reconcile_with(&env.client, &env.queue, &two)
        .await
        .unwrap();
    assert_eq!(
        first_two
            .iter()
            .map(|r| r.job_id.as_str())
            .collect::<Vec<_>>(),
        vec!["stuck-1", "dead-1"]
    );
    // Reconciliation changes nothing.
    assert_eq!(env.unpublished().await, 2);
}

/// A published row whose job key later holds another type (corrupt data in
/// Redis) is listed as `unreadable` with the error, and the rows after it
/// are still listed. Before, that one row's Redis error failed the whole
/// reconciliation.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reconcile_lists_a_row_whose_job_cannot_be_read() {
    let Some(mut env) = setup().await else { return };
    env.stage::<send_mail::Job>("broken-1", &mail(1)).await;
    env.stage::<send_mail::Job>("fine-2", &mail(2)).await;
    let report = env.relay().await.publish_batch(100).await.unwrap();
    assert_eq!(report.published, 2, "{report:?}");
    let key = QueueKeys::new(MAIL_Q).job("broken-1");
    env.redis.command(&["DEL", &key]).unwrap();
    env.redis.command(&["SET", &key, "corrupt"]).unwrap();
    let rows = env.reconcile_all().await;
    assert_eq!(statuses(&rows), ["unreadable", "queued"]);
    let error = rows[0].job_error.as_deref().unwrap_or_default();
    assert!(error.contains("WRONGTYPE"), "{error}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_row_that_can_never_be_published_is_rejected_not_retried() {
    let Some(mut env) = setup().await else { return };
    // Written by hand, bypassing enqueue_in_tx's checks.
    env.execute(
        "INSERT INTO $T (job_id, queue, job_type, schema_version, max_attempts, payload) \
         VALUES (E'bad\\nid', 'outbox_mail', 'send_mail', 1, 3, '\\x80'::bytea)",
    )
    .await;
    env.stage::<send_mail::Job>("good-1", &mail(1)).await;

    let mut relay = env.relay().await;
    let report = relay.publish_batch(100).await.unwrap();
    assert_eq!(
        (
            report.selected,
            report.published,
            report.rejected,
            report.failed
        ),
        (2, 1, 1, 0)
    );
    let rejected = env
        .client
        .query_one(
            &format!(
                "SELECT rejected_at IS NOT NULL, published_at IS NULL, last_error FROM \"{}\" WHERE job_id = E'bad\\nid'",
                env.table()
            ),
            &[],
        )
        .await
        .unwrap();
    assert!(rejected.get::<_, bool>(0) && rejected.get::<_, bool>(1));
    assert!(rejected.get::<_, String>(2).contains("control characters"));
    assert_eq!(
        relay.publish_batch(100).await.unwrap(),
        RelayReport::default(),
        "not picked again"
    );

    let rows = env.reconcile_all().await;
    assert_eq!(statuses(&rows), ["rejected", "queued"]);
    let stats = env.outbox.stats(&env.client).await.unwrap();
    assert_eq!(
        (stats.unpublished, stats.rejected, stats.published),
        (0, 1, 1)
    );
}

/// A row Redis refuses on its own (here: its job key holds a string, so
/// the script refuses the call before any write) keeps its error and is
/// tried again later, and the rows behind it are published. Before, the
/// batch stopped at it, and since it is the oldest it stopped every batch.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_row_redis_refuses_holds_back_no_other_row() {
    let Some(mut env) = setup().await else { return };
    env.stage_refused(&["poison-1"]).await;
    env.stage::<send_mail::Job>("fine-2", &mail(2)).await;
    let mut relay = env.relay().await;
    let report = relay.publish_batch(100).await.unwrap();
    assert_eq!(
        (report.published, report.failed, report.stopped),
        (1, 1, false),
        "{report:?}"
    );
    assert!(env.row("fine-2").await.0, "the row behind it is published");
    let (published, attempts, last_error) = env.row("poison-1").await;
    assert!(!published && attempts == 1, "{last_error:?}");
    // Repaired, it goes out once its retry time has come.
    let key = QueueKeys::new(MAIL_Q).job("poison-1");
    env.redis.command(&["DEL", &key]).unwrap();
    let start = Instant::now();
    while relay.publish_batch(100).await.unwrap().published == 0 {
        assert!(start.elapsed() < T, "the repaired row is not published");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(env.row("poison-1").await.1, 2, "sent once more");
}

/// Rows Redis keeps refusing wait for their own retry time instead of
/// being selected first again by every batch. Before, two of them filled
/// every batch of two (each batch marked them failed and selected them
/// again), so the row behind them was never published.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rows_redis_keeps_refusing_do_not_starve_the_rows_behind_them() {
    let Some(mut env) = setup().await else { return };
    env.stage_refused(&["poison-1", "poison-2"]).await;
    env.stage::<send_mail::Job>("fine-3", &mail(3)).await;
    let mut relay = env.relay().await;
    let mut published = 0;
    for _ in 0..3 {
        published += relay.publish_batch(2).await.unwrap().published;
    }
    assert_eq!(published, 1);
    assert!(
        env.row("fine-3").await.0,
        "the row behind them is published"
    );
    for id in ["poison-1", "poison-2"] {
        let (published, attempts, last_error) = env.row(id).await;
        assert!(!published && attempts >= 1, "{id}: {last_error:?}");
    }
}

/// A relay loop behind rows Redis keeps refusing still publishes at its
/// pace: a refused row is not a failure of Redis, so it neither backs the
/// loop off nor stops the "batch was full, go again" path. Before, every
/// batch held a refused row, each one doubled the wait (up to 30 s), and
/// 20 rows took minutes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_rows_do_not_slow_the_relay_loop_down() {
    let Some(mut env) = setup().await else { return };
    env.stage_refused(&["poison-1", "poison-2"]).await;
    for n in 0..20 {
        env.stage::<send_mail::Job>(&format!("fine-{n}"), &mail(n))
            .await;
    }
    let relay = env.relay().await.batch_size(3);
    let (tx_stop, run) = spawn_relay_loop(relay);
    wait_for(T, "20 fine rows in redis", || async {
        env.enqueued(MAIL_Q).await == 20
    })
    .await;
    tx_stop.send(()).unwrap();
    let summary = run.await.unwrap().unwrap();
    assert_eq!(
        (summary.published, summary.stopped, summary.errors),
        (20, 0, 0),
        "{summary:?}"
    );
    assert!(summary.failed >= 2, "{summary:?}");
}

/// A row whose `extra` cannot be sent (written by hand: a NULL element, two
/// dimensions, a name without its value) is rejected with the reason, and
/// the others are published; reconciliation lists it. Before, reading it
/// failed the whole batch (rolled back, the same row first again: the
/// relay stopped for good) and reconciliation.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_row_whose_extra_cannot_be_read_is_rejected_and_the_others_published() {
    let Some(mut env) = setup().await else { return };
    env.stage_with_extra("odd-1", "ARRAY['group', NULL]::text[]")
        .await;
    env.stage_with_extra("square-2", "ARRAY[['group', 'g'], ['rate_key', 'k']]")
        .await;
    env.stage_with_extra("half-3", "ARRAY['group']").await;
    env.stage::<send_mail::Job>("fine-4", &mail(4)).await;
    let mut relay = env.relay().await;
    let report = relay.publish_batch(100).await.unwrap();
    assert_eq!(
        (report.published, report.rejected, report.failed),
        (1, 3, 0),
        "{report:?}"
    );
    assert!(env.row("fine-4").await.0);
    for (id, why) in [
        ("odd-1", "NULL"),
        ("square-2", "dimensions"),
        ("half-3", "without its value"),
    ] {
        let (published, _, last_error) = env.row(id).await;
        assert!(!published);
        let last_error = last_error.unwrap_or_default();
        assert!(last_error.contains(why), "{id}: {last_error}");
    }
    let rows = env.reconcile_all().await;
    assert_eq!(
        statuses(&rows),
        ["rejected", "rejected", "rejected", "queued"]
    );
}

/// A hand-written row naming an extra field twice is rejected (IDEMPOTENCY
/// section 6: a name given twice is refused), the others published. Before,
/// it was published with the last value.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_row_naming_an_extra_field_twice_is_rejected_not_published_with_the_last_value() {
    let Some(mut env) = setup().await else { return };
    env.stage_with_extra("twice-1", "ARRAY['group', 'a', 'group', 'b']")
        .await;
    env.stage::<send_mail::Job>("fine-2", &mail(2)).await;
    let report = env.relay().await.publish_batch(100).await.unwrap();
    assert_eq!(
        (report.published, report.rejected, report.failed),
        (1, 1, 0),
        "{report:?}"
    );
    let (published, _, last_error) = env.row("twice-1").await;
    assert!(!published);
    let last_error = last_error.unwrap_or_default();
    assert!(last_error.contains("given twice"), "{last_error}");
    assert!(env.queue.job(MAIL_Q, "twice-1").await.unwrap().is_none());
    assert_eq!(statuses(&env.reconcile_all().await), ["rejected", "queued"]);
}

/// A row whose extra field has a name the enqueue script refuses (a core
/// job field such as `token`, written by hand) is rejected: the same
/// arguments are refused every time. Before, the refusal counted as an
/// error of that row's data, and the row was retried forever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_row_with_a_core_field_as_extra_name_is_rejected_not_retried() {
    let Some(mut env) = setup().await else { return };
    env.stage::<send_mail::Job>("fine-1", &mail(1)).await;
    env.stage_with_extra("bad-2", "ARRAY['token', 'x']").await;
    let mut relay = env.relay().await;
    let report = relay.publish_batch(100).await.unwrap();
    assert_eq!(
        (report.published, report.rejected, report.failed),
        (1, 1, 0),
        "{report:?}"
    );
    let (published, _, last_error) = env.row("bad-2").await;
    assert!(!published);
    let last_error = last_error.unwrap_or_default();
    // Refused by queue-core's own check before sending (it names the field).
    assert!(
        last_error.contains("extra field") && last_error.contains("token"),
        "{last_error}"
    );
    assert!(env.queue.job(MAIL_Q, "bad-2").await.unwrap().is_none());
    assert_eq!(
        env.outbox.stats(&env.client).await.unwrap().rejected,
        1,
        "rejected, not waiting for a retry"
    );
}

/// A row whose `run_at` is `infinity` (written by hand, say to park it) is
/// rejected, naming why; the others are published. Before, `infinity -
/// now()` failed the whole `SELECT`, so no row was published again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_row_run_at_infinity_is_rejected_and_the_others_published() {
    let Some(mut env) = setup().await else { return };
    env.stage::<send_mail::Job>("parked-1", &mail(1)).await;
    env.stage::<send_mail::Job>("fine-2", &mail(2)).await;
    env.execute("UPDATE $T SET run_at = 'infinity' WHERE job_id = 'parked-1'")
        .await;
    let mut relay = env.relay().await;
    let report = relay.publish_batch(100).await.unwrap();
    assert_eq!((report.published, report.rejected), (1, 1), "{report:?}");
    let (published, _, last_error) = env.row("parked-1").await;
    assert!(!published);
    assert!(last_error.unwrap_or_default().contains("finite"));
    assert!(env.row("fine-2").await.0);
}

/// A job's extra fields (a group, a rate key) go through the outbox: the
/// relay enqueues the job with them, so fair queuing and per-key limits
/// apply to it. Before, the outbox dropped them without a word.
/// A row whose payload is longer than the relay's `Queue` sends
/// (`Queue::with_max_arg_len`, set to the server's `proto-max-bulk-len`)
/// is rejected with the reason, and the rows behind it, of its queue and of
/// another, are published. Before, queue-core's refusal was taken for a
/// failure of Redis: the row was marked failed, the batch stopped, and
/// every later batch selected it first again, so nothing behind it was
/// ever published.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversized_row_is_rejected_and_the_rows_behind_it_published() {
    let Some(mut env) = setup().await else { return };
    let limit = 256;
    let big = Mail {
        to: "x".repeat(limit * 2),
        n: 0,
    };
    env.stage::<send_mail::Job>("huge-1", &big).await;
    env.stage::<send_mail::Job>("fine-2", &mail(2)).await;
    env.stage::<idle::Job>("fine-3", &mail(3)).await;
    let queue = env.queue.clone().with_max_arg_len(limit);
    let mut relay = Relay::connect(env.outbox.clone(), &env.db_url, queue)
        .await
        .expect("relay connects");

    let report = relay.publish_batch(100).await.unwrap();
    assert_eq!(
        (
            report.published,
            report.rejected,
            report.failed,
            report.stopped
        ),
        (2, 1, 0, false),
        "{report:?}"
    );
    assert!(env.row("fine-2").await.0 && env.row("fine-3").await.0);
    assert_eq!(
        (env.enqueued(MAIL_Q).await, env.enqueued(IDLE_Q).await),
        (1, 1)
    );
    let (published, _, last_error) = env.row("huge-1").await;
    let last_error = last_error.unwrap_or_default();
    assert!(!published, "{last_error}");
    assert!(
        last_error.contains("payload") && last_error.contains(&format!("{limit} bytes")),
        "the reason names the payload and the limit: {last_error}"
    );
    assert_eq!(env.outbox.stats(&env.client).await.unwrap().rejected, 1);
    assert_eq!(
        relay.publish_batch(100).await.unwrap(),
        RelayReport::default(),
        "not picked again"
    );
    assert!(env.queue.job(MAIL_Q, "huge-1").await.unwrap().is_none());
}

/// Staging refuses a payload, or an extra field value, longer than
/// `Outbox::with_max_arg_len` (the server's `proto-max-bulk-len`) with the
/// reason, writing nothing: the relay could never send it. Before, it was
/// staged and only the relay found out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversized_job_is_refused_when_staged() {
    let Some(mut env) = setup().await else { return };
    let limit = 256;
    let outbox = env.outbox.clone().with_max_arg_len(limit);
    let big = Mail {
        to: "x".repeat(limit * 2),
        n: 0,
    };
    let tx = env.client.transaction().await.unwrap();
    for (opts, args, what) in [
        (EnqueueOptions::new().id("huge-1"), &big, "payload"),
        (
            EnqueueOptions::new()
                .id("huge-2")
                .extra_field("group", "g".repeat(limit + 1)),
            &mail(2),
            "extra field `group`",
        ),
    ] {
        let err = outbox
            .enqueue_in_tx_with::<send_mail::Job>(&tx, opts, args)
            .await
            .unwrap_err();
        assert!(matches!(err, OutboxError::InvalidJob { .. }), "{err}");
        let text = err.to_string();
        assert!(
            text.contains(what) && text.contains(&format!("{limit} bytes")),
            "{text}"
        );
    }
    outbox
        .enqueue_in_tx::<send_mail::Job>(&tx, &mail(3), Some("fine-3".into()))
        .await
        .unwrap();
    tx.commit().await.unwrap();
    assert_eq!(env.scalar("SELECT count(*) FROM $T").await, 1);
}

/// A `run_at` PostgreSQL cannot hold (a "never" such as `UNIX_EPOCH +
/// i64::MAX` seconds, or as far before) is refused when staged, naming the
/// job and the queue, and nothing is written; the last instant it can hold
/// is staged. Before, the driver's conversion overflowed: a panic in a debug
/// build, and in a release one a time in 1969, so the job ran at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_at_beyond_what_postgres_holds_is_refused_when_staged() {
    let Some(mut env) = setup().await else { return };
    let epoch = std::time::UNIX_EPOCH;
    let never = epoch + Duration::from_secs(i64::MAX as u64);
    // 294277-01-01T00:00:00Z, PostgreSQL's END_TIMESTAMP.
    let end = epoch + Duration::from_secs(9_224_318_016_000);
    let tx = env.client.transaction().await.unwrap();
    for (id, at) in [
        ("never-1", never),
        ("never-2", epoch - Duration::from_secs(i64::MAX as u64)),
        ("end-3", end),
    ] {
        let opts = EnqueueOptions::new().id(id).run_at(at);
        let err = env
            .outbox
            .enqueue_in_tx_with::<send_mail::Job>(&tx, opts, &mail(1))
            .await
            .unwrap_err();
        assert!(matches!(err, OutboxError::InvalidJob { .. }), "{err}");
        assert_eq!(err.queue(), Some(MAIL_Q));
        let text = err.to_string();
        assert!(text.contains(id) && text.contains("run_at"), "{text}");
    }
    let last = EnqueueOptions::new()
        .id("last-4")
        .run_at(end - Duration::from_micros(1));
    env.outbox
        .enqueue_in_tx_with::<send_mail::Job>(&tx, last, &mail(4))
        .await
        .expect("the last instant PostgreSQL holds is staged");
    tx.commit().await.unwrap();
    assert_eq!(env.scalar("SELECT count(*) FROM $T").await, 1);
    assert_eq!(
        env.scalar("SELECT extract(year FROM run_at AT TIME ZONE 'UTC')::bigint FROM $T")
            .await,
        294_276
    );
}

/// Reconciliation reads no payload: rows of a few MiB each are listed as
/// before (unpublished, rejected, missing from Redis) and not one block of
/// the table's TOAST storage, where such payloads live, is read. Before,
/// every page selected the payloads (up to 512 MiB a row, 500 rows a page)
/// and never used them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reconcile_reads_no_payload_of_large_rows() {
    let Some(mut env) = setup().await else { return };
    for (n, id) in (0u32..).zip(["big-unpublished", "big-rejected", "big-lost"]) {
        let big = Mail {
            to: format!("{id}:{}", "x".repeat(4 << 20)),
            n,
        };
        env.stage::<send_mail::Job>(id, &big).await;
    }
    env.execute("UPDATE $T SET rejected_at = now() WHERE job_id = 'big-rejected'")
        .await;
    // Published, then lost by Redis (never enqueued there).
    env.execute("UPDATE $T SET published_at = now() WHERE job_id = 'big-lost'")
        .await;
    let before = env.toast_blocks_read().await;

    let rows = env.reconcile_all().await;
    assert_eq!(statuses(&rows), ["unpublished", "rejected", "missing"]);
    assert_eq!(
        rows.iter().map(|r| r.job_id.as_str()).collect::<Vec<_>>(),
        ["big-unpublished", "big-rejected", "big-lost"]
    );
    let read = env.toast_blocks_read().await - before;
    assert_eq!(read, 0, "reconcile read {read} blocks of payload");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn extra_fields_reach_the_job_through_the_relay() {
    let Some(mut env) = setup().await else { return };
    let tx = env.client.transaction().await.unwrap();
    let opts = EnqueueOptions::new()
        .id("x-1")
        .group("tenant-1")
        .rate_key("acct-1");
    env.outbox
        .enqueue_in_tx_with::<send_mail::Job>(&tx, opts, &mail(1))
        .await
        .unwrap();
    tx.commit().await.unwrap();
    let mut relay = env.relay().await;
    assert_eq!(relay.publish_batch(100).await.unwrap().published, 1);
    let keys = QueueKeys::new(MAIL_Q);
    let fields: Vec<Option<String>> = redis::cmd("HMGET")
        .arg(keys.job("x-1"))
        .arg("group")
        .arg("rate_key")
        .query_async(&mut env.queue.connection())
        .await
        .unwrap();
    assert_eq!(
        fields,
        [Some("tenant-1".to_string()), Some("acct-1".to_string())]
    );
    let grouped: Vec<String> = redis::cmd("LRANGE")
        .arg(keys.group("tenant-1"))
        .arg(0)
        .arg(-1)
        .query_async(&mut env.queue.connection())
        .await
        .unwrap();
    assert_eq!(grouped, ["x-1"], "waiting in its group's list");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_table_of_the_wrong_shape_is_an_error_not_a_panic() {
    let Some(env) = setup().await else { return };
    let table = postgres::unique_name("badshape");
    let _guard = DropTable::new(&env.db_url, &table);
    let sql = format!(
        "CREATE TABLE \"{table}\" (id bigserial primary key, job_id text, queue text, job_type text,
            schema_version text, max_attempts int, payload bytea, created_at timestamptz default now(),
            published_at timestamptz, rejected_at timestamptz, attempts int default 0, last_error text,
            run_at timestamptz, extra text[], next_attempt_at timestamptz);
         INSERT INTO \"{table}\" (job_id, queue, job_type, schema_version, max_attempts, payload)
            VALUES ('x', 'outbox_mail', 'send_mail', 'one', 3, '\\x80'::bytea);"
    );
    env.client.batch_execute(&sql).await.unwrap();
    let outbox = Outbox::with_table(&table).unwrap();
    let mut relay = Relay::connect(outbox.clone(), &env.db_url, env.queue.clone())
        .await
        .unwrap();
    let err = relay.publish_batch(10).await.unwrap_err();
    assert!(
        matches!(&err, OutboxError::InvalidRow { reason, .. } if reason.contains("schema_version")),
        "{err}"
    );
    assert_eq!(err.job_id().map(|i| i.as_str()), Some("x"));
    // Reconciliation reads no `schema_version` (nor payload): it lists the
    // row, which no relay can publish.
    let rows = outbox
        .reconcile(&env.client, &env.queue, Duration::ZERO)
        .await
        .expect("reconcile reads only the columns it reports");
    assert_eq!(statuses(&rows), ["unpublished"], "{rows:?}");
    drop(relay);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_until_publishes_rows_as_they_commit_and_stops() {
    let Some(mut env) = setup().await else { return };
    let relay = env.relay().await.batch_size(7);
    let (tx_stop, run) = spawn_relay_loop(relay);
    for n in 0..30 {
        env.stage::<send_mail::Job>(&format!("live-{n}"), &mail(n))
            .await;
    }
    wait_for(T, "30 jobs in redis", || async {
        env.enqueued(MAIL_Q).await == 30
    })
    .await;
    tx_stop.send(()).unwrap();
    let summary = tokio::time::timeout(Duration::from_secs(10), run)
        .await
        .expect("the relay stops")
        .unwrap()
        .unwrap();
    assert_eq!(
        (summary.published, summary.duplicates, summary.errors),
        (30, 0, 0),
        "{summary:?}"
    );
    assert!(summary.batches >= 5, "batches of 7: {summary:?}");
    assert_eq!(env.unpublished().await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delay_counts_from_the_insert_and_reaches_redis() {
    let Some(mut env) = setup().await else { return };
    let tx = env.client.transaction().await.unwrap();
    let opts = EnqueueOptions::new()
        .id("later-1")
        .delay(Duration::from_secs(3600))
        .max_attempts(9);
    env.outbox
        .enqueue_in_tx_with::<send_mail::Job>(&tx, opts, &mail(1))
        .await
        .unwrap();
    env.outbox
        .enqueue_in_tx_with::<send_mail::Job>(&tx, EnqueueOptions::new().id("now-1"), &mail(2))
        .await
        .unwrap();
    tx.commit().await.unwrap();
    // The relay runs ten minutes after the insert.
    env.execute(
        "UPDATE $T SET created_at = created_at - interval '10 minutes', run_at = run_at - interval '10 minutes'",
    )
    .await;
    // An absolute time takes precedence over a delay.
    let at = std::time::SystemTime::now() + Duration::from_secs(7200);
    let tx = env.client.transaction().await.unwrap();
    let opts = EnqueueOptions::new()
        .id("at-1")
        .run_at(at)
        .delay(Duration::from_secs(1));
    env.outbox
        .enqueue_in_tx_with::<send_mail::Job>(&tx, opts, &mail(3))
        .await
        .unwrap();
    // Options the outbox cannot carry are refused, not dropped.
    for opts in [
        EnqueueOptions::new().once_for(Duration::from_secs(60)),
        EnqueueOptions::new().wait_for_replicas(1, Duration::from_secs(1)),
    ] {
        let err = env
            .outbox
            .enqueue_in_tx_with::<send_mail::Job>(&tx, opts, &mail(4))
            .await
            .unwrap_err();
        assert!(matches!(err, OutboxError::InvalidJob { .. }), "{err}");
    }
    tx.commit().await.unwrap();

    let mut relay = env.relay().await;
    assert_eq!(relay.publish_batch(100).await.unwrap().published, 3);
    let at_job = env.queue.job(MAIL_Q, "at-1").await.unwrap().unwrap();
    let run_at: i64 = at_job.field("run_at").unwrap().parse().unwrap();
    let want = at
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64;
    assert_eq!(at_job.state(), Some("delayed"));
    assert!((run_at - want).abs() < 2_000, "run_at {run_at} vs {want}");
    let later = env.queue.job(MAIL_Q, "later-1").await.unwrap().unwrap();
    assert_eq!(
        (later.state(), later.field("max_attempts")),
        (Some("delayed"), Some("9"))
    );
    let enqueued: i64 = later.field("enqueued_at").unwrap().parse().unwrap();
    let run_at: i64 = later.field("run_at").unwrap().parse().unwrap();
    let remaining = Duration::from_millis((run_at - enqueued) as u64);
    assert!(
        remaining > Duration::from_secs(49 * 60) && remaining <= Duration::from_secs(50 * 60),
        "the 10 minutes already waited are subtracted: {remaining:?}"
    );
    let now = env.queue.job(MAIL_Q, "now-1").await.unwrap().unwrap();
    assert_eq!(now.state(), Some("queued"));
}

/// A delay counts from the insert, not from the start of the business
/// transaction that staged it. Before, `run_at` was `now() + delay`, and
/// `now()` is the transaction's start: a job staged 1.5 s into its
/// transaction lost 1.5 s of its delay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delay_counts_from_the_insert_not_from_the_transaction_start() {
    let Some(env) = setup().await else { return };
    let mut client = connect_postgres(&env.db_url).await.unwrap();
    let tx = client.transaction().await.unwrap();
    tx.execute("SELECT pg_sleep(1.5)", &[]).await.unwrap();
    let before: std::time::SystemTime = tx
        .query_one("SELECT clock_timestamp()", &[])
        .await
        .unwrap()
        .get(0);
    let opts = EnqueueOptions::new()
        .id("later-1")
        .delay(Duration::from_secs(5));
    env.outbox
        .enqueue_in_tx_with::<send_mail::Job>(&tx, opts, &mail(1))
        .await
        .unwrap();
    let sql = format!(
        "SELECT run_at, clock_timestamp() FROM \"{}\" WHERE job_id = 'later-1'",
        env.table()
    );
    let row = tx.query_one(&sql, &[]).await.unwrap();
    let (run_at, after): (std::time::SystemTime, std::time::SystemTime) = (row.get(0), row.get(1));
    tx.commit().await.unwrap();
    let from_before = run_at.duration_since(before).unwrap_or_default();
    assert!(
        from_before >= Duration::from_secs(5),
        "run_at is 5 s after a time read before the insert: {from_before:?}"
    );
    let from_after = run_at.duration_since(after).unwrap_or_default();
    assert!(
        from_after >= Duration::from_millis(4_500),
        "run_at is about 5 s after the insert: {from_after:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stats_and_prune() {
    let Some(mut env) = setup().await else { return };
    for n in 0..5 {
        env.stage::<send_mail::Job>(&format!("p-{n}"), &mail(n))
            .await;
    }
    let mut relay = env.relay().await;
    relay.publish_batch(3).await.unwrap();
    let stats = env.outbox.stats(&env.client).await.unwrap();
    assert_eq!(
        (stats.unpublished, stats.rejected, stats.published),
        (2, 0, 3)
    );
    assert!(stats.oldest_unpublished.is_some());

    // Nothing published long enough ago.
    assert_eq!(
        env.outbox
            .prune(&env.client, Duration::from_secs(3600))
            .await
            .unwrap(),
        0
    );
    // Created before it was published, as every row is (prune reads the
    // oldest rows through the created_at index).
    env.execute(
        "UPDATE $T SET created_at = created_at - interval '2 days', \
                       published_at = published_at - interval '2 days' \
         WHERE published_at IS NOT NULL",
    )
    .await;
    assert_eq!(
        env.outbox
            .prune(&env.client, Duration::from_secs(86_400))
            .await
            .unwrap(),
        3
    );
    let stats = env.outbox.stats(&env.client).await.unwrap();
    assert_eq!(
        (stats.unpublished, stats.published),
        (2, 0),
        "unpublished rows are never pruned"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrate_is_idempotent_and_safe_to_run_concurrently() {
    let Some(mut env) = setup().await else { return };
    env.outbox.migrate(&env.client).await.unwrap();
    // A table made before `next_attempt_at` gets it, and relays again.
    env.execute("ALTER TABLE $T DROP COLUMN next_attempt_at")
        .await;
    env.stage::<send_mail::Job>("old-1", &mail(1)).await;
    env.outbox.migrate(&env.client).await.unwrap();
    let report = env.relay().await.publish_batch(10).await.unwrap();
    assert_eq!(report.published, 1, "{report:?}");

    let table = postgres::unique_name("concur");
    let _guard = DropTable::new(&env.db_url, &table);
    let outbox = Outbox::with_table(&table).unwrap();
    let mut tasks = Vec::new();
    for _ in 0..4 {
        let (outbox, url) = (outbox.clone(), env.db_url.clone());
        tasks.push(tokio::spawn(async move {
            let client = connect_postgres(&url).await.unwrap();
            outbox.migrate(&client).await
        }));
    }
    for t in tasks {
        t.await.unwrap().expect("concurrent migrate succeeds");
    }
    let indexes: HashSet<String> = env
        .client
        .query(
            "SELECT indexname FROM pg_indexes WHERE tablename = $1",
            &[&table],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert!(
        indexes.contains(&format!("{table}_unpublished_idx")),
        "{indexes:?}"
    );
    assert!(
        indexes.contains(&format!("{table}_created_idx")),
        "{indexes:?}"
    );

    // Inside a caller's transaction, it commits (or not) with it.
    let table2 = postgres::unique_name("intx");
    let _guard2 = DropTable::new(&env.db_url, &table2);
    let mut client = connect_postgres(&env.db_url).await.unwrap();
    let tx = client.transaction().await.unwrap();
    Outbox::with_table(&table2)
        .unwrap()
        .migrate(&tx)
        .await
        .unwrap();
    tx.rollback().await.unwrap();
    let exists: bool = client
        .query_one("SELECT to_regclass($1) IS NOT NULL", &[&table2])
        .await
        .unwrap()
        .get(0);
    assert!(!exists, "rolled back with the caller's transaction");
}

/// A transaction on the outbox table that stays open (a relay batch waiting
/// for Redis): a row lock taken by `SELECT ... FOR UPDATE` on its own
/// connection. Roll it back (or drop it) to end it.
async fn hold_row_locks(env: &Env) -> Client {
    let holder = connect_postgres(&env.db_url).await.unwrap();
    holder.batch_execute("BEGIN").await.unwrap();
    let sql = format!("SELECT id FROM \"{}\" FOR UPDATE", env.table());
    assert!(!holder.query(&sql, &[]).await.unwrap().is_empty());
    holder
}

/// Runs `outbox.migrate` on a connection of its own, for at most 10 s.
async fn migrate_bounded(outbox: &Outbox, url: &str) -> Result<(), OutboxError> {
    let client = connect_postgres(url).await.unwrap();
    tokio::time::timeout(Duration::from_secs(10), outbox.migrate(&client))
        .await
        .expect("migrate ends within 10 s (it does not wait for the open transaction)")
}

/// Stages `id` on a connection of its own, for at most 10 s.
async fn stage_bounded(env: &Env, id: &str) {
    let mut writer = connect_postgres(&env.db_url).await.unwrap();
    tokio::time::timeout(Duration::from_secs(10), async {
        let tx = writer.transaction().await.unwrap();
        let staged = env
            .outbox
            .enqueue_in_tx::<send_mail::Job>(&tx, &mail(9), Some(id.into()))
            .await
            .unwrap();
        assert!(staged.is_new());
        tx.commit().await.unwrap();
    })
    .await
    .expect("an insert is not queued behind migrate");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrate_again_takes_no_lock_that_an_open_transaction_or_an_insert_waits_for() {
    let Some(mut env) = setup().await else { return };
    env.stage::<send_mail::Job>("held-1", &mail(1)).await;
    let holder = hold_row_locks(&env).await;
    // Nothing to change: it neither waits for the open transaction nor
    // makes the next insert wait behind it.
    migrate_bounded(&env.outbox, &env.db_url)
        .await
        .expect("migrate of an up-to-date table succeeds");
    stage_bounded(&env, "new-1").await;
    holder.batch_execute("ROLLBACK").await.unwrap();
    assert_eq!(env.unpublished().await, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_migration_that_must_change_the_table_gives_up_on_its_lock_instead_of_queueing_writers() {
    let Some(mut env) = setup().await else { return };
    env.execute("ALTER TABLE $T DROP COLUMN next_attempt_at")
        .await;
    env.stage::<send_mail::Job>("held-1", &mail(1)).await;
    let holder = hold_row_locks(&env).await;
    let err = migrate_bounded(&env.outbox, &env.db_url)
        .await
        .expect_err("the column cannot be added while the transaction is open");
    let OutboxError::Postgres { action, source, .. } = &err else {
        panic!("unexpected error: {err}");
    };
    assert_eq!(
        source.code(),
        Some(&queue_outbox::tokio_postgres::error::SqlState::LOCK_NOT_AVAILABLE),
        "{err}"
    );
    assert!(action.contains("lock_timeout"), "{err}");
    assert!(err.to_string().contains(env.table()), "{err}");
    holder.batch_execute("ROLLBACK").await.unwrap();
    migrate_bounded(&env.outbox, &env.db_url)
        .await
        .expect("migrate succeeds once the transaction ended");
    let columns: i64 = env
        .client
        .query_one(
            "SELECT count(*) FROM information_schema.columns \
             WHERE table_name = $1 AND column_name = 'next_attempt_at'",
            &[&env.table()],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(columns, 1, "added once the transaction ended");
}

/// `t` (through `search_path`) and `schema.t` are the same table: their
/// migrations serialise on one advisory lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrations_of_a_qualified_and_an_unqualified_name_serialise() {
    let Some(env) = setup().await else { return };
    let schema = postgres::TempSchema::create(&env.db_url).unwrap();
    let plain = Outbox::with_table("relay_rows").unwrap();
    let qualified = Outbox::with_table(&format!("{}.relay_rows", schema.name())).unwrap();
    migrate_bounded(&plain, schema.url()).await.unwrap();

    let first = connect_postgres(schema.url()).await.unwrap();
    first.batch_execute("BEGIN").await.unwrap();
    plain.migrate(&first).await.unwrap();
    let url = env.db_url.clone();
    let second = tokio::spawn(async move { migrate_bounded(&qualified, &url).await });
    wait_for(
        Duration::from_secs(10),
        "the second migration waits for the first's advisory lock",
        || async {
            env.client
                .query_one(
                    "SELECT count(*) FROM pg_stat_activity \
                     WHERE datname = current_database() AND wait_event = 'advisory' \
                       AND query LIKE 'DO $queue_migrate$%'",
                    &[],
                )
                .await
                .unwrap()
                .get::<_, i64>(0)
                > 0
        },
    )
    .await;
    first.batch_execute("COMMIT").await.unwrap();
    second
        .await
        .unwrap()
        .expect("the second migration succeeds");
}

/// Stages row `w-1` and sends it through a relay that waits for one
/// replica, which this server does not have: the row stays unpublished
/// (its job is on the primary). Returns that relay.
async fn held_back_by_replicas(env: &mut Env) -> Relay {
    env.stage::<send_mail::Job>("w-1", &mail(1)).await;
    let mut strict = env
        .relay()
        .await
        .wait_for_replicas(1, Duration::from_millis(100));
    let report = strict.publish_batch(100).await.unwrap();
    assert_eq!((report.published, report.failed), (0, 1), "{report:?}");
    strict
}

/// With `wait_for_replicas`, "published" means replicated: with no replica
/// the row stays unpublished (its job is on the primary), and is marked once
/// a relay that does not require replicas re-sends it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_that_waits_for_replicas_does_not_mark_unreplicated_rows() {
    let Some(mut env) = setup().await else { return };
    held_back_by_replicas(&mut env).await;
    let (published, attempts, last_error) = env.row("w-1").await;
    assert!(!published && attempts == 1);
    assert!(last_error.unwrap().contains("replicas"));
    assert!(
        env.queue.job(MAIL_Q, "w-1").await.unwrap().is_some(),
        "written on the primary"
    );

    let mut relaxed = env.relay().await;
    let report = relaxed.publish_batch(100).await.unwrap();
    assert_eq!((report.published, report.duplicates), (1, 1));
    assert_eq!(env.enqueued(MAIL_Q).await, 1);
}

/// With `wait_for_replicas` and no replica, a row whose job already ran is
/// published all the same: held back, it was sent again at every batch, and
/// once its completion record expired the re-send created the job anew, so
/// it ran twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_row_whose_job_ran_is_published_without_its_replicas() {
    let Some(mut env) = setup().await else { return };
    let mut strict = held_back_by_replicas(&mut env).await;
    let (shutdown, worker) = spawn_worker(&env).await;
    wait_for(Duration::from_secs(30), "the job ran", || async {
        env.queue.stats(MAIL_Q).await.unwrap().counter("completed") == 1
    })
    .await;
    shutdown.shutdown();
    worker.await.unwrap().unwrap();
    let report = strict.publish_batch(100).await.unwrap();
    assert_eq!((report.published, report.duplicates), (1, 1), "{report:?}");
    assert!(env.row("w-1").await.0);
    assert_eq!(env.enqueued(MAIL_Q).await, 1);
}

/// Runs `relay.run_until` (interval 50 ms) on a task until the sender fires.
fn spawn_relay_loop(
    relay: Relay,
) -> (
    tokio::sync::oneshot::Sender<()>,
    tokio::task::JoinHandle<queue_outbox::Result<queue_outbox::RelaySummary>>,
) {
    let (tx_stop, rx_stop) = tokio::sync::oneshot::channel::<()>();
    let run = tokio::spawn(relay.run_until(
        async move {
            let _ = rx_stop.await;
        },
        Duration::from_millis(50),
    ));
    (tx_stop, run)
}

async fn spawn_worker(
    env: &Env,
) -> (
    queue_core::ShutdownHandle,
    tokio::task::JoinHandle<queue_core::Result<()>>,
) {
    let config = WorkerConfig {
        concurrency: 2,
        block_timeout: Duration::from_millis(200),
        promote_interval: Duration::from_millis(50),
        grace: Duration::from_secs(2),
        ..WorkerConfig::default()
    };
    let worker = Worker::builder(&env.redis.url())
        .register(send_mail::handler())
        .register(bounce::handler())
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

async fn wait_for<F, Fut>(limit: Duration, what: &str, mut cond: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let start = Instant::now();
    while !cond().await {
        assert!(
            start.elapsed() < limit,
            "timed out after {limit:?} waiting for: {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
