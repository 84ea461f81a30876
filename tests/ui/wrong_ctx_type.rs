use queue_core::{job, JobError};

#[derive(serde::Serialize, serde::Deserialize)]
struct Welcome {
    email: String,
}

#[job(queue = "emails")]
async fn send_welcome(job_id: String, args: Welcome) -> Result<(), JobError> {
    println!("{job_id} {}", args.email);
    Ok(())
}

fn main() {
    let _ = send_welcome;
}
