//! `queue-watchdog run … --metrics-listen 127.0.0.1:<port>` on a freshly
//! picked port, started again on another one when the picked port was taken
//! between the pick and the bind (another test's server got it). The
//! exporter binds before the first pass: the process logs "serving
//! Prometheus metrics" once its listener is bound, or exits with "cannot
//! serve metrics". Shared by `cli.rs` and `observability.rs` with `#[path]`,
//! with the scrape of a `/metrics` endpoint.
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_queue-watchdog");

/// Attempts on fresh ports before giving up.
const PORT_ATTEMPTS: u32 = 4;

/// A `queue-watchdog run` serving its metrics at `addr`; killed on drop.
pub struct MetricsWatchdog {
    child: Child,
    /// `127.0.0.1:<port>`, bound by this process.
    pub addr: String,
}

impl Drop for MetricsWatchdog {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl MetricsWatchdog {
    /// Scrapes its metrics every 100 ms until the exposition contains
    /// `needle`, and answers it; panics after `within`.
    pub fn wait_for(&self, needle: &str, within: Duration) -> String {
        let deadline = Instant::now() + within;
        loop {
            if let Some(body) = scrape(&self.addr).filter(|b| b.contains(needle)) {
                return body;
            }
            assert!(
                Instant::now() < deadline,
                "no `{needle}` in the metrics within {within:?}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

/// One `GET /metrics` of the exporter at `addr` (the whole HTTP response);
/// `None` when it could not be read.
pub fn scrape(addr: &str) -> Option<String> {
    let mut s = std::net::TcpStream::connect(addr).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(
        s,
        "GET /metrics HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    Some(out)
}

/// Starts `queue-watchdog <args…> --metrics-listen 127.0.0.1:<port>` and
/// returns once the process has bound the port (its later log is drained).
pub fn run_with_metrics(args: &[&str]) -> MetricsWatchdog {
    let mut failures = String::new();
    for attempt in 1..=PORT_ATTEMPTS {
        let addr = format!("127.0.0.1:{}", queue_testkit::free_port().unwrap());
        let mut child = Command::new(BIN)
            .args(args)
            .args(["--metrics-listen", &addr])
            // The "serving" line is an info event: make sure it is printed.
            .env("RUST_LOG", "info")
            .env("NO_COLOR", "1")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("queue-watchdog starts");
        let lines = child.stderr.take().unwrap();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            // Read to the end (the process must never block on a full pipe);
            // after the caller stopped listening the lines are dropped.
            for line in BufReader::new(lines).lines() {
                let Ok(line) = line else { break };
                let _ = tx.send(line);
            }
        });
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut log = String::new();
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match rx.recv_timeout(left) {
                Ok(line) if line.contains("serving Prometheus metrics") => {
                    return MetricsWatchdog { child, addr };
                }
                Ok(line) => {
                    log.push_str(&line);
                    log.push('\n');
                }
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    let _ = child.kill();
                    let _ = child.wait();
                    panic!("queue-watchdog did not bind {addr} within 30 s:\n{log}");
                }
                // The process ended (its stderr closed) without binding.
                Err(mpsc::RecvTimeoutError::Disconnected) => break,
            }
        }
        let status = child.wait().unwrap();
        let taken = log.contains("cannot serve metrics") && log.contains("in use");
        assert!(
            taken && attempt < PORT_ATTEMPTS,
            "queue-watchdog exited ({status}) without serving metrics on {addr}:\n{failures}{log}"
        );
        failures.push_str(&format!("attempt {attempt}, {addr} taken:\n{log}"));
    }
    unreachable!("the last attempt returns or panics")
}
