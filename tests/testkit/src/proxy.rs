//! `ReplyDropper`: a TCP proxy in front of a `redis-server` that can lose one
//! reply on purpose, as a network does when a connection breaks after a
//! request reached Redis: the request runs, its reply never arrives, and the
//! client sees the connection close. This is the "outcome unknown" case that
//! every retry with the same token must answer as the first call did.
//!
//! It also stands for a DNS name or a virtual IP that a failover moves:
//! [`ReplyDropper::forward_new_connections_to`] sends the connections made
//! from then on to another server, while those already open stay on the old
//! one (as a client's open TCP connection does when the name moves); and
//! for a node that came back half up, or an address whose L4 proxy accepts
//! and forwards nowhere: [`ReplyDropper::hang_new_connections`].
//!
//! [`CommandGate`] holds back the requests naming one command;
//! [`PipelineSplitter`] holds back the rest of a pipeline after its first
//! request naming one, so that a test can change the server (demote it)
//! between two commands of one pipeline.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU16, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread;

/// A proxy to `127.0.0.1:<upstream>` on a port of its own.
pub struct ReplyDropper {
    port: u16,
    upstream: Arc<AtomicU16>,
    drop_next: Arc<AtomicBool>,
    dropped: Arc<AtomicU64>,
    hang: Arc<AtomicBool>,
}

impl ReplyDropper {
    /// Listens on a free loopback port and forwards every connection to
    /// `upstream`, until the process ends.
    pub fn start(upstream: u16) -> std::io::Result<Self> {
        let listener = TcpListener::bind(("127.0.0.1", 0))?;
        let port = listener.local_addr()?.port();
        let drop_next = Arc::new(AtomicBool::new(false));
        let dropped = Arc::new(AtomicU64::new(0));
        let upstream = Arc::new(AtomicU16::new(upstream));
        let hang = Arc::new(AtomicBool::new(false));
        let (flag, count, to, hanging) = (
            drop_next.clone(),
            dropped.clone(),
            upstream.clone(),
            hang.clone(),
        );
        thread::spawn(move || {
            let mut hung = Vec::new();
            for client in listener.incoming().flatten() {
                if hanging.load(Ordering::SeqCst) {
                    // Accepted, never read from nor answered, kept open.
                    hung.push(client);
                    continue;
                }
                let port = to.load(Ordering::SeqCst);
                let Some((client, server, c2, s2)) = connect_upstream(client, port) else {
                    continue;
                };
                thread::spawn(move || pipe(client, server, None));
                let (flag, count) = (flag.clone(), count.clone());
                thread::spawn(move || pipe(s2, c2, Some((flag, count))));
            }
        });
        Ok(ReplyDropper {
            port,
            upstream,
            drop_next,
            dropped,
            hang,
        })
    }

    /// The port it listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `redis://127.0.0.1:<proxy port>`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Connections accepted from now on are forwarded to `127.0.0.1:<port>`;
    /// those already open keep their server (a failover moving a DNS name or
    /// a virtual IP to the new primary).
    pub fn forward_new_connections_to(&self, port: u16) {
        self.upstream.store(port, Ordering::SeqCst);
    }

    /// The next reply the server sends, on any connection, is not
    /// delivered: that connection is closed instead.
    pub fn drop_next_reply(&self) {
        self.drop_next.store(true, Ordering::SeqCst);
    }

    /// How many replies were dropped so far.
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::SeqCst)
    }

    /// Connections accepted from now on are kept open and never answered
    /// (nothing is forwarded): a client's connect hangs until its own
    /// timeout. Those already open are still forwarded.
    pub fn hang_new_connections(&self) {
        self.hang.store(true, Ordering::SeqCst);
    }
}

/// Connects an accepted `client` to the server on `port` (no Nagle delay
/// either way): the client and server streams and a second handle of each,
/// for the two directions' threads; `None` when the server cannot be
/// reached or a handle cannot be cloned (the client is then dropped).
fn connect_upstream(
    client: TcpStream,
    port: u16,
) -> Option<(TcpStream, TcpStream, TcpStream, TcpStream)> {
    let server = TcpStream::connect(("127.0.0.1", port)).ok()?;
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let (c2, s2) = (client.try_clone().ok()?, server.try_clone().ok()?);
    Some((client, server, c2, s2))
}

/// Copies `from` to `to` until either closes; on the reply side (`drop`
/// given) a chunk read while the flag is set is swallowed and both
/// connections are closed.
fn pipe(mut from: TcpStream, mut to: TcpStream, drop: Option<(Arc<AtomicBool>, Arc<AtomicU64>)>) {
    let mut buf = [0u8; 16 * 1024];
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        if let Some((flag, count)) = &drop {
            if flag.swap(false, Ordering::SeqCst) {
                count.fetch_add(1, Ordering::SeqCst);
                break;
            }
        }
        if to.write_all(&buf[..n]).is_err() {
            break;
        }
    }
    let _ = from.shutdown(Shutdown::Both);
    let _ = to.shutdown(Shutdown::Both);
}

/// A TCP proxy to a `redis-server` that holds back every request naming one
/// command (e.g. `SCAN`) until [`CommandGate::open`]: that command is "in
/// progress" for as long as a test needs, with no sleep and no load. Other
/// requests pass (a held request holds only its own connection). A request
/// is recognised by a bulk string equal to the command's name in a chunk the
/// client sent (the whole chunk is held): use it for a command whose name is
/// no argument of the test's other requests.
pub struct CommandGate {
    port: u16,
    gate: Arc<(std::sync::Mutex<bool>, std::sync::Condvar)>,
    held: Arc<AtomicU64>,
}

impl CommandGate {
    /// Listens on a free loopback port and forwards every connection to
    /// `127.0.0.1:<upstream>`, holding requests of `command` (any case)
    /// while the gate is closed (it starts closed).
    pub fn start(upstream: u16, command: &str) -> std::io::Result<Self> {
        let listener = TcpListener::bind(("127.0.0.1", 0))?;
        let port = listener.local_addr()?.port();
        let gate = Arc::new((std::sync::Mutex::new(false), std::sync::Condvar::new()));
        let held = Arc::new(AtomicU64::new(0));
        let name = format!("\r\n${}\r\n{}\r\n", command.len(), command).to_ascii_uppercase();
        let (g, h) = (gate.clone(), held.clone());
        thread::spawn(move || {
            for client in listener.incoming().flatten() {
                let Some((client, server, c2, s2)) = connect_upstream(client, upstream) else {
                    continue;
                };
                let (g, h, name) = (g.clone(), h.clone(), name.clone());
                thread::spawn(move || gated_pipe(client, server, &name, &g, &h));
                thread::spawn(move || pipe(s2, c2, None));
            }
        });
        Ok(CommandGate { port, gate, held })
    }

    /// `redis://127.0.0.1:<proxy port>`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Requests of the command that reached the gate so far (held, or
    /// passed once it opened).
    pub fn held(&self) -> u64 {
        self.held.load(Ordering::SeqCst)
    }

    /// Lets every held request through, and every later one.
    pub fn open(&self) {
        let (open, wake) = &*self.gate;
        *open.lock().unwrap_or_else(|e| e.into_inner()) = true;
        wake.notify_all();
    }
}

/// Copies client `from` to server `to`, holding a chunk that names the
/// command (`name`: `\r\n$<len>\r\n<NAME>\r\n`, upper case) until the gate opens.
fn gated_pipe(
    mut from: TcpStream,
    mut to: TcpStream,
    name: &str,
    gate: &(std::sync::Mutex<bool>, std::sync::Condvar),
    held: &AtomicU64,
) {
    let mut buf = [0u8; 16 * 1024];
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        let upper = buf[..n].to_ascii_uppercase();
        if upper.windows(name.len()).any(|w| w == name.as_bytes()) {
            held.fetch_add(1, Ordering::SeqCst);
            let (open, wake) = gate;
            let mut is_open = open.lock().unwrap_or_else(|e| e.into_inner());
            while !*is_open {
                is_open = wake.wait(is_open).unwrap_or_else(|e| e.into_inner());
            }
        }
        if to.write_all(&buf[..n]).is_err() {
            break;
        }
    }
    let _ = from.shutdown(Shutdown::Both);
    let _ = to.shutdown(Shutdown::Both);
}

/// A TCP proxy to a `redis-server` that, once [armed](Self::arm), splits the
/// next pipeline that holds two or more requests naming one command (e.g.
/// `FCALL`): it forwards the pipeline up to the end of its first such
/// request and holds the rest — from the start of the second such request
/// on, and every later byte of that connection — until
/// [`release`](Self::release). The server runs the first request(s) and is
/// then, for as long as the test needs, between two commands of one
/// pipeline: a test can demote it (`FAILOVER`) there. Requests are
/// recognised by a bulk string equal to the command's name: use it for a
/// command whose name is no argument of the test's requests.
pub struct PipelineSplitter {
    port: u16,
    armed: Arc<AtomicBool>,
    held: Arc<AtomicU64>,
    gate: Arc<(std::sync::Mutex<bool>, std::sync::Condvar)>,
}

impl PipelineSplitter {
    /// Listens on a free loopback port and forwards every connection to
    /// `127.0.0.1:<upstream>`; splits on requests of `command` (upper case,
    /// as clients send it) once armed.
    pub fn start(upstream: u16, command: &str) -> std::io::Result<Self> {
        let listener = TcpListener::bind(("127.0.0.1", 0))?;
        let port = listener.local_addr()?.port();
        let armed = Arc::new(AtomicBool::new(false));
        let held = Arc::new(AtomicU64::new(0));
        let gate = Arc::new((std::sync::Mutex::new(false), std::sync::Condvar::new()));
        let mark = format!("${}\r\n{}\r\n", command.len(), command).into_bytes();
        let (a, h, g) = (armed.clone(), held.clone(), gate.clone());
        thread::spawn(move || {
            for client in listener.incoming().flatten() {
                let Some((client, server, c2, s2)) = connect_upstream(client, upstream) else {
                    continue;
                };
                let (a, h, g, mark) = (a.clone(), h.clone(), g.clone(), mark.clone());
                thread::spawn(move || split_pipe(client, server, &mark, &a, &h, &g));
                thread::spawn(move || pipe(s2, c2, None));
            }
        });
        Ok(PipelineSplitter {
            port,
            armed,
            held,
            gate,
        })
    }

    /// The port it listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Splits the next pipeline with two or more requests of the command.
    pub fn arm(&self) {
        self.armed.store(true, Ordering::SeqCst);
    }

    /// Pipelines split so far (1 once the armed split holds its rest).
    pub fn held(&self) -> u64 {
        self.held.load(Ordering::SeqCst)
    }

    /// Forwards the held rest, and everything after it.
    pub fn release(&self) {
        let (open, wake) = &*self.gate;
        *open.lock().unwrap_or_else(|e| e.into_inner()) = true;
        wake.notify_all();
    }
}

/// Copies client `from` to server `to`; while `armed`, looks for requests
/// naming the command (`mark`: `$<len>\r\n<NAME>\r\n`) and at the second
/// one of the stream holds the bytes from that request's `*<n>` header on
/// until the gate opens (disarming the proxy).
fn split_pipe(
    mut from: TcpStream,
    mut to: TcpStream,
    mark: &[u8],
    armed: &AtomicBool,
    held: &AtomicU64,
    gate: &(std::sync::Mutex<bool>, std::sync::Condvar),
) {
    // Bytes read and not forwarded yet: the tail that may hold a request's
    // header and the start of its name, cut by the read.
    let keep = mark.len() + 24;
    let mut pending: Vec<u8> = Vec::new();
    let mut from_at = 0usize;
    let mut first_seen = false;
    let mut buf = [0u8; 16 * 1024];
    // A pause in the client's writes forwards the kept tail: a request
    // shorter than it is not held back for ever.
    let _ = from.set_read_timeout(Some(std::time::Duration::from_millis(50)));
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                if to.write_all(&pending).is_err() {
                    break;
                }
                pending.clear();
                from_at = 0;
                continue;
            }
            Err(_) => break,
        };
        if !armed.load(Ordering::SeqCst) {
            first_seen = false;
            from_at = 0;
            pending.extend_from_slice(&buf[..n]);
            if to.write_all(&pending).is_err() {
                break;
            }
            pending.clear();
            continue;
        }
        pending.extend_from_slice(&buf[..n]);
        let mut split = None;
        while let Some(p) = find(&pending[from_at..], mark).map(|i| i + from_at) {
            if first_seen {
                split = Some(pending[..p].iter().rposition(|&b| b == b'*').unwrap_or(p));
                break;
            }
            first_seen = true;
            from_at = p + mark.len();
        }
        if let Some(at) = split {
            if to.write_all(&pending[..at]).is_err() {
                break;
            }
            armed.store(false, Ordering::SeqCst);
            held.fetch_add(1, Ordering::SeqCst);
            let (open, wake) = gate;
            let mut is_open = open.lock().unwrap_or_else(|e| e.into_inner());
            while !*is_open {
                is_open = wake.wait(is_open).unwrap_or_else(|e| e.into_inner());
            }
            drop(is_open);
            if to.write_all(&pending[at..]).is_err() {
                break;
            }
            pending.clear();
            from_at = 0;
            first_seen = false;
            continue;
        }
        let cut = pending.len().saturating_sub(keep);
        if to.write_all(&pending[..cut]).is_err() {
            break;
        }
        pending.drain(..cut);
        from_at = from_at.saturating_sub(cut);
    }
    let _ = from.shutdown(Shutdown::Both);
    let _ = to.shutdown(Shutdown::Both);
}

/// The first position of `needle` in `hay`.
fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}
