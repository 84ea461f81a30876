use queue_core::{job, JobContext, JobError};

#[derive(serde::Serialize, serde::Deserialize)]
struct Welcome {
    email: String,
}

#[job(queue = "")]
async fn empty(_ctx: JobContext, _args: Welcome) -> Result<(), JobError> {
    Ok(())
}

#[job(queue = "my emails")]
async fn spaces(_ctx: JobContext, _args: Welcome) -> Result<(), JobError> {
    Ok(())
}

#[job(queue = "emails}")]
async fn braces(_ctx: JobContext, _args: Welcome) -> Result<(), JobError> {
    Ok(())
}

#[job(queue = emails)]
async fn not_a_literal(_ctx: JobContext, _args: Welcome) -> Result<(), JobError> {
    Ok(())
}

fn main() {}
