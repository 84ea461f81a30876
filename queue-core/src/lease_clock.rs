//! The local view of a lease (a job delivery's or a lock's): a deadline on
//! this process's monotonic clock, measured from *before* the request that
//! took or extended the lease was sent, minus a safety margin. Redis grants
//! the lease some time after the request left, so the lease really ends
//! later than this deadline; a holder that cannot reach Redis to confirm an
//! extension therefore learns it may have lost the lease before anyone else
//! can take it over (clock rates drift far less than the margin).
//!
//! Once lost, a clock stays lost: a later extend does not revive it.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

/// The part of a lease the holder counts on: 90 % of it (at least 1 ms less).
pub(crate) fn trusted(lease: Duration) -> Duration {
    lease.saturating_sub((lease / 10).max(Duration::from_millis(1)))
}

/// A lease deadline on the local monotonic clock plus a sticky lost flag.
#[derive(Debug)]
pub(crate) struct LeaseClock {
    /// `None`: no deadline (a context built for unit tests).
    valid_until: Mutex<Option<Instant>>,
    lost: AtomicBool,
}

impl LeaseClock {
    /// A lease of `lease` whose request was sent at `sent_at`.
    pub(crate) fn new(sent_at: Instant, lease: Duration) -> Self {
        LeaseClock {
            valid_until: Mutex::new(Some(sent_at + trusted(lease))),
            lost: AtomicBool::new(false),
        }
    }

    /// A lease that never runs out by itself (only [`mark_lost`](Self::mark_lost) ends it).
    pub(crate) fn unbounded() -> Self {
        LeaseClock {
            valid_until: Mutex::new(None),
            lost: AtomicBool::new(false),
        }
    }

    /// Redis confirmed an extension to `lease` requested at `sent_at`.
    /// Ignored when the lease was already lost locally.
    pub(crate) fn confirm(&self, sent_at: Instant, lease: Duration) {
        if self.is_lost() {
            return;
        }
        if let Ok(mut until) = self.valid_until.lock() {
            let next = sent_at + trusted(lease);
            if let Some(u) = until.as_mut() {
                *u = (*u).max(next);
            }
        }
    }

    /// Redis said the lease belongs to someone else (or is gone).
    pub(crate) fn mark_lost(&self) {
        self.lost.store(true, Ordering::SeqCst);
    }

    /// The local deadline, `None` when there is none.
    pub(crate) fn deadline(&self) -> Option<Instant> {
        self.valid_until.lock().ok().and_then(|u| *u)
    }

    /// True once Redis reported the lease lost or the local deadline passed
    /// without a confirmed extension.
    pub(crate) fn is_lost(&self) -> bool {
        if self.lost.load(Ordering::SeqCst) {
            return true;
        }
        match self.deadline() {
            Some(until) if Instant::now() >= until => {
                self.mark_lost();
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
}
