mod jobs {
    use queue_core::{job, JobContext, JobError};

    // Private to `jobs`: rustc only warns about it in the signature of a
    // `pub` fn (`private_interfaces`), but the generated `pub struct Job`
    // implements `queue_core::Job` with `type Args = Welcome`.
    #[derive(serde::Serialize, serde::Deserialize)]
    struct Welcome {
        email: String,
    }

    #[job(queue = "emails")]
    pub async fn send_welcome(_ctx: JobContext, args: Welcome) -> Result<(), JobError> {
        let _ = args.email;
        Ok(())
    }
}

fn main() {
    let _ = jobs::send_welcome::QUEUE;
}
