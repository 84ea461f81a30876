//! Compile-pass tests for `#[job]` (no Redis needed): the generated `Job`
//! constants, `handler()`, the enqueue helpers' signatures, visibility rules,
//! and calling the handler directly.
//!
//! The crate denies warnings so that any warning in generated code (unused
//! imports, dead code, private types in public interfaces, missing docs)
//! fails this test.

#![deny(warnings, missing_docs)]
// Allow-by-default lints that projects commonly enable; the generated code
// must not trip them either.
#![warn(
    missing_debug_implementations,
    unreachable_pub,
    unused_results,
    elided_lifetimes_in_paths
)]

use std::time::Duration;

use queue_core::{
    job, EnqueueOptions, Enqueued, Job, JobContext, JobError, JobId, Queue, QueueError,
};
use serde::{Deserialize, Serialize};

// A private function with a private argument type: the generated items are
// `pub(super)`, so there is no `private_interfaces` warning.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Welcome {
    email: String,
}

#[job(queue = "emails", max_attempts = 5, timeout = "30s")]
async fn send_welcome(ctx: JobContext, args: Welcome) -> Result<(), JobError> {
    if args.email.is_empty() {
        return Err(JobError::permanent(format!(
            "job {}: no address",
            ctx.job_id()
        )));
    }
    Ok(())
}

/// A public job with every option left at its default.
pub mod public {
    use queue_core::{job, JobContext, JobError};
    use serde::{Deserialize, Serialize};

    /// Payload of [`ping`].
    #[derive(Debug, Serialize, Deserialize)]
    pub struct Ping {
        /// Sequence number.
        pub seq: u64,
    }

    /// Answers a ping.
    #[job]
    pub async fn ping(_ctx: JobContext, _args: Ping) -> Result<(), JobError> {
        Ok(())
    }
}

// `name` and `version`, on a `pub(crate)` function.
#[derive(Serialize, Deserialize)]
pub(crate) struct Invoice {
    number: u64,
}

#[job(
    queue = "billing",
    name = "invoice.send",
    version = 3,
    timeout = "500ms"
)]
pub(crate) async fn send_invoice(_ctx: JobContext, args: Invoice) -> Result<(), JobError> {
    if args.number == 0 {
        return Err(JobError::permanent("invoice 0"));
    }
    Ok(())
}

// Nested modules: `pub(super)` function, relative argument paths, an argument
// type named `Job`, names shadowed by the parent's imports.
mod nested {
    use serde::{Deserialize, Serialize};

    #[derive(Serialize, Deserialize)]
    pub(super) struct Report {
        pub(super) id: u32,
    }

    pub(super) mod inner {
        // The parent's imports are visible to the generated module through
        // `use super::*`; these must not break it.
        use queue_core::{job, JobContext, JobError};
        #[allow(unused_imports)]
        use queue_core::{Job as _, Result};
        use serde::{Deserialize, Serialize};

        /// An argument type that happens to be called `Job`.
        #[derive(Serialize, Deserialize)]
        pub(crate) struct Job {
            pub(crate) id: u32,
        }

        #[job(queue = "reports", timeout = "5m")]
        pub(super) async fn build_report(
            _ctx: queue_core::JobContext,
            args: super::Report,
        ) -> core::result::Result<(), JobError> {
            let _ = args.id;
            Ok(())
        }

        #[job(queue = "reports", timeout = "1h")]
        pub(in crate::nested) async fn archive(
            _ctx: JobContext,
            args: self::Job,
        ) -> core::result::Result<(), JobError> {
            let _ = args.id;
            Ok(())
        }

        #[job(queue = "reports", timeout = "1m30s", max_attempts = 1)]
        async fn purge(_ctx: JobContext, args: Job) -> core::result::Result<(), JobError> {
            let _ = args.id;
            Ok(())
        }

        pub(crate) fn purge_handler() -> queue_core::Registration {
            purge::handler()
        }

        pub(crate) fn purge_timeout() -> Option<std::time::Duration> {
            <purge::Job as queue_core::Job>::TIMEOUT
        }
    }

    pub(crate) fn archive_name() -> &'static str {
        <inner::archive::Job as queue_core::Job>::NAME
    }

    pub(crate) fn archive_timeout() -> Option<std::time::Duration> {
        <inner::archive::Job as queue_core::Job>::TIMEOUT
    }

    pub(crate) fn build_report_timeout() -> Option<std::time::Duration> {
        <inner::build_report::Job as queue_core::Job>::TIMEOUT
    }

    pub(crate) fn check_args_types() {
        super::same_args::<inner::build_report::Job, Report>();
        super::same_args::<inner::archive::Job, inner::Job>();
    }
}

/// Compiles only if `J::Args` is `A`.
fn same_args<J, A>()
where
    J: Job<Args = A>,
{
}

// A raw identifier and a tuple payload.
#[job(queue = "misc")]
async fn r#move(_ctx: JobContext, args: (String, u32)) -> Result<(), JobError> {
    let _ = args;
    Ok(())
}

/// A job type's constants: (NAME, QUEUE, MAX_ATTEMPTS, TIMEOUT, SCHEMA_VERSION).
fn constants<J: Job>() -> (&'static str, &'static str, u32, Option<Duration>, u32) {
    (
        J::NAME,
        J::QUEUE,
        J::MAX_ATTEMPTS,
        J::TIMEOUT,
        J::SCHEMA_VERSION,
    )
}

#[test]
fn options_become_job_constants() {
    assert_eq!(
        constants::<send_welcome::Job>(),
        (
            "send_welcome",
            "emails",
            5,
            Some(Duration::from_secs(30)),
            1
        )
    );
}

#[test]
fn defaults_apply_when_options_are_omitted() {
    assert_eq!(
        constants::<public::ping::Job>(),
        ("ping", "default", 25, None, 1)
    );
}

#[test]
fn name_and_version_options() {
    assert_eq!(
        constants::<send_invoice::Job>(),
        (
            "invoice.send",
            "billing",
            25,
            Some(Duration::from_millis(500)),
            3
        )
    );
}

#[test]
fn duration_units() {
    assert_eq!(
        nested::build_report_timeout(),
        Some(Duration::from_secs(300))
    );
    assert_eq!(nested::archive_timeout(), Some(Duration::from_secs(3600)));
    assert_eq!(
        nested::inner::purge_timeout(),
        Some(Duration::from_secs(90))
    );
}

#[test]
fn args_type_is_the_second_argument() {
    same_args::<send_welcome::Job, Welcome>();
    same_args::<public::ping::Job, public::Ping>();
    same_args::<r#move::Job, (String, u32)>();
    nested::check_args_types();
}

#[test]
fn relative_paths_and_shadowing() {
    assert_eq!(nested::archive_name(), "archive");
    let reg = nested::inner::purge_handler();
    assert_eq!(reg.name(), "purge");
    assert_eq!(reg.queue(), "reports");
    assert_eq!(<r#move::Job as Job>::NAME, "move");
    assert_eq!(<r#move::Job as Job>::QUEUE, "misc");
    assert_eq!(cleanup::cleanup::handler().name(), "cleanup");
}

#[test]
fn handler_registers_the_job() {
    let reg = send_welcome::handler();
    assert_eq!(reg.name(), "send_welcome");
    assert_eq!(reg.queue(), "emails");
    assert_eq!(reg.version(), 1);

    let reg = send_invoice::handler();
    assert_eq!(reg.name(), "invoice.send");
    assert_eq!(reg.queue(), "billing");
    assert_eq!(reg.version(), 3);

    assert_eq!(public::ping::handler().name(), "ping");
}

#[test]
fn job_struct_derives() {
    fn derives<T: std::fmt::Debug + Clone + Copy + Default + Send + Sync + 'static>() {}
    derives::<send_welcome::Job>();
    derives::<public::ping::Job>();
    assert_eq!(format!("{:?}", send_welcome::Job), "Job");
}

#[tokio::test]
async fn the_original_function_can_be_called_directly() {
    let ctx = JobContext::for_test("id", "emails", 1);
    let ok = send_welcome(
        ctx.clone(),
        Welcome {
            email: "a@example.com".into(),
        },
    )
    .await;
    assert_eq!(ok, Ok(()));

    let err = send_welcome(
        ctx,
        Welcome {
            email: String::new(),
        },
    )
    .await
    .unwrap_err();
    assert!(!err.is_retryable());
    assert!(err.message().contains("job id"), "{err}");
}

#[tokio::test]
async fn job_run_calls_the_function() {
    let ctx = JobContext::for_test("id", "emails", 1);
    let run = <send_welcome::Job as Job>::run(
        ctx.clone(),
        Welcome {
            email: "a@example.com".into(),
        },
    );
    assert_eq!(run.await, Ok(()));
    let run = <send_invoice::Job as Job>::run(ctx, Invoice { number: 0 });
    assert!(!run.await.unwrap_err().is_retryable());
}

/// Never called (it needs Redis): checks that the enqueue helpers have the
/// documented signatures and return `Send` futures.
#[allow(dead_code)]
async fn enqueue_helpers_type_check(queue: &Queue) -> Result<(), QueueError> {
    fn send<T: Send>(t: T) -> T {
        t
    }
    let welcome = || Welcome {
        email: "a@example.com".into(),
    };

    let id: JobId = send(send_welcome::enqueue(queue, welcome())).await?;
    let by_key: Enqueued =
        send(send_welcome::enqueue_with_id(queue, "welcome-1", welcome())).await?;
    let by_string: Enqueued =
        send_welcome::enqueue_with_id(queue, String::from("welcome-2"), welcome()).await?;
    let by_id: Enqueued = send_welcome::enqueue_with_id(queue, &id, welcome()).await?;
    let opts = EnqueueOptions::new()
        .delay(Duration::from_secs(5))
        .max_attempts(2);
    let with: Enqueued = send(send_welcome::enqueue_with(queue, opts, welcome())).await?;

    let _: JobId = public::ping::enqueue(queue, public::Ping { seq: 1 }).await?;
    let _: Enqueued =
        send_invoice::enqueue_with_id(queue, "invoice-7", Invoice { number: 7 }).await?;
    let _: JobId = r#move::enqueue(queue, ("x".to_string(), 1)).await?;
    let _ = (by_key, by_string, by_id, with);
    Ok(())
}

// A job named like its enclosing module (no `module_inception` lint).
mod cleanup {
    use queue_core::{job, JobContext, JobError};

    #[job]
    pub(super) async fn cleanup(_ctx: JobContext, _args: ()) -> Result<(), JobError> {
        Ok(())
    }
}

#[test]
fn generated_module_exposes_queue_and_name_constants() {
    assert_eq!(send_welcome::QUEUE, "emails");
    assert_eq!(send_welcome::NAME, "send_welcome");
}

// A periodic job on a shorthand schedule: the attribute parses `cron` with
// the crate the worker's scheduler uses, so what `Worker::build()` accepts
// compiles (before, `@daily` was refused: only 6 or 7 fields were counted).
#[job(queue = "maintenance", cron = "@daily")]
async fn daily_cleanup(_ctx: JobContext, _args: ()) -> Result<(), JobError> {
    Ok(())
}

#[test]
fn a_shorthand_cron_schedule_is_accepted() {
    assert_eq!(daily_cleanup::handler().cron(), Some("@daily"));
}

// A return type through an alias of `Result<(), JobError>`: `#[job]` cannot
// see a value type in it, and needs none (an alias of `Result<T, JobError>`
// with a value is refused with a message asking for `Result<T, JobError>`
// written out: ui/aliased_value_return.rs).
type Outcome<T = ()> = Result<T, JobError>;

#[job(queue = "misc")]
async fn aliased_unit(_ctx: JobContext, args: u32) -> Outcome {
    match args {
        0 => Err(JobError::permanent("zero")),
        _ => Ok(()),
    }
}

#[tokio::test]
async fn a_unit_result_through_an_alias_runs() {
    let ctx = JobContext::for_test("id", "misc", 1);
    assert_eq!(
        <aliased_unit::Job as Job>::run(ctx.clone(), 1).await,
        Ok(())
    );
    let err = <aliased_unit::Job as Job>::run(ctx, 0).await.unwrap_err();
    assert!(!err.is_retryable());
    same_output::<aliased_unit::Job, ()>();
}

fn same_output<J: queue_core::JobOutput<Output = O>, O>() {}
