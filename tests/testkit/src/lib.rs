//! Test support: throwaway `redis-server` processes on free loopback ports.
//!
//! Every test that needs Redis starts its own server with [`RedisServer::start`],
//! so it can kill, restart or reconfigure it without disturbing any other test
//! or the machine's shared Redis.
//!
//! ```
//! let server = queue_testkit::RedisServer::start().expect("redis-server");
//! assert!(server.url().starts_with("redis://127.0.0.1:"));
//! ```

pub mod cluster;
pub mod postgres;
pub mod proxy;
pub mod sentinel;

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

static COUNTER: AtomicU32 = AtomicU32::new(0);

/// A `redis-server` child process bound to `127.0.0.1` on a free port.
///
/// The server is killed (SIGKILL) and its scratch directory removed on drop.
#[derive(Debug)]
pub struct RedisServer {
    child: Option<Child>,
    port: u16,
    dir: PathBuf,
    extra_args: Vec<String>,
}

impl RedisServer {
    /// Starts a server with no persistence (`save ""`, `appendonly no`).
    pub fn start() -> std::io::Result<Self> {
        Self::start_with(&[])
    }

    /// Starts a server with extra `redis-server` arguments, e.g.
    /// `["--appendonly", "yes", "--appendfsync", "always"]`.
    ///
    /// The port is picked free but only taken when the server binds it; if
    /// another process got it first, the server is started again on a fresh
    /// port (see [`retry_on_fresh_port`]).
    pub fn start_with(extra_args: &[&str]) -> std::io::Result<Self> {
        retry_on_fresh_port(|| Self::start_once(extra_args))
    }

    /// One attempt of [`RedisServer::start_with`] on one freshly picked port.
    pub(crate) fn start_once(extra_args: &[&str]) -> std::io::Result<Self> {
        let port = free_port()?;
        let n = COUNTER.fetch_add(1, Ordering::SeqCst);
        let dir = std::env::temp_dir().join(format!(
            "queue-testkit-{}-{}-{}",
            std::process::id(),
            port,
            n
        ));
        std::fs::create_dir_all(&dir)?;
        // Reserved until the value drops (through kills and restarts): no
        // other server of this process is started on it meanwhile.
        reserve_port(port);
        let mut server = RedisServer {
            child: None,
            port,
            dir,
            extra_args: extra_args.iter().map(|s| s.to_string()).collect(),
        };
        server.spawn()?;
        Ok(server)
    }

    fn spawn(&mut self) -> std::io::Result<()> {
        let bin = std::env::var("REDIS_SERVER").unwrap_or_else(|_| "redis-server".to_string());
        let mut cmd = Command::new(&bin);
        cmd.arg("--port")
            .arg(self.port.to_string())
            .arg("--bind")
            .arg("127.0.0.1")
            .arg("--save")
            .arg("")
            .arg("--appendonly")
            .arg("no")
            .arg("--dir")
            .arg(&self.dir)
            .arg("--logfile")
            .arg(self.dir.join("redis.log"))
            .arg("--daemonize")
            .arg("no");
        cmd.args(&self.extra_args);
        cmd.stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let child = cmd.spawn().map_err(|e| {
            std::io::Error::new(
                e.kind(),
                format!("cannot start `{bin}` (is redis-server installed? set REDIS_SERVER to its path): {e}"),
            )
        })?;
        self.child = Some(child);
        self.wait_ready(Duration::from_secs(10))
    }

    fn wait_ready(&mut self, limit: Duration) -> std::io::Result<()> {
        let start = Instant::now();
        loop {
            if let Some(child) = self.child.as_mut() {
                if let Some(status) = child.try_wait()? {
                    let log =
                        std::fs::read_to_string(self.dir.join("redis.log")).unwrap_or_default();
                    return Err(std::io::Error::other(format!(
                        "redis-server exited early with {status}; log:\n{log}"
                    )));
                }
            }
            // PONG: up and done loading its AOF/RDB (while loading it answers
            // -LOADING). And only our own child counts: if another process
            // holds the port, it may answer before our child exits with
            // "Address already in use".
            let own = format!("process_id:{}", self.pid().unwrap_or_default());
            let answers = |args: &[&str], needle: &str| {
                self.command(args)
                    .map(|r| r.contains(needle))
                    .unwrap_or(false)
            };
            if answers(&["PING"], "PONG") && answers(&["INFO", "server"], &own) {
                return Ok(());
            }
            if start.elapsed() > limit {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    "redis-server did not answer PING in time",
                ));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The connection URL, `redis://127.0.0.1:<port>/`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// The TCP port the server listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The server's working directory (RDB/AOF files, `redis.log`).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The OS process id of the running server, if it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(|c| c.id())
    }

    /// Kills the server with SIGKILL (no shutdown save) and waits for it to exit.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts the server again on the same port, directory and arguments
    /// (so an AOF or RDB file written before a [`kill`](Self::kill) is loaded).
    ///
    /// The same port, since clients reconnect to it. No server of this
    /// process takes it while it is down: the port stays reserved for this
    /// value ([`free_port`] never hands it out). Another process could still
    /// bind it: the spawn is retried for 30 s (a socket on the port, say an
    /// outgoing connection, may go away), then the error names the port.
    pub fn restart(&mut self) -> std::io::Result<()> {
        self.kill();
        let start = Instant::now();
        loop {
            match self.spawn() {
                Ok(()) => return Ok(()),
                Err(e) if start.elapsed() < RESTART_RETRY => {
                    self.child.take().map(|mut c| {
                        let _ = c.kill();
                        c.wait()
                    });
                    let _ = e;
                    std::thread::sleep(Duration::from_millis(100));
                }
                Err(e) if port_taken(&e) => {
                    return Err(std::io::Error::new(
                        std::io::ErrorKind::AddrInUse,
                        format!(
                            "redis-server cannot restart on port {}: another process bound it while the server was down, and kept it for {RESTART_RETRY:?} (clients reconnect to that port, so no other one will do): {e}",
                            self.port
                        ),
                    ))
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Sends one inline command over a fresh TCP connection and returns the raw reply.
    ///
    /// Arguments must not contain spaces or newlines (inline protocol). Useful for
    /// `CONFIG SET`, `DEBUG SLEEP` and other setup in tests without a client library.
    pub fn command(&self, args: &[&str]) -> std::io::Result<String> {
        let mut stream = TcpStream::connect(("127.0.0.1", self.port))?;
        stream.set_read_timeout(Some(Duration::from_secs(5)))?;
        let mut line = args.join(" ");
        line.push_str("\r\n");
        stream.write_all(line.as_bytes())?;
        let mut buf = [0u8; 4096];
        let n = stream.read(&mut buf)?;
        Ok(String::from_utf8_lossy(&buf[..n]).into_owned())
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
        release_port(self.port);
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// How long [`RedisServer::restart`] retries binding its port.
const RESTART_RETRY: Duration = Duration::from_secs(30);

/// Ports of this process's [`RedisServer`]s, kept from the start until the
/// value drops: a server being restarted is down for a moment, and its port
/// must not go to another test's server meanwhile (its clients would
/// reconnect to the wrong server, and the restart would fail).
fn reserved_ports() -> &'static std::sync::Mutex<std::collections::HashSet<u16>> {
    static PORTS: std::sync::OnceLock<std::sync::Mutex<std::collections::HashSet<u16>>> =
        std::sync::OnceLock::new();
    PORTS.get_or_init(Default::default)
}

fn reserve_port(port: u16) {
    reserved_ports()
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(port);
}

fn release_port(port: u16) {
    reserved_ports()
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .remove(&port);
}

fn port_reserved(port: u16) -> bool {
    reserved_ports()
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .contains(&port)
}

/// Attempts of [`retry_on_fresh_port`].
const PORT_ATTEMPTS: u32 = 4;

/// Runs `start` (which picks its own free ports) again while it fails
/// because a port was taken by another process between being picked and
/// being bound ("Address already in use" in the server's log), at most
/// [`PORT_ATTEMPTS`] times. Used for plain servers, cluster nodes (whose bus
/// port is picked the same way) and sentinels.
pub(crate) fn retry_on_fresh_port<T>(
    mut start: impl FnMut() -> std::io::Result<T>,
) -> std::io::Result<T> {
    let mut attempt = 1;
    loop {
        match start() {
            Err(e) if attempt < PORT_ATTEMPTS && port_taken(&e) => attempt += 1,
            other => return other,
        }
    }
}

/// Whether a start failed because its port was already bound.
fn port_taken(e: &std::io::Error) -> bool {
    e.kind() == std::io::ErrorKind::AddrInUse || e.to_string().contains("Address already in use")
}

/// Field `field` (`calls`, `usec`) of `command`'s line (lower case:
/// `fcall`, `lpos`) in the text of `INFO commandstats`; 0 when the command
/// has not run since the server started or the last `CONFIG RESETSTAT`.
///
/// ```
/// let info = "# Commandstats\r\ncmdstat_lpos:calls=3,usec=12,usec_per_call=4.00\r\n";
/// assert_eq!(queue_testkit::command_stat(info, "lpos", "calls"), 3);
/// assert_eq!(queue_testkit::command_stat(info, "lpos", "usec"), 12);
/// assert_eq!(queue_testkit::command_stat(info, "scan", "calls"), 0);
/// ```
pub fn command_stat(info: &str, command: &str, field: &str) -> u64 {
    let prefix = format!("cmdstat_{command}:");
    let key = format!("{field}=");
    info.lines()
        .find_map(|l| l.strip_prefix(prefix.as_str()))
        .and_then(|l| l.split(',').find_map(|kv| kv.strip_prefix(key.as_str())))
        .map_or(0, |v| v.trim().parse().expect("a commandstats count"))
}

/// A TCP port on 127.0.0.1 that was free a moment ago, and not the port
/// of a [`RedisServer`] of this process (one that is down while it
/// restarts has no socket on it, and the kernel could hand it out).
///
/// Nothing keeps it free: for an address that must stay unreachable use
/// [`RefusingPort`].
pub fn free_port() -> std::io::Result<u16> {
    free_port_from(|| TcpListener::bind("127.0.0.1:0"))
}

/// [`free_port`] with the listeners from `bind`: the first one on a port
/// that is not reserved; the others stay bound until then, so the kernel
/// does not hand the same port back.
fn free_port_from(mut bind: impl FnMut() -> std::io::Result<TcpListener>) -> std::io::Result<u16> {
    let mut skipped = Vec::new();
    loop {
        let listener = bind()?;
        let port = listener.local_addr()?.port();
        if !port_reserved(port) {
            return Ok(port);
        }
        if skipped.len() >= 64 {
            return Err(std::io::Error::other(
                "every free port picked was reserved by a RedisServer",
            ));
        }
        skipped.push(listener);
    }
}

/// A port on 127.0.0.1 where nobody listens, for as long as this value
/// lives: every connect to it is refused at once, and no other process (a
/// redis-server another test starts) can take it.
///
/// A socket is bound to the port and never listens, without `SO_REUSEADDR`,
/// so a later `bind` of the port fails (`redis-server` then picks another
/// port through [`retry_on_fresh_port`]) and the kernel hands it to no
/// outgoing connection. A port from [`free_port`] is only free when picked:
/// a server started meanwhile could answer on it.
///
/// ```
/// let nobody = queue_testkit::RefusingPort::bind().unwrap();
/// let refused = std::net::TcpStream::connect(("127.0.0.1", nobody.port())).unwrap_err();
/// assert_eq!(refused.kind(), std::io::ErrorKind::ConnectionRefused);
/// ```
#[derive(Debug)]
pub struct RefusingPort {
    _socket: socket2::Socket,
    port: u16,
}

impl RefusingPort {
    /// Binds a fresh port on 127.0.0.1 without listening.
    pub fn bind() -> std::io::Result<Self> {
        use socket2::{Domain, Protocol, Socket, Type};
        let socket = Socket::new(Domain::IPV4, Type::STREAM, Some(Protocol::TCP))?;
        socket.bind(&std::net::SocketAddr::from(([127, 0, 0, 1], 0)).into())?;
        let port = socket
            .local_addr()?
            .as_socket()
            .ok_or_else(|| std::io::Error::other("bound socket has no inet address"))?
            .port();
        Ok(RefusingPort {
            _socket: socket,
            port,
        })
    }

    /// The port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `redis://127.0.0.1:<port>/`: a Redis URL nothing answers on.
    pub fn redis_url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }
}

#[cfg(test)]
mod tests {
    use super::{free_port_from, retry_on_fresh_port, RedisServer};
    use std::io::{Error, ErrorKind};
    use std::net::TcpListener;

    /// A server killed for a restart has no socket on its port: the kernel
    /// may hand the port to the next `bind(0)`, here forced by binding it
    /// first. `free_port` passes over it, and the restart gets it back.
    /// (Before, another test's server could be started on it meanwhile.)
    #[test]
    fn the_port_of_a_server_down_for_a_restart_is_not_handed_out() {
        let mut server = RedisServer::start().expect("redis-server starts");
        let port = server.port();
        server.kill();
        let mut first = true;
        let picked = free_port_from(|| {
            let addr = if std::mem::take(&mut first) {
                ("127.0.0.1", port)
            } else {
                ("127.0.0.1", 0)
            };
            TcpListener::bind(addr)
        })
        .unwrap();
        assert_ne!(picked, port, "the restarting server's port was handed out");
        server.restart().expect("restarts on its port");
        assert_eq!(server.port(), port);
        assert!(server.command(&["PING"]).unwrap().contains("PONG"));
    }

    #[test]
    fn a_taken_port_is_retried_and_other_errors_are_not() {
        let mut calls = 0;
        let taken = || Error::other("exited early; log:\nbind: Address already in use");
        let r = retry_on_fresh_port(|| {
            calls += 1;
            if calls < 3 {
                Err(taken())
            } else {
                Ok(calls)
            }
        });
        assert_eq!(r.unwrap(), 3);

        let mut calls = 0;
        let r: std::io::Result<()> = retry_on_fresh_port(|| {
            calls += 1;
            Err(Error::new(ErrorKind::NotFound, "no redis-server"))
        });
        assert_eq!((r.unwrap_err().kind(), calls), (ErrorKind::NotFound, 1));

        let mut calls = 0;
        let r: std::io::Result<()> = retry_on_fresh_port(|| {
            calls += 1;
            Err(taken())
        });
        assert!(r.is_err());
        assert_eq!(calls, 4, "gives up after a few fresh ports");
    }

    /// The port refuses connections and cannot be taken while held: a
    /// listener's bind (std sets `SO_REUSEADDR`, as redis-server does)
    /// fails.
    #[test]
    fn a_refusing_port_refuses_connections_and_cannot_be_taken() {
        let nobody = super::RefusingPort::bind().unwrap();
        for _ in 0..3 {
            let e = std::net::TcpStream::connect(("127.0.0.1", nobody.port())).unwrap_err();
            assert_eq!(e.kind(), ErrorKind::ConnectionRefused, "{e}");
        }
        let taken = std::net::TcpListener::bind(("127.0.0.1", nobody.port())).unwrap_err();
        assert_eq!(taken.kind(), ErrorKind::AddrInUse, "{taken}");
        assert_eq!(
            nobody.redis_url(),
            format!("redis://127.0.0.1:{}/", nobody.port())
        );
    }

    #[test]
    fn a_started_server_answers_as_itself() {
        let server = super::RedisServer::start().expect("redis-server");
        let pid = server.pid().expect("running");
        let info = server.command(&["INFO", "server"]).unwrap();
        assert!(info.contains(&format!("process_id:{pid}")), "{info}");
    }
}
