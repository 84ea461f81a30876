//! The jobs of the runnable examples, shared by the `web` binary (which
//! enqueues them) and the `worker` binary (which runs them).
//!
//! `send_welcome` simulates sending a welcome mail. It is deterministic so the
//! demo's summary shows every outcome:
//!
//! - an address without `@` fails permanently (dead-lettered at once);
//! - an address containing `flaky` fails retryably on its first attempt
//!   (retried with backoff, then completes);
//! - anything else completes after the simulated work.
//!
//! The simulated work lasts `WELCOME_WORK_MS` milliseconds (default 300).

use std::sync::OnceLock;
use std::time::Duration;

use queue_core::{job, JobContext, JobError};
use serde::{Deserialize, Serialize};
use tracing::info;

pub mod http;

/// The payload of [`send_welcome`]: who gets the mail.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Welcome {
    /// Recipient address.
    pub email: String,
    /// Recipient name, used in the greeting.
    pub name: String,
}

/// Sends (simulates) a welcome mail. See the crate docs for its failure modes.
#[job(queue = "emails", max_attempts = 5, timeout = "30s")]
pub async fn send_welcome(ctx: JobContext, args: Welcome) -> Result<(), JobError> {
    check_address(&args.email)?;
    tokio::time::sleep(work_time()).await;
    if args.email.contains("flaky") && ctx.attempt() == 1 {
        return Err(JobError::retryable(
            "mail server answered 421 (try again later), simulated on the first attempt",
        ));
    }
    info!(
        job_id = %ctx.job_id(),
        attempt = ctx.attempt(),
        email = %args.email,
        idempotency_key = %ctx.idempotency_key(),
        "welcome mail sent to {}",
        args.name
    );
    // The completion record keeps the request's hash once the job hash (and
    // its `request_sha256` field) is gone, so the web can still refuse an
    // Idempotency-Key reused with another body (`web.rs`).
    ctx.set_result_ref(format!("{REQUEST_HASH_PREFIX}{}", request_sha256(&args)));
    Ok(())
}

/// The job field in which `web` stores [`request_sha256`] of the request
/// that created a job under an `Idempotency-Key`.
pub const REQUEST_HASH_FIELD: &str = "request_sha256";

/// How [`send_welcome`] writes the hash into its completion record's `result`.
pub const REQUEST_HASH_PREFIX: &str = "request-sha256:";

/// The SHA-256 (hex) of a request body, as the web example compares it for
/// a reused `Idempotency-Key`: of the parsed `Welcome` written back as JSON,
/// so whitespace or key order in the client's JSON do not matter.
pub fn request_sha256(welcome: &Welcome) -> String {
    use sha2::{Digest, Sha256};
    let canonical = serde_json::to_vec(welcome).expect("a Welcome serializes to JSON");
    Sha256::digest(&canonical)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The queue `send_welcome` jobs live on.
pub const WELCOME_QUEUE: &str = <send_welcome::Job as queue_core::Job>::QUEUE;

/// Rejects addresses no retry can fix.
fn check_address(email: &str) -> Result<(), JobError> {
    if email.contains('@') {
        Ok(())
    } else {
        Err(JobError::permanent(format!(
            "invalid address {email:?}: no '@'"
        )))
    }
}

/// The simulated work per attempt: `WELCOME_WORK_MS` or 300 ms.
pub fn work_time() -> Duration {
    static WORK: OnceLock<Duration> = OnceLock::new();
    *WORK.get_or_init(|| {
        let ms = std::env::var("WELCOME_WORK_MS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(300);
        Duration::from_millis(ms)
    })
}

/// Installs a `tracing` subscriber writing to stderr. `RUST_LOG` overrides
/// `default_filter`; colours only when stderr is a terminal.
pub fn init_tracing(default_filter: &str) {
    use std::io::IsTerminal;
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default_filter));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .init();
}

#[cfg(test)]
mod tests {
    use super::*;

    fn welcome(email: &str) -> Welcome {
        Welcome {
            email: email.into(),
            name: "Ada".into(),
        }
    }

    #[tokio::test]
    async fn a_valid_address_completes() {
        let ctx = JobContext::for_test("j1", WELCOME_QUEUE, 1);
        assert_eq!(send_welcome(ctx, welcome("ada@example.com")).await, Ok(()));
    }

    #[tokio::test]
    async fn a_flaky_address_fails_retryably_once() {
        let first = send_welcome(
            JobContext::for_test("j2", WELCOME_QUEUE, 1),
            welcome("flaky@example.com"),
        )
        .await;
        assert!(first.unwrap_err().is_retryable());
        let second = send_welcome(
            JobContext::for_test("j2", WELCOME_QUEUE, 2),
            welcome("flaky@example.com"),
        )
        .await;
        assert_eq!(second, Ok(()));
    }

    #[tokio::test]
    async fn an_address_without_at_is_permanent() {
        let err = send_welcome(
            JobContext::for_test("j3", WELCOME_QUEUE, 1),
            welcome("nobody"),
        )
        .await
        .unwrap_err();
        assert!(!err.is_retryable(), "{err}");
        assert!(err.message().contains("no '@'"), "{err}");
    }

    #[test]
    fn the_job_is_on_the_emails_queue() {
        assert_eq!(WELCOME_QUEUE, "emails");
    }
}
