//! A throwaway primary + replicas + Redis Sentinel setup on loopback.
//!
//! Data nodes are [`RedisServer`]s (node 0 starts as the primary, the others
//! with `--replicaof` it); sentinels are `redis-server <conf> --sentinel`
//! processes (no separate `redis-sentinel` binary needed) monitoring the
//! primary under [`SentinelSetup::master_name`].
//!
//! ```no_run
//! let setup = queue_testkit::sentinel::SentinelSetup::start(1, 1).expect("sentinel");
//! assert!(setup.url().starts_with("redis-sentinel://127.0.0.1:"));
//! let old = setup.primary_index().unwrap();
//! let new = setup.failover(std::time::Duration::from_secs(20)).unwrap();
//! assert_ne!(old, new);
//! ```

use std::io;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use crate::{free_port, RedisServer};

static COUNTER: AtomicU32 = AtomicU32::new(0);

/// Options of [`SentinelSetup::start_with`].
#[derive(Debug, Clone)]
pub struct SentinelOptions {
    /// Replicas of the primary.
    pub replicas: usize,
    /// Sentinel processes.
    pub sentinels: usize,
    /// Sentinels that must agree the primary is down (default: a majority).
    pub quorum: Option<usize>,
    /// `down-after-milliseconds` (default 1000).
    pub down_after_ms: u64,
    /// `failover-timeout` (default 5000).
    pub failover_timeout_ms: u64,
    /// The monitored master's name (default `mymaster`).
    pub master_name: String,
    /// Extra `redis-server` arguments for every data node.
    pub extra_args: Vec<String>,
}

impl Default for SentinelOptions {
    fn default() -> Self {
        SentinelOptions {
            replicas: 1,
            sentinels: 1,
            quorum: None,
            down_after_ms: 1000,
            failover_timeout_ms: 5000,
            master_name: "mymaster".into(),
            extra_args: Vec::new(),
        }
    }
}

/// One sentinel process.
#[derive(Debug)]
struct SentinelProcess {
    child: Option<Child>,
    port: u16,
    dir: PathBuf,
}

impl Drop for SentinelProcess {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Primary, replicas and sentinels. Everything is killed on drop.
#[derive(Debug)]
pub struct SentinelSetup {
    servers: Vec<RedisServer>,
    sentinels: Vec<SentinelProcess>,
    master_name: String,
}

impl SentinelSetup {
    /// `replicas` replicas and `sentinels` sentinels (quorum: a majority).
    pub fn start(replicas: usize, sentinels: usize) -> io::Result<Self> {
        Self::start_with(SentinelOptions {
            replicas,
            sentinels,
            ..SentinelOptions::default()
        })
    }

    /// Starts everything and waits until the sentinels see every replica
    /// (and each other) and every replica's link is up.
    pub fn start_with(opts: SentinelOptions) -> io::Result<Self> {
        let extra: Vec<&str> = opts.extra_args.iter().map(String::as_str).collect();
        let primary = RedisServer::start_with(&extra)?;
        let pport = primary.port().to_string();
        let mut servers = vec![primary];
        for _ in 0..opts.replicas {
            let mut args = vec!["--replicaof", "127.0.0.1", &pport];
            args.extend(extra.iter().copied());
            servers.push(RedisServer::start_with(&args)?);
        }
        let quorum = opts.quorum.unwrap_or(opts.sentinels / 2 + 1).max(1);
        let mut sentinels = Vec::new();
        for _ in 0..opts.sentinels.max(1) {
            sentinels.push(spawn_sentinel(&opts, &pport, quorum)?);
        }
        let setup = SentinelSetup {
            servers,
            sentinels,
            master_name: opts.master_name.clone(),
        };
        setup.wait_ready(opts.replicas, Duration::from_secs(30))?;
        Ok(setup)
    }

    /// `redis-sentinel://127.0.0.1:s1[,127.0.0.1:s2...]/<master-name>`.
    pub fn url(&self) -> String {
        let hosts: Vec<String> = self
            .sentinels
            .iter()
            .map(|s| format!("127.0.0.1:{}", s.port))
            .collect();
        format!("redis-sentinel://{}/{}", hosts.join(","), self.master_name)
    }

    /// The monitored master's name.
    pub fn master_name(&self) -> &str {
        &self.master_name
    }

    /// Data node `i` (0 was the first primary).
    pub fn server(&self, i: usize) -> &RedisServer {
        &self.servers[i]
    }

    /// Number of data nodes.
    pub fn len(&self) -> usize {
        self.servers.len()
    }

    /// Always false.
    pub fn is_empty(&self) -> bool {
        self.servers.is_empty()
    }

    /// Runs a command on sentinel `s` with `redis-cli`; returns raw stdout.
    pub fn sentinel_cli(&self, s: usize, args: &[&str]) -> io::Result<String> {
        let port = self.sentinels[s].port.to_string();
        let mut all = vec!["-h", "127.0.0.1", "-p", &port];
        all.extend_from_slice(args);
        cli(&all)
    }

    /// Runs a command on data node `i` with `redis-cli`; returns raw stdout.
    pub fn server_cli(&self, i: usize, args: &[&str]) -> io::Result<String> {
        let port = self.servers[i].port().to_string();
        let mut all = vec!["-h", "127.0.0.1", "-p", &port];
        all.extend_from_slice(args);
        cli(&all)
    }

    /// The primary's port according to the first sentinel that answers.
    pub fn primary_port(&self) -> Option<u16> {
        (0..self.sentinels.len()).find_map(|s| {
            let out = self
                .sentinel_cli(
                    s,
                    &["SENTINEL", "get-master-addr-by-name", &self.master_name],
                )
                .ok()?;
            out.lines().nth(1)?.trim().parse().ok()
        })
    }

    /// The index of the data node the sentinels name as primary.
    pub fn primary_index(&self) -> Option<usize> {
        let port = self.primary_port()?;
        self.servers.iter().position(|s| s.port() == port)
    }

    /// `SENTINEL FAILOVER` (a controlled failover), then waits until the
    /// sentinels name another node and that node says `role:master`.
    /// Returns the new primary's index.
    ///
    /// The old primary is *not* demoted at that point: Sentinel turns it
    /// into a replica some 8 s later (it waits four publish periods before
    /// reconfiguring an instance that still claims to be a primary); use
    /// [`SentinelSetup::wait_role`] with `role:slave` to wait for that.
    pub fn failover(&self, limit: Duration) -> io::Result<usize> {
        let old = self
            .primary_index()
            .ok_or_else(|| io::Error::other("no primary known to the sentinels"))?;
        let start = Instant::now();
        loop {
            let out = self.sentinel_cli(0, &["SENTINEL", "FAILOVER", &self.master_name])?;
            if out.trim() == "OK" {
                break;
            }
            // NOGOODSLAVE right after a previous failover: replicas not seen yet.
            if start.elapsed() > limit {
                return Err(io::Error::other(format!("SENTINEL FAILOVER: {out}")));
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        self.wait_primary_change(old, limit.saturating_sub(start.elapsed()))
    }

    /// Waits until the sentinels name a primary other than node `old` and
    /// that node reports `role:master`. Returns its index.
    pub fn wait_primary_change(&self, old: usize, limit: Duration) -> io::Result<usize> {
        let start = Instant::now();
        loop {
            if let Some(i) = self.primary_index() {
                if i != old
                    && self
                        .server_cli(i, &["ROLE"])
                        .map(|r| r.starts_with("master"))
                        .unwrap_or(false)
                {
                    return Ok(i);
                }
            }
            if start.elapsed() > limit {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("no new primary after {limit:?}"),
                ));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Waits until data node `i`'s `INFO replication` contains `needle`
    /// (e.g. `role:slave`, `master_link_status:up`).
    pub fn wait_role(&self, i: usize, needle: &str, limit: Duration) -> io::Result<()> {
        let start = Instant::now();
        loop {
            let info = self
                .server_cli(i, &["INFO", "replication"])
                .unwrap_or_default();
            if info.contains(needle) {
                return Ok(());
            }
            if start.elapsed() > limit {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("node {i}: no `{needle}` after {limit:?}: {info}"),
                ));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Waits until the primary the sentinels name has every other running
    /// data node as a linked replica (`master_link_status:up`), and the
    /// sentinels count them as replicas.
    pub fn wait_healthy(&self, limit: Duration) -> io::Result<()> {
        let start = Instant::now();
        loop {
            if let Some(p) = self.primary_index() {
                let port = self.servers[p].port();
                let running: Vec<usize> = (0..self.servers.len())
                    .filter(|i| *i != p && self.servers[*i].pid().is_some())
                    .collect();
                let linked = running.iter().all(|i| {
                    let info = self
                        .server_cli(*i, &["INFO", "replication"])
                        .unwrap_or_default();
                    info.contains("master_link_status:up")
                        && info.contains(&format!("master_port:{port}"))
                });
                let primary = self
                    .server_cli(p, &["INFO", "replication"])
                    .unwrap_or_default();
                let counted = primary.contains(&format!("connected_slaves:{}", running.len()));
                if linked && counted {
                    return Ok(());
                }
            }
            if start.elapsed() > limit {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("replicas not linked to the primary after {limit:?}"),
                ));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// SIGKILLs data node `i`.
    pub fn kill(&mut self, i: usize) {
        self.servers[i].kill();
    }

    /// Restarts data node `i` (same port and arguments) and makes it a
    /// replica of the current primary right away with `REPLICAOF` — what the
    /// sentinels would do themselves some 8 s after seeing it back — then
    /// waits for its replication link.
    pub fn restart_as_replica(&mut self, i: usize, limit: Duration) -> io::Result<()> {
        self.servers[i].restart()?;
        // The sentinels may reconfigure the returning node themselves, in
        // either direction (on a loaded machine they have been seen to fail
        // back to it): follow whatever primary they name until the node is
        // that primary or a linked replica of it.
        let start = Instant::now();
        let own = self.servers[i].port();
        loop {
            let port = self
                .primary_port()
                .ok_or_else(|| io::Error::other("no primary known to the sentinels"))?;
            if port == own {
                if self
                    .wait_role(i, "role:master", Duration::from_secs(2))
                    .is_ok()
                {
                    return Ok(());
                }
            } else {
                let info = self
                    .server_cli(i, &["INFO", "replication"])
                    .unwrap_or_default();
                if !info.contains(&format!("master_port:{port}")) {
                    let out = self.server_cli(i, &["REPLICAOF", "127.0.0.1", &port.to_string()])?;
                    if !out.starts_with("OK") {
                        return Err(io::Error::other(format!("REPLICAOF: {out}")));
                    }
                }
                let linked = self.wait_role(i, "master_link_status:up", Duration::from_secs(5));
                let still = self.primary_port() == Some(port);
                if linked.is_ok() && still {
                    return Ok(());
                }
            }
            if start.elapsed() > limit {
                let info = self
                    .server_cli(i, &["INFO", "replication"])
                    .unwrap_or_default();
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("node {i} did not rejoin within {limit:?}: {info}"),
                ));
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    fn wait_ready(&self, replicas: usize, limit: Duration) -> io::Result<()> {
        let start = Instant::now();
        let others = (self.sentinels.len() - 1).to_string();
        let replicas_s = replicas.to_string();
        loop {
            let mut ready = true;
            for s in 0..self.sentinels.len() {
                let out = self
                    .sentinel_cli(s, &["SENTINEL", "MASTER", &self.master_name])
                    .unwrap_or_default();
                let lines: Vec<&str> = out.lines().collect();
                let field = |name: &str| {
                    lines
                        .iter()
                        .position(|l| *l == name)
                        .and_then(|p| lines.get(p + 1))
                        .copied()
                        .unwrap_or_default()
                };
                if field("num-slaves") != replicas_s
                    || field("num-other-sentinels") != others
                    || field("flags") != "master"
                {
                    ready = false;
                }
            }
            for i in 1..self.servers.len() {
                let info = self
                    .server_cli(i, &["INFO", "replication"])
                    .unwrap_or_default();
                if !info.contains("master_link_status:up") {
                    ready = false;
                }
            }
            if ready {
                return Ok(());
            }
            if start.elapsed() > limit {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("sentinels not ready after {limit:?}"),
                ));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

fn spawn_sentinel(
    opts: &SentinelOptions,
    primary_port: &str,
    quorum: usize,
) -> io::Result<SentinelProcess> {
    let port = free_port()?;
    let n = COUNTER.fetch_add(1, Ordering::SeqCst);
    let dir = std::env::temp_dir().join(format!(
        "queue-testkit-sentinel-{}-{}-{}",
        std::process::id(),
        port,
        n
    ));
    std::fs::create_dir_all(&dir)?;
    let name = &opts.master_name;
    let conf = format!(
        "port {port}\nbind 127.0.0.1\ndaemonize no\ndir {dir}\nlogfile {dir}/sentinel.log\n\
         sentinel monitor {name} 127.0.0.1 {primary_port} {quorum}\n\
         sentinel down-after-milliseconds {name} {down}\n\
         sentinel failover-timeout {name} {ft}\n\
         sentinel parallel-syncs {name} 1\n",
        dir = dir.display(),
        down = opts.down_after_ms,
        ft = opts.failover_timeout_ms,
    );
    let conf_path = dir.join("sentinel.conf");
    std::fs::write(&conf_path, conf)?;
    let bin = std::env::var("REDIS_SERVER").unwrap_or_else(|_| "redis-server".to_string());
    let child = Command::new(&bin)
        .arg(&conf_path)
        .arg("--sentinel")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| io::Error::new(e.kind(), format!("cannot start `{bin} --sentinel`: {e}")))?;
    let mut proc = SentinelProcess {
        child: Some(child),
        port,
        dir,
    };
    let start = Instant::now();
    let p = port.to_string();
    loop {
        if let Some(status) = proc
            .child
            .as_mut()
            .and_then(|c| c.try_wait().ok().flatten())
        {
            let log = std::fs::read_to_string(proc.dir.join("sentinel.log")).unwrap_or_default();
            return Err(io::Error::other(format!(
                "sentinel exited early with {status}; log:\n{log}"
            )));
        }
        if cli(&["-h", "127.0.0.1", "-p", &p, "PING"])
            .map(|r| r.contains("PONG"))
            .unwrap_or(false)
        {
            return Ok(proc);
        }
        if start.elapsed() > Duration::from_secs(10) {
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "sentinel did not answer PING in time",
            ));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn cli(args: &[&str]) -> io::Result<String> {
    let bin = std::env::var("REDIS_CLI").unwrap_or_else(|_| "redis-cli".to_string());
    let out = Command::new(&bin)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| io::Error::new(e.kind(), format!("cannot run `{bin}`: {e}")))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(io::Error::other(format!(
            "redis-cli {} failed: {}{}",
            args.join(" "),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )))
    }
}
