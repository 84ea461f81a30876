//! `queue-watchdog inbox migrate | stats | reconcile | prune` against a real
//! PostgreSQL.

use queue_core::JobContext;
use queue_inbox::Inbox;
use queue_testkit::postgres::{require, unique_name, DropTable};

#[path = "support/billing_cli.rs"]
mod billing_cli;
use billing_cli::{cli, migrated_outbox, stage_published_days_ago, Invoice};

#[tokio::test]
async fn migrate_stats_reconcile_and_prune_from_the_command_line() {
    let Some(db) = require() else { return };
    let table = unique_name("cli_inbox");
    let outbox_table = unique_name("cli_outbox");
    let _drop = [
        DropTable::new(&db, &table),
        DropTable::new(&db, &outbox_table),
    ];

    let (code, out, err) = cli(None, &db, &["inbox", "migrate", "--table", &table]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("is ready"), "{out}");

    // Two events in the outbox; the first one's effect commits through the inbox.
    let (mut client, outbox) = migrated_outbox(&db, &outbox_table).await;
    let tx = client.transaction().await.unwrap();
    for id in ["invoice-1", "invoice-2"] {
        outbox
            .enqueue_in_tx::<Invoice>(&tx, &1, Some(id.into()))
            .await
            .unwrap();
    }
    tx.commit().await.unwrap();
    let inbox = Inbox::with_table(&table).unwrap();
    let ctx = JobContext::for_test("invoice-1", "billing", 1);
    let tx = client.transaction().await.unwrap();
    assert!(!inbox.delivery(&ctx, &tx).already_done().await.unwrap());
    inbox
        .delivery(&ctx, &tx)
        .complete("ledger-1")
        .await
        .unwrap();
    tx.commit().await.unwrap();

    let (code, out, err) = cli(None, &db, &["inbox", "stats", "--table", &table, "--json"]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("\"queue\":\"billing\""), "{out}");
    assert!(out.contains("\"done\":1"), "{out}");

    let reconcile = [
        "inbox",
        "reconcile",
        "--table",
        &table,
        "--outbox-table",
        &outbox_table,
        "--older-than-secs",
        "0",
        "--queue",
        "billing",
    ];
    let (code, out, err) = cli(None, &db, &reconcile);
    assert_eq!(code, 1, "a row is listed: {out}{err}");
    assert!(
        out.contains("invoice-2") && !out.contains("invoice-1"),
        "{out}"
    );

    // An age below 24 h is refused without --force: a replayed dead job (or a
    // redelivery) would find no row and apply its effect again.
    let prune = [
        "inbox",
        "prune",
        "--table",
        &table,
        "--older-than-secs",
        "0",
    ];
    let (code, out, err) = cli(None, &db, &prune);
    assert_eq!(code, 2, "refused: {out}{err}");
    assert!(
        err.contains("refusing to prune") && err.contains("--force"),
        "{err}"
    );
    assert_eq!(
        inbox
            .stats(&client)
            .await
            .unwrap()
            .iter()
            .map(|s| s.done)
            .sum::<u64>(),
        1,
        "nothing pruned"
    );
    let (code, out, err) = cli(None, &db, &[&prune[..], &["--force"]].concat());
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("deleted 1 done row"), "{out}");
}

/// An outbox row staged eight days ago whose job's done row was pruned
/// (the default prune age is 7 days): by default reconcile looks only at
/// rows within that age (exit 0); a larger --max-age-secs lists it.
#[tokio::test]
async fn reconcile_by_default_leaves_out_rows_older_than_the_prune_age() {
    let Some(db) = require() else { return };
    let table = unique_name("cli_inbox");
    let outbox_table = unique_name("cli_outbox");
    let _drop = [
        DropTable::new(&db, &table),
        DropTable::new(&db, &outbox_table),
    ];
    let (mut client, outbox) = migrated_outbox(&db, &outbox_table).await;
    Inbox::with_table(&table)
        .unwrap()
        .migrate(&client)
        .await
        .unwrap();
    stage_published_days_ago(&mut client, &outbox, &outbox_table, "invoice-old", 8).await;

    let reconcile = [
        "inbox",
        "reconcile",
        "--table",
        &table,
        "--outbox-table",
        &outbox_table,
        "--older-than-secs",
        "0",
    ];
    let (code, out, err) = cli(None, &db, &reconcile);
    assert_eq!(code, 0, "not listed by default: {out}{err}");
    assert!(!out.contains("invoice-old"), "{out}");

    let wider = [&reconcile[..], &["--max-age-secs", "1000000"]].concat();
    let (code, out, err) = cli(None, &db, &wider);
    assert_eq!(code, 1, "{out}{err}");
    assert!(out.contains("invoice-old"), "{out}");
    assert!(err.contains("pruned"), "{err}");
}
