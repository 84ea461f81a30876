use queue_core::{job, JobContext, JobError};

#[derive(serde::Serialize, serde::Deserialize)]
struct Welcome {
    email: String,
}

#[job(queue = "emails")]
async fn send_welcome(_ctx: JobContext, args: &Welcome) -> Result<(), JobError> {
    println!("{}", args.email);
    Ok(())
}

#[job(queue = "emails")]
async fn send_many(_ctx: JobContext, emails: Vec<&str>) -> Result<(), JobError> {
    println!("{emails:?}");
    Ok(())
}

fn main() {
    let _ = (send_welcome, send_many);
}
