//! The heartbeat of one running job: extends its lease every
//! `heartbeat_interval` while the token matches (`extend.lua`, DESIGN rule 3),
//! moves the context's local lease deadline forward on each confirmed extend
//! (`lease_clock.rs`), and marks the context lease-lost when an extend finds
//! another token or the deadline passed without a confirmed extend.
//!
//! The runner waits out the first interval itself (a timer in its own task)
//! and spawns this task only for a job still running then: most jobs end
//! within one interval, and a task spawned and aborted per job was a wake-up
//! of another runtime thread per job (issue #12, concurrency 1).

use std::sync::Arc;

use tracing::{debug, info, warn};

use super::Inner;
use crate::job::{JobContext, JobId};
use crate::keys::QueueKeys;
use crate::scripts::extend::{Extend, ExtendReply};

/// Extends the lease now and then every heartbeat interval while the token
/// matches; marks the context lease-lost and stops when it no longer does or
/// when the local deadline passed (Redis unreachable). Started by the runner
/// once the job has run for one interval; runs until aborted by the runner.
pub(super) async fn heartbeat_after_first_interval(
    inner: Arc<Inner>,
    keys: Arc<QueueKeys>,
    id: JobId,
    token: String,
    ctx: JobContext,
) {
    if !inner.config.heartbeat_enabled {
        return;
    }
    let every = inner.config.heartbeat_interval();
    let mut conn = inner.conn.clone();
    let extend = Extend {
        keys: &keys,
        id: &id,
        token: &token,
        lease: inner.config.lease,
    };
    let mut first = true;
    loop {
        if !first {
            tokio::time::sleep(every).await;
        }
        first = false;
        if ctx.inner.lease.is_lost() {
            warn!("lease lost: no extend confirmed before the local lease deadline; another worker may run this job");
            return;
        }
        let sent_at = tokio::time::Instant::now();
        match extend.run(&mut conn).await {
            Ok(ExtendReply::LeaseLost) => {
                ctx.inner.lease.mark_lost();
                warn!("lease lost: the job was reclaimed; its result will be discarded");
                return;
            }
            Ok(ExtendReply::Extended {
                lease_until_ms,
                cancel_requested,
            }) => {
                ctx.inner.lease.confirm(sent_at, inner.config.lease);
                debug!(lease_until_ms, "lease extended");
                if cancel_requested && !ctx.inner.cancel.set() {
                    info!("cancel requested by an operator");
                }
            }
            Err(e) => warn!(error = %e, "heartbeat failed; retrying at the next interval"),
        }
    }
}
