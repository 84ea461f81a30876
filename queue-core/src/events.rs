//! The bounded event stream of a queue (docs/EVENTS.md): [`QueueEvent`], the
//! switch ([`Queue::set_events`]) and the readers ([`Queue::events`], a
//! `futures::Stream` over `XREAD BLOCK` on a dedicated connection, and
//! [`Queue::read_events`] / [`Queue::read_events_page`], one page).
//!
//! The scripts that make each transition append to `q:{Q}:events`
//! (`XADD MAXLEN ~ N`) while `q:{Q}:events:on` holds N > 0: `ev()` /
//! `ev_hist()` in `scripts/prelude.lua`, the flag read once per script call.

use std::collections::VecDeque;
use std::time::Duration;

use futures::stream::BoxStream;
use redis::Value;

use crate::conn::{connect, ConnectionConfig, RedisConnection};
use crate::error::{QueueError, Result};
use crate::job::JobId;
use crate::keys::QueueKeys;
use crate::queue::Queue;

/// The stream cap [`Queue::set_events`] sets: about this many entries are
/// kept (`XADD MAXLEN ~`), the oldest trimmed first.
pub const DEFAULT_EVENTS_MAXLEN: u64 = 10_000;

/// The largest cap [`Queue::set_events_maxlen`] takes: 2^53 − 1, the
/// largest count the scripts' `ev()` reads from `q:{Q}:events:on` (a Lua
/// number is exact only up to there; `as_count` in `scripts/prelude.lua`
/// reads anything above as not a count, i.e. events off).
const MAX_EVENTS_MAXLEN: u64 = (1 << 53) - 1;

/// The cap stored in `q:{Q}:events:on` as the scripts read it: a count from
/// 1 to [`MAX_EVENTS_MAXLEN`], else `None` (the scripts write no event).
fn stored_maxlen(v: &str) -> Option<u64> {
    v.trim()
        .parse()
        .ok()
        .filter(|n| (1..=MAX_EVENTS_MAXLEN).contains(n))
}

/// How long one `XREAD BLOCK` of [`Queue::events`] waits before asking again.
const BLOCK: Duration = Duration::from_secs(5);
/// Entries per `XREAD`.
const READ_COUNT: usize = 256;

/// What happened to a job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EventKind {
    /// Enqueued (waiting, or delayed until `run_at`).
    Enqueued,
    /// A worker claimed a delivery (`attempt`, `worker`).
    Started,
    /// Acked: the job succeeded.
    Completed,
    /// The handler failed and the job was scheduled again (`detail`: the error).
    Retried,
    /// The watchdog returned a delivery whose lease expired (`detail`: why).
    Reclaimed,
    /// Given back without using an attempt: its payload version is newer than the handler.
    Deferred,
    /// Moved to the dead-letter list (`detail`: the reason).
    DeadLettered,
    /// Moved back from the dead-letter list (`detail`: why it had died).
    Replayed,
    /// An operator asked a running job to cancel.
    CancelRequested,
    /// Ended as cancelled.
    Cancelled,
    /// A kind this version does not know (written by a newer one).
    Other(String),
}

impl EventKind {
    /// The kind as written in the stream's `event` field (and in a job's history).
    pub fn parse(s: &str) -> Self {
        match s {
            "enqueued" => EventKind::Enqueued,
            "started" => EventKind::Started,
            "completed" => EventKind::Completed,
            "retried" => EventKind::Retried,
            "reclaimed" => EventKind::Reclaimed,
            "deferred" => EventKind::Deferred,
            "dead" => EventKind::DeadLettered,
            "replayed" => EventKind::Replayed,
            "cancel_requested" => EventKind::CancelRequested,
            "cancelled" => EventKind::Cancelled,
            other => EventKind::Other(other.to_string()),
        }
    }

    /// The name as written by the scripts (`dead` for [`EventKind::DeadLettered`]).
    pub fn as_str(&self) -> &str {
        match self {
            EventKind::Enqueued => "enqueued",
            EventKind::Started => "started",
            EventKind::Completed => "completed",
            EventKind::Retried => "retried",
            EventKind::Reclaimed => "reclaimed",
            EventKind::Deferred => "deferred",
            EventKind::DeadLettered => "dead",
            EventKind::Replayed => "replayed",
            EventKind::CancelRequested => "cancel_requested",
            EventKind::Cancelled => "cancelled",
            EventKind::Other(s) => s,
        }
    }
}

/// One entry of a queue's event stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueEvent {
    /// The stream entry id (`<ms>-<seq>`): pass it to [`EventsFrom::After`] to resume.
    pub stream_id: String,
    /// What happened.
    pub kind: EventKind,
    /// The job.
    pub job_id: JobId,
    /// When (Redis clock, ms since the epoch).
    pub at_ms: i64,
    /// The attempt (delivery number) it concerns, when it concerns one.
    pub attempt: Option<u32>,
    /// The worker of that delivery, when known.
    pub worker: Option<String>,
    /// The job type (on `enqueued`).
    pub job_type: Option<String>,
    /// The error, dead-letter reason or other detail, when there is one.
    pub detail: Option<String>,
}

impl QueueEvent {
    /// Decodes one stream entry (its field, value pairs); `None` without an `event` or `id`.
    fn decode(stream_id: String, fields: &[(String, String)]) -> Option<Self> {
        let get = |name: &str| {
            fields
                .iter()
                .find(|(f, _)| f == name)
                .map(|(_, v)| v.as_str())
                .filter(|v| !v.is_empty())
        };
        Some(QueueEvent {
            kind: EventKind::parse(get("event")?),
            job_id: JobId::from(get("id")?.to_string()),
            at_ms: get("at").and_then(|t| t.parse().ok()).unwrap_or_else(|| {
                // The entry id starts with the Redis time it was added.
                stream_id
                    .split('-')
                    .next()
                    .and_then(|t| t.parse().ok())
                    .unwrap_or(0)
            }),
            attempt: get("attempt")
                .and_then(|a| a.parse().ok())
                .filter(|a| *a > 0),
            worker: get("worker").map(str::to_string),
            job_type: get("type").map(str::to_string),
            detail: get("detail").map(str::to_string),
            stream_id,
        })
    }
}

/// One page of a queue's event stream ([`Queue::read_events_page`],
/// [`Queue::last_events_page`]): the events decoded, and the cursor to go
/// on from, which is the stream id of the last entry the page read, whether
/// or not it decoded. A page of entries this version cannot decode (another
/// writer's, a newer version's) has no events but still moves the cursor:
/// from the last *decoded* event a reader would read the same page again
/// and again, taking "nothing decoded" for "nothing new".
#[derive(Debug, Clone, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct EventsPage {
    /// The entries that decode as events, oldest first.
    pub events: Vec<QueueEvent>,
    /// The stream id to read after next (pass it to
    /// [`Queue::read_events_page`] or [`EventsFrom::After`]); `None` when
    /// the page read no entry (keep the cursor you had).
    pub next_after: Option<String>,
}

/// Where [`Queue::events`] starts reading.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum EventsFrom {
    /// Only events added after the call (`$`).
    #[default]
    Now,
    /// Every event still in the stream, oldest first.
    Start,
    /// Events after this stream entry id (from a previous [`QueueEvent::stream_id`]).
    After(String),
}

impl Queue {
    /// Turns the event stream of `queue` on (capped at
    /// [`DEFAULT_EVENTS_MAXLEN`] entries) or off. Off by default: each
    /// transition of a job then costs one `XADD` (docs/EVENTS.md, measured
    /// cost). Every worker's scripts see the switch at their next call.
    ///
    /// ```
    /// # #[tokio::main] async fn main() -> Result<(), queue_core::QueueError> {
    /// # let server = queue_testkit::RedisServer::start().unwrap();
    /// use futures::StreamExt;
    /// use queue_core::{EventKind, EventsFrom, Queue};
    ///
    /// let queue = Queue::connect(&server.url()).await?;
    /// queue.set_events("emails", true).await?;
    /// let mut events = queue.events("emails", EventsFrom::Now).await?;
    /// queue.enqueue_raw("emails", "send", 1, 3, Default::default(), b"\x80").await?;
    /// let event = events.next().await.expect("a stream never ends")?;
    /// assert_eq!(event.kind, EventKind::Enqueued);
    /// assert_eq!(event.job_type.as_deref(), Some("send"));
    /// # Ok(()) }
    /// ```
    pub async fn set_events(&self, queue: &str, on: bool) -> Result<()> {
        self.set_events_maxlen(queue, if on { DEFAULT_EVENTS_MAXLEN } else { 0 })
            .await
    }

    /// Turns the event stream on, capped at about `maxlen` entries
    /// (`XADD MAXLEN ~ maxlen`); 0 turns it off (the stream already written
    /// stays until it is deleted). A cap above 2^53 − 1
    /// (9007199254740991, the largest count the scripts read) is refused
    /// with [`QueueError::Config`] naming the queue, before anything is
    /// written: stored, the scripts would read the stream as off and write
    /// nothing, while [`events_maxlen`](Self::events_maxlen) said on.
    pub async fn set_events_maxlen(&self, queue: &str, maxlen: u64) -> Result<()> {
        if maxlen > MAX_EVENTS_MAXLEN {
            return Err(QueueError::Config(format!(
                "queue `{queue}`: events maxlen {maxlen} is above {MAX_EVENTS_MAXLEN} (2^53 - 1), the largest cap the scripts read"
            )));
        }
        let k = QueueKeys::new(queue);
        let cmd = if maxlen > 0 {
            let mut c = redis::cmd("SET");
            c.arg(k.events_on()).arg(maxlen);
            c
        } else {
            let mut c = redis::cmd("DEL");
            c.arg(k.events_on());
            c
        };
        let _: Value = cmd
            .query_async(&mut self.connection())
            .await
            .map_err(|e| QueueError::redis(queue, None, e))?;
        Ok(())
    }

    /// The event stream's cap when it is on for `queue`, `None` when off.
    /// Read as the scripts read it: a stored value that is not a count from
    /// 1 to 2^53 − 1 (e.g. a larger one set by hand) is off: the scripts
    /// write no event for it.
    pub async fn events_maxlen(&self, queue: &str) -> Result<Option<u64>> {
        let v: Option<String> = redis::cmd("GET")
            .arg(QueueKeys::new(queue).events_on())
            .query_async(&mut self.connection())
            .await
            .map_err(|e| QueueError::redis(queue, None, e))?;
        Ok(v.as_deref().and_then(stored_maxlen))
    }

    /// Up to `count` events of `queue` after stream entry `after` (`"0"`:
    /// from the oldest still kept), oldest first, without blocking.
    ///
    /// Entries that do not decode are left out, so an empty answer does not
    /// mean the stream has nothing more: to page through a stream, use
    /// [`read_events_page`](Self::read_events_page), whose cursor moves past
    /// them.
    pub async fn read_events(
        &self,
        queue: &str,
        after: &str,
        count: usize,
    ) -> Result<Vec<QueueEvent>> {
        Ok(self.read_events_page(queue, after, count).await?.events)
    }

    /// Up to `count` entries of `queue`'s stream after stream entry `after`
    /// (`"0"`: from the oldest still kept), without blocking: the events
    /// among them, oldest first, and the cursor to read after next
    /// ([`EventsPage::next_after`]: the last entry read, decoded or not).
    /// The stream has nothing more after `after` when `next_after` is
    /// `None`.
    ///
    /// ```
    /// # #[tokio::main] async fn main() -> Result<(), queue_core::QueueError> {
    /// # let server = queue_testkit::RedisServer::start().unwrap();
    /// use queue_core::{EventKind, Queue};
    ///
    /// let queue = Queue::connect(&server.url()).await?;
    /// queue.set_events("emails", true).await?;
    /// for _ in 0..3 {
    ///     queue.enqueue_raw("emails", "send", 1, 3, Default::default(), b"\x80").await?;
    /// }
    /// // Two entries a page, from the start, until nothing is left.
    /// let (mut after, mut seen) = ("0".to_string(), Vec::new());
    /// loop {
    ///     let page = queue.read_events_page("emails", &after, 2).await?;
    ///     seen.extend(page.events);
    ///     match page.next_after {
    ///         Some(next) => after = next,
    ///         None => break,
    ///     }
    /// }
    /// assert_eq!(seen.len(), 3);
    /// assert!(seen.iter().all(|e| e.kind == EventKind::Enqueued));
    /// # Ok(()) }
    /// ```
    pub async fn read_events_page(
        &self,
        queue: &str,
        after: &str,
        count: usize,
    ) -> Result<EventsPage> {
        let reply: Value = redis::cmd("XRANGE")
            .arg(QueueKeys::new(queue).events())
            .arg(format!("({after}"))
            .arg("+")
            .arg("COUNT")
            .arg(count)
            .query_async(&mut self.connection())
            .await
            .map_err(|e| QueueError::redis(queue, None, e))?;
        Ok(EventsPage {
            events: entries(&reply),
            next_after: last_id(&reply),
        })
    }

    /// The last `count` events of `queue`, oldest first.
    ///
    /// Entries that do not decode are left out (fewer than `count` events,
    /// possibly none, while the stream is not empty): to follow on from
    /// here, use [`last_events_page`](Self::last_events_page), which also
    /// tells the newest entry's id.
    pub async fn last_events(&self, queue: &str, count: usize) -> Result<Vec<QueueEvent>> {
        Ok(self.last_events_page(queue, count).await?.events)
    }

    /// The last `count` entries of `queue`'s stream: the events among them,
    /// oldest first, and the newest entry's id, decoded or not
    /// ([`EventsPage::next_after`]; `None` when the stream is empty). Follow
    /// on from it with [`EventsFrom::After`]: only what is added later.
    ///
    /// ```
    /// # #[tokio::main] async fn main() -> Result<(), queue_core::QueueError> {
    /// # let server = queue_testkit::RedisServer::start().unwrap();
    /// use queue_core::{EventsFrom, Queue};
    ///
    /// let queue = Queue::connect(&server.url()).await?;
    /// queue.set_events("emails", true).await?;
    /// queue.enqueue_raw("emails", "send", 1, 3, Default::default(), b"\x80").await?;
    /// let page = queue.last_events_page("emails", 10).await?;
    /// assert_eq!(page.events.len(), 1);
    /// let from = match page.next_after {
    ///     Some(newest) => EventsFrom::After(newest),
    ///     None => EventsFrom::Start,
    /// };
    /// let _new_ones = queue.events("emails", from).await?;
    /// # Ok(()) }
    /// ```
    pub async fn last_events_page(&self, queue: &str, count: usize) -> Result<EventsPage> {
        let reply: Value = redis::cmd("XREVRANGE")
            .arg(QueueKeys::new(queue).events())
            .arg("+")
            .arg("-")
            .arg("COUNT")
            .arg(count)
            .query_async(&mut self.connection())
            .await
            .map_err(|e| QueueError::redis(queue, None, e))?;
        let mut events = entries(&reply);
        events.reverse();
        Ok(EventsPage {
            events,
            next_after: first_id(&reply),
        })
    }

    /// The events of `queue` as they happen: a `Stream` that never ends,
    /// reading with `XREAD BLOCK` on a connection of its own (opened here,
    /// so a blocked read never delays this `Queue`'s other commands). A
    /// Redis error is yielded as an `Err` item and the stream goes on
    /// reading after a second. Needs a `Queue` made by [`Queue::connect`]
    /// (it knows the URL); see [`Queue::set_events`] for an example.
    pub async fn events(
        &self,
        queue: &str,
        from: EventsFrom,
    ) -> Result<BoxStream<'static, Result<QueueEvent>>> {
        let Some(origin) = self.origin.clone() else {
            return Err(QueueError::Config(
                "Queue::events needs a Queue made by Queue::connect (it opens its own connection)"
                    .into(),
            ));
        };
        let (url, cfg) = &*origin;
        let cfg = ConnectionConfig {
            response_timeout: BLOCK + cfg.response_timeout,
            connection_timeout: cfg.connection_timeout,
        };
        let conn = connect(url, &cfg).await?;
        let last = match from {
            EventsFrom::Start => "0-0".to_string(),
            EventsFrom::After(id) => id,
            EventsFrom::Now => {
                // Resolved now, so nothing added between two reads is missed:
                // the newest entry's id, whether or not it is an event this
                // version decodes (from an undecodable one, the whole history
                // was read again).
                let newest: Value = redis::cmd("XREVRANGE")
                    .arg(QueueKeys::new(queue).events())
                    .arg("+")
                    .arg("-")
                    .arg("COUNT")
                    .arg(1)
                    .query_async(&mut self.connection())
                    .await
                    .map_err(|e| QueueError::redis(queue, None, e))?;
                last_id(&newest).unwrap_or_else(|| "0-0".to_string())
            }
        };
        let state = Follow {
            conn,
            queue: queue.to_string(),
            key: QueueKeys::new(queue).events(),
            last,
            buffer: VecDeque::new(),
            failed: false,
        };
        Ok(Box::pin(futures::stream::unfold(
            state,
            |mut s| async move {
                let item = s.next().await;
                Some((item, s))
            },
        )))
    }
}

/// The state of one [`Queue::events`] stream.
struct Follow {
    conn: RedisConnection,
    queue: String,
    key: String,
    last: String,
    buffer: VecDeque<QueueEvent>,
    failed: bool,
}

impl Follow {
    async fn next(&mut self) -> Result<QueueEvent> {
        loop {
            if let Some(e) = self.buffer.pop_front() {
                return Ok(e);
            }
            if self.failed {
                tokio::time::sleep(Duration::from_secs(1)).await;
                self.failed = false;
            }
            let reply: redis::RedisResult<Value> = redis::cmd("XREAD")
                .arg("COUNT")
                .arg(READ_COUNT)
                .arg("BLOCK")
                .arg(BLOCK.as_millis() as u64)
                .arg("STREAMS")
                .arg(&self.key)
                .arg(&self.last)
                .query_async(&mut self.conn)
                .await;
            match reply {
                Err(e) => {
                    self.failed = true;
                    return Err(QueueError::redis(&self.queue, None, e));
                }
                Ok(v) => {
                    for entries_of_key in stream_replies(&v) {
                        // Past every entry read, decoded or not: from the last
                        // decoded one, entries that do not decode (another
                        // writer's, a newer version's) were read again and
                        // again, and a page of them never moved on.
                        if let Some(id) = last_id(entries_of_key) {
                            self.last = id;
                        }
                        self.buffer.extend(entries(entries_of_key));
                    }
                }
            }
        }
    }
}

/// The per-stream entry lists of an `XREAD` reply (RESP2 array or RESP3 map).
fn stream_replies(v: &Value) -> Vec<&Value> {
    match v {
        Value::Array(streams) => streams
            .iter()
            .filter_map(|s| match s {
                Value::Array(pair) if pair.len() == 2 => Some(&pair[1]),
                _ => None,
            })
            .collect(),
        Value::Map(pairs) => pairs.iter().map(|(_, entries)| entries).collect(),
        _ => Vec::new(),
    }
}

/// The events of an `XRANGE`-shaped reply: `[[id, [field, value, ...]], ...]`.
/// An entry that does not decode is skipped (never a panic on bad data).
fn entries(v: &Value) -> Vec<QueueEvent> {
    let Value::Array(items) = v else {
        return Vec::new();
    };
    items
        .iter()
        .filter_map(|item| {
            let Value::Array(pair) = item else {
                return None;
            };
            let id = text(pair.first()?)?;
            let fields = match pair.get(1)? {
                Value::Array(fv) => fv
                    .chunks(2)
                    .filter_map(|c| Some((text(c.first()?)?, text(c.get(1)?)?)))
                    .collect::<Vec<_>>(),
                Value::Map(m) => m
                    .iter()
                    .filter_map(|(f, v)| Some((text(f)?, text(v)?)))
                    .collect(),
                _ => return None,
            };
            QueueEvent::decode(id, &fields)
        })
        .collect()
}

/// The id of the last entry of an `XRANGE`-shaped reply, decodable or not.
fn last_id(v: &Value) -> Option<String> {
    match v {
        Value::Array(items) => entry_id(items.last()?),
        _ => None,
    }
}

/// The id of the first entry of an `XRANGE`-shaped reply (the newest of an
/// `XREVRANGE`), decodable or not.
fn first_id(v: &Value) -> Option<String> {
    match v {
        Value::Array(items) => entry_id(items.first()?),
        _ => None,
    }
}

fn entry_id(entry: &Value) -> Option<String> {
    match entry {
        Value::Array(pair) => text(pair.first()?),
        _ => None,
    }
}

fn text(v: &Value) -> Option<String> {
    match v {
        Value::BulkString(b) => Some(String::from_utf8_lossy(b).into_owned()),
        Value::SimpleString(s) => Some(s.clone()),
        Value::Int(n) => Some(n.to_string()),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bulk(s: &str) -> Value {
        Value::BulkString(s.as_bytes().to_vec())
    }

    #[test]
    fn decodes_entries_and_skips_garbage() {
        let reply = Value::Array(vec![
            Value::Array(vec![
                bulk("1700000000000-0"),
                Value::Array(
                    [
                        "event",
                        "started",
                        "id",
                        "j1",
                        "at",
                        "1700000000000",
                        "attempt",
                        "2",
                        "worker",
                        "w1",
                    ]
                    .iter()
                    .map(|s| bulk(s))
                    .collect(),
                ),
            ]),
            Value::Int(7),
            Value::Array(vec![bulk("1-0"), Value::Array(vec![bulk("id"), bulk("x")])]),
        ]);
        let events = entries(&reply);
        assert_eq!(events.len(), 1);
        let e = &events[0];
        assert_eq!(e.kind, EventKind::Started);
        assert_eq!(e.job_id.as_str(), "j1");
        assert_eq!(e.at_ms, 1_700_000_000_000);
        assert_eq!(e.attempt, Some(2));
        assert_eq!(e.worker.as_deref(), Some("w1"));
        assert_eq!(e.detail, None);
    }

    /// Scenario: an operator sets the events cap above 2^53 − 1, the
    /// largest count the scripts' `ev()` reads. The call is refused, naming
    /// the queue, and nothing is stored; the largest cap they read is taken
    /// and events are written. A larger cap stored by hand reads as off, as
    /// the scripts see it: no event is written for it. Before, the cap was
    /// stored and read back as on, while the scripts wrote nothing.
    #[tokio::test]
    async fn an_events_cap_the_scripts_cannot_read_is_refused_and_read_as_off() {
        let server = queue_testkit::RedisServer::start().unwrap();
        let queue = Queue::connect(&server.url()).await.unwrap();
        let mut conn = queue.connection();
        let xlen = |mut c: RedisConnection| async move {
            redis::cmd("XLEN")
                .arg(QueueKeys::new("q").events())
                .query_async::<u64>(&mut c)
                .await
                .unwrap()
        };
        let enqueue = || queue.enqueue_raw("q", "send", 1, 3, Default::default(), b"\x80");

        for maxlen in [1 << 53, u64::MAX] {
            let err = queue.set_events_maxlen("q", maxlen).await.unwrap_err();
            assert!(
                matches!(&err, QueueError::Config(m) if m.contains("`q`") && m.contains(&maxlen.to_string())),
                "{maxlen}: {err}"
            );
            assert_eq!(queue.events_maxlen("q").await.unwrap(), None, "{maxlen}");
        }

        queue
            .set_events_maxlen("q", MAX_EVENTS_MAXLEN)
            .await
            .unwrap();
        assert_eq!(
            queue.events_maxlen("q").await.unwrap(),
            Some(MAX_EVENTS_MAXLEN)
        );
        enqueue().await.unwrap();
        assert_eq!(xlen(conn.clone()).await, 1, "the largest cap is read");

        redis::cmd("SET")
            .arg(QueueKeys::new("q").events_on())
            .arg("123456789012345678")
            .query_async::<()>(&mut conn)
            .await
            .unwrap();
        assert_eq!(queue.events_maxlen("q").await.unwrap(), None);
        enqueue().await.unwrap();
        assert_eq!(
            xlen(conn.clone()).await,
            1,
            "the scripts read it as off too"
        );
    }

    #[test]
    fn every_kind_round_trips_through_its_name() {
        for name in [
            "enqueued",
            "started",
            "completed",
            "retried",
            "reclaimed",
            "deferred",
            "dead",
            "replayed",
            "cancel_requested",
            "cancelled",
            "future_kind",
        ] {
            assert_eq!(EventKind::parse(name).as_str(), name);
        }
    }
}
