use queue_core::{job, JobContext, JobError};

// A return type through an alias: `#[job]` sees the tokens `JobResult<u32>`,
// not the `u32` it would store.
type JobResult<T> = Result<T, JobError>;

#[job(queue = "math")]
async fn double(_ctx: JobContext, args: u32) -> JobResult<u32> {
    Ok(args * 2)
}

fn main() {}
