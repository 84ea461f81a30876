//! A fetcher whose queue is paused (`fetch.lua` answered `paused`, or
//! `claim.lua` put a BLMOVE'd id back): it frees its slots and looks again
//! after one block timeout, so an idle paused worker costs Redis what an
//! idle unpaused one does (docs/FLOW-CONTROL.md). A fetcher held by a queue
//! limit (`limited`: docs/LIMITS.md) likewise frees its slots and sleeps the
//! wait the script computed, at most one block timeout.

use std::time::Duration;

use tracing::debug;

use super::fetcher::Fetcher;
use super::slots::Slot;

impl Fetcher {
    /// Frees `slots`, then waits one `block_timeout` (or until stopped).
    pub(super) async fn wait_while_paused(&mut self, slots: Vec<Slot>) {
        drop(slots);
        let queue = &self.inner.queues[self.me].keys.queue;
        debug!(queue = %queue, "queue paused; looking again after one block timeout");
        tokio::select! {
            _ = tokio::time::sleep(self.inner.config.block_timeout) => {}
            _ = self.stop.changed() => {}
        }
    }

    /// Frees `slots`, then sleeps `wait` (the time until the queue's rate
    /// window frees, or the concurrency recheck interval), at most one
    /// `block_timeout`, or until stopped. The cap: a limit cleared or raised
    /// meanwhile is seen within a block timeout, not after the whole wait
    /// (up to a day with a rate of 1/24h).
    pub(super) async fn wait_while_limited(&mut self, slots: Vec<Slot>, wait: Duration) {
        drop(slots);
        let queue = &self.inner.queues[self.me].keys.queue;
        let sleep = wait.min(self.inner.config.block_timeout);
        debug!(queue = %queue, wait_ms = wait.as_millis() as u64, sleep_ms = sleep.as_millis() as u64,
            "queue limit reached; waiting");
        tokio::select! {
            _ = tokio::time::sleep(sleep) => {}
            _ = self.stop.changed() => {}
        }
    }
}
