use std::rc::Rc;

use queue_core::{job, JobContext, JobError};

#[derive(serde::Serialize, serde::Deserialize)]
struct Welcome {
    email: String,
}

async fn deliver(_email: &str) {}

#[job(queue = "emails")]
async fn send_welcome(_ctx: JobContext, args: Welcome) -> Result<(), JobError> {
    let email = Rc::new(args.email);
    deliver(&email).await;
    Ok(())
}

fn main() {}
