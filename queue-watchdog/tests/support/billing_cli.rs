//! What the outbox and inbox command-line tests share: the `invoice` job they
//! stage in PostgreSQL, an outbox table made ready for it, and a runner of the `queue-watchdog` binary with
//! `DATABASE_URL` (and `--redis` when given) that returns its exit code and
//! output.

use std::process::Command;

use queue_core::{BoxFuture, Job, JobContext, JobError};
use queue_outbox::{connect_postgres, tokio_postgres::Client, Outbox};

const BIN: &str = env!("CARGO_BIN_EXE_queue-watchdog");

/// The staged job (`billing` queue); never run by these tests' workers.
pub struct Invoice;
impl Job for Invoice {
    type Args = u32;
    const NAME: &'static str = "invoice";
    const QUEUE: &'static str = "billing";
    fn run(_: JobContext, _: u32) -> BoxFuture<'static, Result<(), JobError>> {
        Box::pin(async { Ok(()) })
    }
}

/// A connection to `db` and the outbox on `table`, migrated (the table is
/// the caller's to drop).
pub async fn migrated_outbox(db: &str, table: &str) -> (Client, Outbox) {
    let client = connect_postgres(db).await.unwrap();
    let outbox = Outbox::with_table(table).unwrap();
    outbox.migrate(&client).await.unwrap();
    (client, outbox)
}

/// Runs `queue-watchdog [--redis URL] args…` with `DATABASE_URL=db`:
/// (exit code, stdout, stderr).
pub fn cli(redis: Option<&str>, db: &str, args: &[&str]) -> (i32, String, String) {
    let mut cmd = Command::new(BIN);
    if let Some(url) = redis {
        cmd.arg("--redis").arg(url);
    }
    let out = cmd
        .args(args)
        .env("DATABASE_URL", db)
        .output()
        .expect("binary runs");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Stages invoice `id` in `outbox` (table `table`, migrated) and dates it
/// back `days`: created and published then, sent once. Reconcile tests look
/// at a row older than a retention with it.
pub async fn stage_published_days_ago(
    client: &mut Client,
    outbox: &Outbox,
    table: &str,
    id: &str,
    days: u32,
) {
    let tx = client.transaction().await.unwrap();
    outbox
        .enqueue_in_tx::<Invoice>(&tx, &days, Some(id.into()))
        .await
        .unwrap();
    tx.commit().await.unwrap();
    client
        .execute(
            &format!(
                "UPDATE \"{table}\" SET created_at = now() - interval '{days} days', \
                 published_at = now() - interval '{days} days', attempts = 1 WHERE job_id = $1"
            ),
            &[&id],
        )
        .await
        .unwrap();
}
