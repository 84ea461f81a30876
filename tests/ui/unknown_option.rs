use queue_core::{job, JobContext, JobError};

#[derive(serde::Serialize, serde::Deserialize)]
struct Welcome {
    email: String,
}

#[job(queue = "emails", priority = 3)]
async fn send_welcome(_ctx: JobContext, args: Welcome) -> Result<(), JobError> {
    println!("{}", args.email);
    Ok(())
}

#[job(queue = "emails", max_attempt = 3)]
async fn send_reminder(_ctx: JobContext, args: Welcome) -> Result<(), JobError> {
    println!("{}", args.email);
    Ok(())
}

fn main() {}
