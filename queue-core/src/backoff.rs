//! Jittered exponential backoff of retries. The worker draws the delay; the
//! script adds it to the Redis clock (DESIGN rule 2, docs/DESIGN.md).

use std::time::Duration;

use rand::Rng;

use crate::error::{QueueError, Result};

/// The longest backoff `max` a worker ([`WorkerConfig::backoff`](crate::WorkerConfig::backoff))
/// or a watchdog ([`WatchdogConfig::backoff`](crate::WatchdogConfig::backoff)) accepts:
/// 30 days. A `max` near `u64` milliseconds put a retried (or reclaimed) job's
/// run time decades away (and past what the scripts store as a count).
pub const MAX_BACKOFF: Duration = Duration::from_secs(30 * 24 * 3600);

/// Exponential backoff with "equal jitter": attempt `n` waits a uniformly random
/// time in `[d/2, d]` where `d = min(max, base * 2^(n-1))`. The jitter spreads a
/// burst of failures so retries do not arrive together.
///
/// ```
/// use std::time::Duration;
/// use queue_core::Backoff;
/// let b = Backoff { base: Duration::from_secs(1), max: Duration::from_secs(60) };
/// let d = b.delay(3); // nominal 4s
/// assert!(d >= Duration::from_secs(2) && d <= Duration::from_secs(4));
/// assert!(b.delay(30) <= Duration::from_secs(60));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    /// Delay before the first retry (nominal).
    pub base: Duration,
    /// Upper bound of any delay.
    pub max: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff {
            base: Duration::from_secs(1),
            max: Duration::from_secs(600),
        }
    }
}

impl Backoff {
    /// The check a worker ([`WorkerBuilder::build`](crate::WorkerBuilder::build)),
    /// a watchdog ([`Watchdog::connect`](crate::Watchdog::connect)) and
    /// `queue-watchdog run` make of their backoff: `base` at most `max`, and
    /// `max` at most [`MAX_BACKOFF`]; [`QueueError::Config`] saying which
    /// otherwise. Zero is accepted (a zero base retries at once).
    ///
    /// ```
    /// use std::time::Duration;
    /// use queue_core::Backoff;
    /// let b = Backoff { base: Duration::from_secs(2), max: Duration::from_secs(1) };
    /// assert!(b.validate().unwrap_err().to_string().contains("backoff base"));
    /// assert!(Backoff::default().validate().is_ok());
    /// ```
    pub fn validate(&self) -> Result<()> {
        // A base above the max is a mistake (every retry waits the max);
        // a max of decades parks a retried job out of reach.
        if self.base > self.max {
            return Err(QueueError::Config(format!(
                "backoff base ({:?}) must be at most its max ({:?})",
                self.base, self.max
            )));
        }
        if self.max > MAX_BACKOFF {
            return Err(QueueError::Config(format!(
                "backoff max ({:?}) must be at most 30 days",
                self.max
            )));
        }
        Ok(())
    }

    /// The nominal (un-jittered) delay after failed attempt `attempt` (1-based).
    pub fn nominal(&self, attempt: u32) -> Duration {
        let exp = attempt.saturating_sub(1).min(40);
        let factor = 1u64 << exp;
        let ms = (self.base.as_millis() as u64).saturating_mul(factor);
        Duration::from_millis(ms).min(self.max)
    }

    /// A jittered delay in `[nominal/2, nominal]`.
    pub fn delay(&self, attempt: u32) -> Duration {
        let nominal = self.nominal(attempt).as_millis() as u64;
        if nominal == 0 {
            return Duration::ZERO;
        }
        let half = nominal / 2;
        Duration::from_millis(half + rand::rng().random_range(0..=nominal - half))
    }
}
