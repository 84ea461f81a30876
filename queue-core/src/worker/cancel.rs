//! Ending a delivery an operator cancelled: when the handler returned an
//! error and `fail.lua` answered that a cancel was requested, the job ends
//! with `finish_cancel.lua` (completion record `cancelled`), never retried
//! nor dead-lettered (docs/FLOW-CONTROL.md).

use tracing::info;

use super::runner::JobRunner;
use crate::error::Result;
use crate::scripts::claim::Delivery;
use crate::scripts::finish_cancel::FinishCancel;

impl JobRunner {
    /// Runs `finish_cancel.lua`; the metrics label on success.
    pub(super) async fn end_cancelled(&self, d: &Delivery, message: &str) -> Result<&'static str> {
        let mut conn = self.inner.conn.clone();
        let ended = FinishCancel {
            keys: &self.keys,
            id: &d.id,
            token: &d.token,
            retention: self.inner.config.completion_retention,
            message,
        }
        .run(&mut conn)
        .await?;
        if !ended {
            return Err(self.lease_lost(d));
        }
        info!(error = message, "cancelled");
        Ok("cancelled")
    }
}
