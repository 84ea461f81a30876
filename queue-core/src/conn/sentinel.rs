//! Sentinel-managed primaries (`redis-sentinel://`): the primary is resolved
//! through the sentinels, checked in the background, and replaced after a
//! failover, an I/O error, a timeout or a `READONLY` reply (see
//! [`RedisConnection`](super::RedisConnection) and docs/SCALE-OUT.md).
//! Each call, a resolution it waits for included, is bounded by the
//! response timeout.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use futures::future::{BoxFuture, FutureExt, Shared};
use redis::aio::{ConnectionLike, MultiplexedConnection};
use redis::{
    AsyncConnectionConfig, Cmd, ErrorKind, Pipeline, RedisError, RedisResult, ServerErrorKind,
    Value,
};
use tracing::{debug, info, warn};

use super::health::{health_of, is_readonly_value, Health};
use super::{invalid_url, no_reply_within, split_userinfo, ConnectionConfig};

/// After a failed resolution, commands fail fast with the same error for
/// this long instead of asking the sentinels again (a burst of callers during
/// a failover then costs one round of sentinel queries, not one each).
const RESOLVE_BACKOFF: Duration = Duration::from_millis(100);

/// Default period of the background check "do the sentinels still name the
/// primary we use?" (`?check_interval_ms=` in the URL; 0 turns it off).
const DEFAULT_CHECK_INTERVAL: Duration = Duration::from_millis(500);

/// What a `redis-sentinel://` URL names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct SentinelTarget {
    /// `host:port` of each sentinel.
    sentinels: Vec<String>,
    /// The monitored master's name.
    master: String,
    /// Database on the primary.
    db: i64,
    /// `user:pass` (as written in the URL, still percent-encoded) for the primary.
    userinfo: Option<String>,
    /// Period of the background primary check (zero: none).
    check_interval: Duration,
}

impl SentinelTarget {
    /// `rest` is the URL after `redis-sentinel://`.
    pub(super) fn parse(rest: &str) -> RedisResult<Self> {
        const USAGE: &str = "a sentinel URL is redis-sentinel://[user:pass@]host:port[,host:port]/<master-name>[/db][?check_interval_ms=N]";
        let (userinfo, rest) = split_userinfo(rest);
        let (rest, query) = rest.split_once('?').unwrap_or((rest, ""));
        let (hosts, path) = rest.split_once('/').ok_or_else(|| invalid_url(USAGE))?;
        let sentinels: Vec<String> = hosts
            .split(',')
            .map(str::trim)
            .filter(|h| !h.is_empty())
            .map(|h| {
                if has_port(h) {
                    h.to_string()
                } else {
                    host_port(h, "26379")
                }
            })
            .collect();
        let mut parts = path.trim_matches('/').split('/');
        let master = parts.next().unwrap_or_default().to_string();
        let db = match parts.next() {
            Some(d) if !d.is_empty() => d.parse().map_err(|_| invalid_url(USAGE))?,
            _ => 0,
        };
        if sentinels.is_empty() || master.is_empty() || parts.next().is_some() {
            return Err(invalid_url(USAGE));
        }
        let mut check_interval = DEFAULT_CHECK_INTERVAL;
        for kv in query.split('&').filter(|kv| !kv.is_empty()) {
            match kv.split_once('=') {
                Some(("check_interval_ms", v)) => {
                    check_interval =
                        Duration::from_millis(v.parse().map_err(|_| invalid_url(USAGE))?);
                }
                _ => return Err(invalid_url(USAGE)),
            }
        }
        Ok(SentinelTarget {
            sentinels,
            master,
            db,
            userinfo: userinfo.filter(|u| !u.is_empty()).map(str::to_string),
            check_interval,
        })
    }

    fn primary_url(&self, addr: &str) -> String {
        match &self.userinfo {
            Some(u) => format!("redis://{u}@{addr}/{}", self.db),
            None => format!("redis://{addr}/{}", self.db),
        }
    }
}

/// Whether sentinel host `h` names its port: `host:port`, `[v6]:port`
/// (a bare IPv6 address has colons but no port; it takes the default).
fn has_port(h: &str) -> bool {
    match h.strip_prefix('[') {
        Some(v6) => v6.split_once(']').is_some_and(|(_, p)| p.starts_with(':')),
        None => h.matches(':').count() == 1,
    }
}

/// `ip:port` for a URL: an IPv6 address (as a sentinel names one, `::1`)
/// in brackets, `[::1]:6379`. Before, `::1:6379` made every connection to
/// a primary the sentinels named by an IPv6 address fail to parse.
fn host_port(ip: &str, port: &str) -> String {
    if ip.contains(':') && !ip.starts_with('[') {
        format!("[{ip}]:{port}")
    } else {
        format!("{ip}:{port}")
    }
}

#[derive(Clone)]
pub(super) struct SentinelConnection {
    shared: Arc<SentinelShared>,
}

struct SentinelShared {
    target: SentinelTarget,
    cfg: ConnectionConfig,
    /// The primary in use; `None` after a failure until the next command
    /// resolves it again.
    current: RwLock<Option<Current>>,
    /// The resolution running, and the last failed one.
    resolving: Mutex<Resolving>,
    generation: AtomicU64,
}

/// A resolution of the primary: a task of its own, awaited by every command
/// that needs it.
type Resolution = Shared<BoxFuture<'static, RedisResult<Current>>>;

#[derive(Default)]
struct Resolving {
    /// The one running (one at a time).
    running: Option<Resolution>,
    /// The last failed one (time, error).
    failed: Option<(Instant, RedisError)>,
}

/// Clears the running resolution when its task ends, however it ends.
struct Running(Arc<SentinelShared>);

impl Drop for Running {
    fn drop(&mut self) {
        self.0
            .resolving
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .running = None;
    }
}

#[derive(Clone)]
pub(super) struct Current {
    generation: u64,
    pub(super) addr: String,
    /// The configuration epoch the sentinels named `addr` with (`None`: not
    /// given; refreshed when a sentinel confirms `addr` with another epoch,
    /// so that sentinels reset to epoch 0 are followed again at their next
    /// failover): a sentinel that names another node with an epoch no higher
    /// missed a failover
    /// (or monitors something else under the name), and is not followed.
    epoch: Option<i64>,
    conn: MultiplexedConnection,
}

impl SentinelConnection {
    /// Database number on the primary.
    pub(super) fn db(&self) -> i64 {
        self.shared.target.db
    }

    pub(super) fn new(target: SentinelTarget, cfg: ConnectionConfig) -> Self {
        let conn = SentinelConnection {
            shared: Arc::new(SentinelShared {
                target,
                cfg,
                current: RwLock::new(None),
                resolving: Mutex::new(Resolving::default()),
                generation: AtomicU64::new(0),
            }),
        };
        conn.spawn_watcher();
        conn
    }

    /// Every `check_interval`, asks a sentinel which node is the primary; when
    /// it names another node than the one in use (a failover happened while
    /// the old primary still answers, e.g. a controlled failover: Sentinel
    /// demotes the old primary only seconds later), drops the current
    /// connection so the next command goes to the new primary. Ends when the
    /// last clone of the connection is dropped.
    fn spawn_watcher(&self) {
        let every = self.shared.target.check_interval;
        if every.is_zero() {
            return;
        }
        let weak = Arc::downgrade(&self.shared);
        tokio::spawn(async move {
            let mut sentinel: Option<(usize, MultiplexedConnection)> = None;
            let mut next = 0usize;
            loop {
                tokio::time::sleep(every).await;
                let Some(shared) = weak.upgrade() else { return };
                let me = SentinelConnection { shared };
                let Some(cur) = me.read_current() else {
                    continue;
                };
                let n = me.shared.target.sentinels.len();
                if sentinel.is_none() {
                    for k in 0..n {
                        let i = (next + k) % n;
                        if let Ok(c) = me.sentinel_conn(&me.shared.target.sentinels[i]).await {
                            sentinel = Some((i, c));
                            break;
                        }
                    }
                }
                let Some((i, conn)) = sentinel.as_mut() else {
                    continue;
                };
                let asked = me
                    .master_info_on(conn, &me.shared.target.sentinels[*i])
                    .await;
                match asked.map(|(epoch, addr)| (watch_step(&cur, epoch, &addr), epoch, addr)) {
                    Ok((WatchStep::Follow, _, _)) => {
                        me.invalidate(cur.generation, "the sentinels name another primary");
                    }
                    Ok((WatchStep::Refresh, epoch, _)) => me.refresh_epoch(cur.generation, epoch),
                    Ok((WatchStep::Keep, _, _)) => {}
                    Ok((WatchStep::AskAnother, epoch, addr)) => {
                        // A stale sentinel (partitioned during the last
                        // failover, restarted with an old configuration) or
                        // one that monitors another node under this name:
                        // before, it dropped the connection every check, on
                        // every connection of the process. Ask another.
                        debug!(master = %me.shared.target.master, sentinel = %me.shared.target.sentinels[*i],
                            named = %addr, epoch = ?epoch, current_epoch = ?cur.epoch,
                            "sentinel names another primary with no newer epoch; not followed");
                        next = *i + 1;
                        sentinel = None;
                    }
                    Err(_) => {
                        next = *i + 1;
                        sentinel = None;
                    }
                }
            }
        });
    }

    pub(super) fn read_current(&self) -> Option<Current> {
        self.shared
            .current
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// The primary to use, resolving it through the sentinels when needed.
    ///
    /// The resolution runs as a task of its own, one at a time, which every
    /// command that needs it awaits: a command whose response timeout ends
    /// meanwhile leaves it running for the next ones. (Awaited in the
    /// command itself, a resolution slower than the response timeout — a
    /// sentinel or a named node that accepts connections and never answers
    /// costs up to `connection_timeout` each — was cancelled by every
    /// command's timeout and never ended.)
    pub(super) async fn current(&self) -> RedisResult<Current> {
        if let Some(c) = self.read_current() {
            return Ok(c);
        }
        let running = {
            let mut resolving = self
                .shared
                .resolving
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            if let Some(c) = self.read_current() {
                return Ok(c);
            }
            match &resolving.running {
                Some(running) => running.clone(),
                None => {
                    if let Some((at, e)) = resolving.failed.as_ref() {
                        if at.elapsed() < RESOLVE_BACKOFF {
                            return Err(e.clone());
                        }
                    }
                    let me = self.clone();
                    let task = tokio::spawn(async move { me.resolve_and_use().await });
                    let running = async move {
                        task.await.unwrap_or_else(|e| {
                            Err(RedisError::from(std::io::Error::other(format!(
                                "sentinel: the resolution of the primary failed: {e}"
                            ))))
                        })
                    }
                    .boxed()
                    .shared();
                    resolving.running = Some(running.clone());
                    running
                }
            }
        };
        running.await
    }

    /// Resolves the primary and uses it, or records the failure (the body
    /// of the resolution task).
    async fn resolve_and_use(&self) -> RedisResult<Current> {
        let _running = Running(self.shared.clone());
        let resolved = self.resolve().await;
        let mut resolving = self
            .shared
            .resolving
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        match resolved {
            Ok((epoch, addr, conn)) => {
                let generation = self.shared.generation.fetch_add(1, Ordering::SeqCst) + 1;
                let cur = Current {
                    generation,
                    addr,
                    epoch,
                    conn,
                };
                info!(master = %self.shared.target.master, primary = %cur.addr, generation, "sentinel: using primary");
                *self
                    .shared
                    .current
                    .write()
                    .unwrap_or_else(|p| p.into_inner()) = Some(cur.clone());
                resolving.failed = None;
                Ok(cur)
            }
            Err(e) => {
                debug!(master = %self.shared.target.master, error = %e, "sentinel: no usable primary yet");
                resolving.failed = Some((Instant::now(), e.clone()));
                Err(e)
            }
        }
    }

    /// Records the epoch a sentinel confirmed the primary of `generation`
    /// with (if it is still the current one).
    fn refresh_epoch(&self, generation: u64, epoch: Option<i64>) {
        let mut cur = self
            .shared
            .current
            .write()
            .unwrap_or_else(|p| p.into_inner());
        if let Some(c) = cur.as_mut().filter(|c| c.generation == generation) {
            c.epoch = epoch;
        }
    }

    /// Drops the primary of `generation` (if it is still the current one), so
    /// the next command resolves the primary again.
    fn invalidate(&self, generation: u64, why: &str) {
        let mut cur = self
            .shared
            .current
            .write()
            .unwrap_or_else(|p| p.into_inner());
        if cur.as_ref().map(|c| c.generation) == Some(generation) {
            let addr = cur.take().map(|c| c.addr).unwrap_or_default();
            warn!(master = %self.shared.target.master, primary = %addr, why, "sentinel: leaving this primary; asking the sentinels again");
        }
    }

    /// Asks every sentinel (at once) for the primary, tries the named nodes
    /// from the highest configuration epoch down (a sentinel that missed the
    /// last failover names the old primary with an older epoch), and keeps
    /// the first that connects and says `ROLE` master.
    async fn resolve(&self) -> RedisResult<(Option<i64>, String, MultiplexedConnection)> {
        let t = &self.shared.target;
        let answers =
            futures::future::join_all(t.sentinels.iter().map(|s| self.master_info(s))).await;
        let mut last_err: Option<RedisError> = None;
        let mut candidates: Vec<(Option<i64>, String)> = Vec::new();
        for (answer, sentinel) in answers.into_iter().zip(&t.sentinels) {
            match answer {
                Ok(c) => candidates.push(c),
                Err(e) => {
                    debug!(sentinel, error = %e, "sentinel did not answer");
                    last_err = Some(e);
                }
            }
        }
        candidates.sort_by_key(|c| std::cmp::Reverse(c.0));
        let mut tried: Vec<String> = Vec::new();
        for (epoch, addr) in candidates {
            if tried.contains(&addr) {
                continue;
            }
            tried.push(addr.clone());
            match self.connect_primary(&addr).await {
                Ok(conn) => return Ok((epoch, addr, conn)),
                Err(e) => {
                    debug!(primary = %addr, epoch = ?epoch, error = %e, "primary named by the sentinels not usable");
                    last_err = Some(e);
                }
            }
        }
        Err(last_err.unwrap_or_else(|| {
            RedisError::from((ErrorKind::EmptySentinelList, "no sentinel in the URL"))
        }))
    }

    fn async_config(&self) -> AsyncConnectionConfig {
        AsyncConnectionConfig::new()
            .set_connection_timeout(Some(self.shared.cfg.connection_timeout))
            .set_response_timeout(Some(self.shared.cfg.response_timeout))
    }

    async fn sentinel_conn(&self, sentinel: &str) -> RedisResult<MultiplexedConnection> {
        redis::Client::open(format!("redis://{sentinel}/"))?
            .get_multiplexed_async_connection_with_config(&self.async_config())
            .await
    }

    /// `SENTINEL MASTER <name>` of one sentinel: (config epoch if given,
    /// "ip:port").
    async fn master_info(&self, sentinel: &str) -> RedisResult<(Option<i64>, String)> {
        let mut conn = self.sentinel_conn(sentinel).await?;
        self.master_info_on(&mut conn, sentinel).await
    }

    /// `SENTINEL MASTER <name>` on an open sentinel connection.
    async fn master_info_on(
        &self,
        conn: &mut MultiplexedConnection,
        sentinel: &str,
    ) -> RedisResult<(Option<i64>, String)> {
        let fields: HashMap<String, String> = redis::cmd("SENTINEL")
            .arg("MASTER")
            .arg(&self.shared.target.master)
            .query_async(conn)
            .await?;
        match (fields.get("ip"), fields.get("port")) {
            (Some(ip), Some(port)) => {
                let epoch = fields.get("config-epoch").and_then(|e| e.parse().ok());
                Ok((epoch, host_port(ip, port)))
            }
            _ => Err(RedisError::from((
                ErrorKind::MasterNameNotFoundBySentinel,
                "the sentinel does not monitor this master name",
                format!("{} (asked {sentinel})", self.shared.target.master),
            ))),
        }
    }

    async fn connect_primary(&self, addr: &str) -> RedisResult<MultiplexedConnection> {
        let client = redis::Client::open(self.shared.target.primary_url(addr))?;
        let mut conn = client
            .get_multiplexed_async_connection_with_config(&self.async_config())
            .await?;
        let role: Vec<Value> = match redis::cmd("ROLE").query_async(&mut conn).await {
            Ok(role) => role,
            // An ACL user without `+role` (`ROLE` is `@admin @dangerous`: an
            // app user `+@all -@dangerous` lacks it): the node the sentinels
            // name, from the highest epoch, is taken as the primary. If it
            // is not one (yet), its first write answers `READONLY` and the
            // connection asks the sentinels again. Before, such a user could
            // never connect (docs/OPERATIONS.md recommends `+role`).
            Err(e) if e.code() == Some("NOPERM") => {
                debug!(primary = %addr, error = %e,
                    "sentinel: ROLE refused to this user; taking the node the sentinels name as the primary");
                return Ok(conn);
            }
            Err(e) => return Err(e),
        };
        match role.first() {
            Some(Value::BulkString(r)) if r == b"master" => Ok(conn),
            Some(Value::SimpleString(r)) if r == "master" => Ok(conn),
            _ => Err(RedisError::from((
                ErrorKind::Server(ServerErrorKind::ReadOnly),
                "the node the sentinels name as primary is not a primary (yet)",
                addr.to_string(),
            ))),
        }
    }

    /// Sends `cmd` to the primary, within the response timeout (a
    /// resolution of the primary it waits for included); a `READONLY` reply
    /// (the command did not run) is sent once more, to the primary the
    /// sentinels then name.
    pub(super) async fn command(&self, cmd: &Cmd) -> RedisResult<Value> {
        let limit = self.shared.cfg.response_timeout;
        // `None`: a timeout too long for the clock, no bound.
        let deadline = tokio::time::Instant::now().checked_add(limit);
        let mut attempt = 0;
        loop {
            attempt += 1;
            let cur = by(deadline, limit, self.current()).await?;
            let mut conn = cur.conn.clone();
            let res = by(deadline, limit, conn.req_packed_command(cmd)).await;
            match health_of(&res, is_readonly_value) {
                Health::Fine => return res,
                Health::Broken => {
                    self.invalidate(cur.generation, "connection error");
                    return res;
                }
                Health::Demoted => {
                    self.invalidate(cur.generation, "READONLY: the primary was demoted");
                    if attempt >= 2 {
                        return res;
                    }
                }
            }
        }
    }

    /// Sends a pipeline, within the response timeout as
    /// [`command`](Self::command). A `READONLY` reply leaves the primary; the
    /// pipeline is sent again (once) only when its *first* reply is
    /// `READONLY` ([`resend_whole`]); otherwise the replies are returned as
    /// they are, each refused command's `READONLY` with them, for the
    /// caller's per-command handling.
    pub(super) async fn commands(
        &self,
        pipeline: &Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisResult<Vec<Value>> {
        let limit = self.shared.cfg.response_timeout;
        // `None`: a timeout too long for the clock, no bound.
        let deadline = tokio::time::Instant::now().checked_add(limit);
        let mut attempt = 0;
        loop {
            attempt += 1;
            let cur = by(deadline, limit, self.current()).await?;
            let mut conn = cur.conn.clone();
            let res = by(
                deadline,
                limit,
                conn.req_packed_commands(pipeline, offset, count),
            )
            .await;
            match health_of(&res, |vs: &Vec<Value>| vs.iter().any(is_readonly_value)) {
                Health::Fine => return res,
                Health::Broken => {
                    self.invalidate(cur.generation, "connection error");
                    return res;
                }
                Health::Demoted => {
                    self.invalidate(cur.generation, "READONLY: the primary was demoted");
                    if attempt >= 2 || !resend_whole(&res) {
                        return res;
                    }
                }
            }
        }
    }
}

/// `call`, failed with the error of a response timeout (`limit`) at
/// `deadline` (no bound for `None`).
async fn by<T>(
    deadline: Option<tokio::time::Instant>,
    limit: Duration,
    call: impl std::future::Future<Output = RedisResult<T>>,
) -> RedisResult<T> {
    match deadline {
        Some(at) => tokio::time::timeout_at(at, call)
            .await
            .unwrap_or_else(|_| Err(no_reply_within(limit))),
        None => call.await,
    }
}

/// Whether a pipeline answered `READONLY` may be sent again whole: only when
/// its first reply is `READONLY`. Then nothing of it ran — the server was a
/// replica when it read the first command, and a replica does not turn
/// primary again between two commands of one pipeline — so every write is
/// refused and sending it again runs it once. A `READONLY` after the first
/// reply means the server was demoted mid-pipeline (`FAILOVER`,
/// `REPLICAOF`): the commands before it ran. Before, the whole pipeline was
/// sent again: an enqueue window's calls that had run were run again on the
/// new primary, their generated ids (sent as fresh, with no dedupe read)
/// written and pushed to main twice (DESIGN rule 5).
fn resend_whole(res: &RedisResult<Vec<Value>>) -> bool {
    match res {
        Ok(replies) => replies.first().is_some_and(is_readonly_value),
        // Which of its commands ran is not known.
        Err(_) => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A pipeline is sent again whole only when its first reply is
    /// `READONLY` (nothing of it ran); one refused after its first command
    /// ran (the server demoted mid-pipeline) is returned as it is.
    #[test]
    fn a_pipeline_is_sent_again_only_when_its_first_reply_is_readonly() {
        let readonly = || {
            redis::parse_redis_value(b"-READONLY You can't write against a read only replica.\r\n")
                .unwrap()
        };
        assert!(is_readonly_value(&readonly()), "{:?}", readonly());
        assert!(resend_whole(&Ok(vec![readonly(), readonly()])));
        assert!(resend_whole(&Ok(vec![readonly(), Value::Okay])));
        assert!(!resend_whole(&Ok(vec![Value::Int(1), readonly()])));
        assert!(!resend_whole(&Ok(vec![Value::Okay, Value::Okay])));
        assert!(!resend_whole(&Ok(vec![])));
        assert!(!resend_whole(&Err(RedisError::from((
            ErrorKind::Server(ServerErrorKind::ReadOnly),
            "READONLY"
        )))));
    }

    #[test]
    fn sentinel_urls_parse() {
        let t = SentinelTarget::parse("127.0.0.1:26379,127.0.0.1:26380/mymaster").unwrap();
        assert_eq!(t.sentinels, vec!["127.0.0.1:26379", "127.0.0.1:26380"]);
        assert_eq!(t.master, "mymaster");
        assert_eq!(t.db, 0);
        assert_eq!(t.userinfo, None);
        assert_eq!(t.primary_url("10.0.0.1:6379"), "redis://10.0.0.1:6379/0");

        let t = SentinelTarget::parse(":s%40cret@sentinel-a,sentinel-b:5000/orders/3").unwrap();
        assert_eq!(t.sentinels, vec!["sentinel-a:26379", "sentinel-b:5000"]);
        assert_eq!((t.master.as_str(), t.db), ("orders", 3));
        assert_eq!(
            t.primary_url("10.0.0.1:6379"),
            "redis://:s%40cret@10.0.0.1:6379/3"
        );

        let t = SentinelTarget::parse("[::1]:26380,[fe80::1],::1/m").unwrap();
        assert_eq!(
            t.sentinels,
            vec!["[::1]:26380", "[fe80::1]:26379", "[::1]:26379"]
        );

        for bad in [
            "127.0.0.1:26379",
            "127.0.0.1:26379/",
            "/m",
            "h:1/m/x",
            "h:1/m/1/2",
        ] {
            assert!(SentinelTarget::parse(bad).is_err(), "{bad}");
        }
    }

    /// A primary the sentinels name by an IPv6 address (`SENTINEL MASTER`
    /// answers `ip ::1`) gets a URL the client opens, to that host. Before,
    /// `redis://::1:6379/0` did not parse: no connection to it ever opened.
    #[test]
    fn a_primary_named_by_an_ipv6_address_gets_a_url_that_opens() {
        let t = SentinelTarget::parse("127.0.0.1:26379/m").unwrap();
        for (ip, host) in [
            ("::1", "::1"),
            ("fe80::2", "fe80::2"),
            ("10.0.0.1", "10.0.0.1"),
        ] {
            let url = t.primary_url(&host_port(ip, "6380"));
            let client = redis::Client::open(url.as_str()).unwrap_or_else(|e| panic!("{url}: {e}"));
            match client.get_connection_info().addr() {
                redis::ConnectionAddr::Tcp(h, port) => {
                    assert_eq!(
                        (h.trim_matches(|c| c == '[' || c == ']'), *port),
                        (host, 6380),
                        "{url}"
                    )
                }
                other => panic!("{url}: {other:?}"),
            }
        }
    }
}

/// What the watcher does with a sentinel's answer.
#[derive(Debug, PartialEq, Eq)]
enum WatchStep {
    /// Another primary with a newer (or an unknown) epoch: leave ours.
    Follow,
    /// Another primary with no newer epoch: a stale sentinel; ask another.
    AskAnother,
    /// Ours, confirmed with another epoch: record it (sentinels reset to
    /// epoch 0 are then followed at their next failover, epoch 1).
    Refresh,
    /// Ours, same epoch.
    Keep,
}

/// The watcher's decision for a sentinel naming `addr` with `epoch` while
/// `cur` is in use.
fn watch_step(cur: &Current, epoch: Option<i64>, addr: &str) -> WatchStep {
    watch_decision(&cur.addr, cur.epoch, epoch, addr)
}

fn watch_decision(
    cur_addr: &str,
    cur_epoch: Option<i64>,
    epoch: Option<i64>,
    addr: &str,
) -> WatchStep {
    if addr != cur_addr {
        match (epoch, cur_epoch) {
            (Some(n), Some(c)) if n <= c => WatchStep::AskAnother,
            // Newer, or either unknown: a sentinel that gives no epoch is
            // followed, as before epochs were compared.
            _ => WatchStep::Follow,
        }
    } else if epoch.is_some() && epoch != cur_epoch {
        WatchStep::Refresh
    } else {
        WatchStep::Keep
    }
}

#[cfg(test)]
mod epoch_tests {
    use super::{watch_decision, WatchStep};

    #[test]
    fn only_a_newer_or_unknown_epoch_is_followed() {
        let d = |e, a| watch_decision("b:1", Some(2), e, a);
        assert_eq!(d(Some(3), "c:1"), WatchStep::Follow);
        assert_eq!(d(Some(2), "c:1"), WatchStep::AskAnother);
        assert_eq!(d(Some(1), "c:1"), WatchStep::AskAnother);
        assert_eq!(d(None, "c:1"), WatchStep::Follow);
        assert_eq!(
            watch_decision("b:1", None, Some(0), "c:1"),
            WatchStep::Follow
        );
        assert_eq!(d(Some(2), "b:1"), WatchStep::Keep);
        assert_eq!(d(None, "b:1"), WatchStep::Keep);
    }

    /// Sentinels reset (SENTINEL REMOVE + MONITOR, or restarted with a
    /// fresh configuration) restart their epochs at 0: once one confirms
    /// the primary in use with epoch 0, their next failover (epoch 1) is
    /// followed. Without the refresh, epoch 1 was not newer than the 1 the
    /// primary was resolved with, and the watcher stayed on the old primary
    /// while it still accepted writes.
    #[test]
    fn a_failover_after_the_sentinels_were_reset_is_followed() {
        let mut epoch = Some(1);
        assert_eq!(
            watch_decision("b:1", epoch, Some(0), "b:1"),
            WatchStep::Refresh
        );
        epoch = Some(0);
        assert_eq!(
            watch_decision("b:1", epoch, Some(1), "c:1"),
            WatchStep::Follow
        );
    }
}
