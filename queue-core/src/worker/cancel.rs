//! Ending a delivery an operator cancelled: when the handler returned an
//! error (or a claimed row did not decode) and `fail.lua` answered that a
//! cancel was requested, the job ends with `finish_cancel.lua` (completion
//! record `cancelled`), never retried nor dead-lettered
//! (docs/FLOW-CONTROL.md). The script is idempotent for its token, so a call
//! whose reply was lost is sent again as it was, never as a new `fail.lua`
//! (which would find the job gone and answer "lease lost").

use tokio::sync::watch;
use tracing::info;

use super::fetcher::same_token_retries;
use super::runner::JobRunner;
use super::Inner;
use crate::error::Result;
use crate::job::JobId;
use crate::keys::QueueKeys;
use crate::scripts::claim::Delivery;
use crate::scripts::finish_cancel::FinishCancel;

impl JobRunner {
    /// Ends the delivery cancelled; the metrics label on success.
    pub(super) async fn end_cancelled(&self, d: &Delivery, message: &str) -> Result<&'static str> {
        if !finish_cancel(
            &self.inner,
            &self.hard_stop,
            &self.keys,
            &d.id,
            &d.token,
            message,
            d.far_from_tail,
        )
        .await?
        {
            return Err(self.lease_lost(d));
        }
        info!(error = message, "cancelled");
        Ok("cancelled")
    }
}

/// Runs `finish_cancel.lua` for delivery `token` of job `id`, retrying Redis
/// failures with the same token (see [`same_token_retries`]): true when the
/// job ended cancelled, false when the lease was lost.
pub(super) async fn finish_cancel(
    inner: &Inner,
    hard_stop: &watch::Receiver<bool>,
    keys: &QueueKeys,
    id: &JobId,
    token: &str,
    message: &str,
    far_from_tail: bool,
) -> Result<bool> {
    let finish = FinishCancel {
        keys,
        id,
        token,
        retention: inner.config.completion_retention,
        message,
        far_from_tail,
    };
    same_token_retries(inner, hard_stop, keys, Some(id), "cancel", || {
        let mut conn = inner.conn.clone();
        let finish = &finish;
        async move { finish.run(&mut conn).await }
    })
    .await
}
