//! The inbox against a real PostgreSQL (`DATABASE_URL`, default
//! `postgres://postgres@127.0.0.1:5432/test`): redelivery after commit,
//! rollback, fencing, concurrent deliveries, business keys, and the
//! operator calls (stats, prune, reconcile with the outbox).
//!
//! Each test has its own inbox and effect tables (dropped at the end, even on
//! panic), so tests run in parallel. Deliveries are `JobContext::for_test`
//! contexts, whose fencing token is the attempt number. With no PostgreSQL
//! they fail, unless `QUEUE_TEST_SKIP_POSTGRES=1` is set.

use std::sync::OnceLock;
use std::time::{Duration, Instant};

use queue_core::{job, JobContext, JobError};
use queue_inbox::tokio_postgres::{Client, NoTls, Transaction};
use queue_inbox::{Inbox, InboxError, InboxExt, InboxReconcileOptions, InboxStatus, DEFAULT_TABLE};
use queue_outbox::Outbox;
use queue_testkit::postgres::{self, DropTable};
use serde::{Deserialize, Serialize};

const T: Duration = Duration::from_secs(20);
const Q: &str = "inbox_billing";

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

async fn connect(url: &str) -> Client {
    let (client, conn) = queue_inbox::tokio_postgres::connect(url, NoTls)
        .await
        .expect("postgres connects");
    tokio::spawn(conn);
    client
}

/// One test's world: an inbox table and an effect table (one row per
/// applied effect). Field order is drop order: clients close first.
struct Env {
    client: Client,
    inbox: Inbox,
    effects: String,
    url: String,
    _guards: [DropTable; 2],
}

async fn setup() -> Option<Env> {
    init_tracing();
    let url = postgres::require()?;
    let inbox_table = postgres::unique_name("inbox");
    let effects = postgres::unique_name("fx");
    let guards = [
        DropTable::new(&url, &inbox_table),
        DropTable::new(&url, &effects),
    ];
    let client = connect(&url).await;
    let inbox = Inbox::with_table(&inbox_table).expect("valid table name");
    inbox.migrate(&client).await.expect("migrate");
    client
        .batch_execute(&format!(
            "CREATE TABLE \"{effects}\" (id bigserial PRIMARY KEY, job_id text NOT NULL)"
        ))
        .await
        .unwrap();
    Some(Env {
        client,
        inbox,
        effects,
        url,
        _guards: guards,
    })
}

impl Env {
    /// The business change: one effect row for the job.
    async fn apply(&self, tx: &Transaction<'_>, ctx: &JobContext) -> i64 {
        let sql = format!(
            "INSERT INTO \"{}\" (job_id) VALUES ($1) RETURNING id",
            self.effects
        );
        tx.query_one(&sql, &[&ctx.job_id().as_str()])
            .await
            .unwrap()
            .get(0)
    }

    async fn effects_of(&self, job_id: &str) -> i64 {
        let sql = format!(
            "SELECT count(*) FROM \"{}\" WHERE job_id = $1",
            self.effects
        );
        self.client
            .query_one(&sql, &[&job_id])
            .await
            .unwrap()
            .get(0)
    }

    /// A whole handler run on its own connection: claim, change, complete,
    /// commit. Returns whether it found the work already done.
    async fn deliver(&self, ctx: &JobContext, key: Option<&str>) -> Result<bool, InboxError> {
        let mut client = connect(&self.url).await;
        let tx = client.transaction().await.unwrap();
        let inbox = match key {
            Some(k) => self.inbox.delivery(ctx, &tx).key(k),
            None => self.inbox.delivery(ctx, &tx),
        };
        if inbox.already_done().await? {
            return Ok(true);
        }
        let entry = self.apply(&tx, ctx).await;
        inbox.complete(format!("fx-{entry}")).await?;
        tx.commit().await.unwrap();
        Ok(false)
    }

    /// Claims the row (it must not be done) and applies the change in `tx`.
    async fn claim_and_apply(&self, tx: &Transaction<'_>, ctx: &JobContext) {
        assert!(!self.inbox.delivery(ctx, tx).already_done().await.unwrap());
        self.apply(tx, ctx).await;
    }

    /// Claims the row and commits without completing it: a committed
    /// `running` row with this delivery's fence.
    async fn claim_and_commit(&self, ctx: &JobContext) {
        let mut client = connect(&self.url).await;
        let tx = client.transaction().await.unwrap();
        assert!(!self.inbox.delivery(ctx, &tx).already_done().await.unwrap());
        tx.commit().await.unwrap();
    }
}

#[tokio::test]
async fn redelivery_after_commit_is_acked_without_repeating_the_change() {
    let Some(env) = setup().await else { return };
    let first = JobContext::for_test("invoice-1", Q, 1);
    assert!(
        !env.deliver(&first, None).await.unwrap(),
        "first run does the work"
    );
    // The worker died after the commit, before the Redis ack: the job comes again.
    let again = JobContext::for_test("invoice-1", Q, 2);
    assert!(
        env.deliver(&again, None).await.unwrap(),
        "redelivery sees done"
    );
    assert_eq!(env.effects_of("invoice-1").await, 1);

    let rec = env
        .inbox
        .record(&env.client, Q, "invoice-1")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(rec.status, InboxStatus::Done);
    assert_eq!(
        (rec.fence, rec.attempts),
        (1, 1),
        "written by the first delivery"
    );
    assert!(rec.result_ref.as_deref().unwrap().starts_with("fx-"));
    assert!(rec.finished_at.is_some());
    assert!(
        rec.worker.ends_with(&format!(":{}", std::process::id())),
        "{}",
        rec.worker
    );
}

#[tokio::test]
async fn a_rolled_back_delivery_leaves_no_trace_and_the_next_one_does_the_work() {
    let Some(env) = setup().await else { return };
    let first = JobContext::for_test("invoice-2", Q, 1);
    {
        let mut client = connect(&env.url).await;
        let tx = client.transaction().await.unwrap();
        env.claim_and_apply(&tx, &first).await;
        env.inbox.delivery(&first, &tx).complete("x").await.unwrap();
        // Crash inside the transaction: dropped without commit.
    }
    assert_eq!(env.effects_of("invoice-2").await, 0);
    assert!(env
        .inbox
        .record(&env.client, Q, "invoice-2")
        .await
        .unwrap()
        .is_none());

    let retry = JobContext::for_test("invoice-2", Q, 2);
    assert!(!env.deliver(&retry, None).await.unwrap());
    assert_eq!(env.effects_of("invoice-2").await, 1);
    let rec = env
        .inbox
        .record(&env.client, Q, "invoice-2")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        (rec.status, rec.fence, rec.attempts),
        (InboxStatus::Done, 2, 2)
    );
}

#[tokio::test]
async fn a_stale_delivery_is_fenced_after_a_newer_one_wrote_the_row() {
    let Some(env) = setup().await else { return };
    let stale = JobContext::for_test("invoice-3", Q, 1);
    let newer = JobContext::for_test("invoice-3", Q, 2);
    // The newer delivery claimed the row and committed (e.g. a first phase).
    env.claim_and_commit(&newer).await;

    let err = env.deliver(&stale, None).await.unwrap_err();
    match &err {
        InboxError::Fenced {
            job_id,
            queue,
            key,
            fence,
            newer,
        } => {
            assert_eq!(
                (job_id.as_str(), queue.as_str(), key.as_str()),
                ("invoice-3", Q, "invoice-3")
            );
            assert_eq!((*fence, *newer), (1, 2));
        }
        other => panic!("expected Fenced, got {other}"),
    }
    assert!(err.is_permanent());
    assert!(!err.into_job_error().is_retryable());

    // complete() without a claim is refused by the fence too.
    let mut client = connect(&env.url).await;
    let tx = client.transaction().await.unwrap();
    let err = env
        .inbox
        .delivery(&stale, &tx)
        .complete("late")
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            InboxError::Fenced {
                fence: 1,
                newer: 2,
                ..
            }
        ),
        "{err}"
    );
    drop(tx);

    // A still newer delivery takes the row over and completes it.
    let newest = JobContext::for_test("invoice-3", Q, 3);
    assert!(!env.deliver(&newest, None).await.unwrap());
    assert_eq!(env.effects_of("invoice-3").await, 1);
    let rec = env
        .inbox
        .record(&env.client, Q, "invoice-3")
        .await
        .unwrap()
        .unwrap();
    assert_eq!((rec.status, rec.fence), (InboxStatus::Done, 3));
}

#[tokio::test]
async fn complete_without_a_claim_is_refused() {
    let Some(env) = setup().await else { return };
    let ctx = JobContext::for_test("invoice-4", Q, 1);
    let mut client = connect(&env.url).await;
    let tx = client.transaction().await.unwrap();
    let err = env
        .inbox
        .delivery(&ctx, &tx)
        .complete("x")
        .await
        .unwrap_err();
    assert!(
        matches!(&err, InboxError::NotClaimed { found, .. } if found == "no row"),
        "{err}"
    );
    let err = env
        .inbox
        .delivery(&ctx, &tx)
        .key("")
        .already_done()
        .await
        .unwrap_err();
    assert!(matches!(err, InboxError::InvalidKey { .. }), "{err}");
}

/// Waits until a backend waits for a lock in an insert into `table` (the
/// second delivery's claim).
async fn wait_for_lock_waiter(client: &Client, table: &str) {
    let start = Instant::now();
    let pattern = format!("INSERT INTO \"{table}\"%");
    loop {
        let n: i64 = client
            .query_one(
                "SELECT count(*) FROM pg_stat_activity \
                 WHERE datname = current_database() AND wait_event_type = 'Lock' \
                   AND query LIKE $1",
                &[&pattern],
            )
            .await
            .unwrap()
            .get(0);
        if n > 0 {
            return;
        }
        assert!(
            start.elapsed() < T,
            "the second delivery never waited for the first"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A first delivery of `job_id` claims the row and applies its change; a
/// second delivery starts meanwhile and must wait for it. The first then
/// commits (or rolls back). Returns what the second delivery's
/// `already_done()` said, and the job's effect count.
async fn second_delivery_during_the_first(
    job_id: &str,
    first_commits: bool,
) -> Option<(bool, i64)> {
    let env = std::sync::Arc::new(setup().await?);
    let first = JobContext::for_test(job_id, Q, 1);
    let mut client = connect(&env.url).await;
    let tx = client.transaction().await.unwrap();
    env.claim_and_apply(&tx, &first).await;
    // The lease expired meanwhile: a second delivery starts while the first
    // transaction is open.
    let second = tokio::spawn({
        let (env, id) = (env.clone(), job_id.to_string());
        async move { env.deliver(&JobContext::for_test(id, Q, 2), None).await }
    });
    wait_for_lock_waiter(&env.client, env.inbox.table()).await;
    assert!(!second.is_finished(), "it waits for the first transaction");
    if first_commits {
        env.inbox
            .delivery(&first, &tx)
            .complete("first")
            .await
            .unwrap();
        tx.commit().await.unwrap();
    } else {
        tx.rollback().await.unwrap();
    }
    let done = tokio::time::timeout(T, second)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    Some((done, env.effects_of(job_id).await))
}

#[tokio::test]
async fn a_concurrent_second_delivery_waits_then_sees_done() {
    let Some((done, effects)) = second_delivery_during_the_first("invoice-5", true).await else {
        return;
    };
    assert!(done, "the second delivery saw the first one's commit");
    assert_eq!(effects, 1);
}

#[tokio::test]
async fn a_concurrent_second_delivery_does_the_work_when_the_first_rolls_back() {
    let Some((done, effects)) = second_delivery_during_the_first("invoice-6", false).await else {
        return;
    };
    assert!(
        !done,
        "nothing committed: the second delivery does the work"
    );
    assert_eq!(effects, 1);
}

#[tokio::test]
async fn a_business_key_is_done_once_across_different_jobs() {
    let Some(env) = setup().await else { return };
    let key = "cust-7:2026-11";
    let a = JobContext::for_test("close-month-a", Q, 1);
    let b = JobContext::for_test("close-month-b", Q, 1);
    assert!(!env.deliver(&a, Some(key)).await.unwrap());
    assert!(
        env.deliver(&b, Some(key)).await.unwrap(),
        "same key, other job: done"
    );
    assert_eq!(env.effects_of("close-month-a").await, 1);
    assert_eq!(env.effects_of("close-month-b").await, 0);
    let rec = env
        .inbox
        .record(&env.client, Q, key)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(rec.job_id.as_str(), "close-month-a");
    // The job id itself has no row: the key replaced it.
    assert!(env
        .inbox
        .record(&env.client, Q, "close-month-a")
        .await
        .unwrap()
        .is_none());
}

/// A `ship_order` job keyed by `order-7` on a queue where a `send_invoice`
/// job with id `order-7` committed its effect. The key is per queue (the
/// documented contract), so the row is the invoice's: the shipping job is
/// refused with a permanent `KeyCollision` naming both types instead of
/// being told "already done" (before: `Ok(true)`, the order was never
/// shipped and nothing said why). A key shared on purpose still counts; a
/// row written before the `job_type` column (NULL) counts as before.
#[tokio::test]
async fn a_key_claimed_by_another_job_type_is_refused_not_taken_as_done() {
    let Some(env) = setup().await else { return };
    let invoice = JobContext::for_test_of_type("send_invoice", "order-7", Q, 1);
    assert!(!env.deliver(&invoice, None).await.unwrap());

    let ship = JobContext::for_test_of_type("ship_order", "ship-7", Q, 1);
    let err = env.deliver(&ship, Some("order-7")).await.unwrap_err();
    match &err {
        InboxError::KeyCollision {
            job_id,
            queue,
            key,
            owner,
        } => {
            assert_eq!(
                (job_id.as_str(), queue.as_str(), key.as_str()),
                ("ship-7", Q, "order-7")
            );
            assert_eq!(
                (
                    owner.job_type.as_deref(),
                    owner.job_id.as_str(),
                    owner.status
                ),
                (Some("send_invoice"), "order-7", InboxStatus::Done)
            );
        }
        other => panic!("expected KeyCollision, got {other:?}"),
    }
    assert_eq!(err.job_id().map(|id| id.as_str()), Some("ship-7"));
    assert!(
        !err.into_job_error().is_retryable(),
        "a collision is permanent"
    );
    assert_eq!(env.effects_of("ship-7").await, 0);

    // The same type with the same key: done once, as before.
    let again = JobContext::for_test_of_type("send_invoice", "order-7-again", Q, 1);
    assert!(env.deliver(&again, Some("order-7")).await.unwrap());

    // Sharing on purpose: the other type's done row counts.
    let mut client = connect(&env.url).await;
    let tx = client.transaction().await.unwrap();
    let shared = env
        .inbox
        .delivery(&ship, &tx)
        .key("order-7")
        .share_key_across_types();
    assert!(shared.already_done().await.unwrap());
    tx.rollback().await.unwrap();

    // A row from before the upgrade has no type: it counts for any type.
    env.client
        .execute(
            &format!(
                "UPDATE \"{}\" SET job_type = NULL WHERE key = 'order-7'",
                env.inbox.table()
            ),
            &[],
        )
        .await
        .unwrap();
    assert!(env.deliver(&ship, Some("order-7")).await.unwrap());
    let rec = env
        .inbox
        .record(&env.client, Q, "order-7")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(rec.job_type, None);
    assert_eq!(rec.job_id.as_str(), "order-7");
}

/// A table made by a version without the `job_type` column, with a done row:
/// `migrate` adds the column, the old row reads back (type `None`) and still
/// stops a redelivery; a new claim records its type.
#[tokio::test]
async fn migrate_adds_the_job_type_column_and_rows_from_before_still_count() {
    let Some(env) = setup().await else { return };
    let table = env.inbox.table().to_string();
    env.client
        .batch_execute(&format!("ALTER TABLE \"{table}\" DROP COLUMN job_type"))
        .await
        .unwrap();
    env.client
        .execute(
            &format!(
                "INSERT INTO \"{table}\" (queue, key, job_id, status, fence, attempts, worker, \
                 finished_at) VALUES ($1, 'old-1', 'old-1', 'done', 1, 1, 'w:1', now())"
            ),
            &[&Q],
        )
        .await
        .unwrap();
    env.inbox
        .migrate(&env.client)
        .await
        .expect("migrate adds the column");
    let old = env
        .inbox
        .record(&env.client, Q, "old-1")
        .await
        .unwrap()
        .unwrap();
    assert_eq!((old.status, old.job_type), (InboxStatus::Done, None));
    let redelivery = JobContext::for_test_of_type("charge", "old-1", Q, 2);
    assert!(env.deliver(&redelivery, None).await.unwrap());
    let fresh = JobContext::for_test_of_type("charge", "new-1", Q, 1);
    assert!(!env.deliver(&fresh, None).await.unwrap());
    let rec = env
        .inbox
        .record(&env.client, Q, "new-1")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(rec.job_type.as_deref(), Some("charge"));
}

/// A delivery whose inbox row another transaction holds (the worker of the
/// first delivery stopped without dying: its transaction stays open) fails
/// with the retryable `LockTimeout` naming the job and queue once the
/// inbox's lock timeout ran out, in both places it can wait: the claim's
/// insert (the other transaction's claim not committed) and the lock of an
/// existing row. Before, it waited as long as the other transaction stayed
/// open (the guard below fails on that). The handler's own statements keep
/// the transaction's `lock_timeout`.
#[tokio::test]
async fn a_delivery_behind_a_stuck_transaction_fails_retryably_within_the_lock_timeout() {
    let Some(mut env) = setup().await else { return };
    env.inbox = env
        .inbox
        .clone()
        .with_lock_timeout(Duration::from_millis(300));
    let expect_lock_timeout = |err: InboxError, what: &str| {
        match &err {
            InboxError::LockTimeout {
                job_id, queue, key, ..
            } => assert_eq!(
                (job_id.as_str(), queue.as_str(), key.as_str()),
                ("stuck-1", Q, "stuck-1"),
                "{what}"
            ),
            other => panic!("{what}: expected LockTimeout, got {other:?}"),
        }
        assert!(!err.is_permanent(), "{what}");
        assert!(err.into_job_error().is_retryable(), "{what}");
    };

    // 1. The first delivery's claim is not committed: the insert waits.
    let mut stuck = connect(&env.url).await;
    let open = stuck.transaction().await.unwrap();
    env.claim_and_apply(&open, &JobContext::for_test("stuck-1", Q, 1))
        .await;
    let second = tokio::time::timeout(T, env.deliver(&JobContext::for_test("stuck-1", Q, 2), None))
        .await
        .expect("the delivery gives up on the lock instead of waiting for the open transaction");
    expect_lock_timeout(second.unwrap_err(), "claim behind an uncommitted claim");
    open.rollback().await.unwrap();

    // 2. A committed row locked by another transaction: the row lock waits.
    env.claim_and_commit(&JobContext::for_test("stuck-1", Q, 3))
        .await;
    let open = stuck.transaction().await.unwrap();
    open.execute(
        &format!(
            "SELECT 1 FROM \"{}\" WHERE queue = $1 AND key = 'stuck-1' FOR UPDATE",
            env.inbox.table()
        ),
        &[&Q],
    )
    .await
    .unwrap();
    let third = tokio::time::timeout(T, env.deliver(&JobContext::for_test("stuck-1", Q, 4), None))
        .await
        .expect("the delivery gives up on the row lock instead of waiting");
    expect_lock_timeout(third.unwrap_err(), "lock of a committed row");
    open.rollback().await.unwrap();
    // Once the transaction ended, the next delivery takes the row over.
    assert!(!env
        .deliver(&JobContext::for_test("stuck-1", Q, 5), None)
        .await
        .unwrap());

    // The transaction's own lock_timeout is back after already_done().
    let mut client = connect(&env.url).await;
    let tx = client.transaction().await.unwrap();
    tx.batch_execute("SET LOCAL lock_timeout = '7s'")
        .await
        .unwrap();
    let ctx = JobContext::for_test("other-1", Q, 1);
    assert!(!env.inbox.delivery(&ctx, &tx).already_done().await.unwrap());
    let setting: String = tx.query_one("SHOW lock_timeout", &[]).await.unwrap().get(0);
    assert_eq!(setting, "7s");
    tx.rollback().await.unwrap();
}

/// A bound PostgreSQL cannot take (`lock_timeout` is at most `i32::MAX`
/// ms; `0 ms` is no bound) still lets deliveries claim their rows: a
/// `Duration::MAX` or 40-day bound waits without one, a sub-millisecond one
/// waits a millisecond. Before, the 40-day bound was sent as is, PostgreSQL
/// refused it, and every delivery failed (retried until dead-lettered,
/// never run); the sub-millisecond one was sent as `0ms`, no bound at all.
#[tokio::test]
async fn a_lock_timeout_postgres_cannot_take_does_not_fail_deliveries() {
    let Some(mut env) = setup().await else { return };
    for (n, bound) in [
        Duration::MAX,
        Duration::from_secs(40 * 86_400),
        Duration::from_micros(10),
    ]
    .into_iter()
    .enumerate()
    {
        env.inbox = env.inbox.clone().with_lock_timeout(bound);
        let id = format!("bound-{n}");
        let done = env
            .deliver(&JobContext::for_test(&id, Q, 1), None)
            .await
            .unwrap_or_else(|e| panic!("{bound:?}: {e:?}"));
        assert!(!done, "{bound:?}: a new key is claimed");
    }
}

#[tokio::test]
async fn the_context_extension_uses_the_default_table() {
    let Some(url) = postgres::require() else {
        return;
    };
    init_tracing();
    let mut client = connect(&url).await;
    Inbox::new().migrate(&client).await.unwrap();
    // A queue of its own in the shared default table.
    let queue = postgres::unique_name("q");
    let ctx = JobContext::for_test("job-1", &queue, 1);
    for expect_done in [false, true] {
        let tx = client.transaction().await.unwrap();
        let done = ctx
            .inbox(&tx)
            .already_done()
            .await
            .map_err(InboxError::into_job_error)
            .unwrap();
        assert_eq!(done, expect_done);
        if !done {
            ctx.inbox(&tx).complete("ref-1").await.unwrap();
            tx.commit().await.unwrap();
        }
    }
    let rec = Inbox::new()
        .record(&client, &queue, "job-1")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(rec.result_ref.as_deref(), Some("ref-1"));
    client
        .execute(
            &format!("DELETE FROM {DEFAULT_TABLE} WHERE queue = $1"),
            &[&queue],
        )
        .await
        .unwrap();
}

#[tokio::test]
async fn migrate_is_safe_from_several_connections_at_once() {
    let Some(url) = postgres::require() else {
        return;
    };
    let table = postgres::unique_name("inbox");
    let _guard = DropTable::new(&url, &table);
    let inbox = Inbox::with_table(&table).unwrap();
    let mut runs = Vec::new();
    for _ in 0..4 {
        let (url, inbox) = (url.clone(), inbox.clone());
        runs.push(tokio::spawn(async move {
            let client = connect(&url).await;
            inbox.migrate(&client).await
        }));
    }
    for r in runs {
        r.await.unwrap().expect("concurrent migrate succeeds");
    }
}

/// Running migrate again while a delivery's transaction is open (its claim
/// written, not committed: a handler waiting on something): nothing to
/// change, so it takes no lock on the table; neither it nor a third
/// connection's claim waits.
#[tokio::test]
async fn migrate_again_takes_no_lock_that_an_open_delivery_or_a_claim_waits_for() {
    let Some(env) = setup().await else { return };
    let mut holder = connect(&env.url).await;
    let open = holder.transaction().await.unwrap();
    env.claim_and_apply(&open, &JobContext::for_test("held-1", Q, 1))
        .await;

    let client = connect(&env.url).await;
    tokio::time::timeout(Duration::from_secs(10), env.inbox.migrate(&client))
        .await
        .expect("migrate does not wait for the open transaction")
        .expect("migrate of an up-to-date table succeeds");
    let done = tokio::time::timeout(
        Duration::from_secs(10),
        env.deliver(&JobContext::for_test("new-1", Q, 1), None),
    )
    .await
    .expect("a claim is not queued behind migrate")
    .unwrap();
    assert!(!done);
    open.rollback().await.unwrap();
    assert_eq!(env.effects_of("new-1").await, 1);
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Charge {
    pub cents: i64,
}

#[job(queue = "inbox_billing")]
async fn charge(_ctx: JobContext, _c: Charge) -> Result<(), JobError> {
    Ok(())
}

#[tokio::test]
async fn stats_prune_and_reconcile() {
    let Some(env) = setup().await else { return };
    let outbox_table = postgres::unique_name("outbox");
    let _outbox_guard = DropTable::new(&env.url, &outbox_table);
    let outbox = Outbox::with_table(&outbox_table).unwrap();
    outbox.migrate(&env.client).await.unwrap();
    let mut client = connect(&env.url).await;
    let tx = client.transaction().await.unwrap();
    for id in ["ev-done", "ev-running", "ev-never"] {
        outbox
            .enqueue_in_tx::<charge::Job>(&tx, &Charge { cents: 100 }, Some(id.into()))
            .await
            .unwrap();
    }
    tx.commit().await.unwrap();
    env.deliver(&JobContext::for_test("ev-done", Q, 1), None)
        .await
        .unwrap();
    env.claim_and_commit(&JobContext::for_test("ev-running", Q, 1))
        .await;

    let stats = env.inbox.stats(&env.client).await.unwrap();
    assert_eq!(stats.len(), 1);
    assert_eq!(
        (stats[0].queue.as_str(), stats[0].running, stats[0].done),
        (Q, 1, 1)
    );
    assert!(stats[0].oldest_running.is_some() && stats[0].last_done_ago.is_some());

    let opts = InboxReconcileOptions::new(Duration::ZERO).queue(Q);
    let rows = env
        .inbox
        .reconcile(&env.client, &outbox, &opts)
        .await
        .unwrap();
    let listed: Vec<(&str, bool)> = rows
        .iter()
        .map(|r| (r.job_id.as_str(), r.inbox_running))
        .collect();
    assert_eq!(listed, vec![("ev-running", true), ("ev-never", false)]);
    assert!(rows.iter().all(|r| !r.published && r.job_type == "charge"));
    assert!(rows.iter().all(|r| !r.rejected));
    // A row the relay rejected for good is told apart from one not yet
    // published: no job will ever run for it.
    env.client
        .execute(
            &format!("UPDATE \"{outbox_table}\" SET rejected_at = now() WHERE job_id = 'ev-never'"),
            &[],
        )
        .await
        .unwrap();
    let rows = env
        .inbox
        .reconcile(&env.client, &outbox, &opts)
        .await
        .unwrap();
    let rejected: Vec<(&str, bool)> = rows
        .iter()
        .map(|r| (r.job_id.as_str(), r.rejected))
        .collect();
    assert_eq!(rejected, vec![("ev-running", false), ("ev-never", true)]);
    let other = InboxReconcileOptions::new(Duration::ZERO).queue("another_queue");
    assert!(env
        .inbox
        .reconcile(&env.client, &outbox, &other)
        .await
        .unwrap()
        .is_empty());
    let young = InboxReconcileOptions::new(Duration::from_secs(3600));
    assert!(env
        .inbox
        .reconcile(&env.client, &outbox, &young)
        .await
        .unwrap()
        .is_empty());

    // Prune keeps recent rows and running rows, deletes old done rows.
    assert_eq!(
        env.inbox
            .prune(&env.client, Duration::from_secs(3600))
            .await
            .unwrap(),
        0
    );
    assert_eq!(
        env.inbox.prune(&env.client, Duration::ZERO).await.unwrap(),
        1
    );
    let stats = env.inbox.stats(&env.client).await.unwrap();
    assert_eq!((stats[0].running, stats[0].done), (1, 0));
    assert!(env
        .inbox
        .record(&env.client, Q, "ev-done")
        .await
        .unwrap()
        .is_none());
}
