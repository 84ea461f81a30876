//! Who a worker is: [`WorkerIdentity`] (a name, the host and the process id).
//! The name is on every log line of a job's life (the `job` span's `worker`
//! field) and, while a delivery runs, in its job hash (`worker`, written by
//! the claim), so `queue-watchdog jobs show` says which worker holds a job.

use std::fmt;

/// A worker's identity. The default name is `<hostname>:<pid>`; set another
/// with [`WorkerBuilder::name`](super::WorkerBuilder::name).
///
/// ```
/// let me = queue_core::WorkerIdentity::current();
/// assert_eq!(me.pid, std::process::id());
/// assert_eq!(me.name, format!("{}:{}", me.host, me.pid));
/// assert_eq!(me.named("billing-1").name, "billing-1");
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerIdentity {
    /// What logs and the job hash show (default `<hostname>:<pid>`).
    pub name: String,
    /// The host the worker runs on.
    pub host: String,
    /// The worker's process id.
    pub pid: u32,
}

impl WorkerIdentity {
    /// This process: its host name and pid, named `<hostname>:<pid>`.
    pub fn current() -> Self {
        let host = hostname();
        let pid = std::process::id();
        WorkerIdentity {
            name: format!("{host}:{pid}"),
            host,
            pid,
        }
    }

    /// The same host and pid under another name.
    pub fn named(mut self, name: impl Into<String>) -> Self {
        self.name = name.into();
        self
    }
}

impl fmt::Display for WorkerIdentity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name)
    }
}

/// The kernel's host name (Linux), else `HOSTNAME` / `COMPUTERNAME`, else
/// `localhost`.
fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .or_else(|| std::env::var("COMPUTERNAME").ok())
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "localhost".to_string())
}
