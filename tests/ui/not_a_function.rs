use queue_core::job;

#[job(queue = "emails")]
struct SendWelcome {
    email: String,
}

fn main() {}
