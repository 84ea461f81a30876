//! The local view of a lease (a job delivery's or a lock's): a deadline on
//! this process's monotonic clock, measured from *before* the request that
//! took or extended the lease was sent, minus a safety margin. Redis grants
//! the lease some time after the request left, so the lease really ends
//! later than this deadline; a holder that cannot reach Redis to confirm an
//! extension therefore learns it may have lost the lease before anyone else
//! can take it over (clock rates drift far less than the margin).
//!
//! The deadline follows the most recently *sent* confirmed request, earlier
//! or later than the one before: Redis applies a lock's `PEXPIRE` as it
//! arrives, so an extend to a shorter TTL shortens the lease there, and the
//! local deadline must shorten with it. A confirmation of a request sent
//! before the one the deadline already follows (the reply of an older of
//! two concurrent extends) is ignored.
//!
//! An extend whose outcome is unknown (its reply was lost or timed out: Redis
//! may apply it now, later, or never) may have set the TTL Redis keeps, so
//! the deadline is capped at that extend's send time + its trusted part when
//! that is earlier ([`LeaseClock::unconfirmed`]), until an extend sent after
//! it is confirmed. Without the cap, a lost reply of an extend to a shorter
//! TTL left the holder counting on the longer deadline after Redis had let
//! the lease go.
//!
//! Every change that can move the deadline earlier or end the lease wakes
//! [`LeaseClock::wait_lost`], which re-reads the deadline: a waiter that went
//! to sleep until the deadline it read first used to sleep through a
//! shortening.
//!
//! Once lost, a clock stays lost: a later extend does not revive it. The one
//! exception is [`LeaseClock::regain`], for a holder that has not relied on
//! the lease yet (a delivery whose handler would start after the deadline):
//! an extend sent then and confirmed by Redis (which checks the token) holds
//! the lease again, unless Redis had already reported it another's.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

/// The part of a lease the holder counts on: 90 % of it (at least 1 ms less).
pub(crate) fn trusted(lease: Duration) -> Duration {
    lease.saturating_sub((lease / 10).max(Duration::from_millis(1)))
}

/// The request a deadline follows.
#[derive(Debug, Clone, Copy)]
struct Granted {
    /// When the acquire, claim or extend was sent.
    sent_at: Instant,
    /// `sent_at` + the trusted part of its lease; `None` when that is beyond
    /// what the monotonic clock can represent (it never runs out by itself).
    until: Option<Instant>,
}

impl Granted {
    fn new(sent_at: Instant, lease: Duration) -> Self {
        Granted {
            sent_at,
            until: sent_at.checked_add(trusted(lease)),
        }
    }
}

/// Extends whose outcome is unknown, not yet overtaken by a confirmed extend
/// sent after them.
#[derive(Debug, Clone, Copy)]
struct Cap {
    /// The latest send among them: a confirmed extend sent after it lifts
    /// the cap.
    last_sent: Instant,
    /// The earliest `sent_at` + trusted part among them; `None`: beyond the
    /// clock (no cap).
    until: Option<Instant>,
}

/// What the deadline follows.
#[derive(Debug, Clone, Copy)]
struct Lease {
    granted: Granted,
    cap: Option<Cap>,
}

impl Lease {
    fn deadline(&self) -> Option<Instant> {
        earliest(self.granted.until, self.cap.and_then(|c| c.until))
    }

    /// A request sent at `sent_at` was confirmed: an unknown extend sent
    /// before it no longer decides the TTL.
    fn lift_cap(&mut self, sent_at: Instant) {
        if self.cap.is_some_and(|c| sent_at > c.last_sent) {
            self.cap = None;
        }
    }
}

/// The earlier of two optional instants, `None` being "never".
fn earliest(a: Option<Instant>, b: Option<Instant>) -> Option<Instant> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// A lease deadline on the local monotonic clock plus a sticky lost flag.
#[derive(Debug)]
pub(crate) struct LeaseClock {
    /// `None`: no deadline (a context built for unit tests).
    lease: Mutex<Option<Lease>>,
    lost: AtomicBool,
    /// Redis said the lease is another's ([`mark_lost`](Self::mark_lost)),
    /// not only the local deadline passed: [`regain`](Self::regain) refuses.
    taken: AtomicBool,
    /// Signalled by every change that can move the deadline or end the
    /// lease: [`wait_lost`](Self::wait_lost) re-reads it.
    changed: Notify,
}

impl LeaseClock {
    /// A lease of `lease` whose request was sent at `sent_at`.
    pub(crate) fn new(sent_at: Instant, lease: Duration) -> Self {
        LeaseClock {
            lease: Mutex::new(Some(Lease {
                granted: Granted::new(sent_at, lease),
                cap: None,
            })),
            lost: AtomicBool::new(false),
            taken: AtomicBool::new(false),
            changed: Notify::new(),
        }
    }

    /// A lease that never runs out by itself (only [`mark_lost`](Self::mark_lost) ends it).
    pub(crate) fn unbounded() -> Self {
        LeaseClock {
            lease: Mutex::new(None),
            lost: AtomicBool::new(false),
            taken: AtomicBool::new(false),
            changed: Notify::new(),
        }
    }

    /// Redis confirmed an extension to `lease` requested at `sent_at`: the
    /// deadline becomes `sent_at` + 90 % of `lease`, earlier or later than
    /// before, unless a request sent after this one was already confirmed;
    /// the cap of unknown extends sent before it is lifted. Ignored when the
    /// lease was already lost locally.
    pub(crate) fn confirm(&self, sent_at: Instant, lease: Duration) {
        if self.is_lost() {
            return;
        }
        if let Ok(mut state) = self.lease.lock() {
            if let Some(l) = state.as_mut() {
                if sent_at >= l.granted.sent_at {
                    l.granted = Granted::new(sent_at, lease);
                }
                l.lift_cap(sent_at);
            }
        }
        self.changed.notify_waiters();
    }

    /// An extension to `lease` requested at `sent_at` failed with an
    /// unknown outcome (its reply was lost or timed out: Redis may have
    /// applied it, or may apply it later). The deadline is at most
    /// `sent_at` + 90 % of `lease` until an extend sent after this one is
    /// confirmed. Ignored when one sent after it was already confirmed.
    pub(crate) fn unconfirmed(&self, sent_at: Instant, lease: Duration) {
        if let Ok(mut state) = self.lease.lock() {
            if let Some(l) = state.as_mut() {
                if sent_at < l.granted.sent_at {
                    return;
                }
                let until = sent_at.checked_add(trusted(lease));
                l.cap = Some(match l.cap {
                    Some(c) => Cap {
                        last_sent: c.last_sent.max(sent_at),
                        until: earliest(c.until, until),
                    },
                    None => Cap {
                        last_sent: sent_at,
                        until,
                    },
                });
            }
        }
        self.changed.notify_waiters();
    }

    /// Redis said the lease belongs to someone else (or is gone).
    pub(crate) fn mark_lost(&self) {
        self.taken.store(true, Ordering::SeqCst);
        self.lost.store(true, Ordering::SeqCst);
        self.changed.notify_waiters();
    }

    /// Redis confirmed an extension to `lease` requested at `sent_at` after
    /// the local deadline had passed, before the holder relied on the lease
    /// (the runner's one extend of a delivery that starts late): the
    /// deadline follows it and the lease is held again. True when it is;
    /// false when Redis had reported the lease lost, or when this extend's
    /// own trusted part has passed too (its reply was that slow).
    pub(crate) fn regain(&self, sent_at: Instant, lease: Duration) -> bool {
        if self.taken.load(Ordering::SeqCst) {
            return false;
        }
        if let Ok(mut state) = self.lease.lock() {
            if let Some(l) = state.as_mut() {
                l.granted = Granted::new(sent_at, lease);
                l.lift_cap(sent_at);
            }
        }
        self.lost.store(false, Ordering::SeqCst);
        !self.is_lost()
    }

    /// The local deadline, `None` when there is none.
    pub(crate) fn deadline(&self) -> Option<Instant> {
        self.lease
            .lock()
            .ok()
            .and_then(|l| l.and_then(|l| l.deadline()))
    }

    /// True once Redis reported the lease lost or the local deadline passed
    /// without a confirmed extension.
    pub(crate) fn is_lost(&self) -> bool {
        if self.lost.load(Ordering::SeqCst) {
            return true;
        }
        match self.deadline() {
            Some(until) if Instant::now() >= until => {
                self.lost.store(true, Ordering::SeqCst);
                true
            }
            _ => false,
        }
    }

    /// Completes once the lease is lost ([`is_lost`](Self::is_lost)): sleeps
    /// until the deadline, and re-reads it whenever it changes (a shorter
    /// extend, an unknown outcome's cap, [`mark_lost`](Self::mark_lost)).
    pub(crate) async fn wait_lost(&self) {
        loop {
            // Registered before the deadline is read: a change between the
            // read and the sleep still wakes this waiter.
            let changed = self.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            if self.is_lost() {
                return;
            }
            match self.deadline() {
                Some(at) => {
                    tokio::select! {
                        _ = changed => {}
                        _ = tokio::time::sleep_until(at) => {}
                    }
                }
                None => changed.await,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn the_deadline_is_the_trusted_part_of_the_lease_and_stays_passed() {
        let clock = LeaseClock::new(Instant::now(), Duration::from_secs(10));
        tokio::time::advance(Duration::from_millis(8_900)).await;
        assert!(!clock.is_lost());
        tokio::time::advance(Duration::from_millis(200)).await;
        assert!(clock.is_lost(), "9 s of a 10 s lease is all it trusts");
        clock.confirm(Instant::now(), Duration::from_secs(10));
        assert!(
            clock.is_lost(),
            "an extension after the deadline does not revive it"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_confirmed_extension_moves_the_deadline_from_its_send_time() {
        let clock = LeaseClock::new(Instant::now(), Duration::from_secs(1));
        tokio::time::advance(Duration::from_millis(500)).await;
        let sent = Instant::now();
        tokio::time::advance(Duration::from_millis(300)).await;
        clock.confirm(sent, Duration::from_secs(1));
        tokio::time::advance(Duration::from_millis(500)).await; // 1300 ms < 500 + 900
        assert!(!clock.is_lost());
        tokio::time::advance(Duration::from_millis(200)).await;
        assert!(clock.is_lost());
        assert!(!LeaseClock::unbounded().is_lost());
    }

    /// A lease too long for the monotonic clock has no deadline; building
    /// or extending it panicked (`Instant + Duration` overflow).
    #[test]
    fn a_lease_beyond_the_clock_has_no_deadline() {
        let clock = LeaseClock::new(Instant::now(), Duration::MAX);
        assert_eq!(clock.deadline(), None);
        assert!(!clock.is_lost());
        let clock = LeaseClock::new(Instant::now(), Duration::from_secs(1));
        clock.confirm(Instant::now(), Duration::MAX);
        assert_eq!(clock.deadline(), None);
        assert!(!clock.is_lost());
    }

    /// A later-sent extension to a shorter lease shortens the deadline
    /// (Redis's TTL shortened too); it used to keep the later deadline.
    #[tokio::test(start_paused = true)]
    async fn a_later_extension_to_a_shorter_lease_shortens_the_deadline() {
        let clock = LeaseClock::new(Instant::now(), Duration::from_secs(10));
        tokio::time::advance(Duration::from_secs(1)).await;
        clock.confirm(Instant::now(), Duration::from_secs(1));
        tokio::time::advance(Duration::from_millis(1_000)).await; // 2 s: Redis let it go
        assert!(clock.is_lost(), "1 s + 90 % of 1 s has passed");
    }

    /// A lease whose local deadline passed is held again by an extend
    /// confirmed afterwards ([`LeaseClock::regain`], a late start), from
    /// that extend's send; not once Redis reported it lost, and not when
    /// the extend's own trusted part has passed too.
    #[tokio::test(start_paused = true)]
    async fn a_deadline_passed_is_regained_by_an_extend_unless_redis_said_lost() {
        let lease = Duration::from_secs(1);
        let clock = LeaseClock::new(Instant::now(), lease);
        tokio::time::advance(Duration::from_millis(950)).await;
        assert!(clock.is_lost());
        let sent = Instant::now();
        tokio::time::advance(Duration::from_millis(100)).await;
        assert!(clock.regain(sent, lease));
        assert_eq!(clock.deadline(), Some(sent + trusted(lease)));
        tokio::time::advance(Duration::from_millis(700)).await; // 800 ms < 900
        assert!(!clock.is_lost());

        let slow = LeaseClock::new(Instant::now(), lease);
        let sent = Instant::now() + Duration::from_millis(950);
        tokio::time::advance(Duration::from_millis(1_900)).await;
        assert!(
            !slow.regain(sent, lease),
            "the reply came after 950 + 900 ms"
        );

        let taken = LeaseClock::new(Instant::now(), lease);
        taken.mark_lost();
        assert!(!taken.regain(Instant::now(), lease));
        assert!(taken.is_lost());
    }

    /// Two concurrent extends whose replies come back out of order: the
    /// deadline follows the one sent last, whichever reply arrives last.
    #[tokio::test(start_paused = true)]
    async fn the_reply_of_an_older_extend_does_not_move_the_deadline() {
        let clock = LeaseClock::new(Instant::now(), Duration::from_secs(10));
        let older = Instant::now();
        tokio::time::advance(Duration::from_millis(100)).await;
        let newer = Instant::now();
        clock.confirm(newer, Duration::from_secs(1));
        clock.confirm(older, Duration::from_secs(60));
        assert_eq!(
            clock.deadline(),
            Some(newer + trusted(Duration::from_secs(1)))
        );
        // Same lease each time (a heartbeat): out of order is harmless too.
        let clock = LeaseClock::new(older, Duration::from_secs(1));
        clock.confirm(newer, Duration::from_secs(1));
        clock.confirm(older, Duration::from_secs(1));
        assert_eq!(
            clock.deadline(),
            Some(newer + trusted(Duration::from_secs(1)))
        );
    }

    /// A waiter that read the 9 s deadline of a 10 s lease wakes when a
    /// confirmed extend shortens it to 300 ms (and completes at the new
    /// deadline); it used to sleep until the first one.
    #[tokio::test(start_paused = true)]
    async fn a_waiter_follows_a_deadline_moved_earlier() {
        let clock = LeaseClock::new(Instant::now(), Duration::from_secs(10));
        let start = Instant::now();
        let wait = clock.wait_lost();
        tokio::pin!(wait);
        assert!(futures::poll!(wait.as_mut()).is_pending());
        clock.confirm(Instant::now(), Duration::from_millis(300));
        wait.await;
        assert_eq!(start.elapsed(), trusted(Duration::from_millis(300)));
        // Redis reporting the lease lost ends the wait at once.
        let clock = LeaseClock::new(Instant::now(), Duration::from_secs(10));
        let wait = clock.wait_lost();
        tokio::pin!(wait);
        assert!(futures::poll!(wait.as_mut()).is_pending());
        clock.mark_lost();
        assert!(futures::poll!(wait.as_mut()).is_ready());
    }

    /// An extend whose outcome is unknown caps the deadline at its own
    /// trusted part (Redis may apply it); an extend sent after it and
    /// confirmed lifts the cap, one sent before it does not; an unknown
    /// extend sent before a confirmed one changes nothing.
    #[tokio::test(start_paused = true)]
    async fn an_extend_of_unknown_outcome_caps_the_deadline_until_a_later_one_is_confirmed() {
        let ten = Duration::from_secs(10);
        let short = Duration::from_millis(300);
        let clock = LeaseClock::new(Instant::now(), ten);
        let older = Instant::now();
        tokio::time::advance(Duration::from_millis(10)).await;
        let unknown = Instant::now();
        clock.unconfirmed(unknown, short);
        assert_eq!(clock.deadline(), Some(unknown + trusted(short)));
        clock.confirm(older, ten); // sent before the unknown one
        assert_eq!(clock.deadline(), Some(unknown + trusted(short)));
        tokio::time::advance(Duration::from_millis(10)).await;
        let later = Instant::now();
        clock.confirm(later, ten);
        assert_eq!(clock.deadline(), Some(later + trusted(ten)));
        clock.unconfirmed(older, short); // overtaken by `later`
        assert_eq!(clock.deadline(), Some(later + trusted(ten)));
        // A cap that is not earlier changes nothing; past the cap it is lost.
        clock.unconfirmed(Instant::now(), Duration::from_secs(60));
        assert_eq!(clock.deadline(), Some(later + trusted(ten)));
        clock.unconfirmed(Instant::now(), short);
        tokio::time::advance(short).await;
        assert!(clock.is_lost());
    }
}
