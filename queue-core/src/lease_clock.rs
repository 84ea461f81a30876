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
//! Once lost, a clock stays lost: a later extend does not revive it. The one
//! exception is [`LeaseClock::regain`], for a holder that has not relied on
//! the lease yet (a delivery whose handler would start after the deadline):
//! an extend sent then and confirmed by Redis (which checks the token) holds
//! the lease again, unless Redis had already reported it another's.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::Duration;

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

/// A lease deadline on the local monotonic clock plus a sticky lost flag.
#[derive(Debug)]
pub(crate) struct LeaseClock {
    /// `None`: no deadline (a context built for unit tests).
    granted: Mutex<Option<Granted>>,
    lost: AtomicBool,
    /// Redis said the lease is another's ([`mark_lost`](Self::mark_lost)),
    /// not only the local deadline passed: [`regain`](Self::regain) refuses.
    taken: AtomicBool,
}

impl LeaseClock {
    /// A lease of `lease` whose request was sent at `sent_at`.
    pub(crate) fn new(sent_at: Instant, lease: Duration) -> Self {
        LeaseClock {
            granted: Mutex::new(Some(Granted::new(sent_at, lease))),
            lost: AtomicBool::new(false),
            taken: AtomicBool::new(false),
        }
    }

    /// A lease that never runs out by itself (only [`mark_lost`](Self::mark_lost) ends it).
    pub(crate) fn unbounded() -> Self {
        LeaseClock {
            granted: Mutex::new(None),
            lost: AtomicBool::new(false),
            taken: AtomicBool::new(false),
        }
    }

    /// Redis confirmed an extension to `lease` requested at `sent_at`: the
    /// deadline becomes `sent_at` + 90 % of `lease`, earlier or later than
    /// before, unless a request sent after this one was already confirmed.
    /// Ignored when the lease was already lost locally.
    pub(crate) fn confirm(&self, sent_at: Instant, lease: Duration) {
        if self.is_lost() {
            return;
        }
        if let Ok(mut granted) = self.granted.lock() {
            if let Some(g) = granted.as_mut() {
                if sent_at >= g.sent_at {
                    *g = Granted::new(sent_at, lease);
                }
            }
        }
    }

    /// Redis said the lease belongs to someone else (or is gone).
    pub(crate) fn mark_lost(&self) {
        self.taken.store(true, Ordering::SeqCst);
        self.lost.store(true, Ordering::SeqCst);
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
        if let Ok(mut granted) = self.granted.lock() {
            if let Some(g) = granted.as_mut() {
                *g = Granted::new(sent_at, lease);
            }
        }
        self.lost.store(false, Ordering::SeqCst);
        !self.is_lost()
    }

    /// The local deadline, `None` when there is none.
    pub(crate) fn deadline(&self) -> Option<Instant> {
        self.granted
            .lock()
            .ok()
            .and_then(|g| g.and_then(|g| g.until))
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
}
