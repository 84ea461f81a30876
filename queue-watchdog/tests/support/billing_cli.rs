//! What the outbox and inbox command-line tests share: the `invoice` job they
//! stage in PostgreSQL and a runner of the `queue-watchdog` binary with
//! `DATABASE_URL` (and `--redis` when given) that returns its exit code and
//! output.

use std::process::Command;

use queue_core::{BoxFuture, Job, JobContext, JobError};

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
