use queue_core::{job, JobContext, JobError};

#[derive(serde::Serialize, serde::Deserialize)]
struct Report {
    day: u32,
}

// A periodic job enqueues `Args::default()`: the missing `Default` is
// reported at the cron expression, not at the whole attribute.
#[job(queue = "reports", cron = "0 0 3 * * *")]
async fn nightly(_ctx: JobContext, args: Report) -> Result<(), JobError> {
    println!("{}", args.day);
    Ok(())
}

fn main() {}
