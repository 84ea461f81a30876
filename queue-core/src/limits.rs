//! Rate limits and concurrency caps (docs/LIMITS.md): the public types
//! ([`RateLimit`], [`LimitScope`], [`QueueLimits`]) and the [`Queue`] methods
//! that set, clear and read them. The limits live in Redis (the queue's
//! limits hash, [`QueueKeys::limits`]) and are enforced inside `fetch.lua` and
//! `claim.lua` (prelude functions under `-- ==== limits ====`), so they hold
//! across every worker process.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use serde::Serialize;

use crate::error::{QueueError, Result};
use crate::keys::QueueKeys;
use crate::queue::EnqueueOptions;
use crate::queue::Queue;
use crate::scripts::limits_read;
use crate::scripts::set_limits::SetLimits;

/// At most `max` jobs started per `per` (a sliding window, Redis clock).
///
/// Parses from and prints as `N/<window>`: `100/1s`, `5/250ms`, `600/1m`.
///
/// ```
/// use std::time::Duration;
/// use queue_core::RateLimit;
/// let rate: RateLimit = "100/1s".parse().unwrap();
/// assert_eq!(rate, RateLimit::new(100, Duration::from_secs(1)));
/// assert_eq!(rate.to_string(), "100/1s");
/// ```
/// Serialized as `{"max": N, "per_ms": W}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RateLimit {
    /// Starts allowed per window.
    pub max: u32,
    /// The window (at least 1 ms; whole milliseconds).
    pub per: Duration,
}

impl RateLimit {
    /// `max` starts per `per`.
    pub fn new(max: u32, per: Duration) -> Self {
        RateLimit { max, per }
    }

    /// `max` starts per second.
    pub fn per_second(max: u32) -> Self {
        Self::new(max, Duration::from_secs(1))
    }

    /// The stored form, `N/W` with W in ms.
    fn stored(&self) -> String {
        format!("{}/{}", self.max, self.per.as_millis())
    }

    /// Reads the stored form.
    fn from_stored(v: &str) -> Option<Self> {
        let (n, w) = v.split_once('/')?;
        let w: u64 = w.parse().ok().filter(|w| *w >= 1)?;
        Some(Self::new(n.parse().ok()?, Duration::from_millis(w)))
    }
}

impl Serialize for RateLimit {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        let mut st = s.serialize_struct("RateLimit", 2)?;
        st.serialize_field("max", &self.max)?;
        st.serialize_field("per_ms", &(self.per.as_millis() as u64))?;
        st.end()
    }
}

impl fmt::Display for RateLimit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ms = self.per.as_millis();
        match ms {
            ms if ms % 60_000 == 0 => write!(f, "{}/{}m", self.max, ms / 60_000),
            ms if ms % 1_000 == 0 => write!(f, "{}/{}s", self.max, ms / 1_000),
            ms => write!(f, "{}/{}ms", self.max, ms),
        }
    }
}

impl FromStr for RateLimit {
    type Err = String;

    /// `N/<window>`, the window a number (default 1) and a unit `ms`, `s`,
    /// `m` or `h`: `100/1s`, `100/s`, `5/250ms`.
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        let bad = || format!("rate {s:?}: want N/<window>, e.g. 100/1s or 5/250ms");
        let (n, w) = s.split_once('/').ok_or_else(bad)?;
        let max: u32 = n.trim().parse().map_err(|_| bad())?;
        let w = w.trim();
        let split = w.find(|c: char| !c.is_ascii_digit()).unwrap_or(w.len());
        let (num, unit) = w.split_at(split);
        let num: u64 = if num.is_empty() {
            1
        } else {
            num.parse().map_err(|_| bad())?
        };
        let unit_ms: u64 = match unit {
            "ms" => 1,
            "s" => 1_000,
            "m" => 60_000,
            "h" => 3_600_000,
            _ => return Err(bad()),
        };
        // A window too long for a u64 of milliseconds is refused (it
        // panicked in debug builds and wrapped around in release ones).
        let ms = num.checked_mul(unit_ms).ok_or_else(|| {
            format!(
                "rate {s:?}: the window is too long (more than {} ms)",
                u64::MAX
            )
        })?;
        if ms == 0 {
            return Err(bad());
        }
        if max == 0 {
            return Err(format!("rate {s:?}: {ZERO_LIMIT}"));
        }
        Ok(Self::new(max, Duration::from_millis(ms)))
    }
}

/// Why a limit of 0 (no start per window, none running) is refused: it runs
/// nothing and reports nothing (the jobs went round between delayed and
/// main, or every fetcher polled, for ever).
const ZERO_LIMIT: &str = "a limit of 0 runs nothing; to hold the jobs, pause the queue \
     (`Queue::pause`, `queue-watchdog queue pause`) or their group (`Queue::pause_group`)";

/// What a limit applies to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LimitScope {
    /// The whole queue, across all workers.
    Queue,
    /// Each rate key on its own (the default for every key without an override).
    EveryKey,
    /// One rate key (an override of the [`EveryKey`](Self::EveryKey) default).
    Key(String),
}

impl LimitScope {
    fn field(&self, kind: &str) -> String {
        match self {
            LimitScope::Queue => kind.to_string(),
            LimitScope::EveryKey => format!("key_{kind}"),
            LimitScope::Key(k) => format!("key_{kind}:{k}"),
        }
    }
}

/// Which limit [`Queue::clear_limit`] clears.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LimitKind {
    /// The rate limit.
    Rate,
    /// The concurrency cap.
    Concurrency,
}

impl LimitKind {
    fn name(self) -> &'static str {
        match self {
            LimitKind::Rate => "rate",
            LimitKind::Concurrency => "concurrency",
        }
    }
}

/// One rate key's overrides.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct KeyLimits {
    /// Its rate limit (instead of the every-key default).
    pub rate: Option<RateLimit>,
    /// Its concurrency cap (instead of the every-key default).
    pub concurrency: Option<u32>,
}

/// A queue's limits and their current use ([`Queue::limits`]).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct QueueLimits {
    /// Queue name.
    pub queue: String,
    /// Queue rate limit.
    pub rate: Option<RateLimit>,
    /// Queue concurrency cap: jobs running at once across all workers.
    pub concurrency: Option<u32>,
    /// Default rate limit of every rate key.
    pub key_rate: Option<RateLimit>,
    /// Default concurrency cap of every rate key.
    pub key_concurrency: Option<u32>,
    /// Per-key overrides.
    pub keys: BTreeMap<String, KeyLimits>,
    /// Jobs running now (live leases).
    pub running: u64,
    /// Jobs started within the current queue rate window (0 without one).
    pub started_in_window: u64,
    /// Fields of the limits hash that do not parse (set by hand), as stored.
    pub unreadable: Vec<(String, String)>,
}

impl QueueLimits {
    /// True when the queue has no limit at all.
    pub fn is_empty(&self) -> bool {
        self.rate.is_none()
            && self.concurrency.is_none()
            && self.key_rate.is_none()
            && self.key_concurrency.is_none()
            && self.keys.is_empty()
            && self.unreadable.is_empty()
    }

    fn from_fields(queue: &str, fields: Vec<(String, String)>) -> Self {
        let mut l = QueueLimits {
            queue: queue.to_string(),
            ..Default::default()
        };
        for (name, value) in fields {
            let rate = RateLimit::from_stored(&value);
            let count = value.parse::<u32>().ok();
            let ok = match name.as_str() {
                "rate" => rate.map(|r| l.rate = Some(r)),
                "concurrency" => count.map(|n| l.concurrency = Some(n)),
                "key_rate" => rate.map(|r| l.key_rate = Some(r)),
                "key_concurrency" => count.map(|n| l.key_concurrency = Some(n)),
                other => match (
                    other.strip_prefix("key_rate:"),
                    other.strip_prefix("key_concurrency:"),
                ) {
                    (Some(k), _) => {
                        rate.map(|r| l.keys.entry(k.into()).or_default().rate = Some(r))
                    }
                    (_, Some(k)) => {
                        count.map(|n| l.keys.entry(k.into()).or_default().concurrency = Some(n))
                    }
                    _ => None,
                },
            };
            if ok.is_none() {
                l.unreadable.push((name, value));
            }
        }
        l
    }
}

impl fmt::Display for QueueLimits {
    /// One line: `rate 100/1s (37 in window), concurrency 8 (3 running), per key: ...`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut parts = Vec::new();
        if let Some(r) = self.rate {
            parts.push(format!("rate {r} ({} in window)", self.started_in_window));
        }
        if let Some(n) = self.concurrency {
            parts.push(format!("concurrency {n} ({} running)", self.running));
        }
        if let Some(r) = self.key_rate {
            parts.push(format!("per key rate {r}"));
        }
        if let Some(n) = self.key_concurrency {
            parts.push(format!("per key concurrency {n}"));
        }
        for (k, o) in &self.keys {
            let mut s = format!("key {k}:");
            if let Some(r) = o.rate {
                s.push_str(&format!(" rate {r}"));
            }
            if let Some(n) = o.concurrency {
                s.push_str(&format!(" concurrency {n}"));
            }
            parts.push(s);
        }
        for (name, value) in &self.unreadable {
            parts.push(format!("{name}={value:?} (unreadable)"));
        }
        if parts.is_empty() {
            return f.write_str("none");
        }
        f.write_str(&parts.join(", "))
    }
}

impl Queue {
    /// Limits how many jobs of `queue` start per window, across all
    /// workers: for the whole queue, or per rate key
    /// ([`EnqueueOptions::rate_key`](crate::EnqueueOptions::rate_key)).
    /// Replaces the scope's previous rate. A rate of 0 starts is refused
    /// (`QueueError::Config`; to hold the jobs, pause the queue or their
    /// group). A change of a rate key's limits
    /// (its own, or the every-key default) makes the jobs deferred under
    /// the old ones due at once, to be booked again under the new ones
    /// ([`release_deferred`](Self::release_deferred)); setting the rate a
    /// scope has already changes nothing. See docs/LIMITS.md.
    ///
    /// ```
    /// # #[tokio::main] async fn main() -> Result<(), queue_core::QueueError> {
    /// # let server = queue_testkit::RedisServer::start().unwrap();
    /// use queue_core::{LimitScope, Queue, RateLimit};
    /// let queue = Queue::connect(&server.url()).await?;
    /// queue.set_rate_limit("emails", LimitScope::Queue, RateLimit::per_second(100)).await?;
    /// queue.set_rate_limit("emails", LimitScope::EveryKey, "5/1s".parse().unwrap()).await?;
    /// queue.set_concurrency_limit("emails", LimitScope::Key("tenant-1".into()), 2).await?;
    /// let limits = queue.limits("emails").await?;
    /// assert_eq!(limits.rate, Some(RateLimit::per_second(100)));
    /// assert_eq!(limits.keys["tenant-1"].concurrency, Some(2));
    /// queue.clear_limits("emails").await?;
    /// assert!(queue.limits("emails").await?.is_empty());
    /// # Ok(()) }
    /// ```
    pub async fn set_rate_limit(
        &self,
        queue: &str,
        scope: LimitScope,
        rate: RateLimit,
    ) -> Result<()> {
        if rate.per.as_millis() < 1 {
            return Err(QueueError::Config(format!(
                "queue `{queue}`: a rate window must be at least 1 ms, got {:?}",
                rate.per
            )));
        }
        if rate.max == 0 {
            return Err(QueueError::Config(format!(
                "queue `{queue}`: rate {rate}: {ZERO_LIMIT}"
            )));
        }
        self.write_limit(queue, scope.field("rate"), rate.stored())
            .await
    }

    /// Caps how many jobs of `queue` run at once across all workers: for the
    /// whole queue, or per rate key. Counted from live leases, so a dead
    /// worker's slots come back when its leases expire. `max` is at least
    /// 1: 0 is refused (`QueueError::Config`; to hold the jobs, pause the
    /// queue or their group). See docs/LIMITS.md.
    pub async fn set_concurrency_limit(
        &self,
        queue: &str,
        scope: LimitScope,
        max: u32,
    ) -> Result<()> {
        if max == 0 {
            return Err(QueueError::Config(format!(
                "queue `{queue}`: concurrency 0: {ZERO_LIMIT}"
            )));
        }
        self.write_limit(queue, scope.field("concurrency"), max.to_string())
            .await
    }

    /// Clears one limit of `queue` (a no-op when it is not set).
    pub async fn clear_limit(&self, queue: &str, scope: LimitScope, kind: LimitKind) -> Result<()> {
        self.write_limit(queue, scope.field(kind.name()), String::new())
            .await
    }

    /// Clears every limit of `queue`; the jobs deferred for their rate keys
    /// are due again at once.
    pub async fn clear_limits(&self, queue: &str) -> Result<()> {
        let keys = QueueKeys::new(queue);
        let reply = SetLimits::ClearAll
            .run_to_end(&keys, &mut self.connection())
            .await?;
        tracing::info!(queue, released = reply.released, "limits cleared");
        Ok(())
    }

    /// Makes the jobs of `queue` deferred for rate key `key` (`None`: for
    /// every key) due now, and drops the key's booking of its next starts:
    /// they are claimed, or deferred again under the key's limits as they
    /// are now, booked from now. A change of a key's limits
    /// ([`set_rate_limit`](Self::set_rate_limit), [`clear_limit`](Self::clear_limit),
    /// ...) does this already; this is the operator's way to finish one that
    /// was interrupted, or to re-spread a key's backlog. Returns how many
    /// jobs were made due. See docs/LIMITS.md.
    pub async fn release_deferred(&self, queue: &str, key: Option<&str>) -> Result<u64> {
        let keys = QueueKeys::new(queue);
        let reply = SetLimits::ReleaseDeferred(key)
            .run_to_end(&keys, &mut self.connection())
            .await?;
        tracing::info!(
            queue,
            key,
            released = reply.released,
            "deferred jobs released"
        );
        Ok(reply.released)
    }

    /// The limits of `queue` and their current use.
    pub async fn limits(&self, queue: &str) -> Result<QueueLimits> {
        let keys = QueueKeys::new(queue);
        let reply = limits_read::read(&keys, &mut self.connection()).await?;
        let mut limits = QueueLimits::from_fields(queue, reply.fields);
        limits.running = reply.running;
        limits.started_in_window = reply.started_in_window;
        Ok(limits)
    }

    async fn write_limit(&self, queue: &str, field: String, value: String) -> Result<()> {
        let keys = QueueKeys::new(queue);
        let fields = [(field, value)];
        let reply = SetLimits::Fields(&fields)
            .run_to_end(&keys, &mut self.connection())
            .await?;
        tracing::info!(queue, field = %fields[0].0, value = %fields[0].1, released = reply.released, "limit set");
        Ok(())
    }
}

/// `opts` with the rate key `J` derives from `args` (`#[job(rate_key = ..)]`),
/// unless `opts` names one already.
pub(crate) fn with_rate_key<J: crate::Job>(opts: EnqueueOptions, args: &J::Args) -> EnqueueOptions {
    if opts.extra_fields.iter().any(|(n, _)| n == "rate_key") {
        return opts;
    }
    match J::rate_key(args) {
        Some(key) => opts.rate_key(key),
        None => opts,
    }
}

/// The wait of a `limited:<ms>` fetch reply.
pub(crate) fn decode_wait(queue: &str, text: &str) -> Result<Duration> {
    text.strip_prefix("limited:")
        .and_then(|ms| ms.parse::<u64>().ok())
        .map(Duration::from_millis)
        .ok_or_else(|| QueueError::protocol(queue, None, format!("fetch reply {text:?}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_parse_and_print() {
        for (s, max, ms) in [
            ("100/1s", 100, 1000),
            ("100/s", 100, 1000),
            ("5/250ms", 5, 250),
            ("2/1m", 2, 60_000),
        ] {
            let r: RateLimit = s.parse().unwrap();
            assert_eq!((r.max, r.per.as_millis()), (max, ms), "{s}");
            assert_eq!(r.to_string().parse::<RateLimit>().unwrap(), r);
        }
        for bad in ["100", "x/1s", "1/0s", "1/1y", "1/"] {
            assert!(bad.parse::<RateLimit>().is_err(), "{bad}");
        }
        let zero = "0/1s".parse::<RateLimit>().unwrap_err();
        assert!(zero.contains("pause"), "{zero}");
    }

    /// A window whose milliseconds overflow a u64 is a parse error; it
    /// panicked (debug) or wrapped around to a short window (release).
    #[test]
    fn a_window_too_long_for_milliseconds_is_a_parse_error() {
        for bad in [
            "1/5124095576030432h",
            "1/5124095576031h",
            "1/307445734561826m",
            "1/18446744073709552s",
        ] {
            let err = bad.parse::<RateLimit>().unwrap_err();
            assert!(err.contains("too long"), "{bad}: {err}");
        }
        // The longest windows that fit still parse.
        let r: RateLimit = "1/5124095576030h".parse().unwrap();
        assert_eq!(r.per.as_millis(), 5_124_095_576_030 * 3_600_000);
        let r: RateLimit = "1/18446744073709551615ms".parse().unwrap();
        assert_eq!(r.per.as_millis(), u128::from(u64::MAX));
    }

    #[test]
    fn stored_fields_decode_and_bad_ones_are_listed() {
        let f = |n: &str, v: &str| (n.to_string(), v.to_string());
        let l = QueueLimits::from_fields(
            "q",
            vec![
                f("rate", "100/1000"),
                f("key_concurrency", "2"),
                f("key_rate:t1", "5/1000"),
                f("concurrency", "x"),
            ],
        );
        assert_eq!(l.rate, Some(RateLimit::per_second(100)));
        assert_eq!(l.key_concurrency, Some(2));
        assert_eq!(l.keys["t1"].rate, Some(RateLimit::per_second(5)));
        assert_eq!(l.unreadable, vec![f("concurrency", "x")]);
        assert!(decode_wait("q", "limited:12").unwrap() == Duration::from_millis(12));
        assert!(decode_wait("q", "limited:").is_err());
    }
}
