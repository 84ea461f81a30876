use queue_core::{job, JobContext};

#[derive(serde::Serialize, serde::Deserialize)]
struct Welcome {
    email: String,
}

#[job(queue = "emails")]
async fn send_welcome(_ctx: JobContext, args: Welcome) -> Result<(), String> {
    println!("{}", args.email);
    Ok(())
}

fn main() {}
