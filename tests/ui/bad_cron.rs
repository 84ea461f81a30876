use queue_core::{job, JobContext, JobError};

#[derive(Default, serde::Serialize, serde::Deserialize)]
struct Report {}

// An hour of 25: refused here, with the cron crate's reason, rather than by
// `Worker::build()` at deploy.
#[job(cron = "0 0 25 * * *")]
async fn nightly(_ctx: JobContext, _args: Report) -> Result<(), JobError> {
    Ok(())
}

// A 5-field (minute-first) expression: the schedule needs seconds.
#[job(cron = "*/5 * * * *")]
async fn every_five(_ctx: JobContext, _args: Report) -> Result<(), JobError> {
    Ok(())
}

fn main() {}
