use queue_core::{job, JobContext, JobError};

#[derive(serde::Serialize, serde::Deserialize)]
struct Welcome {
    email: String,
}

#[job]
async fn only_context(_ctx: JobContext) -> Result<(), JobError> {
    Ok(())
}

#[job]
async fn three_args(_ctx: JobContext, args: Welcome, retries: u32) -> Result<(), JobError> {
    println!("{} {retries}", args.email);
    Ok(())
}

fn main() {
    let _ = (only_context, three_args);
}
