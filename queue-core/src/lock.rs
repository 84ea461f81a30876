//! A distributed lock for user code, as users of Redis locks expect it: a
//! short lease, a fresh random owner token per acquisition, release and
//! extend only while the token matches (one script each), an auto-renew loop
//! that stops once the lock is lost or cannot be renewed in time, and a
//! bounded wait on acquire. Whether the lock is held follows its TTL on the
//! local monotonic clock (`lease_clock.rs`): measured from before the
//! acquire (then the most recently sent confirmed extend or renewal, whether
//! it lengthened or shortened the TTL) was sent, 90 % of that TTL, with or
//! without auto-renew; an extend or renewal whose reply was lost caps it at
//! its own send + 90 % of its TTL (Redis may apply it), until one sent after
//! it is confirmed.
//!
//! Renewals are timed from send times, as the heartbeat's beats are
//! ([`next_renewal`]): the first `renew_every` after the acquire that got
//! the answer was sent, each next one `renew_every` after the previous
//! renewal was sent. Timed from each reply, slow replies pushed a renewal
//! past the local deadline.
//!
//! A single-instance Redis lock is a *efficiency* lock: after a failover or a
//! long pause the holder may have lost it without knowing. Check
//! [`LockGuard::is_held`] before each critical write, and where the protected
//! store allows it, pass [`LockGuard::fencing`] along so stale holders are
//! rejected there.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use crate::conn::RedisConnection;
use rand::Rng;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tracing::{debug, warn};

use crate::error::outcome_unknown;
use crate::keys::LockKeys;
use crate::lease_clock::{trusted, LeaseClock};
use crate::scripts::lock_acquire::{LockAcquire, LockAcquireReply};
use crate::scripts::lock_extend::LockExtend;
use crate::scripts::lock_release::LockRelease;

/// Lock errors: a name or options refused before anything was sent, or
/// Redis failed while acquiring, extending or releasing.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LockError {
    /// Redis failed (or did not answer in time).
    #[error("lock `{name}`: redis error: {source}")]
    Redis {
        /// The lock's name.
        name: String,
        /// The client error.
        #[source]
        source: redis::RedisError,
    },
    /// A name that cannot name a lock's keys, refused before anything was
    /// sent: `""` or a name starting with `}`. The keys are `lock:{<name>}`
    /// and `lock:{<name>}:fence`, whose hash tag runs up to the first `}`:
    /// those names gave an empty tag, so the two keys fell in different
    /// cluster slots and every acquire failed with `CROSSSLOT`. Any other
    /// name (whitespace, braces elsewhere, e.g. `"nightly report"`,
    /// `"user {42}"`) is accepted.
    #[error("invalid lock name {name:?}: a lock name {reason}")]
    InvalidName {
        /// The rejected name.
        name: String,
        /// Why it was rejected.
        reason: &'static str,
    },
    /// [`LockOptions`] that cannot work, refused before anything was sent.
    #[error("lock `{name}`: invalid options: {reason}")]
    InvalidOptions {
        /// The lock's name.
        name: String,
        /// What is wrong.
        reason: String,
    },
    /// The lock's fencing counter (`lock:{<name>}:fence`) is at the
    /// largest count Redis keeps (`i64::MAX`, 9223372036854775807): no
    /// fencing number above the ones already handed out is left, so the
    /// lock was not taken. Only a counter set there by hand gets there in
    /// practice; deleting it (once no holder's number matters any more)
    /// lets the lock be taken again.
    #[error("lock `{name}`: its fencing counter is at its largest value (9223372036854775807): no fencing number is left, the lock was not taken")]
    FencingExhausted {
        /// The lock's name.
        name: String,
    },
}

impl LockError {
    /// The lock's name.
    pub fn name(&self) -> &str {
        match self {
            LockError::Redis { name, .. }
            | LockError::InvalidName { name, .. }
            | LockError::InvalidOptions { name, .. }
            | LockError::FencingExhausted { name } => name,
        }
    }

    /// The call may or may not have reached Redis (its reply was lost or
    /// timed out): an extend may still be applied, so
    /// [`LockGuard::is_held`] counts on no more than it would set.
    pub fn outcome_unknown(&self) -> bool {
        matches!(self, LockError::Redis { source, .. } if outcome_unknown(source))
    }

    fn redis(name: &str, source: redis::RedisError) -> Self {
        LockError::Redis {
            name: name.to_string(),
            source,
        }
    }
}

/// How to take a lock.
///
/// ```
/// use std::time::Duration;
/// let opts = queue_core::LockOptions::default().wait(Duration::from_secs(2));
/// assert_eq!(opts.ttl, Duration::from_secs(10));
/// ```
#[derive(Debug, Clone)]
pub struct LockOptions {
    /// Lease of the lock; it expires by itself if the holder dies. At least
    /// 1 ms (`acquire` refuses a shorter one with
    /// [`LockError::InvalidOptions`] before anything is sent); a longer one
    /// than Redis can keep (2^53 − 1 ms, ~285,000 years) is that longest one.
    pub ttl: Duration,
    /// How long `acquire` keeps trying; zero: try once; `Duration::MAX`
    /// (or any wait past what the clock holds): until it is free.
    pub wait: Duration,
    /// Pause between tries (jittered by ±50%).
    pub retry_interval: Duration,
    /// Auto-renew period; `None`: no auto-renew (call [`LockGuard::extend`]).
    /// A period that cannot keep the lock, zero or not below 90 % of `ttl`
    /// (the part of the lease the guard counts on), is replaced by a third
    /// of `ttl` (logged at acquire): e.g. `LockOptions { ttl: 2 s,
    /// ..Default::default() }` keeps the default's 3.33 s period, and is
    /// renewed every 667 ms.
    pub renew_every: Option<Duration>,
}

impl Default for LockOptions {
    fn default() -> Self {
        LockOptions {
            ttl: Duration::from_secs(10),
            wait: Duration::ZERO,
            retry_interval: Duration::from_millis(50),
            renew_every: Some(Duration::from_secs(10) / 3),
        }
    }
}

impl LockOptions {
    /// Sets the lease and an auto-renew period of a third of it (of the
    /// longest lease Redis keeps, for a longer one).
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self.renew_every = self.renew_every.map(|_| clamp_ttl(ttl) / 3);
        self
    }

    /// Sets the longest wait on acquire.
    pub fn wait(mut self, wait: Duration) -> Self {
        self.wait = wait;
        self
    }

    /// Turns auto-renew off.
    pub fn no_renew(mut self) -> Self {
        self.renew_every = None;
        self
    }

    /// Refuses a TTL below 1 ms (Redis refuses it: a script error, sent
    /// again on each retry of a job that can never succeed).
    fn check(&self, name: &str) -> Result<(), LockError> {
        if self.ttl < Duration::from_millis(1) {
            return Err(LockError::InvalidOptions {
                name: name.to_string(),
                reason: format!("ttl {:?} is below 1 ms", self.ttl),
            });
        }
        Ok(())
    }

    /// The renewal period used: `renew_every`, or a third of the TTL when
    /// that cannot keep the lock (zero: a loop of renewals with no pause;
    /// not below the trusted part of the TTL: the local deadline passes
    /// before the first renewal is sent), e.g. the default period kept by
    /// a struct literal that only sets a shorter `ttl`.
    fn effective_renew_every(&self, name: &str) -> Option<Duration> {
        let every = self.renew_every?;
        if !every.is_zero() && every < trusted(self.ttl) {
            return Some(every);
        }
        let used = self.ttl / 3;
        debug!(
            lock = name,
            renew_every = ?every,
            ttl = ?self.ttl,
            used = ?used,
            "lock renew_every is zero or not below 90 % of the ttl: renewing every third of the ttl instead"
        );
        Some(used)
    }
}

/// Checks that `name` can name a lock's keys `lock:{<name>}` and
/// `lock:{<name>}:fence`: their hash tag (up to the first `}`) must not be
/// empty, or the two keys fall in different cluster slots. `Err`
/// completes "a lock name …".
fn validate_lock_name(name: &str) -> Result<(), &'static str> {
    if name.is_empty() {
        Err("must not be empty")
    } else if name.starts_with('}') {
        Err("must not start with `}` (the keys' Redis hash tag would be empty)")
    } else {
        Ok(())
    }
}

/// Entry point: [`Lock::acquire`] (its docs have a runnable example:
/// acquire, a second owner refused, release).
#[derive(Debug)]
pub struct Lock;

impl Lock {
    /// Tries to take lock `name` until `options.wait` has passed. `Ok(None)`
    /// when another owner held it the whole time. A name that cannot name
    /// a lock (`""` or starting with `}`: [`LockError::InvalidName`]) or a
    /// TTL below 1 ms ([`LockError::InvalidOptions`]) is refused before
    /// anything is sent. A `renew_every` that cannot keep the lock is
    /// replaced by a third of the TTL ([`LockOptions::renew_every`]). A
    /// fencing counter with no number left refuses the call without taking
    /// the lock ([`LockError::FencingExhausted`]).
    ///
    /// ```
    /// # #[tokio::main] async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let server = queue_testkit::RedisServer::start()?;
    /// use queue_core::{Lock, LockOptions, Queue};
    /// let queue = Queue::connect(&server.url()).await?;
    /// let guard = Lock::acquire(queue.connection(), "nightly-report", LockOptions::default())
    ///     .await?
    ///     .expect("free");
    /// // A second owner cannot take it meanwhile.
    /// assert!(Lock::acquire(queue.connection(), "nightly-report", LockOptions::default()).await?.is_none());
    /// assert!(guard.release().await?);
    /// # Ok(()) }
    /// ```
    pub async fn acquire(
        conn: RedisConnection,
        name: &str,
        options: LockOptions,
    ) -> Result<Option<LockGuard>, LockError> {
        validate_lock_name(name).map_err(|reason| LockError::InvalidName {
            name: name.to_string(),
            reason,
        })?;
        let keys = LockKeys::new(name);
        let token = uuid::Uuid::new_v4().to_string();
        // `None`: a wait longer than the clock holds, i.e. until it is free
        // (`Instant + Duration::MAX` panicked).
        let deadline = Instant::now().checked_add(options.wait);
        // The TTL Redis keeps is the one the guard counts on: with the TTL
        // clamped before it is sent, the lease clock (and the renewals) use
        // the same value (`Duration::MAX` set the lock, then building the
        // clock panicked and left it held for ages with no owner).
        let mut options = LockOptions {
            ttl: clamp_ttl(options.ttl),
            ..options
        };
        options.check(name)?;
        // The renew loop (and `next_renewal`) use the effective period.
        options.renew_every = options.effective_renew_every(name);
        let mut c = conn.clone();
        // A call whose reply was lost may have taken the lock: it is sent
        // again with the same token (the script answers that acquisition
        // and restarts its lease, as a fresh one does), and the lease is
        // counted from the send that got the answer.
        let mut lost_replies = 0;
        loop {
            let sent_at = Instant::now();
            let reply = match (LockAcquire {
                keys: &keys,
                token: &token,
                ttl: options.ttl,
            })
            .run(&mut c)
            .await
            {
                Ok(reply) => reply,
                Err(source) => {
                    if lost_replies < LOST_REPLY_RETRIES && outcome_unknown(&source) {
                        warn!(lock = name, error = %source, "lock acquire: reply lost; sending it again with the same token");
                        lost_replies += 1;
                        continue;
                    }
                    return Err(LockError::redis(name, source));
                }
            };
            lost_replies = 0;
            match reply {
                LockAcquireReply::Acquired { fencing } => {
                    debug!(lock = name, fencing, "lock acquired");
                    let clock = LeaseClock::new(sent_at, options.ttl);
                    return Ok(Some(LockGuard::new(
                        conn, name, keys.lock, token, fencing, clock, sent_at, options,
                    )));
                }
                LockAcquireReply::FencingExhausted => {
                    return Err(LockError::FencingExhausted {
                        name: name.to_string(),
                    });
                }
                LockAcquireReply::Held => {}
            }
            let now = Instant::now();
            if deadline.is_some_and(|d| now >= d) {
                return Ok(None);
            }
            let base = options.retry_interval.as_millis().clamp(2, 1 << 62) as u64;
            let pause = Duration::from_millis(rand::rng().random_range(base / 2..=base + base / 2));
            let left = deadline.map_or(pause, |d| d - now);
            tokio::time::sleep(pause.min(left)).await;
        }
    }
}

/// How many times an acquire or a release whose reply was lost is sent
/// again (with the same token) before its error is returned.
const LOST_REPLY_RETRIES: u32 = 3;

/// A held lock. Dropping it stops the auto-renew and releases the lock in
/// the background; prefer [`release`](Self::release) to know the outcome.
/// Made by [`Lock::acquire`], whose docs have a runnable example.
#[derive(Debug)]
pub struct LockGuard {
    conn: RedisConnection,
    name: String,
    key: String,
    token: String,
    fencing: u64,
    ttl: Duration,
    held: Arc<LeaseClock>,
    renew: Option<JoinHandle<()>>,
    released: bool,
}

impl LockGuard {
    #[allow(clippy::too_many_arguments)]
    fn new(
        conn: RedisConnection,
        name: &str,
        key: String,
        token: String,
        fencing: u64,
        clock: LeaseClock,
        acquired_at: Instant,
        options: LockOptions,
    ) -> Self {
        let held = Arc::new(clock);
        let renew = options.renew_every.map(|every| {
            let (conn, name, key, token, held) = (
                conn.clone(),
                name.to_string(),
                key.clone(),
                token.clone(),
                held.clone(),
            );
            let ttl = options.ttl;
            tokio::spawn(async move {
                let call = || {
                    let (conn, key, token) = (&conn, &key, &token);
                    async move { extend(conn, key, token, ttl).await }
                };
                renew_loop(&name, &held, ttl, every, acquired_at, call).await;
            })
        });
        LockGuard {
            conn,
            name: name.to_string(),
            key,
            token,
            fencing,
            ttl: options.ttl,
            held,
            renew,
            released: false,
        }
    }

    /// False once a renewal or extend found the lock gone, or once 90 % of
    /// the TTL passed (local monotonic clock, from before the acquire or the
    /// last confirmed extend was sent) without a confirmed renewal: with
    /// [`LockOptions::no_renew`] that is 90 % of the TTL after acquiring
    /// unless [`extend`](Self::extend) is called. An extend or renewal
    /// whose reply was lost may still be applied by Redis: until one sent
    /// after it is confirmed, this turns false no later than 90 % of its
    /// TTL after it was sent. Check before each critical write.
    ///
    /// ```
    /// # #[tokio::main] async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let server = queue_testkit::RedisServer::start()?;
    /// use std::time::Duration;
    /// use queue_core::{Lock, LockOptions, Queue};
    /// let queue = Queue::connect(&server.url()).await?;
    /// let opts = LockOptions::default().ttl(Duration::from_millis(300)).no_renew();
    /// let guard = Lock::acquire(queue.connection(), "report", opts).await?.expect("free");
    /// assert!(guard.is_held());
    /// tokio::time::sleep(Duration::from_millis(300)).await;
    /// assert!(!guard.is_held()); // its TTL ran out: another owner may hold it now
    /// # Ok(()) }
    /// ```
    pub fn is_held(&self) -> bool {
        !self.held.is_lost()
    }

    /// Completes when the lock is lost, i.e. once [`is_held`](Self::is_held)
    /// turns false (use in `tokio::select!` to abort work): a renewal or
    /// extend found it gone, or its local deadline passed. It follows the
    /// deadline as extends move it, earlier too.
    pub async fn lost(&self) {
        self.held.wait_lost().await
    }

    /// A number that grows with every acquisition of this lock: pass it to
    /// the protected store so writes from a stale holder can be refused.
    ///
    /// The counter lives in Redis next to the lock: after an asynchronous
    /// failover that lost the latest `INCR` (the replica had not received
    /// it), the promoted server hands out that number again, to another
    /// owner. A store that keeps the highest number it saw still refuses
    /// the older holder's writes once the newer one has written; it cannot
    /// tell two holders of the same number apart.
    pub fn fencing(&self) -> u64 {
        self.fencing
    }

    /// This acquisition's owner token.
    pub fn token(&self) -> &str {
        &self.token
    }

    /// Sets the lease to `ttl` from now (shorter or longer than before: the
    /// auto-renew, if on, sets it back to the configured TTL at its next
    /// renewal); false when the lock was lost. [`is_held`](Self::is_held)
    /// follows the new TTL. A `ttl` below 1 ms is refused with an error and
    /// leaves the lock as it was (Redis would delete it). On an error whose
    /// outcome is unknown ([`LockError::outcome_unknown`]: Redis may still
    /// apply it), `is_held` counts on no more than this `ttl` from the send.
    pub async fn extend(&self, ttl: Duration) -> Result<bool, LockError> {
        let ttl = clamp_ttl(ttl);
        let sent_at = Instant::now();
        match extend(&self.conn, &self.key, &self.token, ttl).await {
            Ok(true) => {
                self.held.confirm(sent_at, ttl);
                Ok(true)
            }
            Ok(false) => {
                self.held.mark_lost();
                Ok(false)
            }
            Err(source) => {
                // A refusal for its data (a TTL below 1 ms) changed nothing.
                if outcome_unknown(&source) {
                    self.held.unconfirmed(sent_at, ttl);
                }
                Err(LockError::redis(&self.name, source))
            }
        }
    }

    /// Releases the lock; false when it had already been lost. A release
    /// whose reply was lost is sent again (release checks the token, so
    /// that is safe: it never deletes another owner's lock), up to three
    /// times; when the one sent again finds the lock gone, the answer is
    /// true if the guard still counted the lock as held when the release
    /// was first sent, else false.
    ///
    /// So after a resend, true means "held by this guard when the release
    /// was first sent, and no longer ours now", not "this call deleted
    /// it": the lost call usually did, but the lock may instead have
    /// expired in Redis, and even been taken by another owner, between the
    /// first send and the resend (a reply lost for most of the lease's
    /// remaining 10 %). Either way this guard no longer holds it and the
    /// other owner's lock is untouched; do not read true as "nobody else
    /// held the lock after my work", use [`fencing`](Self::fencing) for that.
    pub async fn release(mut self) -> Result<bool, LockError> {
        self.released = true;
        if let Some(t) = self.renew.take() {
            t.abort();
        }
        let was_held = self.is_held();
        self.held.mark_lost();
        release(&self.conn, &self.name, &self.key, &self.token, was_held)
            .await
            .map_err(|source| LockError::redis(&self.name, source))
    }

    /// The configured lease.
    pub fn ttl(&self) -> Duration {
        self.ttl
    }
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        if let Some(t) = self.renew.take() {
            t.abort();
        }
        if !self.released {
            if let Ok(rt) = tokio::runtime::Handle::try_current() {
                let was_held = self.is_held();
                self.held.mark_lost();
                let (c, name, key, token) = (
                    self.conn.clone(),
                    self.name.clone(),
                    self.key.clone(),
                    self.token.clone(),
                );
                rt.spawn(async move {
                    if let Err(e) = release(&c, &name, &key, &token, was_held).await {
                        warn!(lock = %name, error = %e, "dropped lock guard: release failed; the lock expires at the end of its TTL");
                    }
                });
            }
        }
    }
}

/// One release, sent again up to [`LOST_REPLY_RETRIES`] times while its
/// reply is lost. An answer of "not held" to a call sent again after a
/// lost reply counts as released when `was_held` (the lost call found the
/// token and deleted the lock: the guard's deadline, which passes before
/// Redis's TTL, had not passed).
async fn release(
    conn: &RedisConnection,
    name: &str,
    key: &str,
    token: &str,
    was_held: bool,
) -> redis::RedisResult<bool> {
    let mut c = conn.clone();
    let mut lost_replies = 0;
    loop {
        match (LockRelease { key, token }).run(&mut c).await {
            Ok(released) => return Ok(released || (lost_replies > 0 && was_held)),
            Err(e) if lost_replies < LOST_REPLY_RETRIES && outcome_unknown(&e) => {
                warn!(lock = name, error = %e, "lock release: reply lost; sending it again");
                lost_replies += 1;
            }
            Err(e) => return Err(e),
        }
    }
}

/// A TTL no longer than Redis keeps (what `scripts::ms` sends).
fn clamp_ttl(ttl: Duration) -> Duration {
    ttl.min(Duration::from_millis(crate::scripts::MAX_MS))
}

async fn extend(
    conn: &RedisConnection,
    key: &str,
    token: &str,
    ttl: Duration,
) -> redis::RedisResult<bool> {
    let mut c = conn.clone();
    LockExtend { key, token, ttl }.run(&mut c).await
}

/// When the renewal after a request (the acquire that got the answer, or a
/// renewal) sent at `sent_at` is due; `None` beyond what the clock can
/// represent.
fn next_renewal(sent_at: Instant, every: Duration) -> Option<Instant> {
    sent_at.checked_add(every)
}

/// The auto-renew loop over `extend` (one `lock_extend.lua` call to `ttl`):
/// the first renewal `every` after the acquire was sent (`acquired_at`),
/// each next one `every` after the previous one was sent. Ends, with the
/// clock marked lost, once a renewal finds the lock gone or the local
/// deadline passed without a confirmed one.
async fn renew_loop<F, Fut>(
    name: &str,
    held: &LeaseClock,
    ttl: Duration,
    every: Duration,
    acquired_at: Instant,
    mut extend: F,
) where
    F: FnMut() -> Fut,
    Fut: Future<Output = redis::RedisResult<bool>>,
{
    let mut last_sent = acquired_at;
    loop {
        // Due already when the reply took longer than `every`: sent at
        // once, still within the lease of the one before.
        match next_renewal(last_sent, every) {
            Some(at) => tokio::time::sleep_until(at).await,
            None => tokio::time::sleep(every).await,
        }
        if held.is_lost() {
            warn!(lock = %name, "lock lost: no renewal confirmed before its TTL ran out");
            break;
        }
        let sent_at = Instant::now();
        last_sent = sent_at;
        match extend().await {
            Ok(true) => held.confirm(sent_at, ttl),
            Ok(false) => {
                warn!(lock = %name, "lock lost: another owner holds it or it expired");
                break;
            }
            Err(e) => {
                if outcome_unknown(&e) {
                    // Redis may apply it later: count on no more than its TTL.
                    held.unconfirmed(sent_at, ttl);
                }
                warn!(lock = %name, error = %e, "lock renewal failed; retrying while the TTL lasts");
            }
        }
    }
    held.mark_lost();
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::conn::{connect, ConnectionConfig};

    async fn owner(conn: &RedisConnection, name: &str) -> Option<String> {
        let mut c = conn.clone();
        redis::cmd("GET")
            .arg(LockKeys::new(name).lock)
            .query_async(&mut c)
            .await
            .unwrap()
    }

    /// Scenario: a holder shortens its lock with `extend`; Redis lets it go
    /// when the short TTL ends and another client takes it. The first guard
    /// must no longer say "held" (its local deadline used to stay at 90 % of
    /// the original TTL, so both guards said "held" for seconds).
    #[tokio::test]
    async fn a_shortened_lock_taken_by_another_owner_is_not_held_by_the_first() {
        let (_server, conn) = crate::scripts::test_redis().await;
        let opts = LockOptions::default()
            .ttl(Duration::from_secs(10))
            .no_renew();
        let first = Lock::acquire(conn.clone(), "short", opts.clone())
            .await
            .unwrap()
            .expect("free");
        assert!(first.extend(Duration::from_millis(300)).await.unwrap());
        let second = Lock::acquire(conn.clone(), "short", opts.wait(Duration::from_secs(5)))
            .await
            .unwrap()
            .expect("free once the 300 ms TTL ran out in Redis");
        assert!(second.is_held());
        assert!(
            !first.is_held(),
            "the first owner's lock expired in Redis and is held by another"
        );
    }

    /// Scenario: a user extends to 60 s, then the auto-renew sets the TTL
    /// back to the configured 600 ms: the local deadline follows it back.
    #[tokio::test]
    async fn a_renewal_after_a_long_extend_brings_the_deadline_back() {
        let (_server, conn) = crate::scripts::test_redis().await;
        let ttl = Duration::from_millis(600);
        let guard = Lock::acquire(conn.clone(), "renewed", LockOptions::default().ttl(ttl))
            .await
            .unwrap()
            .expect("free");
        assert!(guard.extend(Duration::from_secs(60)).await.unwrap());
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        loop {
            let until = guard.held.deadline().expect("bounded");
            if until < tokio::time::Instant::now() + Duration::from_secs(1) {
                break;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "the renewals to 600 ms never brought the deadline back from 60 s"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(guard.is_held(), "the renewals keep it held");
    }

    /// `extend(ZERO)` (or anything under 1 ms, sent as 0 ms) used to send
    /// `PEXPIRE key 0`, which deletes the lock, and answer Ok(true).
    #[tokio::test]
    async fn an_extend_below_one_millisecond_is_refused_and_keeps_the_lock() {
        let (_server, conn) = crate::scripts::test_redis().await;
        let guard = Lock::acquire(conn.clone(), "zero", LockOptions::default().no_renew())
            .await
            .unwrap()
            .expect("free");
        for ttl in [Duration::ZERO, Duration::from_micros(500)] {
            let refused = guard.extend(ttl).await;
            assert!(refused.is_err(), "{ttl:?}: {refused:?}");
            assert_eq!(
                owner(&conn, "zero").await.as_deref(),
                Some(guard.token()),
                "{ttl:?} left the lock to its owner"
            );
            assert!(guard.is_held());
        }
        assert!(guard.release().await.unwrap());
    }

    async fn exists(conn: &RedisConnection, name: &str) -> bool {
        let mut c = conn.clone();
        redis::cmd("EXISTS")
            .arg(LockKeys::new(name).lock)
            .query_async::<i64>(&mut c)
            .await
            .unwrap()
            == 1
    }

    /// `wait(Duration::MAX)` panicked computing its deadline
    /// (`Instant + Duration`); now it waits until the lock is free.
    #[tokio::test]
    async fn an_unbounded_wait_does_not_panic_and_waits_until_free() {
        let (_server, conn) = crate::scripts::test_redis().await;
        let forever = LockOptions::default().wait(Duration::MAX);
        let first = Lock::acquire(conn.clone(), "wait", forever.clone())
            .await
            .unwrap()
            .expect("free");
        let waiter = tokio::spawn(Lock::acquire(conn.clone(), "wait", forever));
        tokio::time::sleep(Duration::from_millis(100)).await; // let it try while held
        assert!(first.release().await.unwrap());
        let second = tokio::time::timeout(Duration::from_secs(10), waiter)
            .await
            .expect("taken once released")
            .unwrap()
            .unwrap()
            .expect("free");
        assert!(second.is_held());
        assert!(second.release().await.unwrap());
        assert!(!exists(&conn, "wait").await);
    }

    /// `ttl(Duration::MAX)` set the lock (PX 2^53 − 1), then building the
    /// lease clock panicked: the lock stayed held for ages with no guard to
    /// release it. Now the guard is returned, and release (or drop) frees it.
    #[tokio::test]
    async fn an_unbounded_ttl_does_not_panic_and_release_frees_the_lock() {
        let (_server, conn) = crate::scripts::test_redis().await;
        let long = LockOptions::default().ttl(Duration::MAX);
        let guard = Lock::acquire(conn.clone(), "long", long.clone())
            .await
            .unwrap()
            .expect("free");
        assert!(guard.is_held());
        assert_eq!(guard.ttl(), Duration::from_millis(crate::scripts::MAX_MS));
        assert!(guard.extend(Duration::MAX).await.unwrap());
        assert!(guard.is_held());
        assert!(guard.release().await.unwrap());
        assert!(!exists(&conn, "long").await, "released");
        // Dropped instead of released: freed in the background.
        let dropped = Lock::acquire(conn.clone(), "long", long.no_renew())
            .await
            .unwrap()
            .expect("free");
        drop(dropped);
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        while exists(&conn, "long").await {
            assert!(tokio::time::Instant::now() < deadline, "freed on drop");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Scenario: the acquire reaches Redis and takes the lock, then the
    /// connection breaks before its reply arrives. The call is sent again
    /// with the same token and answers that acquisition (same fencing
    /// number, the lock held by this guard). Before, the error came back at
    /// once (and a retry would have answered "held") while the lock stayed
    /// taken by a token nobody had for its whole TTL.
    #[tokio::test]
    async fn an_acquire_whose_reply_was_lost_holds_the_lock_it_took() {
        let server = queue_testkit::RedisServer::start().unwrap();
        let proxy = queue_testkit::proxy::ReplyDropper::start(server.port()).unwrap();
        let conn = connect(&proxy.url(), &ConnectionConfig::default())
            .await
            .unwrap();
        // The function library is loaded by a first call, so that the reply
        // dropped below is the acquire's own.
        let warm = Lock::acquire(conn.clone(), "warm-up", LockOptions::default())
            .await
            .unwrap()
            .expect("free");
        warm.release().await.unwrap();

        proxy.drop_next_reply();
        let guard = Lock::acquire(conn.clone(), "report", LockOptions::default().no_renew())
            .await
            .expect("answered after the lost reply")
            .expect("the lock this call took");
        assert_eq!(proxy.dropped(), 1);
        assert_eq!(owner(&conn, "report").await.as_deref(), Some(guard.token()));
        assert!(guard.is_held());
        let fence: u64 = {
            let mut c = conn.clone();
            redis::cmd("GET")
                .arg(LockKeys::new("report").fence)
                .query_async(&mut c)
                .await
                .unwrap()
        };
        assert_eq!(guard.fencing(), fence, "one acquisition, one number");
        assert!(guard.release().await.unwrap());
        assert_eq!(owner(&conn, "report").await, None);
    }

    /// Scenario: the fencing counter is set back (by hand, or restored from
    /// an old backup) to a small number after a holder got its number. The
    /// next acquisition still gets a larger number than that holder's: a
    /// fenced store must refuse the stale holder's writes. Before, the
    /// counter went on from the small number (`5` then `6`).
    #[tokio::test]
    async fn a_fencing_counter_set_back_still_hands_out_larger_numbers() {
        let (_server, conn) = crate::scripts::test_redis().await;
        let opts = LockOptions::default().no_renew();
        let first = Lock::acquire(conn.clone(), "fenced", opts.clone())
            .await
            .unwrap()
            .expect("free");
        let earlier = first.fencing();
        assert!(first.release().await.unwrap());
        for set_back in ["5", "0", "1796632645963651"] {
            let mut c = conn.clone();
            redis::cmd("SET")
                .arg(LockKeys::new("fenced").fence)
                .arg(set_back)
                .query_async::<()>(&mut c)
                .await
                .unwrap();
            let next = Lock::acquire(conn.clone(), "fenced", opts.clone())
                .await
                .unwrap()
                .expect("free");
            assert!(
                next.fencing() > earlier,
                "counter set back to {set_back}: {} after {earlier}",
                next.fencing()
            );
            assert!(next.release().await.unwrap());
        }
    }

    async fn set_fence(conn: &RedisConnection, name: &str, value: &str) {
        let mut c = conn.clone();
        redis::cmd("SET")
            .arg(LockKeys::new(name).fence)
            .arg(value)
            .query_async::<()>(&mut c)
            .await
            .unwrap();
    }

    /// Scenario: a lock whose fencing counter is far above 2^53 (near 2^60;
    /// and just below 10^18, which the script used to treat as the edge).
    /// Holders in turn get the exact next numbers, one more each time.
    /// Before, the number went through a Lua double: the holders after
    /// `999999999999999998` both got `1000000000000000000`, and a counter of
    /// 19 digits was taken for corrupt and set back to the Redis time in
    /// microseconds (the number went down).
    #[tokio::test]
    async fn fencing_numbers_above_2_pow_53_are_exact_and_keep_growing() {
        let (_server, conn) = crate::scripts::test_redis().await;
        let opts = LockOptions::default().no_renew();
        for start in [999_999_999_999_999_998, (1u64 << 60) + 1] {
            set_fence(&conn, "big", &start.to_string()).await;
            for expected in [start + 1, start + 2, start + 3] {
                let guard = Lock::acquire(conn.clone(), "big", opts.clone())
                    .await
                    .unwrap()
                    .expect("free");
                assert_eq!(guard.fencing(), expected, "counter set to {start}");
                assert!(guard.release().await.unwrap());
            }
        }
    }

    /// Scenario: the acquire's reply is lost at a counter above 2^53 and the
    /// call is sent again (same token): the retry answers the number that
    /// acquisition got, exactly. Before, it answered the counter read as a
    /// Lua number (`2^59 + 1` came back as `2^59`).
    #[tokio::test]
    async fn a_resent_acquire_answers_its_exact_fencing_number_above_2_pow_53() {
        let (_server, conn) = crate::scripts::test_redis().await;
        let keys = LockKeys::new("resent");
        set_fence(&conn, "resent", &(1u64 << 59).to_string()).await;
        let acquire = LockAcquire {
            keys: &keys,
            token: "owner-1",
            ttl: Duration::from_secs(30),
        };
        let fencing = (1 << 59) + 1;
        for call in ["first", "resent"] {
            let reply = acquire.run(&mut conn.clone()).await.unwrap();
            assert_eq!(reply, LockAcquireReply::Acquired { fencing }, "{call}");
        }
    }

    /// Scenario: the fencing counter reaches the largest count Redis keeps
    /// (`i64::MAX`). The acquisition that makes it get exactly that number;
    /// the next acquire is refused with a typed error naming the lock, and
    /// the lock is not taken (a retry after the refusal is refused the same
    /// way, not answered "held"). A counter set above it by hand is refused
    /// too (replaced, it would hand out numbers below those handed out).
    #[tokio::test]
    async fn a_fencing_counter_at_its_largest_value_refuses_the_acquire_without_taking_the_lock() {
        let (_server, conn) = crate::scripts::test_redis().await;
        let opts = LockOptions::default().no_renew();
        let max = i64::MAX as u64;
        set_fence(&conn, "full", &(max - 1).to_string()).await;
        let last = Lock::acquire(conn.clone(), "full", opts.clone())
            .await
            .unwrap()
            .expect("free");
        assert_eq!(last.fencing(), max);
        assert!(last.release().await.unwrap());
        for counter in [
            max.to_string(),
            "9223372036854775808".into(),
            "1".repeat(25),
        ] {
            set_fence(&conn, "full", &counter).await;
            for attempt in ["first", "again"] {
                let err = Lock::acquire(conn.clone(), "full", opts.clone())
                    .await
                    .expect_err("no fencing number left");
                assert!(
                    matches!(&err, LockError::FencingExhausted { name } if name == "full"),
                    "{counter} ({attempt}): {err}"
                );
                assert!(err.to_string().contains("fencing counter"), "{err}");
                assert_eq!(
                    owner(&conn, "full").await,
                    None,
                    "{counter}: lock not taken"
                );
            }
            let mut c = conn.clone();
            let kept: String = redis::cmd("GET")
                .arg(LockKeys::new("full").fence)
                .query_async(&mut c)
                .await
                .unwrap();
            assert_eq!(kept, counter, "the counter is left as it was");
        }
    }

    /// Scenario: a holder waits on `lost()` (as in a `select!` around its
    /// work), then shortens its lock to 300 ms; Redis lets it go and another
    /// owner takes it. `lost()` completes. Before, it slept until the 9 s
    /// deadline it read when it started, and the holder kept working while
    /// another owner held the lock.
    #[tokio::test]
    async fn lost_completes_once_a_shortened_lock_is_taken_by_another_owner() {
        let (_server, conn) = crate::scripts::test_redis().await;
        let opts = LockOptions::default()
            .ttl(Duration::from_secs(10))
            .no_renew();
        let first = Lock::acquire(conn.clone(), "short-wait", opts.clone())
            .await
            .unwrap()
            .expect("free");
        let lost = first.lost();
        tokio::pin!(lost);
        assert!(futures::poll!(lost.as_mut()).is_pending(), "held");
        assert!(first.extend(Duration::from_millis(300)).await.unwrap());
        let second = Lock::acquire(
            conn.clone(),
            "short-wait",
            opts.wait(Duration::from_secs(5)),
        )
        .await
        .unwrap()
        .expect("free once the 300 ms TTL ran out in Redis");
        tokio::time::timeout(Duration::from_secs(2), lost)
            .await
            .expect("lost() completes once another owner holds the lock");
        assert!(second.is_held());
        assert!(second.release().await.unwrap());
    }

    /// Scenario: Redis is paused (`CLIENT PAUSE WRITE`) while the holder
    /// shortens its 10 s lock to 300 ms; the extend times out (outcome
    /// unknown) and Redis applies it when the pause ends, so the lock
    /// expires 300 ms later and a second owner takes it. The first guard no
    /// longer says "held". Before, its deadline stayed at 9 s: both guards
    /// said "held".
    #[tokio::test]
    async fn an_extend_whose_reply_timed_out_but_was_applied_does_not_leave_the_lock_held() {
        let server = queue_testkit::RedisServer::start().unwrap();
        let config = ConnectionConfig {
            response_timeout: Duration::from_millis(500),
            ..ConnectionConfig::default()
        };
        let conn = connect(&server.url(), &config).await.unwrap();
        let other = connect(&server.url(), &ConnectionConfig::default())
            .await
            .unwrap();
        let opts = LockOptions::default()
            .ttl(Duration::from_secs(10))
            .no_renew();
        let first = Lock::acquire(conn.clone(), "paused", opts.clone())
            .await
            .unwrap()
            .expect("free");
        let _: () = redis::cmd("CLIENT")
            .arg("PAUSE")
            .arg(1500)
            .arg("WRITE")
            .query_async(&mut other.clone())
            .await
            .unwrap();
        let err = first
            .extend(Duration::from_millis(300))
            .await
            .expect_err("the reply times out during the pause");
        assert!(err.outcome_unknown(), "{err}");
        let second = Lock::acquire(other.clone(), "paused", opts.wait(Duration::from_secs(5)))
            .await
            .unwrap()
            .expect("free once the extend, applied after the pause, ran out");
        assert!(second.is_held());
        assert!(
            !first.is_held(),
            "the first owner's lock expired in Redis and is held by another"
        );
        assert!(second.release().await.unwrap());
    }

    /// Scenario: the release reaches Redis, then the connection breaks
    /// before its reply arrives. It is sent again (release checks the
    /// token): `release()` answers that it released the lock, and the lock
    /// is free. Before, the error came back at once.
    #[tokio::test]
    async fn a_release_whose_reply_was_lost_is_sent_again_and_frees_the_lock() {
        let server = queue_testkit::RedisServer::start().unwrap();
        let proxy = queue_testkit::proxy::ReplyDropper::start(server.port()).unwrap();
        let conn = connect(&proxy.url(), &ConnectionConfig::default())
            .await
            .unwrap();
        let guard = Lock::acquire(conn.clone(), "release", LockOptions::default().no_renew())
            .await
            .unwrap()
            .expect("free");
        proxy.drop_next_reply();
        assert!(
            guard
                .release()
                .await
                .expect("answered after the lost reply"),
            "the lost call released it"
        );
        assert_eq!(proxy.dropped(), 1);
        assert!(!exists(&conn, "release").await, "released");
    }

    /// Only names whose keys get an empty hash tag (`""`, `"}x"`:
    /// `lock:{}` and `lock:{}:fence` in different cluster slots, CROSSSLOT
    /// on every acquire) are refused, before anything is sent, with the
    /// lock named; a TTL below 1 ms is refused the same way (Redis answered
    /// it with a script error, which `ctx.lock` retried until the job's
    /// attempts ran out). A renewal period that cannot keep the lock is not
    /// refused: a third of the TTL is used instead.
    #[tokio::test]
    async fn bad_lock_names_and_renewal_periods_are_refused_before_anything_is_sent() {
        let (_server, conn) = crate::scripts::test_redis().await;
        for name in ["", "}x"] {
            let err = Lock::acquire(conn.clone(), name, LockOptions::default())
                .await
                .expect_err(name);
            assert!(
                matches!(&err, LockError::InvalidName { name: n, .. } if n == name),
                "{name:?}: {err}"
            );
        }
        for ttl in [Duration::ZERO, Duration::from_micros(500)] {
            for opts in [
                LockOptions::default().ttl(ttl),
                LockOptions::default().ttl(ttl).no_renew(),
                LockOptions {
                    ttl,
                    ..LockOptions::default()
                },
            ] {
                let err = Lock::acquire(conn.clone(), "tiny", opts)
                    .await
                    .expect_err("refused");
                assert!(
                    matches!(&err, LockError::InvalidOptions { name, .. } if name == "tiny"),
                    "{ttl:?}: {err}"
                );
                assert!(err.to_string().contains("below 1 ms"), "{err}");
            }
        }
        let mut c = conn.clone();
        let keys: i64 = redis::cmd("DBSIZE").query_async(&mut c).await.unwrap();
        assert_eq!(keys, 0, "nothing was written");
        // Periods that cannot keep the lock are replaced, not refused.
        let ttl = Duration::from_secs(1);
        for every in [Duration::ZERO, Duration::from_millis(900), ttl * 2] {
            let opts = LockOptions {
                renew_every: Some(every),
                ..LockOptions::default().ttl(ttl)
            };
            let guard = Lock::acquire(conn.clone(), "renew", opts)
                .await
                .unwrap_or_else(|e| panic!("{every:?}: {e}"))
                .expect("free");
            assert!(guard.release().await.unwrap());
        }
    }

    /// Names that worked before validation was added (whitespace, braces
    /// past the first character; their keys' hash tag is not empty) acquire,
    /// hold and release their lock.
    #[tokio::test]
    async fn lock_names_with_spaces_or_inner_braces_are_accepted() {
        let (_server, conn) = crate::scripts::test_redis().await;
        for name in ["nightly report", "user {42}", "a}b", "{x}", "a\tb"] {
            let guard = Lock::acquire(conn.clone(), name, LockOptions::default())
                .await
                .unwrap_or_else(|e| panic!("{name:?}: {e}"))
                .expect("free");
            assert_eq!(owner(&conn, name).await.as_deref(), Some(guard.token()));
            assert!(guard.release().await.unwrap(), "{name:?}");
            assert_eq!(owner(&conn, name).await, None);
        }
    }

    /// Scenario: the common struct-literal form sets a 2 s TTL and keeps
    /// the default renewal period (3.33 s, for the default 10 s TTL). The
    /// lock is renewed every third of its TTL and still ours after 3 s.
    /// Before the fix it was refused (InvalidOptions); before validation it
    /// was lost after 1.8 s (the first renewal came after the lease).
    #[tokio::test]
    async fn a_short_ttl_struct_literal_lock_is_renewed_and_kept() {
        let (_server, conn) = crate::scripts::test_redis().await;
        let opts = LockOptions {
            ttl: Duration::from_secs(2),
            ..Default::default()
        };
        let guard = Lock::acquire(conn.clone(), "literal", opts)
            .await
            .expect("not refused")
            .expect("free");
        tokio::time::sleep(Duration::from_secs(3)).await;
        assert!(guard.is_held(), "renewed past its 2 s TTL");
        assert_eq!(
            owner(&conn, "literal").await.as_deref(),
            Some(guard.token()),
            "still ours in Redis"
        );
        assert!(guard.release().await.unwrap());
    }

    const TTL: Duration = Duration::from_secs(1);
    /// The default period for a 1 s lock: a third of it.
    const EVERY: Duration = Duration::from_millis(333);

    /// Runs the renew loop over a fake Redis whose every extend takes `rtt`
    /// and succeeds, for `renewals` extends (the last one finds the lock
    /// gone and ends the loop). Returns each extend's send time after the
    /// acquire was sent, and whether the lock was held when it was sent.
    async fn renew_with_replies_taking(rtt: Duration, renewals: usize) -> Vec<(Duration, bool)> {
        let acquired = Instant::now();
        let held = LeaseClock::new(acquired, TTL);
        let sends = std::sync::Mutex::new(Vec::new());
        renew_loop("test", &held, TTL, EVERY, acquired, || {
            let mut sends = sends.lock().unwrap();
            sends.push((acquired.elapsed(), !held.is_lost()));
            let last = sends.len() >= renewals;
            async move {
                tokio::time::sleep(rtt).await;
                Ok(!last)
            }
        })
        .await;
        assert!(held.is_lost(), "the loop ends with the lock lost");
        sends.into_inner().unwrap()
    }

    /// Renewals go out at acquire + k·period, not a period after each
    /// reply; replies of 300 ms (well within the 900 ms the lease is
    /// trusted for) keep the lock held. Timed from each reply, the second
    /// renewal went out at 333 + 300 + 333 ms and its reply came after the
    /// first one's deadline (333 + 900 ms): the lock was lost locally and
    /// the renewals stopped.
    #[tokio::test(start_paused = true)]
    async fn renewals_are_timed_from_the_acquire_and_each_send() {
        let sends = renew_with_replies_taking(Duration::from_millis(300), 6).await;
        let at: Vec<Duration> = sends.iter().map(|(at, _)| *at).collect();
        let expected: Vec<Duration> = (1..=6).map(|k| EVERY * k).collect();
        assert_eq!(at, expected);
        assert!(
            sends.iter().all(|(_, held)| *held),
            "a renewal found the lock lost: {sends:?}"
        );
    }
}
