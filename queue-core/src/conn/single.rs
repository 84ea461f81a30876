//! One server (`redis://`): a redis-rs `ConnectionManager`, which reconnects
//! by itself after an I/O error, replaced by a new one (a new TCP connection
//! to the URL's host, its name resolved again) when the server answers
//! `READONLY`: a failover demoted it. The manager alone never reconnects on
//! an error reply, so before, every process stayed on the demoted server
//! until restarted. Behind a DNS name or a virtual IP that the failover
//! moved (managed Redis), the new connection reaches the new primary. See
//! [`RedisConnection`](super::RedisConnection) and docs/OPERATIONS.md
//! ("Failover with a `redis://` URL").

use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::{Cmd, Pipeline, RedisResult, Value};
use tracing::{debug, info, warn};

use super::health::{health_of, is_readonly_value, Health};
use super::within;

/// The first reconnect after a `READONLY` starts at once; while the server
/// reached keeps answering `READONLY` (the name has not moved yet, or the URL
/// names a replica), each next one waits twice as long after the previous,
/// from this...
const RECONNECT_MIN_WAIT: Duration = Duration::from_millis(250);
/// ...up to this: a server that stays a replica costs one reconnect per
/// 5 s per connection, not a reconnect storm.
const RECONNECT_MAX_WAIT: Duration = Duration::from_secs(5);
/// A `READONLY` this long after the last reconnect is a new failover: it
/// reconnects at once, and the wait starts again from the minimum.
const RECONNECT_QUIET: Duration = Duration::from_secs(60);

#[derive(Clone)]
pub(super) struct SingleConnection {
    shared: Arc<Shared>,
}

struct Shared {
    /// What a new connection is made from; `None` for a manager wrapped with
    /// `RedisConnection::from_manager` (its URL is not known here).
    source: Option<Source>,
    current: RwLock<Current>,
    /// Shared with the reconnect task's [`InFlight`] guard.
    reconnects: Arc<Mutex<Reconnects>>,
    /// Bound of one whole call, a wait for the manager's reconnect included
    /// (`None` for a wrapped manager: its settings are not known here).
    /// The manager's own response timeout bounds only the round trip: a
    /// call sent while it reconnects waits for the reconnect, up to its 4
    /// attempts of `connection_timeout` each plus their backoff (21 s with
    /// the defaults, against a server that accepts connections and never
    /// answers). Before, nothing else bounded it: an enqueue whose reply
    /// was lost took 21 s, not its documented `retry_window +
    /// response_timeout`, and a worker's same-token fetch retry could run
    /// after the fetch's receipt expired.
    response_timeout: Option<Duration>,
}

struct Source {
    client: redis::Client,
    cfg: ConnectionManagerConfig,
    /// Bound of one whole reconnect (the manager's own retries included).
    timeout: Duration,
    /// The URL without its password, for logs.
    url: String,
}

#[derive(Clone)]
struct Current {
    generation: u64,
    conn: ConnectionManager,
}

/// Reconnects after `READONLY`: one at a time, spaced by a doubling wait.
#[derive(Debug, Default)]
struct Reconnects {
    in_flight: bool,
    /// When the last one started.
    last: Option<Instant>,
    /// How long after `last` the next one may start.
    wait: Duration,
}

impl Reconnects {
    /// Whether a `READONLY` seen at `now` starts a reconnect (and records it).
    fn start(&mut self, now: Instant) -> bool {
        if self.in_flight {
            return false;
        }
        let wait = match self.last {
            None => RECONNECT_MIN_WAIT,
            Some(last) => {
                let since = now.saturating_duration_since(last);
                if since < self.wait {
                    return false;
                }
                if since >= RECONNECT_QUIET {
                    RECONNECT_MIN_WAIT
                } else {
                    (self.wait * 2).min(RECONNECT_MAX_WAIT)
                }
            }
        };
        self.in_flight = true;
        self.last = Some(now);
        self.wait = wait;
        true
    }
}

/// Marks the reconnect of `demoted` as running; clears `in_flight` when
/// dropped: at the end of the reconnect, and also when its task is cancelled
/// (the runtime it was spawned on shuts down while the connection goes on
/// being used from another runtime) or panics. Before, only the end of
/// `reconnect()` cleared it: after a cancelled or panicked reconnect, every
/// later `READONLY` found one "running" and the connection never connected
/// again.
struct InFlight(Arc<Mutex<Reconnects>>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).in_flight = false;
    }
}

impl SingleConnection {
    /// Connects with `cfg`, within `timeout` (the caller bounds the first
    /// connect itself); `url` (password removed) names the server in logs.
    /// Each call is bounded by `response_timeout`, reconnects included.
    pub(super) async fn connect(
        client: redis::Client,
        cfg: ConnectionManagerConfig,
        timeout: Duration,
        response_timeout: Duration,
        url: String,
    ) -> RedisResult<Self> {
        let conn = ConnectionManager::new_with_config(client.clone(), cfg.clone()).await?;
        Ok(Self::new(
            Some(Source {
                client,
                cfg,
                timeout,
                url,
            }),
            conn,
            Some(response_timeout),
        ))
    }

    /// Wraps a manager made elsewhere: it is never replaced (no URL to
    /// connect again to), only reconnects by itself after I/O errors.
    pub(super) fn wrap(conn: ConnectionManager) -> Self {
        Self::new(None, conn, None)
    }

    fn new(
        source: Option<Source>,
        conn: ConnectionManager,
        response_timeout: Option<Duration>,
    ) -> Self {
        SingleConnection {
            shared: Arc::new(Shared {
                source,
                current: RwLock::new(Current {
                    generation: 0,
                    conn,
                }),
                reconnects: Arc::new(Mutex::new(Reconnects::default())),
                response_timeout,
            }),
        }
    }

    fn current(&self) -> Current {
        self.shared
            .current
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    pub(super) fn db(&self) -> i64 {
        self.current().conn.get_db()
    }

    /// Sends `cmd`, within the response timeout (a wait for a reconnect
    /// included). A `READONLY` reply is returned as it is (the command did
    /// not run: a script's first write was refused, so it wrote nothing; the
    /// callers retry) and starts a reconnect for the next commands.
    pub(super) async fn command(&self, cmd: &Cmd) -> RedisResult<Value> {
        let Current {
            generation,
            mut conn,
        } = self.current();
        let res = within(self.shared.response_timeout, conn.req_packed_command(cmd)).await;
        if health_of(&res, is_readonly_value) == Health::Demoted {
            self.demoted(generation);
        }
        res
    }

    /// Sends a pipeline, within the response timeout; `READONLY` as for
    /// [`command`](Self::command).
    pub(super) async fn commands(
        &self,
        pipeline: &Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisResult<Vec<Value>> {
        let Current {
            generation,
            mut conn,
        } = self.current();
        let res = within(
            self.shared.response_timeout,
            conn.req_packed_commands(pipeline, offset, count),
        )
        .await;
        if health_of(&res, |vs: &Vec<Value>| vs.iter().any(is_readonly_value)) == Health::Demoted {
            self.demoted(generation);
        }
        res
    }

    /// The connection of `generation` was answered `READONLY`: unless it was
    /// replaced already, or a reconnect runs or waits its turn, connect
    /// again in the background (the caller does not wait for it: its time
    /// bound stays `response_timeout`).
    fn demoted(&self, generation: u64) {
        let Some(source) = &self.shared.source else {
            return;
        };
        if self.current().generation != generation {
            return;
        }
        let started = self
            .shared
            .reconnects
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .start(Instant::now());
        if !started {
            debug!(redis = %source.url, "READONLY again; a reconnect runs or waits its turn");
            return;
        }
        warn!(redis = %source.url, "READONLY: the server is a read-only replica (a failover demoted it, or the URL names a replica); connecting again to the URL's host");
        let in_flight = InFlight(self.shared.reconnects.clone());
        let me = self.clone();
        tokio::spawn(async move {
            let _in_flight = in_flight;
            me.reconnect().await
        });
    }

    async fn reconnect(&self) {
        let Some(source) = &self.shared.source else {
            return;
        };
        let made = tokio::time::timeout(
            source.timeout,
            ConnectionManager::new_with_config(source.client.clone(), source.cfg.clone()),
        )
        .await;
        match made {
            Ok(Ok(mut conn)) => {
                let role = role(&mut conn).await;
                let generation = {
                    let mut cur = self
                        .shared
                        .current
                        .write()
                        .unwrap_or_else(|p| p.into_inner());
                    cur.generation += 1;
                    cur.conn = conn;
                    cur.generation
                };
                match role.as_deref() {
                    Some("master") | None => {
                        info!(redis = %source.url, generation, role = ?role, "reconnected after READONLY")
                    }
                    Some(other) => {
                        warn!(redis = %source.url, generation, role = other, "reconnected after READONLY, but the server is still not a primary; the next READONLY reconnects again, at most every 5 s")
                    }
                }
            }
            Ok(Err(e)) => {
                warn!(redis = %source.url, error = %e, "reconnect after READONLY failed; the current connection stays until the next try")
            }
            Err(_) => {
                warn!(redis = %source.url, timeout = ?source.timeout, "reconnect after READONLY timed out; the current connection stays until the next try")
            }
        }
    }
}

/// The server's `ROLE` (`master`, `slave`), for the log; `None` when it
/// cannot be read (an ACL user without `+role`).
async fn role(conn: &mut ConnectionManager) -> Option<String> {
    let reply: Vec<Value> = redis::cmd("ROLE").query_async(conn).await.ok()?;
    match reply.first()? {
        Value::BulkString(r) => Some(String::from_utf8_lossy(r).into_owned()),
        Value::SimpleString(r) => Some(r.clone()),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reconnects_start_at_once_then_wait_longer_while_readonly_goes_on() {
        let t0 = Instant::now();
        let mut r = Reconnects::default();
        assert!(r.start(t0), "the first READONLY reconnects at once");
        assert!(!r.start(t0), "one reconnect at a time");
        r.in_flight = false;
        assert!(!r.start(t0 + RECONNECT_MIN_WAIT / 2), "too soon");
        let mut at = t0;
        let mut wait = RECONNECT_MIN_WAIT;
        for _ in 0..10 {
            at += wait;
            assert!(r.start(at), "after {wait:?}");
            r.in_flight = false;
            wait = (wait * 2).min(RECONNECT_MAX_WAIT);
            assert_eq!(r.wait, wait);
            assert!(!r.start(at + wait - Duration::from_millis(1)));
        }
        assert_eq!(r.wait, RECONNECT_MAX_WAIT, "bounded");
        // Long after: a new failover reconnects at once, from the minimum.
        assert!(r.start(at + RECONNECT_QUIET));
        assert_eq!(r.wait, RECONNECT_MIN_WAIT);
    }

    /// A reconnect task dropped mid-way (its runtime shut down) or that
    /// panicked clears `in_flight`: the next `READONLY` after the wait
    /// reconnects. Before, only the end of `reconnect()` cleared it.
    #[test]
    fn a_cancelled_or_panicked_reconnect_does_not_block_later_ones() {
        let reconnects = Arc::new(Mutex::new(Reconnects::default()));
        let t0 = Instant::now();
        assert!(reconnects.lock().unwrap().start(t0));

        // Cancelled: the task waits forever, its runtime is dropped.
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let in_flight = InFlight(reconnects.clone());
        rt.spawn(async move {
            let _in_flight = in_flight;
            std::future::pending::<()>().await
        });
        rt.block_on(tokio::task::yield_now());
        assert!(
            !reconnects.lock().unwrap().start(t0 + RECONNECT_MIN_WAIT),
            "still running"
        );
        drop(rt);
        let t1 = t0 + RECONNECT_MIN_WAIT;
        assert!(
            reconnects.lock().unwrap().start(t1),
            "after the cancelled one, the next READONLY reconnects"
        );

        // Panicked.
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let in_flight = InFlight(reconnects.clone());
        let task = rt.spawn(async move {
            let _in_flight = in_flight;
            panic!("reconnect panicked");
        });
        assert!(rt.block_on(task).unwrap_err().is_panic());
        assert!(
            reconnects.lock().unwrap().start(t1 + RECONNECT_MAX_WAIT),
            "after the panicked one, the next READONLY reconnects"
        );
    }
}
