//! `test-worker` child processes (see `src/bin/test-worker.rs`): start one,
//! optionally with a crash point (`QUEUE_FAILPOINT`), signal it, kill it,
//! wait for it to exit.

use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// A `test-worker` child process, SIGKILLed on drop.
pub struct WorkerProcess {
    /// The child.
    pub child: Child,
}

impl WorkerProcess {
    /// Starts `test-worker <url> <concurrency> <lease_ms> <grace_ms>`.
    pub fn start(bin: &str, url: &str, concurrency: usize, lease_ms: u64, grace_ms: u64) -> Self {
        Self::start_with_failpoint(bin, url, concurrency, lease_ms, grace_ms, None)
    }

    /// [`WorkerProcess::start`] with `QUEUE_FAILPOINT` set to `failpoint`
    /// (or removed from its environment when `None`).
    pub fn start_with_failpoint(
        bin: &str,
        url: &str,
        concurrency: usize,
        lease_ms: u64,
        grace_ms: u64,
        failpoint: Option<&str>,
    ) -> Self {
        Self::start_with_env(bin, url, concurrency, lease_ms, grace_ms, failpoint, &[])
    }

    /// [`WorkerProcess::start_with_failpoint`] with extra environment
    /// variables, e.g. `(workflow_jobs::ENV, "1")` to serve the workflow jobs.
    pub fn start_with_env(
        bin: &str,
        url: &str,
        concurrency: usize,
        lease_ms: u64,
        grace_ms: u64,
        failpoint: Option<&str>,
        env: &[(&str, &str)],
    ) -> Self {
        let mut cmd = Command::new(bin);
        cmd.envs(env.iter().copied());
        cmd.args([
            url.to_string(),
            concurrency.to_string(),
            lease_ms.to_string(),
            grace_ms.to_string(),
        ])
        .stdin(Stdio::null())
        .env_remove("QUEUE_FAILPOINT");
        if let Some(point) = failpoint {
            cmd.env("QUEUE_FAILPOINT", point);
        }
        WorkerProcess {
            child: cmd.spawn().expect("test-worker starts"),
        }
    }

    /// SIGKILL: the process dies at once, mid-job.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Whether the process has exited.
    pub fn exited(&mut self) -> bool {
        self.child.try_wait().expect("try_wait").is_some()
    }

    /// Waits for the process to exit on its own; panics after `limit`.
    pub async fn wait_exit(&mut self, limit: Duration) -> ExitStatus {
        let start = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                return status;
            }
            assert!(
                start.elapsed() < limit,
                "worker process did not exit within {limit:?}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Sends a signal by name (`TERM`, `STOP`, `CONT`) with kill(1).
    pub fn signal(&self, sig: &str) {
        let status = Command::new("kill")
            .arg(format!("-{sig}"))
            .arg(self.child.id().to_string())
            .status()
            .expect("kill(1) runs");
        assert!(status.success(), "kill -{sig} failed");
    }
}

impl Drop for WorkerProcess {
    fn drop(&mut self) {
        self.kill();
    }
}
