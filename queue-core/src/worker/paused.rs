//! A fetcher whose queue is paused (`fetch.lua` answered `paused`, or
//! `claim.lua` put a BLMOVE'd id back): it frees its slots and looks again
//! after one block timeout, so an idle paused worker costs Redis what an
//! idle unpaused one does (docs/FLOW-CONTROL.md).

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
}
