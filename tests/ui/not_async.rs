use queue_core::{job, JobContext, JobError};

#[derive(serde::Serialize, serde::Deserialize)]
struct Welcome {
    email: String,
}

#[job(queue = "emails")]
fn send_welcome(_ctx: JobContext, args: Welcome) -> Result<(), JobError> {
    println!("{}", args.email);
    Ok(())
}

fn main() {
    let _ = send_welcome;
}
