//! Handler registrations: what a [`Worker`](crate::Worker) knows how to run.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use crate::job::{BoxFuture, Job, JobContext, JobError};

type HandlerFuture = BoxFuture<'static, Result<(), JobError>>;
type Runner = Arc<dyn Fn(JobContext, &[u8]) -> Result<HandlerFuture, String> + Send + Sync>;
/// A cron expression and the function producing what each firing enqueues.
type CronSpec = (&'static str, fn() -> Result<CronFiring, String>);

/// What each firing of a periodic job enqueues: the payload of
/// `J::Args::default()` and the rate key `J` derives from those args
/// (`#[job(rate_key = ..)]`), so that a firing runs inside its key's limits
/// like any other enqueue of the type.
pub(crate) struct CronFiring {
    pub(crate) payload: Vec<u8>,
    pub(crate) rate_key: Option<String>,
}

/// A job type's handler, ready to be given to a [`WorkerBuilder`](crate::WorkerBuilder).
///
/// `#[job]` generates `your_fn::handler()` returning one; for a hand-written
/// [`Job`] use [`Registration::of`].
#[derive(Clone)]
pub struct Registration {
    pub(crate) name: &'static str,
    pub(crate) queue: &'static str,
    pub(crate) version: u32,
    pub(crate) timeout: Option<Duration>,
    /// [`Job::DEADLINE`]: the time budget across attempts since the first start.
    pub(crate) deadline: Option<Duration>,
    pub(crate) max_attempts: u32,
    pub(crate) runner: Runner,
    /// Periodic schedule (cron expression, with seconds) and the payload each firing enqueues.
    pub(crate) cron: Option<CronSpec>,
}

impl fmt::Debug for Registration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Registration")
            .field("name", &self.name)
            .field("queue", &self.queue)
            .field("version", &self.version)
            .field("timeout", &self.timeout)
            .field("cron", &self.cron.map(|(expr, _)| expr))
            .finish()
    }
}

impl Registration {
    /// The registration of job type `J`.
    ///
    /// ```
    /// # use queue_core::{BoxFuture, Job, JobContext, JobError, Registration};
    /// # struct Ping;
    /// # impl Job for Ping {
    /// #     type Args = ();
    /// #     const NAME: &'static str = "ping";
    /// #     const QUEUE: &'static str = "default";
    /// #     fn run(_: JobContext, _: ()) -> BoxFuture<'static, Result<(), JobError>> { Box::pin(async { Ok(()) }) }
    /// # }
    /// let reg = Registration::of::<Ping>();
    /// assert_eq!(reg.name(), "ping");
    /// assert_eq!(reg.queue(), "default");
    /// ```
    pub fn of<J: Job>() -> Self {
        Registration {
            name: J::NAME,
            queue: J::QUEUE,
            version: J::SCHEMA_VERSION,
            timeout: J::TIMEOUT,
            deadline: J::DEADLINE,
            max_attempts: J::MAX_ATTEMPTS,
            cron: None,
            runner: Arc::new(|ctx, payload| {
                let args: J::Args = rmp_serde::from_slice(payload).map_err(|e| e.to_string())?;
                Ok(J::run(ctx, args))
            }),
        }
    }

    /// The registration of a periodic job type `J`: every worker that
    /// registers it enqueues `J::Args::default()` at each time of the cron
    /// schedule `expr` (6 fields, with seconds: `"0 */5 * * * *"` = every five
    /// minutes), and each firing runs once across all workers. The schedule
    /// is evaluated in UTC, on the Redis clock (`0 0 3 * * *` is 03:00 UTC,
    /// whatever the workers' time zone). The expression is checked when the
    /// worker is built (`#[job(cron = "..")]` already checks it at compile
    /// time, with the same `cron` crate); `@daily`, `@hourly`, ... are accepted.
    ///
    /// ```
    /// # use queue_core::{BoxFuture, Job, JobContext, JobError, Registration};
    /// # struct Cleanup;
    /// # impl Job for Cleanup {
    /// #     type Args = ();
    /// #     const NAME: &'static str = "cleanup";
    /// #     const QUEUE: &'static str = "maintenance";
    /// #     fn run(_: JobContext, _: ()) -> BoxFuture<'static, Result<(), JobError>> { Box::pin(async { Ok(()) }) }
    /// # }
    /// let reg = Registration::periodic::<Cleanup>("0 0 3 * * *"); // 03:00 UTC daily
    /// assert_eq!(reg.cron(), Some("0 0 3 * * *"));
    /// ```
    pub fn periodic<J: Job>(expr: &'static str) -> Self
    where
        J::Args: Default,
    {
        fn firing<J: Job>() -> Result<CronFiring, String>
        where
            J::Args: Default,
        {
            let args = J::Args::default();
            let payload = rmp_serde::to_vec_named(&args)
                .map_err(|e| format!("its default args do not serialize: {e}"))?;
            Ok(CronFiring {
                payload,
                rate_key: J::rate_key(&args),
            })
        }
        let mut reg = Self::of::<J>();
        reg.cron = Some((expr, firing::<J>));
        reg
    }

    /// The cron expression of a periodic job type.
    pub fn cron(&self) -> Option<&'static str> {
        self.cron.map(|(expr, _)| expr)
    }

    /// The job type name.
    pub fn name(&self) -> &'static str {
        self.name
    }

    /// The queue the job type runs on.
    pub fn queue(&self) -> &'static str {
        self.queue
    }

    /// The payload schema version the handler accepts.
    pub fn version(&self) -> u32 {
        self.version
    }

    /// Per-attempt time limit.
    pub fn timeout(&self) -> Option<Duration> {
        self.timeout
    }
}
