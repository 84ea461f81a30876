//! The sentinels' `+switch-master` events, recorded as they are published.
//!
//! Each sentinel publishes `+switch-master <name> <old-ip> <old-port>
//! <new-ip> <new-port>` on its own Pub/Sub when it moves the master's address
//! to the promoted replica. A test that records these events knows which node
//! was promoted at the switch itself, and can check afterwards that no other
//! switch (a failback) happened, instead of asking "who is the primary now?"
//! at one later instant.

use std::io::{self, BufRead, BufReader, Write};
use std::net::{Shutdown, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// One `+switch-master` event of the monitored master.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Switch {
    /// The sentinel that published it (index in the setup).
    pub sentinel: usize,
    /// When the event was received.
    pub at: Instant,
    /// The port of the data node that was the primary.
    pub from: u16,
    /// The port of the data node that is the primary now.
    pub to: u16,
}

/// Subscriptions to `+switch-master` on every sentinel, and the events seen.
#[derive(Debug, Default)]
pub(super) struct SwitchLog {
    events: Arc<Mutex<Vec<Switch>>>,
    streams: Vec<TcpStream>,
}

impl SwitchLog {
    /// Subscribes to sentinel `sentinel` on `port`; returns once the
    /// subscription is confirmed, so no later switch is missed.
    pub(super) fn watch(&mut self, sentinel: usize, port: u16, master: &str) -> io::Result<()> {
        let stream = TcpStream::connect(("127.0.0.1", port))?;
        stream.set_read_timeout(Some(Duration::from_secs(10)))?;
        (&stream).write_all(b"SUBSCRIBE +switch-master\r\n")?;
        let mut reader = BufReader::new(stream.try_clone()?);
        let confirm = read_array(&mut reader)?;
        if confirm.first().map(String::as_str) != Some("subscribe") {
            return Err(io::Error::other(format!(
                "sentinel {sentinel}: SUBSCRIBE +switch-master answered {confirm:?}"
            )));
        }
        stream.set_read_timeout(None)?;
        let events = self.events.clone();
        let master = master.to_string();
        // Ends when the connection closes (the sentinel is killed, or drop).
        std::thread::spawn(move || {
            while let Ok(msg) = read_array(&mut reader) {
                if let Some(switch) = parse(sentinel, &master, &msg) {
                    if let Ok(mut events) = events.lock() {
                        events.push(switch);
                    }
                }
            }
        });
        self.streams.push(stream);
        Ok(())
    }

    /// How many events were recorded so far (a mark for [`Self::since`]).
    pub(super) fn mark(&self) -> usize {
        self.events.lock().map(|e| e.len()).unwrap_or(0)
    }

    /// The events recorded after `mark`, oldest first.
    pub(super) fn since(&self, mark: usize) -> Vec<Switch> {
        self.events
            .lock()
            .map(|e| e.get(mark..).unwrap_or_default().to_vec())
            .unwrap_or_default()
    }
}

impl Drop for SwitchLog {
    fn drop(&mut self) {
        for s in &self.streams {
            let _ = s.shutdown(Shutdown::Both);
        }
    }
}

/// `["message", "+switch-master", "<name> <ip> <port> <ip> <port>"]`.
fn parse(sentinel: usize, master: &str, msg: &[String]) -> Option<Switch> {
    let [kind, channel, payload] = msg else {
        return None;
    };
    if kind != "message" || channel != "+switch-master" {
        return None;
    }
    let f: Vec<&str> = payload.split_whitespace().collect();
    if f.len() != 5 || f[0] != master {
        return None;
    }
    Some(Switch {
        sentinel,
        at: Instant::now(),
        from: f[2].parse().ok()?,
        to: f[4].parse().ok()?,
    })
}

/// Reads one RESP array of bulk strings and integers (what Pub/Sub sends).
fn read_array(r: &mut impl BufRead) -> io::Result<Vec<String>> {
    let header = read_line(r)?;
    let n: usize = header
        .strip_prefix('*')
        .and_then(|n| n.parse().ok())
        .ok_or_else(|| io::Error::other(format!("expected an array, got {header:?}")))?;
    (0..n)
        .map(|_| {
            let line = read_line(r)?;
            if let Some(len) = line.strip_prefix('$') {
                let len: usize = len
                    .parse()
                    .map_err(|_| io::Error::other(format!("bad bulk length {line:?}")))?;
                let mut buf = vec![0; len + 2];
                r.read_exact(&mut buf)?;
                buf.truncate(len);
                Ok(String::from_utf8_lossy(&buf).into_owned())
            } else if let Some(int) = line.strip_prefix(':') {
                Ok(int.to_string())
            } else {
                Err(io::Error::other(format!("unexpected reply line {line:?}")))
            }
        })
        .collect()
}

fn read_line(r: &mut impl BufRead) -> io::Result<String> {
    let mut line = String::new();
    if r.read_line(&mut line)? == 0 {
        return Err(io::ErrorKind::UnexpectedEof.into());
    }
    Ok(line.trim_end_matches(['\r', '\n']).to_string())
}
