//! `queue-watchdog outbox migrate | relay | reconcile` against real
//! PostgreSQL and redis-server.

use queue_core::Queue;
use queue_outbox::{connect_postgres, Outbox};
use queue_testkit::postgres::{require, unique_name, DropTable};
use queue_testkit::RedisServer;

#[path = "support/billing_cli.rs"]
mod billing_cli;
use billing_cli::{cli, stage_published_days_ago, Invoice};

#[tokio::test]
async fn migrate_relay_and_reconcile_from_the_command_line() {
    let Some(db) = require() else { return };
    let redis = RedisServer::start().unwrap();
    let table = unique_name("cli_outbox");
    let _drop = DropTable::new(&db, &table);

    let (code, out, err) = cli(
        Some(&redis.url()),
        &db,
        &["outbox", "migrate", "--table", &table],
    );
    assert_eq!(code, 0, "{out}{err}");

    // A business transaction stages a job.
    let mut client = connect_postgres(&db).await.unwrap();
    let outbox = Outbox::with_table(&table).unwrap();
    let tx = client.transaction().await.unwrap();
    let staged = outbox
        .enqueue_in_tx::<Invoice>(&tx, &4821, Some("invoice-4821".into()))
        .await
        .unwrap();
    tx.commit().await.unwrap();
    assert_eq!(staged.id.as_str(), "invoice-4821");

    let (code, out, err) = cli(
        Some(&redis.url()),
        &db,
        &["outbox", "relay", "--table", &table, "--once"],
    );
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("published=1"), "{out}");
    let queue = Queue::connect(&redis.url()).await.unwrap();
    let job = queue
        .job("billing", "invoice-4821")
        .await
        .unwrap()
        .expect("published to Redis");
    assert_eq!(job.state(), Some("queued"));

    // Re-running publishes nothing new.
    let (code, out, _) = cli(
        Some(&redis.url()),
        &db,
        &["outbox", "relay", "--table", &table, "--once"],
    );
    assert_eq!(code, 0);
    assert!(out.contains("selected=0"), "{out}");

    // The job never ran: reconcile lists it (exit 1), as queued.
    let (code, out, err) = cli(
        Some(&redis.url()),
        &db,
        &[
            "outbox",
            "reconcile",
            "--table",
            &table,
            "--older-than-secs",
            "0",
            "--json",
        ],
    );
    assert_eq!(code, 1, "{out}{err}");
    assert!(
        out.contains("\"job_id\":\"invoice-4821\"") && out.contains("\"status\":\"queued\""),
        "{out}"
    );
}

/// A row published two days ago whose job completed: its completion record
/// expired after the retention (24 h), so Redis knows nothing of it.
/// By default reconcile looks only at rows within the retention (exit 0); a
/// larger --max-age-secs lists it as `missing`, with a note that it may
/// have expired.
#[tokio::test]
async fn reconcile_by_default_leaves_out_rows_older_than_the_completion_retention() {
    let Some(db) = require() else { return };
    let redis = RedisServer::start().unwrap();
    let table = unique_name("cli_outbox");
    let _drop = DropTable::new(&db, &table);
    let mut client = connect_postgres(&db).await.unwrap();
    let outbox = Outbox::with_table(&table).unwrap();
    outbox.migrate(&client).await.unwrap();
    stage_published_days_ago(&mut client, &outbox, &table, "invoice-old", 2).await;

    let reconcile = [
        "outbox",
        "reconcile",
        "--table",
        &table,
        "--older-than-secs",
        "0",
    ];
    let (code, out, err) = cli(Some(&redis.url()), &db, &reconcile);
    assert_eq!(code, 0, "not listed by default: {out}{err}");
    assert!(!out.contains("invoice-old"), "{out}");

    let wider = [&reconcile[..], &["--max-age-secs", "259200"]].concat();
    let (code, out, err) = cli(Some(&redis.url()), &db, &wider);
    assert_eq!(code, 1, "{out}{err}");
    assert!(
        out.contains("invoice-old") && out.contains("missing"),
        "{out}"
    );
    assert!(err.contains("`missing` may mean expired"), "{err}");
}
