use queue_core::{job, JobContext, JobError};

#[derive(serde::Serialize, serde::Deserialize)]
struct Welcome {
    email: String,
}

#[job(queue = "emails", max_attempts = 3, queue = "mail")]
async fn send_welcome(_ctx: JobContext, _args: Welcome) -> Result<(), JobError> {
    Ok(())
}

fn main() {}
