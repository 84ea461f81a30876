//! [`FakeSentinel`]: a TCP server that answers `SENTINEL MASTER <name>` as a
//! sentinel does, naming whichever primary (and configuration epoch) the
//! test sets. It lets a test decide exactly when "the sentinels" name
//! another node — e.g. the node a test demoted with `FAILOVER` while a
//! client's pipeline is held half-way — with none of a real sentinel's
//! timing (its own failover, its `CLIENT KILL` of the demoted node's
//! clients).

use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::thread;

/// A fake sentinel on a free loopback port.
pub struct FakeSentinel {
    port: u16,
    master: String,
    named: Arc<Mutex<(String, u16, i64)>>,
}

impl FakeSentinel {
    /// Answers for `master`, naming `127.0.0.1:<port>` with `epoch`.
    pub fn start(master: &str, port: u16, epoch: i64) -> std::io::Result<Self> {
        let listener = TcpListener::bind(("127.0.0.1", 0))?;
        let me = listener.local_addr()?.port();
        let named = Arc::new(Mutex::new(("127.0.0.1".to_string(), port, epoch)));
        let (n, name) = (named.clone(), master.to_string());
        thread::spawn(move || {
            for client in listener.incoming().flatten() {
                let (n, name) = (n.clone(), name.clone());
                thread::spawn(move || serve(client, &name, &n));
            }
        });
        Ok(FakeSentinel {
            port: me,
            master: master.to_string(),
            named,
        })
    }

    /// From now on names `127.0.0.1:<port>` with `epoch`.
    pub fn name(&self, port: u16, epoch: i64) {
        *self.named.lock().unwrap_or_else(|e| e.into_inner()) =
            ("127.0.0.1".to_string(), port, epoch);
    }

    /// Its port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `redis-sentinel://[userinfo@]127.0.0.1:<port>/<master>?check_interval_ms=0`
    /// (no background check: the test decides when the client asks).
    pub fn url(&self, userinfo: Option<&str>) -> String {
        let user = userinfo.map(|u| format!("{u}@")).unwrap_or_default();
        format!(
            "redis-sentinel://{user}127.0.0.1:{}/{}?check_interval_ms=0",
            self.port, self.master
        )
    }
}

/// Reads RESP requests (arrays of bulk strings) and answers them.
fn serve(client: TcpStream, master: &str, named: &Mutex<(String, u16, i64)>) {
    let Ok(mut out) = client.try_clone() else {
        return;
    };
    let mut input = BufReader::new(client);
    while let Some(args) = read_request(&mut input) {
        let upper: Vec<String> = args.iter().map(|a| a.to_ascii_uppercase()).collect();
        let reply = match upper.iter().map(String::as_str).collect::<Vec<_>>()[..] {
            ["PING", ..] => "+PONG\r\n".to_string(),
            ["CLIENT", ..] => "+OK\r\n".to_string(),
            ["SENTINEL", "MASTER", _] if args[2] == master => {
                let (ip, port, epoch) = named.lock().unwrap_or_else(|e| e.into_inner()).clone();
                let fields = [
                    ("name", master.to_string()),
                    ("ip", ip),
                    ("port", port.to_string()),
                    ("flags", "master".to_string()),
                    ("config-epoch", epoch.to_string()),
                ];
                let mut r = format!("*{}\r\n", fields.len() * 2);
                for (k, v) in fields {
                    r += &format!("${}\r\n{k}\r\n${}\r\n{v}\r\n", k.len(), v.len());
                }
                r
            }
            ["SENTINEL", "MASTER", _] => "-ERR No such master with that name\r\n".to_string(),
            _ => "-ERR unknown command\r\n".to_string(),
        };
        if out.write_all(reply.as_bytes()).is_err() {
            return;
        }
    }
}

/// One request: `*<n>` then n `$<len>` bulk strings; `None` at the end of
/// the stream or on anything else.
fn read_request(input: &mut BufReader<TcpStream>) -> Option<Vec<String>> {
    let line = read_line(input)?;
    let n: usize = line.strip_prefix('*')?.parse().ok()?;
    let mut args = Vec::with_capacity(n);
    for _ in 0..n {
        let len: usize = read_line(input)?.strip_prefix('$')?.parse().ok()?;
        let mut bytes = vec![0u8; len + 2];
        std::io::Read::read_exact(input, &mut bytes).ok()?;
        bytes.truncate(len);
        args.push(String::from_utf8_lossy(&bytes).into_owned());
    }
    Some(args)
}

fn read_line(input: &mut BufReader<TcpStream>) -> Option<String> {
    let mut line = String::new();
    match input.read_line(&mut line) {
        Ok(0) | Err(_) => None,
        Ok(_) => Some(line.trim_end().to_string()),
    }
}
