//! A distributed lock for user code, as users of Redis locks expect it: a
//! short lease, a fresh random owner token per acquisition, release and
//! extend only while the token matches (one script each), an auto-renew loop
//! that stops once the lock is lost or cannot be renewed in time, and a
//! bounded wait on acquire. Whether the lock is held follows its TTL on the
//! local monotonic clock (`lease_clock.rs`): measured from before the
//! acquire (then the most recently sent confirmed extend or renewal, whether
//! it lengthened or shortened the TTL) was sent, 90 % of that TTL, with or
//! without auto-renew.
//!
//! A single-instance Redis lock is a *efficiency* lock: after a failover or a
//! long pause the holder may have lost it without knowing. Check
//! [`LockGuard::is_held`] before each critical write, and where the protected
//! store allows it, pass [`LockGuard::fencing`] along so stale holders are
//! rejected there.

use std::sync::Arc;
use std::time::Duration;

use crate::conn::RedisConnection;
use rand::Rng;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tracing::{debug, warn};

use crate::error::outcome_unknown;
use crate::keys::LockKeys;
use crate::lease_clock::LeaseClock;
use crate::scripts::lock_acquire::{LockAcquire, LockAcquireReply};
use crate::scripts::lock_extend::LockExtend;
use crate::scripts::lock_release::LockRelease;

/// Lock errors: Redis failed while acquiring, extending or releasing.
#[derive(Debug, thiserror::Error)]
#[error("lock `{name}`: redis error: {source}")]
pub struct LockError {
    /// The lock's name.
    pub name: String,
    /// The client error.
    #[source]
    pub source: redis::RedisError,
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
    /// 1 ms; a longer one than Redis can keep (2^53 − 1 ms, ~285,000 years)
    /// is that longest one.
    pub ttl: Duration,
    /// How long `acquire` keeps trying; zero: try once; `Duration::MAX`
    /// (or any wait past what the clock holds): until it is free.
    pub wait: Duration,
    /// Pause between tries (jittered by ±50%).
    pub retry_interval: Duration,
    /// Auto-renew period; `None`: no auto-renew (call [`LockGuard::extend`]).
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
    /// Sets the lease and an auto-renew period of a third of it.
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self.renew_every = self.renew_every.map(|_| ttl / 3);
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
}

/// Entry point: [`Lock::acquire`].
#[derive(Debug)]
pub struct Lock;

impl Lock {
    /// Tries to take lock `name` until `options.wait` has passed. `Ok(None)`
    /// when another owner held it the whole time.
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
        let keys = LockKeys::new(name);
        let token = uuid::Uuid::new_v4().to_string();
        // `None`: a wait longer than the clock holds, i.e. until it is free
        // (`Instant + Duration::MAX` panicked).
        let deadline = tokio::time::Instant::now().checked_add(options.wait);
        // The TTL Redis keeps is the one the guard counts on: with the TTL
        // clamped before it is sent, the lease clock (and the renewals) use
        // the same value (`Duration::MAX` set the lock, then building the
        // clock panicked and left it held for ages with no owner).
        let options = LockOptions {
            ttl: clamp_ttl(options.ttl),
            ..options
        };
        let mut c = conn.clone();
        // A call whose reply was lost may have taken the lock: it is sent
        // again with the same token (the script answers that acquisition),
        // and the lease is counted from the first send.
        let mut lost: Option<(tokio::time::Instant, u32)> = None;
        loop {
            let sent_at = lost.map_or_else(tokio::time::Instant::now, |(first, _)| first);
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
                    let tries = lost.map_or(0, |(_, n)| n);
                    if tries < LOST_REPLY_RETRIES && outcome_unknown(&source) {
                        warn!(lock = name, error = %source, "lock acquire: reply lost; sending it again with the same token");
                        lost = Some((sent_at, tries + 1));
                        continue;
                    }
                    return Err(LockError {
                        name: name.to_string(),
                        source,
                    });
                }
            };
            lost = None;
            if let LockAcquireReply::Acquired { fencing } = reply {
                debug!(lock = name, fencing, "lock acquired");
                let clock = LeaseClock::new(sent_at, options.ttl);
                return Ok(Some(LockGuard::new(
                    conn, name, keys.lock, token, fencing, clock, options,
                )));
            }
            let now = tokio::time::Instant::now();
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

/// How many times an acquire whose reply was lost is sent again (with the
/// same token) before its error is returned.
const LOST_REPLY_RETRIES: u32 = 3;

/// A held lock. Dropping it stops the auto-renew and releases the lock in
/// the background; prefer [`release`](Self::release) to know the outcome.
#[derive(Debug)]
pub struct LockGuard {
    conn: RedisConnection,
    name: String,
    key: String,
    token: String,
    fencing: u64,
    ttl: Duration,
    held: Arc<LeaseClock>,
    lost_rx: watch::Receiver<bool>,
    renew: Option<JoinHandle<()>>,
    released: bool,
}

impl LockGuard {
    fn new(
        conn: RedisConnection,
        name: &str,
        key: String,
        token: String,
        fencing: u64,
        clock: LeaseClock,
        options: LockOptions,
    ) -> Self {
        let held = Arc::new(clock);
        let (lost_tx, lost_rx) = watch::channel(false);
        let renew = options.renew_every.map(|every| {
            tokio::spawn(renew_loop(
                conn.clone(),
                name.to_string(),
                key.clone(),
                token.clone(),
                options.ttl,
                every,
                held.clone(),
                lost_tx,
            ))
        });
        LockGuard {
            conn,
            name: name.to_string(),
            key,
            token,
            fencing,
            ttl: options.ttl,
            held,
            lost_rx,
            renew,
            released: false,
        }
    }

    /// False once a renewal or extend found the lock gone, or once 90 % of
    /// the TTL passed (local monotonic clock, from before the acquire or the
    /// last confirmed extend was sent) without a confirmed renewal: with
    /// [`LockOptions::no_renew`] that is 90 % of the TTL after acquiring
    /// unless [`extend`](Self::extend) is called. Check before each
    /// critical write.
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

    /// Completes when the lock is lost (use in `tokio::select!` to abort
    /// work): a renewal found it gone, or its local deadline passed.
    pub async fn lost(&self) {
        let mut rx = self.lost_rx.clone();
        let mut renewing = true;
        while !*rx.borrow_and_update() && !self.held.is_lost() {
            let deadline = self.held.deadline();
            tokio::select! {
                changed = rx.changed(), if renewing => {
                    // Err: the renew loop ended without losing the lock
                    // (no auto-renew): only the deadline is left to watch.
                    renewing = changed.is_ok();
                }
                _ = sleep_until_or_forever(deadline) => {}
            }
        }
    }

    /// A number that grows with every acquisition of this lock: pass it to
    /// the protected store so writes from a stale holder can be refused.
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
    /// leaves the lock as it was (Redis would delete it).
    pub async fn extend(&self, ttl: Duration) -> Result<bool, LockError> {
        let ttl = clamp_ttl(ttl);
        let sent_at = tokio::time::Instant::now();
        let ok = extend(&self.conn, &self.key, &self.token, ttl)
            .await
            .map_err(|source| LockError {
                name: self.name.clone(),
                source,
            })?;
        if ok {
            self.held.confirm(sent_at, ttl);
        } else {
            self.held.mark_lost();
        }
        Ok(ok)
    }

    /// Releases the lock; false when it had already been lost.
    pub async fn release(mut self) -> Result<bool, LockError> {
        self.released = true;
        if let Some(t) = self.renew.take() {
            t.abort();
        }
        self.held.mark_lost();
        let mut c = self.conn.clone();
        LockRelease {
            key: &self.key,
            token: &self.token,
        }
        .run(&mut c)
        .await
        .map_err(|source| LockError {
            name: self.name.clone(),
            source,
        })
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
                let (mut c, key, token) = (self.conn.clone(), self.key.clone(), self.token.clone());
                rt.spawn(async move {
                    let release = LockRelease {
                        key: &key,
                        token: &token,
                    };
                    let _ = release.run(&mut c).await;
                });
            }
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

#[allow(clippy::too_many_arguments)]
async fn renew_loop(
    conn: RedisConnection,
    name: String,
    key: String,
    token: String,
    ttl: Duration,
    every: Duration,
    held: Arc<LeaseClock>,
    lost: watch::Sender<bool>,
) {
    loop {
        tokio::time::sleep(every).await;
        if held.is_lost() {
            warn!(lock = %name, "lock lost: no renewal confirmed before its TTL ran out");
            break;
        }
        let attempt_at = tokio::time::Instant::now();
        match extend(&conn, &key, &token, ttl).await {
            Ok(true) => held.confirm(attempt_at, ttl),
            Ok(false) => {
                warn!(lock = %name, "lock lost: another owner holds it or it expired");
                break;
            }
            Err(e) => {
                warn!(lock = %name, error = %e, "lock renewal failed; retrying while the TTL lasts");
            }
        }
    }
    held.mark_lost();
    lost.send_replace(true);
}

/// Sleeps until `deadline`; forever when there is none.
async fn sleep_until_or_forever(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
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
}
