//! A throwaway primary + replicas + Redis Sentinel setup on loopback.
//!
//! Data nodes are [`RedisServer`]s (node 0 starts as the primary, the others
//! with `--replicaof` it); sentinels are `redis-server <conf> --sentinel`
//! processes (no separate `redis-sentinel` binary needed) monitoring the
//! primary under [`SentinelSetup::master_name`]. Every sentinel's
//! `+switch-master` events are recorded from the start ([`Switch`]), so a test
//! learns which node was promoted at the switch itself and can check that no
//! other switch followed.
//!
//! ```no_run
//! let setup = queue_testkit::sentinel::SentinelSetup::start(1, 1).expect("sentinel");
//! assert!(setup.url().starts_with("redis-sentinel://127.0.0.1:"));
//! let old = setup.primary_index().unwrap();
//! let mark = setup.switch_mark();
//! let new = setup.failover(std::time::Duration::from_secs(20)).unwrap();
//! assert_ne!(old, new);
//! let switches = setup.switches_since(mark);
//! assert!(switches.iter().all(|s| s.to == setup.server(new).port()));
//! ```
//!
//! ## A Sentinel quirk the helpers work around
//!
//! When a sentinel switches to the promoted replica it resets the master's
//! link and starts the "no answer since" clock at that instant, but it only
//! reconnects once a second has passed since its *last* reconnection attempt
//! — which, after a SIGKILL, was to the dead old primary, possibly just
//! before the switch. With `down-after-milliseconds` at 1000 (the default
//! here) the sentinel can therefore judge the brand-new primary down about a
//! second after the switch, before its first PING was even answered, and
//! (the switch also clears the failover cool-down) fail over again at once:
//! to the old primary if it has just been restarted as a replica. So
//! [`SentinelSetup::restart_as_replica`] first waits until every sentinel has
//! had an answer from the new primary ([`SentinelSetup::wait_settled`]), and
//! keeps the restarted node at `replica-priority 0` until it has synced.

mod fake;
mod switches;

use std::io;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

pub use fake::FakeSentinel;
pub use switches::Switch;
use switches::SwitchLog;

use crate::{free_port, retry_on_fresh_port, RedisServer};

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
    switches: SwitchLog,
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
            // The port is picked free but taken only when the sentinel binds
            // it: if another process got it first, try again with a new one.
            sentinels.push(retry_on_fresh_port(|| {
                spawn_sentinel(&opts, &pport, quorum)
            })?);
        }
        let mut switches = SwitchLog::default();
        for (s, sentinel) in sentinels.iter().enumerate() {
            switches.watch(s, sentinel.port, &opts.master_name)?;
        }
        let setup = SentinelSetup {
            servers,
            sentinels,
            master_name: opts.master_name.clone(),
            switches,
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

    /// Every sentinel's log (its events: `+sdown`, `+switch-master`, …),
    /// for a test's failure message.
    pub fn sentinel_logs(&self) -> String {
        self.sentinels
            .iter()
            .enumerate()
            .map(|(s, p)| {
                let log = std::fs::read_to_string(p.dir.join("sentinel.log")).unwrap_or_default();
                format!("--- sentinel {s}:\n{log}")
            })
            .collect()
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
        self.index_of_port(self.primary_port()?)
    }

    /// The index of the data node listening on `port`.
    pub fn index_of_port(&self, port: u16) -> Option<usize> {
        self.servers.iter().position(|s| s.port() == port)
    }

    /// A mark in the log of `+switch-master` events, for
    /// [`SentinelSetup::switches_since`] and [`SentinelSetup::wait_switch`].
    pub fn switch_mark(&self) -> usize {
        self.switches.mark()
    }

    /// Every `+switch-master` event (from every sentinel) recorded after
    /// `mark`, oldest first.
    pub fn switches_since(&self, mark: usize) -> Vec<Switch> {
        self.switches.since(mark)
    }

    /// `SENTINEL FAILOVER` (a controlled failover), then waits for the
    /// switch away from the current primary ([`SentinelSetup::wait_switch`]).
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
        let mark = self.switch_mark();
        let start = Instant::now();
        poll(limit, Duration::from_millis(200), || {
            let out = self
                .sentinel_cli(0, &["SENTINEL", "FAILOVER", &self.master_name])
                .map_err(|e| e.to_string())?;
            // NOGOODSLAVE right after a previous failover: replicas not seen yet.
            match out.trim() {
                "OK" => Ok(()),
                other => Err(format!("SENTINEL FAILOVER: {other}")),
            }
        })?;
        let (new, _) = self.wait_switch(old, mark, limit.saturating_sub(start.elapsed()))?;
        Ok(new)
    }

    /// Waits for the first `+switch-master` event after `mark` that moves
    /// the primary away from node `old`, then until the promoted node reports
    /// `role:master`. Returns the promoted node's index and the event.
    pub fn wait_switch(
        &self,
        old: usize,
        mark: usize,
        limit: Duration,
    ) -> io::Result<(usize, Switch)> {
        let start = Instant::now();
        let from = self.servers[old].port();
        let switch = poll(limit, Duration::from_millis(10), || {
            self.switches_since(mark)
                .into_iter()
                .find(|s| s.from == from)
                .ok_or_else(|| format!("no +switch-master away from node {old}"))
        })?;
        let new = self.index_of_port(switch.to).ok_or_else(|| {
            io::Error::other(format!("switched to port {}: not a data node", switch.to))
        })?;
        self.wait_role(new, "role:master", limit.saturating_sub(start.elapsed()))?;
        Ok((new, switch))
    }

    /// Waits until every sentinel names the same primary, sees it up (flags
    /// exactly `master`: not down, no failover in progress) and has had an
    /// answer to a PING since it switched to it (`last-ping-sent` 0: the
    /// switch starts that clock, only an answer stops it). From then on a
    /// sentinel judges the primary down only if it really stops answering;
    /// before, it can do so spuriously (see the module docs). Returns the
    /// primary's index.
    pub fn wait_settled(&self, limit: Duration) -> io::Result<usize> {
        poll(limit, Duration::from_millis(20), || {
            let mut named = None;
            for s in 0..self.sentinels.len() {
                let out = self
                    .sentinel_cli(s, &["SENTINEL", "MASTER", &self.master_name])
                    .map_err(|e| e.to_string())?;
                let m = records(&out).pop().unwrap_or_default();
                let field = |k: &str| m.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
                let (flags, ping) = (field("flags"), field("last-ping-sent"));
                if flags != Some("master") || ping != Some("0") {
                    return Err(format!(
                        "sentinel {s}: flags {flags:?}, last-ping-sent {ping:?}"
                    ));
                }
                let port = field("port").and_then(|p| p.parse().ok());
                if named.is_some() && named != port {
                    return Err(format!("sentinels name {named:?} and {port:?}"));
                }
                named = port;
            }
            named
                .and_then(|p| self.index_of_port(p))
                .ok_or_else(|| format!("primary {named:?} is not a data node"))
        })
    }

    /// Waits until data node `i`'s `INFO replication` contains `needle`
    /// (e.g. `role:slave`, `master_link_status:up`).
    pub fn wait_role(&self, i: usize, needle: &str, limit: Duration) -> io::Result<()> {
        poll(limit, Duration::from_millis(20), || {
            let info = self
                .server_cli(i, &["INFO", "replication"])
                .unwrap_or_default();
            if info.contains(needle) {
                Ok(())
            } else {
                Err(format!("node {i}: no `{needle}`: {info}"))
            }
        })
    }

    /// Waits until the setup is ready for the next failover: the sentinels
    /// are settled on a primary ([`SentinelSetup::wait_settled`]), every
    /// other running data node is a linked replica of it, the primary counts
    /// them, and every sentinel lists each of them as a replica it could
    /// promote (up, link `ok`, `slave-priority` not 0; sentinels refresh a
    /// replica's INFO every 10 s, so this can take that long after a
    /// [`SentinelSetup::restart_as_replica`]).
    pub fn wait_healthy(&self, limit: Duration) -> io::Result<()> {
        let start = Instant::now();
        poll(limit, Duration::from_millis(50), || {
            let left = limit.saturating_sub(start.elapsed());
            let p = self.wait_settled(left).map_err(|e| e.to_string())?;
            let port = self.servers[p].port();
            let running: Vec<usize> = (0..self.servers.len())
                .filter(|i| *i != p && self.servers[*i].pid().is_some())
                .collect();
            for i in &running {
                let info = self
                    .server_cli(*i, &["INFO", "replication"])
                    .unwrap_or_default();
                if !info.contains("master_link_status:up")
                    || !info.contains(&format!("master_port:{port}"))
                {
                    return Err(format!("node {i} is not a linked replica of node {p}"));
                }
            }
            let primary = self
                .server_cli(p, &["INFO", "replication"])
                .unwrap_or_default();
            if !primary.contains(&format!("connected_slaves:{}", running.len())) {
                return Err(format!(
                    "node {p} does not count {} replicas",
                    running.len()
                ));
            }
            for s in 0..self.sentinels.len() {
                self.sentinel_sees_promotable(s, port, &running)?;
            }
            Ok(())
        })
    }

    /// Whether sentinel `s` lists every node of `replicas` as a replica of
    /// the primary on `primary_port` that it could promote.
    fn sentinel_sees_promotable(
        &self,
        s: usize,
        primary_port: u16,
        replicas: &[usize],
    ) -> Result<(), String> {
        let out = self
            .sentinel_cli(s, &["SENTINEL", "REPLICAS", &self.master_name])
            .map_err(|e| e.to_string())?;
        let listed = records(&out);
        for i in replicas {
            let port = self.servers[*i].port().to_string();
            let r = listed
                .iter()
                .find(|r| r.iter().any(|(k, v)| k == "port" && *v == port))
                .ok_or_else(|| format!("sentinel {s} does not list node {i}"))?;
            let field = |k: &str| r.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
            let ok = field("flags") == Some("slave")
                && field("master-link-status") == Some("ok")
                && field("master-port") == Some(primary_port.to_string().as_str())
                && field("slave-priority").is_some_and(|p| p != "0");
            if !ok {
                return Err(format!("sentinel {s} cannot promote node {i} yet: {r:?}"));
            }
        }
        Ok(())
    }

    /// SIGKILLs data node `i`.
    pub fn kill(&mut self, i: usize) {
        self.servers[i].kill();
    }

    /// Restarts data node `i` (same port and arguments) and makes it a
    /// replica of the current primary right away with `REPLICAOF` — what the
    /// sentinels would do themselves some 8 s after seeing it back — then
    /// waits for its replication link (the initial sync done).
    ///
    /// It first waits until the sentinels are settled on the new primary
    /// ([`SentinelSetup::wait_settled`]): until then a sentinel may judge the
    /// new primary down spuriously and fail over again, which with the
    /// restarted node available would promote it straight back. And the node
    /// runs with `replica-priority 0` (never promoted) until it has synced,
    /// so no failover can promote an empty node; then its configured
    /// priority is restored. Fails if the sentinels switched primaries
    /// meanwhile.
    pub fn restart_as_replica(&mut self, i: usize, limit: Duration) -> io::Result<()> {
        let start = Instant::now();
        let left = || limit.saturating_sub(start.elapsed());
        let primary = self.wait_settled(limit)?;
        if primary == i {
            return Err(io::Error::other(format!(
                "node {i} is the primary the sentinels name"
            )));
        }
        self.servers[i].restart()?;
        let node = &self.servers[i];
        let reply = node.command(&["CONFIG", "GET", "replica-priority"])?;
        let configured = reply
            .lines()
            .rev()
            .find(|l| !l.is_empty())
            .unwrap_or_default()
            .to_string();
        expect_ok(node.command(&["CONFIG", "SET", "replica-priority", "0"])?)?;
        let pport = self.servers[primary].port().to_string();
        expect_ok(node.command(&["REPLICAOF", "127.0.0.1", &pport])?)?;
        self.wait_role(i, "master_link_status:up", left())?;
        let now = self.wait_settled(left())?;
        if now != primary {
            return Err(io::Error::other(format!(
                "the sentinels switched from node {primary} to node {now} while node {i} synced"
            )));
        }
        expect_ok(node.command(&["CONFIG", "SET", "replica-priority", &configured])?)
    }

    fn wait_ready(&self, replicas: usize, limit: Duration) -> io::Result<()> {
        let others = (self.sentinels.len() - 1).to_string();
        let replicas_s = replicas.to_string();
        poll(limit, Duration::from_millis(100), || {
            for s in 0..self.sentinels.len() {
                let out = self
                    .sentinel_cli(s, &["SENTINEL", "MASTER", &self.master_name])
                    .unwrap_or_default();
                let m = records(&out).pop().unwrap_or_default();
                let field = |k: &str| m.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
                if field("num-slaves") != Some(replicas_s.as_str())
                    || field("num-other-sentinels") != Some(others.as_str())
                    || field("flags") != Some("master")
                {
                    return Err(format!("sentinel {s} not ready: {m:?}"));
                }
            }
            for i in 1..self.servers.len() {
                let info = self
                    .server_cli(i, &["INFO", "replication"])
                    .unwrap_or_default();
                if !info.contains("master_link_status:up") {
                    return Err(format!("replica {i} not linked"));
                }
            }
            Ok(())
        })
    }
}

/// Calls `probe` every `every` until it returns `Ok`; after `limit`, a
/// `TimedOut` error with the last reason `probe` gave.
fn poll<T>(
    limit: Duration,
    every: Duration,
    mut probe: impl FnMut() -> Result<T, String>,
) -> io::Result<T> {
    let start = Instant::now();
    loop {
        match probe() {
            Ok(t) => return Ok(t),
            Err(why) if start.elapsed() > limit => {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("after {limit:?}: {why}"),
                ))
            }
            Err(_) => std::thread::sleep(every),
        }
    }
}

/// `redis-cli` output of key/value replies (`SENTINEL MASTER`, `SENTINEL
/// REPLICAS`: one element per line) as records, a new one at each `name`.
fn records(out: &str) -> Vec<Vec<(String, String)>> {
    let lines: Vec<&str> = out.lines().collect();
    let mut all: Vec<Vec<(String, String)>> = Vec::new();
    for pair in lines.chunks(2) {
        let [k, v] = pair else { break };
        if *k == "name" || all.is_empty() {
            all.push(Vec::new());
        }
        if let Some(r) = all.last_mut() {
            r.push((k.to_string(), v.to_string()));
        }
    }
    all
}

/// An inline command's raw reply must be `+OK`.
fn expect_ok(reply: String) -> io::Result<()> {
    if reply.starts_with("+OK") {
        Ok(())
    } else {
        Err(io::Error::other(format!("expected +OK, got {reply:?}")))
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
