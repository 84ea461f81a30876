//! The cross-queue relay (docs/WORKFLOWS.md, "Relay"): a member on queue C
//! of a batch homed on queue P (another hash tag, so another Redis Cluster
//! slot) cannot count itself in P's batch in its own ack. The script that
//! ends it (ack, fail, reclaim, defer, cancel, finish_cancel, replay) appends
//! a notice to C's relay list instead, in that same script. The relay moves
//! the notices: `relay_apply.lua` on P (idempotent by member id and seq),
//! then `relay_done.lua` on C (removes exactly those notices, or moves the
//! ones that cannot be applied to C's dead-notice list). A crash in between
//! re-applies, which changes nothing.
//!
//! Who runs it: each worker, for each queue it serves, once at start-up and
//! then whenever one of its calls answered that it wrote notices
//! ([`hint`]: no polling, an idle worker makes no call), and the watchdog on
//! every pass (the safety net when no worker of C runs).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use tokio::sync::{watch, Notify};
use tracing::{debug, info, warn};

use crate::conn::RedisConnection;
use crate::error::{QueueError, Result};
use crate::keys::QueueKeys;
use crate::queue::Queue;
use crate::scripts::relay_apply::{Applied, RelayApply};
use crate::scripts::relay_done::{RelayDone, DROPPED};
use crate::scripts::relay_retry::RelayRetry;

use super::engine::parse_key;

/// Notices read (and applied) per round.
const CHUNK: usize = 100;
/// Queues drained per call: the queue asked for, then the queues whose
/// batches wrote notices of their own while applying (nested flows).
const MAX_QUEUES: usize = 16;

/// What one relay run did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RelayReport {
    /// Notices applied to their batch and removed.
    pub applied: u64,
    /// Notices found already applied (a relay that crashed between its two
    /// steps, or two relayers at once) and removed.
    pub already: u64,
    /// Notices that could not be applied (corrupt batch, unreadable
    /// notice), moved to the dead-notice list and logged.
    pub dead: u64,
    /// Notices whose batch is gone (expired or deleted), removed and logged
    /// (stats `relay_dropped`), as a member on the batch's own queue whose
    /// batch is gone is skipped. Before, they were set aside as dead.
    pub dropped: u64,
}

impl RelayReport {
    fn add(&mut self, other: RelayReport) {
        self.applied += other.applied;
        self.already += other.already;
        self.dead += other.dead;
        self.dropped += other.dropped;
    }
}

/// What [`Queue::relay_retry_dead`] did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RelayRetryReport {
    /// Notices moved back to the relay list, without their reason: the next
    /// relay run applies them (one that still cannot be applied is set
    /// aside again, with its reason).
    pub moved: u64,
    /// Entries left in the dead-notice list: no readable notice after their
    /// reason line (written by hand), or a notice without a seq (written
    /// while the queue's `relay:seq` was corrupt) while `relay:seq` is still
    /// corrupt.
    pub kept: u64,
    /// Entries not examined: set aside after the call began (a notice moved
    /// back and set aside again by a relay run meanwhile among them).
    pub left: u64,
}

/// A relay notice that could not be applied, kept in its queue's
/// dead-notice list ([`QueueKeys::relay_dead`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeadNotice {
    /// Why it could not be applied.
    pub reason: String,
    /// The batch key it names.
    pub batch: String,
    /// The member id.
    pub member: String,
    /// `finished` or `unfinished` (a replay).
    pub kind: String,
}

/// One notice as written by `wf_notice` (prelude.lua):
/// `<seq>\n<kind>\n<batch key>\n<member id>\n<outcome>\n<detail>`.
struct Notice {
    raw: Vec<u8>,
    /// The batch's home queue, when the notice is readable.
    home: Option<String>,
    batch: String,
    member: String,
}

impl Notice {
    fn parse(raw: Vec<u8>) -> Notice {
        let text = String::from_utf8_lossy(&raw);
        let mut parts = text.splitn(6, '\n');
        let (_seq, _kind) = (parts.next(), parts.next());
        let batch = parts.next().unwrap_or_default().to_string();
        let member = parts.next().unwrap_or_default().to_string();
        let home = parse_key(&batch).map(|b| b.queue);
        Notice {
            home,
            batch,
            member,
            raw,
        }
    }
}

fn kind_name(kind: &str) -> &'static str {
    if kind == "u" {
        "unfinished"
    } else {
        "finished"
    }
}

/// Relays every notice in `queue`'s relay list (and then in the relay lists
/// of the queues that got new notices while applying), oldest first.
pub(crate) async fn relay_queue(conn: &mut RedisConnection, queue: &str) -> Result<RelayReport> {
    let mut total = RelayReport::default();
    let mut todo = vec![queue.to_string()];
    let mut done = 0;
    while let Some(q) = todo.pop() {
        done += 1;
        let (report, more) = relay_one(conn, &QueueKeys::new(&q)).await?;
        total.add(report);
        for m in more {
            if done + todo.len() < MAX_QUEUES && !todo.contains(&m) {
                todo.push(m);
            }
        }
    }
    Ok(total)
}

/// Drains one queue's relay list; also the batches' queues whose own relay
/// lists got notices.
async fn relay_one(
    conn: &mut RedisConnection,
    keys: &QueueKeys,
) -> Result<(RelayReport, Vec<String>)> {
    let mut report = RelayReport::default();
    let mut more = Vec::new();
    // Notices kept at the head of the list this run (set aside, but the
    // dead-notice list holds another type): read past them.
    let mut skip = 0i64;
    loop {
        let raw: Vec<Vec<u8>> = redis::cmd("LRANGE")
            .arg(keys.relay())
            .arg(skip)
            .arg(skip + CHUNK as i64 - 1)
            .query_async(conn)
            .await
            .map_err(|e| QueueError::redis(&keys.queue, None, e))?;
        let read = raw.len();
        if read == 0 {
            break;
        }
        let notices: Vec<Notice> = raw.into_iter().map(Notice::parse).collect();
        let mut verdicts: Vec<Option<Result<Applied, String>>> = vec![None; notices.len()];
        // Per batch queue, in order of first appearance; each group keeps
        // the list's order (a member's notices all name the same batch).
        let mut homes: Vec<String> = Vec::new();
        for n in &notices {
            match &n.home {
                Some(h) if !homes.contains(h) => homes.push(h.clone()),
                _ => {}
            }
        }
        for (i, n) in notices.iter().enumerate() {
            if n.home.is_none() {
                verdicts[i] = Some(Err("unreadable notice (no batch key)".into()));
            }
        }
        for home in homes {
            let idx: Vec<usize> = (0..notices.len())
                .filter(|&i| notices[i].home.as_deref() == Some(home.as_str()))
                .collect();
            let home_keys = QueueKeys::new(&home);
            let (outcomes, noted) = apply(conn, &home_keys, &notices, &idx).await?;
            if noted && !more.contains(&home) {
                more.push(home.clone());
            }
            for (i, o) in idx.into_iter().zip(outcomes) {
                verdicts[i] = Some(o);
            }
        }
        crate::failpoint::hit("relay_after_apply");
        let mut ends = Vec::with_capacity(notices.len());
        for (n, v) in notices.iter().zip(verdicts) {
            match &v {
                Some(Ok(Applied::Now)) => report.applied += 1,
                Some(Ok(Applied::Already)) => report.already += 1,
                _ => {}
            }
            let reason = match v {
                Some(Ok(Applied::Now)) | Some(Ok(Applied::Already)) => None,
                Some(Ok(Applied::NoBatch)) => Some(DROPPED.to_string()),
                Some(Ok(Applied::Corrupt)) => Some(
                    "the batch is corrupt: a key of another type, or a count that is not \
                     an integer (the batch's count_error says which)"
                        .to_string(),
                ),
                Some(Ok(Applied::Unreadable)) => Some("unreadable notice".to_string()),
                Some(Ok(Applied::NoSeq)) => Some(
                    "no seq (the queue's relay:seq was corrupt when it was written): \
                     repair relay:seq, then relay retry-dead numbers it"
                        .to_string(),
                ),
                // One line: the reason line is everything before the entry's
                // first line break (relay_retry.lua, `Queue::relay_dead`).
                Some(Err(reason)) => Some(reason.replace(['\n', '\r'], " ")),
                None => Some("not applied".to_string()),
            };
            ends.push((n.raw.clone(), reason));
        }
        let end_args: Vec<(Vec<u8>, Option<String>)> = ends;
        let reply = RelayDone {
            keys,
            notices: &end_args,
        }
        .run(conn)
        .await?;
        report.dead += reply.dead;
        report.dropped += reply.dropped;
        skip += reply.kept as i64;
        for (n, (_, reason)) in notices.iter().zip(&end_args) {
            if let Some(reason) = reason {
                let kind = String::from_utf8_lossy(&n.raw)
                    .split('\n')
                    .nth(1)
                    .map(kind_name)
                    .unwrap_or("finished");
                if reason == DROPPED {
                    warn!(queue = %keys.queue, batch = %n.batch, job_id = %n.member, kind,
                        "relay notice for a batch that is gone (expired or deleted): dropped \
                         (stats `relay_dropped`), as on the batch's own queue");
                } else if reply.kept > 0 {
                    // relay_done.lua checks the dead-notice list once per
                    // call: every notice it could not move was kept.
                    warn!(queue = %keys.queue, batch = %n.batch, job_id = %n.member, kind, %reason,
                        "relay notice cannot be applied and the dead-notice list holds another type \
                         (corrupt data; repair it): kept in the relay list");
                } else {
                    warn!(queue = %keys.queue, batch = %n.batch, job_id = %n.member, kind, %reason,
                        "relay notice cannot be applied: kept in the dead-notice list (check, stats `relay_dead`)");
                }
            }
        }
        if read < CHUNK {
            break;
        }
    }
    if report != RelayReport::default() {
        debug!(queue = %keys.queue, applied = report.applied, already = report.already, dead = report.dead,
            dropped = report.dropped, "relayed");
    }
    Ok((report, more))
}

/// Applies the notices `idx` (all for batches on `home`) in one script; when
/// that script fails with an error of the data (not a transient one, see
/// [`is_transient`]), one by one, so that a notice that breaks the script is set aside with the
/// error and the others still go through.
async fn apply(
    conn: &mut RedisConnection,
    home: &QueueKeys,
    notices: &[Notice],
    idx: &[usize],
) -> Result<(Vec<std::result::Result<Applied, String>>, bool)> {
    let texts: Vec<Vec<u8>> = idx.iter().map(|&i| notices[i].raw.clone()).collect();
    match (RelayApply {
        keys: home,
        notices: &texts,
    })
    .run(conn)
    .await
    {
        Ok(r) => Ok((r.outcomes.into_iter().map(Ok).collect(), r.noted)),
        Err(e) if is_transient(&e) => Err(e),
        Err(_) if texts.len() > 1 => {
            let mut out = Vec::with_capacity(texts.len());
            let mut noted = false;
            for t in &texts {
                match (RelayApply {
                    keys: home,
                    notices: std::slice::from_ref(t),
                })
                .run(conn)
                .await
                {
                    Ok(r) => {
                        noted |= r.noted;
                        out.push(Ok(r.outcomes[0]));
                    }
                    Err(e) if is_transient(&e) => return Err(e),
                    Err(e) => out.push(Err(format!("applying failed: {e}"))),
                }
            }
            Ok((out, noted))
        }
        Err(e) => Ok((vec![Err(format!("applying failed: {e}"))], false)),
    }
}

/// Whether `e` may pass: anything but an error of the script on this data.
/// Only an `ERR` (the script refused the notice, or failed on it) or a
/// `WRONGTYPE` (a key of the batch holds another type) sets notices aside in
/// `relay:dead`, from where nothing applies them again. A server that is
/// loading, busy with a long script, out of memory, a replica, a primary
/// gone, a cluster redirect or a connection lost is retried by the next
/// relay run with every notice kept in the relay list.
fn is_transient(e: &QueueError) -> bool {
    match e {
        QueueError::Redis { .. } => !e.is_data_error(),
        QueueError::ReadOnlyReplica { .. } => true,
        _ => false,
    }
}

/// Relays the notices of `queue` and logs a failure (the next hint or the
/// watchdog's next pass retries).
pub(crate) async fn relay_logged(conn: &mut RedisConnection, queue: &str) {
    if let Err(e) = relay_queue(conn, queue).await {
        warn!(queue = %queue, error = %e, "relay failed; the next relay run or watchdog pass retries");
    }
}

/// The wake-up of one queue's relay tasks in this process: a generation
/// counter (a hint is never lost, even while a relay runs) and a broadcast.
struct Waker {
    generation: AtomicU64,
    notify: Notify,
}

fn waker(queue: &str) -> Arc<Waker> {
    static WAKERS: OnceLock<Mutex<HashMap<String, Arc<Waker>>>> = OnceLock::new();
    let map = WAKERS.get_or_init(Default::default);
    let mut map = map.lock().unwrap_or_else(|e| e.into_inner());
    map.entry(queue.to_string())
        .or_insert_with(|| {
            Arc::new(Waker {
                generation: AtomicU64::new(0),
                notify: Notify::new(),
            })
        })
        .clone()
}

/// A script ending a job of `queue` answered that it wrote relay notices:
/// wakes this process's relay tasks for `queue` (the workers serving it).
/// Without one (a producer process) the watchdog relays them.
pub(crate) fn hint(queue: &str) {
    let w = waker(queue);
    w.generation.fetch_add(1, Ordering::SeqCst);
    w.notify.notify_waiters();
}

/// The `'relay'` marker at `index` of a script's array reply (fail.lua,
/// defer.lua): wakes `queue`'s relay.
pub(crate) fn hint_if_marked(queue: &str, reply: &redis::Value, index: usize) {
    let marked = crate::scripts::reply::array(reply)
        .and_then(|items| items.get(index))
        .and_then(crate::scripts::reply::text)
        .is_some_and(|t| t == "relay");
    if marked {
        hint(queue);
    }
}

/// A worker's relay task for `queue`: drains the list once (what a crashed
/// worker left), then after each hint, until `stop`.
pub(crate) async fn run_for_worker(
    mut conn: RedisConnection,
    queue: String,
    mut stop: watch::Receiver<bool>,
) {
    let w = waker(&queue);
    loop {
        let seen = w.generation.load(Ordering::SeqCst);
        relay_logged(&mut conn, &queue).await;
        loop {
            let notified = w.notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if w.generation.load(Ordering::SeqCst) != seen {
                break;
            }
            if *stop.borrow() {
                return;
            }
            tokio::select! {
                _ = &mut notified => {}
                changed = stop.changed() => {
                    if changed.is_err() || *stop.borrow() {
                        return;
                    }
                }
            }
        }
    }
}

impl Queue {
    /// Relays `queue`'s cross-queue batch notices now (workers and the
    /// watchdog do it on their own; see docs/WORKFLOWS.md, "Relay").
    pub async fn relay(&self, queue: &str) -> Result<RelayReport> {
        relay_queue(&mut self.connection(), queue).await
    }

    /// The relay notices of `queue` that could not be applied, newest first.
    pub async fn relay_dead(&self, queue: &str) -> Result<Vec<DeadNotice>> {
        let raw: Vec<Vec<u8>> = redis::cmd("LRANGE")
            .arg(QueueKeys::new(queue).relay_dead())
            .arg(0)
            .arg(-1)
            .query_async(&mut self.connection())
            .await
            .map_err(|e| QueueError::redis(queue, None, e))?;
        Ok(raw
            .into_iter()
            .map(|r| {
                let text = String::from_utf8_lossy(&r).into_owned();
                let mut parts = text.splitn(7, '\n');
                let reason = parts.next().unwrap_or_default().to_string();
                let _seq = parts.next();
                let kind = kind_name(parts.next().unwrap_or_default()).to_string();
                DeadNotice {
                    reason,
                    batch: parts.next().unwrap_or_default().to_string(),
                    member: parts.next().unwrap_or_default().to_string(),
                    kind,
                }
            })
            .collect())
    }

    /// Moves `queue`'s relay notices that could not be applied
    /// ([`relay_dead`](Self::relay_dead)) back to its relay list, oldest
    /// first and without the reason line, for the next relay run (a worker
    /// of `queue` in this process is woken; else the watchdog's next pass,
    /// or [`relay`](Self::relay)) to apply them again: the way to re-apply a
    /// notice once its cause is repaired (a batch count that was not an
    /// integer, see the batch's `count_error`). Applying again is idempotent:
    /// a notice applied before counts nothing twice (the member's last seq,
    /// the batch's `:done` set); one that still cannot be applied is set
    /// aside again. A notice without a seq (written while `queue`'s
    /// `relay:seq` was corrupt) gets a fresh one from `relay:seq` as it moves
    /// back, once `relay:seq` is repaired (until then it is kept). Works on
    /// the entries there when called, in script calls of at most 100 entries
    /// (`relay_retry.lua`: each notice is pushed to the relay list before its
    /// entry is removed).
    ///
    /// ```
    /// # #[tokio::main] async fn main() -> queue_core::Result<()> {
    /// # let server = queue_testkit::RedisServer::start().unwrap();
    /// use queue_core::{Queue, QueueKeys};
    ///
    /// let queue = Queue::connect(&server.url()).await?;
    /// // A notice of member `m-1` on `emails` for batch `b-1` on `orders`,
    /// // set aside with its reason (here by hand).
    /// let notice = "1\nf\nq:{orders}:batch:b-1\nm-1\nsucceeded\n";
    /// let _: () = redis::cmd("LPUSH")
    ///     .arg(QueueKeys::new("emails").relay_dead())
    ///     .arg(format!("no such batch (expired or deleted)\n{notice}"))
    ///     .query_async(&mut queue.connection())
    ///     .await
    ///     .expect("seeded");
    /// assert_eq!(queue.relay_dead("emails").await?[0].member, "m-1");
    ///
    /// let retried = queue.relay_retry_dead("emails").await?;
    /// assert_eq!((retried.moved, retried.kept, retried.left), (1, 0, 0));
    /// assert!(queue.relay_dead("emails").await?.is_empty());
    /// // Batch `b-1` does not exist (expired or deleted): the relay drops it.
    /// assert_eq!(queue.relay("emails").await?.dropped, 1);
    /// # Ok(()) }
    /// ```
    pub async fn relay_retry_dead(&self, queue: &str) -> Result<RelayRetryReport> {
        crate::enqueue_options::check_queue_name(queue)?;
        let keys = QueueKeys::new(queue);
        let mut conn = self.connection();
        // Only the entries there now: a notice moved back and set aside
        // again meanwhile (pushed at the head) is not moved twice.
        let budget: u64 = redis::cmd("LLEN")
            .arg(keys.relay_dead())
            .query_async(&mut conn)
            .await
            .map_err(|e| QueueError::redis(queue, None, e))?;
        let mut report = RelayRetryReport::default();
        while report.moved + report.kept < budget {
            let examined = report.moved + report.kept;
            let r = RelayRetry {
                keys: &keys,
                limit: (CHUNK as u64).min(budget - examined),
                skip: report.kept,
            }
            .run(&mut conn)
            .await?;
            report.moved += r.moved;
            report.kept += r.kept;
            report.left = r.left;
            if r.moved + r.kept == 0 {
                break;
            }
        }
        if report.moved > 0 {
            info!(queue = %queue, moved = report.moved, kept = report.kept,
                "relay notices moved back from the dead-notice list");
            hint(queue);
        }
        Ok(report)
    }
}

#[cfg(test)]
mod tests {
    use super::is_transient;
    use crate::error::QueueError;

    /// Real error replies of a real server, as the relay's script call gets
    /// them: only the script's own refusal and a key of another type set a
    /// notice aside; out of memory and a server busy with a long script are
    /// retried (before, both moved every notice to `relay:dead` for good).
    #[test]
    fn only_errors_of_the_data_set_notices_aside() {
        let server = queue_testkit::RedisServer::start().unwrap();
        let client = redis::Client::open(server.url()).unwrap();
        let mut c = client.get_connection().unwrap();
        let wrap = |e: redis::RedisError| QueueError::redis("q", None, e);
        let err = |r: redis::RedisResult<redis::Value>| wrap(r.unwrap_err());

        let refused = err(redis::cmd("EVAL")
            .arg("return redis.error_reply('ERR corrupt batch field total')")
            .arg(0)
            .query(&mut c));
        assert!(!is_transient(&refused), "{refused}");
        let _: () = redis::cmd("SET").arg("k").arg("v").query(&mut c).unwrap();
        let wrongtype = err(redis::cmd("LPUSH").arg("k").arg("x").query(&mut c));
        assert!(!is_transient(&wrongtype), "{wrongtype}");

        let _: () = redis::cmd("CONFIG")
            .arg("SET")
            .arg("maxmemory")
            .arg("1")
            .query(&mut c)
            .unwrap();
        let oom = err(redis::cmd("SET").arg("k2").arg("v").query(&mut c));
        assert!(is_transient(&oom), "{oom}");
        let _: () = redis::cmd("CONFIG")
            .arg("SET")
            .arg("maxmemory")
            .arg("0")
            .query(&mut c)
            .unwrap();

        // A script that loops past busy-reply-threshold: others get BUSY.
        let _: () = redis::cmd("CONFIG")
            .arg("SET")
            .arg("busy-reply-threshold")
            .arg("20")
            .query(&mut c)
            .unwrap();
        let mut looping = client.get_connection().unwrap();
        let long = std::thread::spawn(move || {
            let _ = redis::cmd("EVAL")
                .arg("while true do end")
                .arg(0)
                .query::<redis::Value>(&mut looping);
        });
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        let busy = loop {
            match redis::cmd("PING").query::<redis::Value>(&mut c) {
                Err(e) => break wrap(e),
                Ok(_) => assert!(std::time::Instant::now() < deadline, "never BUSY"),
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        };
        let _ = redis::cmd("SCRIPT")
            .arg("KILL")
            .query::<redis::Value>(&mut c);
        long.join().unwrap();
        assert!(busy.to_string().contains("BUSY"), "{busy}");
        assert!(is_transient(&busy), "{busy}");
    }

    /// A server that lacks the function library answers a call's resend
    /// `ERR Function not found` when the load reached another node (a
    /// failover between the two) or the library was flushed in between:
    /// not an error of the notices' data, retried by the next relay run
    /// with every notice kept. Before, it was an `ERR` like a script's
    /// refusal: the notices went to `relay:dead` for good.
    #[test]
    fn a_missing_function_library_is_transient() {
        let server = queue_testkit::RedisServer::start().unwrap();
        let mut c = redis::Client::open(server.url())
            .unwrap()
            .get_connection()
            .unwrap();
        let alone = redis::cmd("FCALL")
            .arg(crate::scripts::relay_apply::SCRIPT.function.as_str())
            .arg(0)
            .query::<redis::Value>(&mut c)
            .unwrap_err();
        assert_eq!(alone.code(), Some("ERR"), "{alone}");
        let alone = QueueError::redis("q", None, alone);
        assert!(!alone.is_data_error(), "{alone}");
        assert!(is_transient(&alone), "{alone}");
        // The same reply as one of a pipeline's (a batch's calls).
        let piped: Vec<redis::Value> = redis::pipe()
            .cmd("PING")
            .cmd("FCALL")
            .arg("qc_none_x")
            .arg(0)
            .ignore_errors()
            .query(&mut c)
            .unwrap();
        let redis::Value::ServerError(e) = piped[1].clone() else {
            panic!("{piped:?}")
        };
        let piped = QueueError::redis("q", None, e.into());
        assert!(!piped.is_data_error(), "{piped}");
        assert!(is_transient(&piped), "{piped}");
    }
}
