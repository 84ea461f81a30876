use queue_core::{job, JobContext, JobError};

#[derive(serde::Serialize, serde::Deserialize)]
struct Welcome {
    email: String,
}

#[job(timeout = "0s")]
async fn zero(_ctx: JobContext, _args: Welcome) -> Result<(), JobError> {
    Ok(())
}

#[job(timeout = "30 seconds")]
async fn words(_ctx: JobContext, _args: Welcome) -> Result<(), JobError> {
    Ok(())
}

#[job(timeout = "30")]
async fn no_unit(_ctx: JobContext, _args: Welcome) -> Result<(), JobError> {
    Ok(())
}

#[job(timeout = "5d")]
async fn unknown_unit(_ctx: JobContext, _args: Welcome) -> Result<(), JobError> {
    Ok(())
}

#[job(timeout = "99999999999999999999h")]
async fn overflow(_ctx: JobContext, _args: Welcome) -> Result<(), JobError> {
    Ok(())
}

#[job(timeout = 30)]
async fn not_a_string(_ctx: JobContext, _args: Welcome) -> Result<(), JobError> {
    Ok(())
}

fn main() {}
