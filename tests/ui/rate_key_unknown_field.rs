use queue_core::{job, JobContext, JobError};

#[derive(serde::Serialize, serde::Deserialize)]
struct Welcome {
    tenant: String,
    email: String,
}

// A misspelt field: reported at `tenantt`, not at the whole attribute.
#[job(queue = "emails", rate_key = tenantt)]
async fn send_welcome(_ctx: JobContext, args: Welcome) -> Result<(), JobError> {
    println!("{} {}", args.tenant, args.email);
    Ok(())
}

fn main() {}
