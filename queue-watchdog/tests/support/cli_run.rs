//! Runs the `queue-watchdog` binary against one Redis: the runner the
//! command-line tests of the feature pages (groups, limits) share.

use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_queue-watchdog");

/// `queue-watchdog args… --redis url`: (success, stdout, stderr).
pub fn run(url: &str, args: &[&str]) -> (bool, String, String) {
    let out = Command::new(BIN)
        .args(args)
        .args(["--redis", url])
        .output()
        .expect("binary runs");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}
