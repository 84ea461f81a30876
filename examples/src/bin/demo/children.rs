//! The demo's child processes: started with their output in a log file,
//! stopped with SIGTERM (graceful) or SIGKILL (a crash), killed on drop.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use tokio::process::Command;

/// A running child process of the demo.
#[derive(Debug)]
pub struct Child {
    pub name: String,
    pub pid: u32,
    pub log: PathBuf,
    child: tokio::process::Child,
}

impl Child {
    /// Starts `bin args…` with stdout and stderr appended to `<logs>/<name>.log`.
    pub fn spawn(
        name: &str,
        bin: &Path,
        args: &[String],
        envs: &[(&str, String)],
        logs: &Path,
    ) -> Result<Child, String> {
        let log = logs.join(format!("{name}.log"));
        let out =
            File::create(&log).map_err(|e| format!("cannot create {}: {e}", log.display()))?;
        let err = out
            .try_clone()
            .map_err(|e| format!("cannot reopen {}: {e}", log.display()))?;
        let child = Command::new(bin)
            .args(args)
            .envs(envs.iter().map(|(k, v)| (k, v)))
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| format!("cannot start {name} ({}): {e}", bin.display()))?;
        let pid = child.id().ok_or_else(|| format!("{name} exited at once"))?;
        Ok(Child {
            name: name.to_string(),
            pid,
            log,
            child,
        })
    }

    /// An error naming the log when the process is no longer running.
    pub fn ensure_running(&mut self) -> Result<(), String> {
        match self.child.try_wait() {
            Ok(None) => Ok(()),
            Ok(Some(status)) => Err(format!(
                "{} (pid {}) exited unexpectedly with {status}; see {}",
                self.name,
                self.pid,
                self.log.display()
            )),
            Err(e) => Err(format!("cannot check {}: {e}", self.name)),
        }
    }

    /// SIGKILL: the process dies at once, whatever it was doing.
    pub async fn kill(&mut self) -> Result<(), String> {
        self.child
            .kill()
            .await
            .map_err(|e| format!("cannot SIGKILL {} (pid {}): {e}", self.name, self.pid))
    }

    /// Sends SIGTERM (graceful shutdown); see [`Child::wait`].
    pub fn terminate(&self) {
        // An error means the process is already gone, which `wait` reports.
        let _ = kill(Pid::from_raw(self.pid as i32), Signal::SIGTERM);
    }

    /// Waits up to `limit` for the process to exit, then SIGKILLs it.
    /// Returns the exit status, or an error when it had to be killed.
    pub async fn wait(&mut self, limit: Duration) -> Result<ExitStatus, String> {
        match tokio::time::timeout(limit, self.child.wait()).await {
            Ok(Ok(status)) => Ok(status),
            Ok(Err(e)) => Err(format!("cannot wait for {}: {e}", self.name)),
            Err(_) => {
                let _ = self.child.kill().await;
                Err(format!(
                    "{} did not stop within {limit:?} of SIGTERM; killed",
                    self.name
                ))
            }
        }
    }
}
