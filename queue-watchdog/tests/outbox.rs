//! `queue-watchdog outbox migrate | relay | reconcile` against real
//! PostgreSQL and redis-server.

use queue_core::Queue;
use queue_outbox::{connect_postgres, Outbox};
use queue_testkit::postgres::{require, unique_name, DropTable};
use queue_testkit::RedisServer;

#[path = "support/billing_cli.rs"]
mod billing_cli;
use billing_cli::{cli, migrated_outbox, stage_published_days_ago, Invoice};

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
    let (mut client, outbox) = migrated_outbox(&db, &table).await;
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

/// A row the relay can never publish (a hand-written job id with a line
/// break) is rejected: `relay --once` says so and exits 1, as for a failed
/// row, so a script or cron running it notices. Before, it exited 0.
#[tokio::test]
async fn relay_once_exits_1_when_it_rejected_a_row() {
    let Some(db) = require() else { return };
    let redis = RedisServer::start().unwrap();
    let table = unique_name("cli_outbox");
    let _drop = DropTable::new(&db, &table);
    let (client, _outbox) = migrated_outbox(&db, &table).await;
    client
        .execute(
            &format!(
                "INSERT INTO \"{table}\" (job_id, queue, job_type, schema_version, max_attempts, payload) \
                 VALUES (E'bad\\nid', 'billing', 'invoice', 1, 3, '\\x80'::bytea)"
            ),
            &[],
        )
        .await
        .unwrap();
    let once = ["outbox", "relay", "--table", &table, "--once"];
    let (code, out, err) = cli(Some(&redis.url()), &db, &once);
    assert!(out.contains("rejected=1"), "{out}{err}");
    assert_eq!(code, 1, "{out}{err}");
    // Nothing left to publish or reject: the next run exits 0.
    let (code, out, err) = cli(Some(&redis.url()), &db, &once);
    assert_eq!((code, out.contains("selected=0")), (0, true), "{out}{err}");
    // `outbox stats` keeps pointing at it.
    let (code, out, err) = cli(None, &db, &["outbox", "stats", "--table", &table]);
    assert!(out.contains("rejected=1"), "{out}{err}");
    assert_eq!(code, 1, "{out}{err}");
}

/// `relay --max-arg-len` is the relay's `Queue::with_max_arg_len` (set to a
/// server's lower `proto-max-bulk-len`): a row whose payload is longer is
/// rejected with its reason, and the row behind it is published. Without
/// the flag an operator could not match a lower server limit, and such a
/// row made Redis close the connection at every batch.
#[tokio::test]
async fn relay_max_arg_len_rejects_a_longer_row_and_publishes_the_others() {
    let Some(db) = require() else { return };
    let redis = RedisServer::start().unwrap();
    let table = unique_name("cli_outbox");
    let _drop = DropTable::new(&db, &table);
    let (mut client, outbox) = migrated_outbox(&db, &table).await;
    // MessagePack: 4821 is 3 bytes, 7 is 1 byte.
    for (id, amount) in [("invoice-big", 4821), ("invoice-small", 7)] {
        let tx = client.transaction().await.unwrap();
        outbox
            .enqueue_in_tx::<Invoice>(&tx, &amount, Some(id.into()))
            .await
            .unwrap();
        tx.commit().await.unwrap();
    }
    let once = [
        "outbox",
        "relay",
        "--table",
        &table,
        "--once",
        "--max-arg-len",
        "2",
    ];
    let (code, out, err) = cli(Some(&redis.url()), &db, &once);
    assert!(
        out.contains("published=1") && out.contains("failed=0") && out.contains("rejected=1"),
        "{out}{err}"
    );
    assert_eq!(code, 1, "a rejected row exits 1: {out}{err}");
    let queue = Queue::connect(&redis.url()).await.unwrap();
    assert!(queue
        .job("billing", "invoice-small")
        .await
        .unwrap()
        .is_some());
    assert!(queue.job("billing", "invoice-big").await.unwrap().is_none());
    let reason: String = client
        .query_one(
            &format!("SELECT last_error FROM \"{table}\" WHERE rejected_at IS NOT NULL"),
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert!(
        reason.contains("invoice-big") && reason.contains("payload"),
        "{reason}"
    );
}

/// `outbox stats` counts rows; `outbox prune` deletes published rows older
/// than its age (7 days by default), refuses an age below 24 h without
/// --force, and leaves unpublished rows alone.
#[tokio::test]
async fn outbox_prune_and_stats_from_the_command_line() {
    let Some(db) = require() else { return };
    let table = unique_name("cli_outbox");
    let _drop = DropTable::new(&db, &table);
    let (mut client, outbox) = migrated_outbox(&db, &table).await;
    stage_published_days_ago(&mut client, &outbox, &table, "invoice-old", 2).await;
    let tx = client.transaction().await.unwrap();
    outbox
        .enqueue_in_tx::<Invoice>(&tx, &1, Some("invoice-new".into()))
        .await
        .unwrap();
    tx.commit().await.unwrap();

    let stats = |json: bool| {
        let mut args = vec!["outbox", "stats", "--table", &table];
        if json {
            args.push("--json");
        }
        cli(None, &db, &args)
    };
    let (code, out, err) = stats(true);
    assert_eq!(code, 0, "{out}{err}");
    let v: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(
        (&v["unpublished"], &v["published"], &v["rejected"]),
        (&1.into(), &1.into(), &0.into()),
        "{out}"
    );

    let prune = |age: Option<&str>, force: bool| {
        let mut args = vec!["outbox", "prune", "--table", &table];
        if let Some(age) = age {
            args.extend(["--older-than-secs", age]);
        }
        if force {
            args.push("--force");
        }
        cli(None, &db, &args)
    };
    let (code, out, err) = prune(None, false);
    assert_eq!((code, out.contains("deleted 0")), (0, true), "{out}{err}");
    let (code, out, err) = prune(Some("60"), false);
    assert_eq!(code, 2, "{out}{err}");
    assert!(err.contains("refusing to prune"), "{err}");
    let (code, out, err) = prune(Some("86400"), false);
    assert_eq!((code, out.contains("deleted 1")), (0, true), "{out}{err}");
    let (code, out, err) = stats(false);
    assert_eq!(code, 0, "{out}{err}");
    assert!(
        out.contains("unpublished=1 rejected=0 published=0"),
        "{out}"
    );
}
