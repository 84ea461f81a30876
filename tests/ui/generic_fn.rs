use queue_core::{job, JobContext, JobError};
use serde::de::DeserializeOwned;

#[job(queue = "emails")]
async fn send_any<T: DeserializeOwned>(_ctx: JobContext, _args: T) -> Result<(), JobError> {
    Ok(())
}

struct Mailer;

impl Mailer {
    #[job(queue = "emails")]
    async fn send(&self, _ctx: JobContext) -> Result<(), JobError> {
        Ok(())
    }
}

fn main() {
    let _ = send_any::<()>;
    let _ = Mailer.send(JobContext::for_test("id", "emails", 1));
}
