//! A throwaway Redis Cluster on loopback: `masters` primaries (and optionally
//! replicas), each a [`RedisServer`] with `cluster-enabled yes`, joined with
//! `redis-cli --cluster create`.
//!
//! Needs `redis-server` and `redis-cli` (7.0+; `REDIS_SERVER` / `REDIS_CLI`
//! override the paths). Every node gets its own data port *and* an explicit
//! cluster bus port (`cluster-port`), both free loopback ports.
//!
//! ```no_run
//! let cluster = queue_testkit::cluster::RedisCluster::start(3).expect("cluster");
//! assert!(cluster.url().starts_with("redis-cluster://127.0.0.1:"));
//! let slot = cluster.keyslot("{emails}");
//! assert_eq!(slot, 3728);
//! assert!(cluster.master_of_slot(slot).is_some());
//! ```

use std::io;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::{free_port, retry_on_fresh_port, RedisServer};

/// Options of [`RedisCluster::start_with`].
#[derive(Debug, Clone)]
pub struct ClusterOptions {
    /// Primaries (at least 3: `redis-cli --cluster create` refuses fewer).
    pub masters: usize,
    /// Replicas per primary.
    pub replicas_per_master: usize,
    /// `cluster-node-timeout` in ms: how long until an unreachable node is
    /// failed (and its replica promoted). Default 1000.
    pub node_timeout_ms: u64,
    /// `cluster-require-full-coverage`: with `false` (the default here) the
    /// slots of healthy primaries stay available while another primary is down.
    pub require_full_coverage: bool,
    /// Extra `redis-server` arguments for every node
    /// (e.g. `["--appendonly", "yes", "--appendfsync", "always"]`).
    pub extra_args: Vec<String>,
}

impl Default for ClusterOptions {
    fn default() -> Self {
        ClusterOptions {
            masters: 3,
            replicas_per_master: 0,
            node_timeout_ms: 1000,
            require_full_coverage: false,
            extra_args: Vec::new(),
        }
    }
}

/// A local Redis Cluster. Nodes are killed and their directories removed on drop.
#[derive(Debug)]
pub struct RedisCluster {
    nodes: Vec<RedisServer>,
    masters: usize,
}

impl RedisCluster {
    /// Starts `masters` primaries without replicas and waits for `cluster_state:ok`.
    pub fn start(masters: usize) -> io::Result<Self> {
        Self::start_with(ClusterOptions {
            masters,
            ..ClusterOptions::default()
        })
    }

    /// Starts a cluster as described by `opts` and waits until every node
    /// reports `cluster_state:ok` and every replica's link is up.
    pub fn start_with(opts: ClusterOptions) -> io::Result<Self> {
        if opts.masters < 3 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "a Redis Cluster needs at least 3 primaries",
            ));
        }
        let total = opts.masters * (1 + opts.replicas_per_master);
        let timeout = opts.node_timeout_ms.to_string();
        let coverage = if opts.require_full_coverage {
            "yes"
        } else {
            "no"
        };
        let mut nodes = Vec::with_capacity(total);
        for _ in 0..total {
            nodes.push(start_node(&opts.extra_args, &timeout, coverage)?);
        }
        let cluster = RedisCluster {
            nodes,
            masters: opts.masters,
        };
        let mut create: Vec<String> = vec!["--cluster".into(), "create".into()];
        create.extend(
            cluster
                .nodes
                .iter()
                .map(|n| format!("127.0.0.1:{}", n.port())),
        );
        create.extend([
            "--cluster-replicas".into(),
            opts.replicas_per_master.to_string(),
            "--cluster-yes".into(),
        ]);
        let args: Vec<&str> = create.iter().map(String::as_str).collect();
        let out = cli_raw(&args)?;
        if !out.contains("All 16384 slots covered") {
            return Err(io::Error::other(format!(
                "redis-cli --cluster create failed:\n{out}"
            )));
        }
        cluster.wait_ok(Duration::from_secs(30))?;
        Ok(cluster)
    }

    /// `redis-cluster://127.0.0.1:p1,127.0.0.1:p2,...` (every node as a seed).
    pub fn url(&self) -> String {
        let nodes: Vec<String> = self
            .nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port()))
            .collect();
        format!("redis-cluster://{}", nodes.join(","))
    }

    /// A URL naming only node `i` as the seed (the client discovers the rest).
    pub fn url_via(&self, i: usize) -> String {
        format!("redis-cluster://127.0.0.1:{}", self.nodes[i].port())
    }

    /// Number of nodes (primaries and replicas).
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// Always false: a cluster has at least 3 nodes.
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// Number of primaries the cluster was created with.
    pub fn masters(&self) -> usize {
        self.masters
    }

    /// Node `i` (the first `masters` were created as primaries; roles change
    /// after a failover: see [`RedisCluster::master_of_slot`]).
    pub fn node(&self, i: usize) -> &RedisServer {
        &self.nodes[i]
    }

    /// The index of the node listening on `port`.
    pub fn index_of_port(&self, port: u16) -> Option<usize> {
        self.nodes.iter().position(|n| n.port() == port)
    }

    /// Runs `redis-cli -h 127.0.0.1 -p <port of node i> args...` and returns
    /// its standard output (raw, one reply element per line).
    pub fn cli(&self, i: usize, args: &[&str]) -> io::Result<String> {
        let port = self.nodes[i].port().to_string();
        let mut all = vec!["-h", "127.0.0.1", "-p", &port];
        all.extend_from_slice(args);
        cli_raw(&all)
    }

    /// The cluster hash slot of `key` (`CLUSTER KEYSLOT`, asked of a live node).
    pub fn keyslot(&self, key: &str) -> u16 {
        for i in 0..self.nodes.len() {
            if let Ok(out) = self.cli(i, &["CLUSTER", "KEYSLOT", key]) {
                if let Ok(slot) = out.trim().parse() {
                    return slot;
                }
            }
        }
        panic!("no node answered CLUSTER KEYSLOT {key}");
    }

    /// The node id (`CLUSTER MYID`) of node `i`.
    pub fn node_id(&self, i: usize) -> io::Result<String> {
        Ok(self.cli(i, &["CLUSTER", "MYID"])?.trim().to_string())
    }

    /// The index of the node that owns `slot` as a primary (even if it is
    /// down right now), as seen by the first live node that answers
    /// `CLUSTER NODES`.
    pub fn master_of_slot(&self, slot: u16) -> Option<usize> {
        for i in 0..self.nodes.len() {
            if self.nodes[i].pid().is_none() {
                continue;
            }
            let Ok(nodes) = self.cli(i, &["CLUSTER", "NODES"]) else {
                continue;
            };
            if nodes.trim().is_empty() {
                continue;
            }
            for line in nodes.lines() {
                let f: Vec<&str> = line.split_whitespace().collect();
                if f.len() < 8 || !f[2].split(',').any(|flag| flag == "master") {
                    continue;
                }
                let owns = f[8..].iter().any(|range| {
                    if range.starts_with('[') {
                        return false; // migrating/importing marker
                    }
                    let (a, b) = range.split_once('-').unwrap_or((range, range));
                    match (a.parse::<u16>(), b.parse::<u16>()) {
                        (Ok(a), Ok(b)) => (a..=b).contains(&slot),
                        _ => false,
                    }
                });
                if owns {
                    let port = f[1]
                        .split('@')
                        .next()
                        .and_then(|a| a.rsplit(':').next())
                        .and_then(|p| p.parse().ok())?;
                    return self.index_of_port(port);
                }
            }
            return None;
        }
        None
    }

    /// The primary index serving the hash tag of queue `queue` (`{queue}`).
    pub fn master_of_queue(&self, queue: &str) -> Option<usize> {
        self.master_of_slot(self.keyslot(&format!("{{{queue}}}")))
    }

    /// The indexes of the replicas of primary `i` (from its `INFO replication`).
    pub fn replicas_of(&self, i: usize) -> Vec<usize> {
        let info = self.cli(i, &["INFO", "replication"]).unwrap_or_default();
        info.lines()
            .filter(|l| l.starts_with("slave") && l.contains("port="))
            .filter_map(|l| {
                l.split(',')
                    .find_map(|kv| kv.strip_prefix("port="))
                    .and_then(|p| p.trim().parse().ok())
            })
            .filter_map(|port| self.index_of_port(port))
            .collect()
    }

    /// Makes node `i` announce `port` as its client port (`CONFIG SET
    /// cluster-announce-port`, e.g. a [`crate::proxy::ReplyDropper`] in front
    /// of it), so that clients which learn the layout from `CLUSTER SLOTS`
    /// reach it there; waits until every running node shows it. Look up
    /// nodes by their own port ([`Self::master_of_slot`]) before: the
    /// layout then names the announced port.
    pub fn announce_port(&self, i: usize, port: u16, limit: Duration) -> io::Result<()> {
        let (p, bus) = (port.to_string(), self.bus_port(i)?.to_string());
        self.cli(i, &["CONFIG", "SET", "cluster-announce-bus-port", &bus])?;
        self.cli(i, &["CONFIG", "SET", "cluster-announce-port", &p])?;
        let id = self.node_id(i)?;
        let start = Instant::now();
        loop {
            let seen = (0..self.nodes.len())
                .filter(|&j| self.nodes[j].pid().is_some())
                .all(|j| {
                    let nodes = self.cli(j, &["CLUSTER", "NODES"]).unwrap_or_default();
                    nodes
                        .lines()
                        .any(|l| l.starts_with(&id) && l.contains(&format!("127.0.0.1:{port}@")))
                });
            if seen {
                return Ok(());
            }
            if start.elapsed() > limit {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("node {i}'s announced port {port} not seen by every node"),
                ));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Node `i`'s cluster bus port (`CONFIG GET cluster-port`).
    fn bus_port(&self, i: usize) -> io::Result<u16> {
        let out = self.cli(i, &["CONFIG", "GET", "cluster-port"])?;
        out.lines()
            .nth(1)
            .and_then(|p| p.trim().parse().ok())
            .ok_or_else(|| io::Error::other(format!("node {i}: no cluster-port in {out:?}")))
    }

    /// Waits until every running node reports `cluster_state:ok`, all agree on
    /// the slot layout (`redis-cli --cluster check`) and every replica's
    /// replication link is up.
    pub fn wait_ok(&self, limit: Duration) -> io::Result<()> {
        let start = Instant::now();
        let mut last = String::new();
        loop {
            let mut all_ok = true;
            let mut any = None;
            for (i, n) in self.nodes.iter().enumerate() {
                if n.pid().is_none() {
                    continue;
                }
                any.get_or_insert(i);
                let info = self.cli(i, &["CLUSTER", "INFO"]).unwrap_or_default();
                let repl = self.cli(i, &["INFO", "replication"]).unwrap_or_default();
                let link_ok =
                    !repl.contains("role:slave") || repl.contains("master_link_status:up");
                if !info.contains("cluster_state:ok") || !link_ok {
                    all_ok = false;
                    last = format!("node {i}: {}", info.lines().next().unwrap_or_default());
                }
            }
            if all_ok {
                if let Some(i) = any {
                    let addr = format!("127.0.0.1:{}", self.nodes[i].port());
                    let check = cli_raw(&["--cluster", "check", &addr]).unwrap_or_default();
                    if check.contains("All 16384 slots covered")
                        && check.contains("[OK] All nodes agree about slots configuration")
                        && !check.contains("[WARNING]")
                    {
                        return Ok(());
                    }
                    last = check;
                }
            }
            if start.elapsed() > limit {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("cluster not ok after {limit:?}: {last}"),
                ));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// SIGKILLs node `i` (no shutdown save).
    pub fn kill_node(&mut self, i: usize) {
        self.nodes[i].kill();
    }

    /// Starts node `i` again on the same ports, directory and `nodes.conf`
    /// (and AOF/RDB if persistence was on), so it rejoins the cluster.
    /// Does not wait for the cluster to agree: see [`RedisCluster::wait_ok`].
    pub fn restart_node(&mut self, i: usize) -> io::Result<()> {
        self.nodes[i].restart()
    }

    /// Waits until node `i` reports `role:master` (e.g. a replica promoted
    /// after its primary was killed).
    pub fn wait_master(&self, i: usize, limit: Duration) -> io::Result<()> {
        let start = Instant::now();
        loop {
            let info = self.cli(i, &["INFO", "replication"]).unwrap_or_default();
            if info.contains("role:master") {
                return Ok(());
            }
            if start.elapsed() > limit {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("node {i} not promoted after {limit:?}"),
                ));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Moves `slot` from its current primary to primary `to` the way
    /// `redis-cli --cluster reshard` does: `SETSLOT IMPORTING/MIGRATING`,
    /// `MIGRATE` of the slot's keys in batches of `batch` (sleeping `pause`
    /// between batches, to keep the slot in the migrating state while
    /// clients work), then `SETSLOT NODE` on every primary.
    /// Returns the number of keys moved.
    pub fn migrate_slot(
        &self,
        slot: u16,
        to: usize,
        batch: usize,
        pause: Duration,
    ) -> io::Result<usize> {
        let from = self
            .master_of_slot(slot)
            .ok_or_else(|| io::Error::other(format!("no primary serves slot {slot}")))?;
        if from == to {
            return Ok(0);
        }
        let slot_s = slot.to_string();
        let from_id = self.node_id(from)?;
        let to_id = self.node_id(to)?;
        let to_port = self.nodes[to].port().to_string();
        expect_ok(self.cli(to, &["CLUSTER", "SETSLOT", &slot_s, "IMPORTING", &from_id])?)?;
        expect_ok(self.cli(from, &["CLUSTER", "SETSLOT", &slot_s, "MIGRATING", &to_id])?)?;
        let mut moved = 0;
        let batch_s = batch.max(1).to_string();
        loop {
            let keys = self.cli(from, &["CLUSTER", "GETKEYSINSLOT", &slot_s, &batch_s])?;
            let keys: Vec<&str> = keys.lines().filter(|k| !k.is_empty()).collect();
            if keys.is_empty() {
                break;
            }
            let mut args = vec!["MIGRATE", "127.0.0.1", &to_port, "", "0", "10000", "KEYS"];
            args.extend(keys.iter().copied());
            let out = self.cli(from, &args)?;
            if !out.contains("OK") && !out.contains("NOKEY") {
                return Err(io::Error::other(format!("MIGRATE failed: {out}")));
            }
            moved += keys.len();
            if !pause.is_zero() {
                std::thread::sleep(pause);
            }
        }
        // The target first, then the source, then everyone else (as redis-cli does).
        expect_ok(self.cli(to, &["CLUSTER", "SETSLOT", &slot_s, "NODE", &to_id])?)?;
        expect_ok(self.cli(from, &["CLUSTER", "SETSLOT", &slot_s, "NODE", &to_id])?)?;
        for i in 0..self.nodes.len() {
            if i != to && i != from && self.nodes[i].pid().is_some() {
                let info = self.cli(i, &["INFO", "replication"]).unwrap_or_default();
                if info.contains("role:master") {
                    let _ = self.cli(i, &["CLUSTER", "SETSLOT", &slot_s, "NODE", &to_id]);
                }
            }
        }
        Ok(moved)
    }
}

/// Starts one cluster node. Its bus port is picked free but only taken when
/// the node binds it, so another process (or the node's own data port) can
/// get it first and the node exits: then try again with fresh ports.
fn start_node(extra: &[String], timeout: &str, coverage: &str) -> io::Result<RedisServer> {
    retry_on_fresh_port(|| {
        let bus = free_port()?.to_string();
        let mut args: Vec<&str> = vec![
            "--cluster-enabled",
            "yes",
            "--cluster-config-file",
            "nodes.conf",
            "--cluster-port",
            &bus,
            "--cluster-node-timeout",
            timeout,
            "--cluster-require-full-coverage",
            coverage,
            // Let a replica take over however long it was disconnected.
            "--cluster-replica-validity-factor",
            "0",
        ];
        args.extend(extra.iter().map(String::as_str));
        RedisServer::start_once(&args)
    })
}

fn expect_ok(out: String) -> io::Result<()> {
    if out.trim() == "OK" {
        Ok(())
    } else {
        Err(io::Error::other(format!("expected OK, got: {out}")))
    }
}

/// Runs `redis-cli` with `args`; returns stdout (stderr appended when it failed).
fn cli_raw(args: &[&str]) -> io::Result<String> {
    let bin = std::env::var("REDIS_CLI").unwrap_or_else(|_| "redis-cli".to_string());
    let out = Command::new(&bin)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| {
            io::Error::new(
                e.kind(),
                format!("cannot run `{bin}` (set REDIS_CLI to its path): {e}"),
            )
        })?;
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    if out.status.success() {
        Ok(stdout)
    } else {
        Err(io::Error::other(format!(
            "redis-cli {} failed ({}): {stdout}{}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr)
        )))
    }
}
