//! Background loops that run beside the jobs, shared by the [`Worker`] and
//! the [`Watchdog`]: the promoter (due delayed jobs → main) and the periodic
//! job scheduler; and the restart of the worker's loops after a panic
//! (`supervise.rs`). Each loop stops when its `stop` flag turns true, or
//! when the flag's every sender is gone ([`stop_requested`]).
//!
//! [`Worker`]: crate::Worker
//! [`Watchdog`]: crate::Watchdog

pub(crate) mod promoter;
pub(crate) mod scheduler;
mod supervise;

pub(crate) use supervise::supervised;

use tokio::sync::watch;

/// Whether a loop watching `stop` must end: the flag is true, or every
/// sender is gone (a worker whose `run_until` future was dropped). A closed
/// channel is a stop: `changed()` on it answers at once, so a loop that
/// read it as "not yet" would run without pause.
pub(crate) fn stop_requested(stop: &watch::Receiver<bool>) -> bool {
    *stop.borrow() || stop.has_changed().is_err()
}

#[cfg(test)]
mod tests {
    use tokio::sync::watch;

    /// True once the flag is true, or once every sender is gone.
    #[test]
    fn a_closed_stop_channel_is_a_stop() {
        let (tx, rx) = watch::channel(false);
        assert!(!super::stop_requested(&rx));
        tx.send_replace(true);
        assert!(super::stop_requested(&rx));
        let (tx, rx) = watch::channel(false);
        drop(tx);
        assert!(super::stop_requested(&rx));
    }
}
