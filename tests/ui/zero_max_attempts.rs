use queue_core::{job, JobContext, JobError};

#[derive(serde::Serialize, serde::Deserialize)]
struct Welcome {
    email: String,
}

#[job(queue = "emails", max_attempts = 0)]
async fn send_welcome(_ctx: JobContext, _args: Welcome) -> Result<(), JobError> {
    Ok(())
}

#[job(queue = "emails", max_attempts = "5")]
async fn quoted(_ctx: JobContext, _args: Welcome) -> Result<(), JobError> {
    Ok(())
}

#[job(queue = "emails", version = 0)]
async fn version_zero(_ctx: JobContext, _args: Welcome) -> Result<(), JobError> {
    Ok(())
}

fn main() {}
