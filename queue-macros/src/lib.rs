//! # queue-macros
//!
//! The `#[job]` attribute macro for `queue-core`. Use it through the
//! re-export `queue_core::job`; the generated code refers to `::queue_core`
//! by absolute path, so the `queue-core` crate must be a dependency of the
//! crate using the macro (under that name).
//!
//! The macro only generates glue that calls into `queue-core`: no Redis logic
//! lives here. Items the generated code needs beyond `queue-core`'s public
//! API come from the versioned `queue_core::__private_v1`, so a mismatched
//! pair of crates fails to compile instead of misbehaving.

#![warn(missing_docs)]

mod duration;
mod errors;
mod expand;
mod options;
mod signature;

use proc_macro::TokenStream;

/// Turns an `async fn` into a job handler.
///
/// ```
/// use queue_core::{job, JobContext, JobError, Queue, Worker};
/// use serde::{Deserialize, Serialize};
///
/// #[derive(Serialize, Deserialize)]
/// pub struct Welcome { pub email: String }
///
/// #[job(queue = "emails", max_attempts = 5, timeout = "30s")]
/// async fn send_welcome(ctx: JobContext, args: Welcome) -> Result<(), JobError> {
///     // ... send the mail; use ctx.idempotency_key() with external APIs ...
///     Ok(())
/// }
///
/// # #[tokio::main] async fn main() -> Result<(), queue_core::QueueError> {
/// # let server = queue_testkit::RedisServer::start().unwrap();
/// # let url = server.url();
/// let queue = Queue::connect(&url).await?;
/// // Enqueue (returns once Redis stored the job):
/// let id = send_welcome::enqueue(&queue, Welcome { email: "a@example.com".into() }).await?;
/// // Run:
/// let worker = Worker::builder(&url).register(send_welcome::handler()).build().await?;
/// # let stop = worker.shutdown_handle();
/// # let running = tokio::spawn(worker.run());
/// # stop.shutdown();
/// # running.await.unwrap()?;
/// # assert!(!id.as_str().is_empty());
/// # Ok(()) }
/// ```
///
/// # The function
///
/// It must have the shape
/// `async fn name(ctx: JobContext, args: Args) -> Result<(), JobError>`,
/// or `-> Result<T, JobError>` to return a value:
///
/// - `async`, not generic, not a method, exactly two arguments;
/// - the first argument is a `JobContext` taken by value;
/// - the second is the job's payload: an owned, `'static` type implementing
///   `Serialize + DeserializeOwned + Send` (no references, no `impl Trait`);
/// - the return type is `Result<(), JobError>`, or `Result<T, JobError>` with
///   `T: Serialize + DeserializeOwned + Send + 'static`: on success the value
///   is stored in the job's completion record, where
///   `Queue::wait_result::<name::Job>(id, timeout)` and `jobs show` read it
///   (docs/RESULTS.md). The macro reads `T` from the tokens, so write
///   `Result<T, JobError>` out (any path ending in `Result`, e.g.
///   `std::result::Result<T, JobError>`): through a type alias
///   (`type JobResult<T> = Result<T, JobError>`) it sees no `T`, and the type
///   must then be `Result<(), JobError>`; an alias of a `Result` with a value
///   is a compile error at the return type asking for `Result<T, JobError>`;
/// - the returned future must be `Send`.
///
/// The function itself is kept unchanged, so tests can call it directly with
/// `JobContext::for_test(..)`.
///
/// # Options
///
/// | option | value | default |
/// |---|---|---|
/// | `queue` | string literal: the queue name; not empty, no whitespace, control characters, `{` or `}` | `"default"` |
/// | `max_attempts` | integer >= 1: deliveries before a failing job is dead-lettered | `Job::MAX_ATTEMPTS` (25) |
/// | `timeout` | duration string: per-attempt time limit, `"500ms"`, `"30s"`, `"5m"`, `"1h"` or sums like `"1m30s"` | no limit |
/// | `deadline` | duration string (as `timeout`): execution budget across all attempts, counted from the job's first start (Redis clock); a delivery still running at the deadline is stopped and the job dead-lettered with `deadline exceeded`, and no retry starts after it (`Job::DEADLINE`, docs/RESULTS.md) | no limit |
/// | `name` | string literal: the job type name stored with each job (unique per queue) | the function's name |
/// | `version` | integer >= 1: payload schema version (`Job::SCHEMA_VERSION`). A worker runs only its handler's version, so a bump is a breaking change during a rolling deploy: jobs of the old version still waiting (queued, delayed retries) that reach an upgraded worker are dead-lettered at once, without retries (`unknown schema version 1 …`); jobs of the new version that reach a not yet upgraded worker are given back without using an attempt until a worker announcing the version runs them, and dead-lettered if none has for `newer_version_wait` (default 5 min). See docs/RELIABILITY.md, "Rolling deploys". Adding a field needs no bump when old payloads still decode: give it `#[serde(default)]` or make it an `Option` | 1 |
/// | `cron` | string: a cron schedule with seconds (`"0 */5 * * * *"`: sec min hour day month weekday, an optional year) or `@yearly`, `@monthly`, `@weekly`, `@daily`, `@hourly`, evaluated in UTC on the Redis clock; the job becomes periodic: every worker that registers it enqueues `Args::default()` at each due time, and each firing runs once across workers (`Args` must implement `Default`). Parsed at compile time by the `cron` crate the worker's scheduler uses | none |
/// | `rate_key` | a field of the args (`tenant`, `customer.id`; its `to_string()`): the job's rate key, to which per-key rate limits and concurrency caps apply (docs/LIMITS.md) | none |
///
/// All values are checked at compile time: an unknown or duplicate option, a
/// value of the wrong type, `timeout = "0s"`, `deadline = "0s"`,
/// `max_attempts = 0`, an invalid cron expression (`"0 0 25 * * *"`) or one
/// that never fires (`"0 0 0 30 2 *"`, the 30th of February) is an
/// error pointing at the offending token; so is a `rate_key` field the args
/// do not have (at the field's name) and, with `cron`, args without
/// `Default` (at the cron expression).
///
/// # What is generated
///
/// Next to the function, a module with the same name (functions and modules
/// live in different namespaces) containing:
///
/// - `struct Job` (a unit struct) implementing `queue_core::Job` with
///   `Args` = the second argument's type and the constants from the options;
///   its `run` calls the function (and stores a returned value);
/// - `impl queue_core::JobOutput for Job` with `Output` = the `T` of
///   `Result<T, JobError>` (`()` when nothing is returned), for
///   `Queue::wait_result` and `Queue::enqueue_and_wait`;
/// - `async fn enqueue(queue: &Queue, args: Args) -> Result<JobId, QueueError>`;
/// - `async fn enqueue_many(queue: &Queue, args: &[Args]) -> Result<Vec<JobId>, QueueError>`:
///   many jobs with random ids in one round trip, ids in order;
/// - `async fn enqueue_with_id(queue: &Queue, id: impl Into<JobId>, args: Args) -> Result<Enqueued, QueueError>`
///   for a stable, deduplicated id (a business key);
/// - `async fn enqueue_with(queue: &Queue, opts: EnqueueOptions, args: Args) -> Result<Enqueued, QueueError>`;
/// - `fn handler() -> Registration`, to register with a worker.
///
/// The module has the function's visibility. Its items are `pub` for a `pub`
/// function, `pub(crate)` for `pub(crate)`, `pub(super)` or `pub(in ..)`
/// functions, and `pub(super)` (visible where the function is) for a private
/// function, so private argument types cause no `private_interfaces` warnings.
///
/// So the argument type and the value type `T` must be at least as visible
/// as those items: `pub` types for a `pub` function, `pub(crate)` or more for
/// a `pub(crate)`, `pub(super)` or `pub(in ..)` one (a private function takes
/// private types). rustc alone only warns about a less visible type in a
/// function's signature (`private_interfaces`), but `Job`'s `type Args` and
/// `type Output` make it error E0446 ("private type in public interface"),
/// reported at the type in the signature: make the type as visible as the
/// function, or the function no more visible than the type. (The items
/// cannot take the types' visibility instead: the macro does not know it,
/// and code outside the module names `name::Job` and `name::enqueue`.)
///
/// # Limitations
///
/// The module sees the surrounding module's names through `use super::*`, so
/// the function must be declared at module level (not inside a function
/// body), and the argument type must be nameable from there; relative paths
/// (`self::T`, `super::T`) are adjusted automatically.
#[proc_macro_attribute]
pub fn job(attr: TokenStream, item: TokenStream) -> TokenStream {
    expand::expand(attr.into(), item.into()).into()
}
