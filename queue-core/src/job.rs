//! The job contract: what `#[job]` implements and what a handler receives.
//! Payloads are MessagePack with a schema version (DESIGN rule 9,
//! docs/DESIGN.md); the context gives handlers the stable id, the attempt
//! number and step results they need to be safe to run twice (rule 7).

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use serde::de::DeserializeOwned;
use serde::Serialize;

/// A boxed, sendable future, as returned by [`Job::run`].
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// A job type: its payload, its queue and its handler.
///
/// You normally do not implement this by hand: `#[job]` generates a unit
/// struct `your_fn::Job` implementing it. Implementing it manually is fine too.
///
/// ```
/// use queue_core::{BoxFuture, Job, JobContext, JobError};
/// use serde::{Deserialize, Serialize};
///
/// #[derive(Serialize, Deserialize)]
/// struct Resize { image: String }
///
/// struct ResizeJob;
/// impl Job for ResizeJob {
///     type Args = Resize;
///     const NAME: &'static str = "resize";
///     const QUEUE: &'static str = "images";
///     fn run(_ctx: JobContext, args: Resize) -> BoxFuture<'static, Result<(), JobError>> {
///         Box::pin(async move {
///             if args.image.is_empty() {
///                 return Err(JobError::permanent("no image"));
///             }
///             Ok(())
///         })
///     }
/// }
/// assert_eq!(ResizeJob::MAX_ATTEMPTS, 25);
/// ```
pub trait Job: Send + Sync + 'static {
    /// The payload, encoded with MessagePack (named fields).
    type Args: Serialize + DeserializeOwned + Send + 'static;
    /// The job type name stored with each job; must be unique per queue.
    const NAME: &'static str;
    /// The queue this job type is enqueued to.
    const QUEUE: &'static str;
    /// Deliveries before a failing job is dead-lettered (the first run counts).
    const MAX_ATTEMPTS: u32 = 25;
    /// Per-attempt handler time limit; `None` means no limit. Zero is
    /// refused when the worker is built (`QueueError::Config`).
    const TIMEOUT: Option<Duration> = None;
    /// Payload schema version. A worker dead-letters payloads of an older
    /// version than the registered handler's; a newer one is left for an
    /// upgraded worker (see [`WorkerConfig::newer_version_wait`]).
    ///
    /// [`WorkerConfig::newer_version_wait`]: crate::WorkerConfig::newer_version_wait
    const SCHEMA_VERSION: u32 = 1;
    /// Execution deadline: the total wall time the job may take across all
    /// its attempts, counted from its FIRST start (Redis clock). A delivery
    /// still running when it passes is stopped and the job dead-lettered
    /// (`deadline exceeded`); a retry due after it is dead-lettered without
    /// running. Distinct from [`TIMEOUT`](Self::TIMEOUT), which bounds one
    /// attempt. `None` (the default): no deadline; zero is refused when the
    /// worker is built (`QueueError::Config`). See docs/RESULTS.md.
    const DEADLINE: Option<Duration> = None;
    /// Runs the handler.
    fn run(ctx: JobContext, args: Self::Args) -> BoxFuture<'static, Result<(), JobError>>;
    /// The rate key of a job with these args (`#[job(rate_key = field)]`):
    /// per-key limits apply to it (docs/LIMITS.md). `None`: no key. An
    /// explicit [`EnqueueOptions::rate_key`](crate::EnqueueOptions::rate_key) wins.
    fn rate_key(_args: &Self::Args) -> Option<String> {
        None
    }
}

/// How a handler failed.
///
/// Any error type converts into a *retryable* `JobError` with `?`, so handlers
/// can use `?` freely (the message is the error's text followed by its
/// `source()` causes, `"error sending request: Connection refused"`); return [`JobError::permanent`] for failures that no retry
/// can fix (the job goes straight to the dead-letter list).
///
/// ```
/// use queue_core::JobError;
/// fn parse(s: &str) -> Result<u32, JobError> {
///     let n: u32 = s.parse()?; // ParseIntError -> retryable JobError
///     if n == 0 { return Err(JobError::permanent("zero is not a valid amount")); }
///     Ok(n)
/// }
/// assert!(parse("x").unwrap_err().is_retryable());
/// assert!(!parse("0").unwrap_err().is_retryable());
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobError {
    kind: JobErrorKind,
    message: String,
}

/// Retry or give up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JobErrorKind {
    /// Retry with backoff while attempts remain.
    Retryable,
    /// Dead-letter at once.
    Permanent,
}

impl JobError {
    /// A failure worth retrying (network error, rate limit, ...).
    pub fn retryable(message: impl fmt::Display) -> Self {
        JobError {
            kind: JobErrorKind::Retryable,
            message: message.to_string(),
        }
    }

    /// A failure no retry can fix (invalid input, rejected card, ...).
    pub fn permanent(message: impl fmt::Display) -> Self {
        JobError {
            kind: JobErrorKind::Permanent,
            message: message.to_string(),
        }
    }

    /// Whether the job will be retried (attempts permitting).
    pub fn is_retryable(&self) -> bool {
        self.kind == JobErrorKind::Retryable
    }

    /// The kind of failure.
    pub fn kind(&self) -> JobErrorKind {
        self.kind
    }

    /// The message stored in the job's `last_error` field.
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl fmt::Display for JobError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = match self.kind {
            JobErrorKind::Retryable => "retryable",
            JobErrorKind::Permanent => "permanent",
        };
        write!(f, "{kind}: {}", self.message)
    }
}

/// `?` on any error: a retryable `JobError` whose message is the error's
/// text followed by its causes (`source()` chain), `"msg: cause: cause"`, so
/// `last_error` keeps the "Connection refused" under "error sending request".
/// A cause whose text the message already contains (errors that print their
/// chain themselves) is not repeated.
impl<E: std::error::Error> From<E> for JobError {
    fn from(e: E) -> Self {
        JobError::retryable(message_with_causes(&e))
    }
}

/// Causes followed, at most: a guard against a `source()` chain that loops.
const MAX_CAUSES: usize = 16;

/// `e`'s text, then each cause's text not already contained in it, joined by `": "`.
fn message_with_causes(e: &dyn std::error::Error) -> String {
    let mut message = e.to_string();
    let mut cause = e.source();
    for _ in 0..MAX_CAUSES {
        let Some(c) = cause else { break };
        let text = c.to_string();
        if !text.is_empty() && !message.contains(&text) {
            message.push_str(": ");
            message.push_str(&text);
        }
        cause = c.source();
    }
    message
}

/// A job's identity: unique within its queue.
///
/// Pass a business key (e.g. `invoice-4821-send`) to make enqueue idempotent;
/// otherwise a random UUID is generated.
///
/// ```
/// use queue_core::JobId;
/// let id = JobId::from("invoice-4821-send");
/// assert_eq!(id.as_str(), "invoice-4821-send");
/// assert_eq!(JobId::random().as_str().len(), 36);
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, serde::Deserialize)]
#[serde(transparent)]
pub struct JobId(String);

impl JobId {
    /// A fresh random (UUID v4) id.
    pub fn random() -> Self {
        JobId(random_uuid())
    }

    /// The id as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Longest accepted id, in bytes.
    pub const MAX_LEN: usize = 512;

    /// Checks the id is usable: not empty, at most [`JobId::MAX_LEN`] bytes,
    /// no control characters. Enqueue runs this before sending anything.
    ///
    /// ```
    /// assert!(queue_core::JobId::from("").validate().is_err());
    /// assert!(queue_core::JobId::from("invoice-1").validate().is_ok());
    /// ```
    pub fn validate(&self) -> Result<(), &'static str> {
        if self.0.is_empty() {
            return Err("job id must not be empty");
        }
        if self.0.len() > Self::MAX_LEN {
            return Err("job id is longer than 512 bytes");
        }
        if self.0.chars().any(|c| c.is_control()) {
            return Err("job id must not contain control characters");
        }
        Ok(())
    }
}

impl fmt::Display for JobId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl From<&str> for JobId {
    fn from(s: &str) -> Self {
        JobId(s.to_string())
    }
}

impl From<String> for JobId {
    fn from(s: String) -> Self {
        JobId(s)
    }
}

impl From<&String> for JobId {
    fn from(s: &String) -> Self {
        JobId(s.clone())
    }
}

impl From<&JobId> for JobId {
    fn from(s: &JobId) -> Self {
        s.clone()
    }
}

pub(crate) use crate::context::ContextInner;
pub use crate::context::JobContext;

/// A job's arguments as its payload: MessagePack with field names (DESIGN
/// rule 9). Written into a buffer of 128 bytes to start with, which holds
/// most payloads whole: `rmp_serde::to_vec_named` starts from an empty
/// buffer and grows it four or five times for a small payload (about a
/// tenth of a producer's instructions per enqueue, issue #12).
fn encode_payload<T: Serialize + ?Sized>(args: &T) -> Result<Vec<u8>, rmp_serde::encode::Error> {
    let mut payload = Vec::with_capacity(128);
    rmp_serde::encode::write_named(&mut payload, args)?;
    Ok(payload)
}

/// [`encode_payload`] of job `J`'s arguments; an encoding error names the
/// queue, the job type and the job (`id`, when the caller has one).
pub(crate) fn encode_args<J: Job>(
    args: &J::Args,
    id: Option<&JobId>,
) -> crate::error::Result<Vec<u8>> {
    encode_payload(args).map_err(|source| crate::error::QueueError::Encode {
        queue: J::QUEUE.to_string(),
        job_type: J::NAME.to_string(),
        job_id: id.cloned(),
        source,
    })
}

/// A random UUID v4 as text, from the thread-local generator (`rand`'s
/// `ThreadRng`, seeded from the OS once per thread) instead of one
/// `getrandom` system call per id as `Uuid::new_v4` makes: job ids and
/// enqueue tokens are drawn once per enqueued job.
pub(crate) fn random_uuid() -> String {
    let bytes: [u8; 16] = rand::random();
    uuid::Builder::from_random_bytes(bytes)
        .into_uuid()
        .hyphenated()
        .to_string()
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::fmt;

    use super::JobError;

    /// An error with an optional cause, printing only its own text (like
    /// reqwest's and hyper's errors) or its own text and its cause's.
    #[derive(Debug)]
    struct Wrapping {
        text: String,
        cause: Option<Box<dyn std::error::Error + Send + Sync>>,
    }

    impl fmt::Display for Wrapping {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str(&self.text)
        }
    }

    impl std::error::Error for Wrapping {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            self.cause.as_deref().map(|c| c as _)
        }
    }

    /// `?` keeps the causes: "error sending request" says why. Before, only
    /// the outer text was kept ("... for url (...)" without "Connection refused").
    #[test]
    fn question_mark_keeps_the_source_chain() {
        fn send() -> Result<(), Wrapping> {
            let refused =
                std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "Connection refused");
            Err(Wrapping {
                text: "error sending request for url (http://127.0.0.1:1/charge)".into(),
                cause: Some(Box::new(Wrapping {
                    text: "client error (Connect)".into(),
                    cause: Some(Box::new(refused)),
                })),
            })
        }
        fn handler() -> Result<(), JobError> {
            send()?;
            Ok(())
        }
        let e = handler().unwrap_err();
        assert!(e.is_retryable());
        assert_eq!(
            e.message(),
            "error sending request for url (http://127.0.0.1:1/charge): client error (Connect): Connection refused"
        );
    }

    /// A cause the message already shows (an error printing its own chain,
    /// like `anyhow`'s `{:#}` or a thiserror `"...: {0}"`) is not repeated.
    #[test]
    fn a_cause_already_in_the_message_is_not_repeated() {
        let e = JobError::from(Wrapping {
            text: "cannot read config: No such file or directory".into(),
            cause: Some(Box::new(std::io::Error::new(
                std::io::ErrorKind::NotFound,
                "No such file or directory",
            ))),
        });
        assert_eq!(e.message(), "cannot read config: No such file or directory");
        let plain = JobError::from("x".parse::<u32>().unwrap_err());
        assert_eq!(plain.message(), "invalid digit found in string");
    }

    /// The payload is the bytes `rmp_serde::to_vec_named` writes: a small
    /// struct, one larger than the first buffer, and a map.
    #[test]
    fn encode_payload_writes_what_to_vec_named_writes() {
        #[derive(serde::Serialize)]
        struct Args {
            seq: u64,
            pad: String,
        }
        for pad in [0, 200] {
            let args = Args {
                seq: 7,
                pad: "x".repeat(pad),
            };
            let ours = super::encode_payload(&args).unwrap();
            assert_eq!(ours, rmp_serde::to_vec_named(&args).unwrap(), "pad {pad}");
        }
        let map: BTreeMap<u32, &str> = [(1, "a")].into();
        assert_eq!(
            super::encode_payload(&map).unwrap(),
            rmp_serde::to_vec_named(&map).unwrap()
        );
    }
}
