//! The jobs of the workflow tests (tests/workflows.rs, the chaos `flow`
//! workload): a member that records its side effect, may sleep, fail or add
//! a member, and sets a typed result; a callback / parent that records each
//! run with the batch's counts and its children's results. Both write the
//! ledger in the same Redis (`ledger:wf:*`), so a test counts how often each
//! callback ran. The same member and callback also exist on other queues
//! (`emails`, `billing`, `orders`: the cross-queue relay's tests).

use std::time::Duration;

use queue_core::{job, JobContext, JobError, JobSpec};
use redis::AsyncCommands;
use serde::{Deserialize, Serialize};

use crate::ledger_conn;

/// The queue of `wf_member` and `wf_callback`.
pub const WF_QUEUE: &str = "wf";
/// The queues of the cross-queue copies: members on `emails` and
/// `billing`, callbacks / parents on `orders`.
pub const EMAILS: &str = "emails";
/// See [`EMAILS`].
pub const BILLING: &str = "billing";
/// See [`EMAILS`].
pub const ORDERS: &str = "orders";
/// Every queue these jobs run on.
pub const WF_QUEUES: [&str; 4] = [WF_QUEUE, EMAILS, BILLING, ORDERS];

/// The environment variable that makes `test-worker` also serve these jobs
/// (`TEST_WORKER_WORKFLOWS=1`); other tests' workers serve only their own
/// queues (a third queue changes which fetcher blocks, which the fault tests
/// count on).
pub const ENV: &str = "TEST_WORKER_WORKFLOWS";

/// These jobs' registrations when `TEST_WORKER_WORKFLOWS` is set, else none.
pub fn if_asked() -> Vec<queue_core::Registration> {
    if std::env::var_os(ENV).is_none() {
        return Vec::new();
    }
    all()
}

/// Every registration of these jobs (all four queues).
pub fn all() -> Vec<queue_core::Registration> {
    vec![
        wf_member::handler(),
        wf_callback::handler(),
        wf_email::handler(),
        wf_bill::handler(),
        wf_order_close::handler(),
        wf_typed_child::handler(),
        wf_typed_parent::handler(),
    ]
}

/// A member's instructions.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct WfMember {
    /// Redis URL of the ledger.
    pub ledger: String,
    /// Sleep this long first.
    pub sleep_ms: u64,
    /// Fail permanently (dead-lettered at once).
    pub fail: bool,
    /// Add one member with id `<this id>-more` to the batch first.
    pub add_more: bool,
}

/// A batch member / flow child.
#[job(queue = "wf", max_attempts = 5, timeout = "60s")]
pub async fn wf_member(ctx: JobContext, m: WfMember) -> Result<(), JobError> {
    member_body(ctx, m).await
}

/// [`wf_member`] on queue `emails`.
#[job(queue = "emails", max_attempts = 5, timeout = "60s")]
pub async fn wf_email(ctx: JobContext, m: WfMember) -> Result<(), JobError> {
    member_body(ctx, m).await
}

/// [`wf_member`] on queue `billing`.
#[job(queue = "billing", max_attempts = 5, timeout = "60s")]
pub async fn wf_bill(ctx: JobContext, m: WfMember) -> Result<(), JobError> {
    member_body(ctx, m).await
}

async fn member_body(ctx: JobContext, m: WfMember) -> Result<(), JobError> {
    let mut c = ledger_conn(&m.ledger).await?;
    let id = ctx.job_id().to_string();
    if m.add_more {
        let more = WfMember {
            ledger: m.ledger.clone(),
            ..WfMember::default()
        };
        ctx.batch_add(JobSpec::new::<wf_member::Job>(&more)?.id(format!("{id}-more")))
            .await?;
    }
    if m.sleep_ms > 0 {
        tokio::time::sleep(Duration::from_millis(m.sleep_ms)).await;
    }
    if m.fail {
        return Err(JobError::permanent("planned member failure"));
    }
    let _: () = c.hincr("ledger:wf:effects", &id, 1).await?;
    ctx.set_child_result(&id.len())?;
    Ok(())
}

/// A callback's / parent's instructions.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct WfCallback {
    /// Redis URL of the ledger.
    pub ledger: String,
}

/// A batch callback or flow parent: counts its runs (`ledger:wf:callbacks`)
/// and records `total/succeeded/dead/cancelled` (`ledger:wf:summary`) and
/// `ok,err` of its children's results (`ledger:wf:children`).
#[job(queue = "wf", max_attempts = 5, timeout = "60s")]
pub async fn wf_callback(ctx: JobContext, cb: WfCallback) -> Result<(), JobError> {
    callback_body(ctx, cb).await
}

/// [`wf_callback`] on queue `orders`.
#[job(queue = "orders", max_attempts = 5, timeout = "60s")]
pub async fn wf_order_close(ctx: JobContext, cb: WfCallback) -> Result<(), JobError> {
    callback_body(ctx, cb).await
}

async fn callback_body(ctx: JobContext, cb: WfCallback) -> Result<(), JobError> {
    let mut c = ledger_conn(&cb.ledger).await?;
    let id = ctx.job_id().to_string();
    let summary = ctx
        .batch_summary()
        .await?
        .ok_or_else(|| JobError::permanent("callback without a batch"))?;
    let children = ctx.child_results::<usize>().await?;
    let ok = children.iter().filter(|r| r.outcome.is_ok()).count();
    let line = format!(
        "{}/{}/{}/{}",
        summary.total, summary.succeeded, summary.dead, summary.cancelled
    );
    let _: () = c.hset("ledger:wf:summary", &id, line).await?;
    let _: () = c
        .hset(
            "ledger:wf:children",
            &id,
            format!("{ok},{}", children.len() - ok),
        )
        .await?;
    let _: () = c.hincr("ledger:wf:callbacks", &id, 1).await?;
    ctx.set_child_result(&id.len())?;
    Ok(())
}

/// A flow child whose `#[job]` fn returns a typed value (`set_output`, the
/// form docs/RESULTS.md advertises); it also sets a child result first,
/// which the returned value replaces.
#[job(queue = "wf", max_attempts = 5, timeout = "60s")]
pub async fn wf_typed_child(ctx: JobContext, n: u32) -> Result<u32, JobError> {
    ctx.set_child_result(&0u32)?;
    Ok(n)
}

/// A flow parent that reads its children's results as `u32` and records
/// them (`ledger:wf:typed`: `<child id>=<outcome>` sorted by id, joined by `,`).
#[job(queue = "wf", max_attempts = 5, timeout = "60s")]
pub async fn wf_typed_parent(ctx: JobContext, cb: WfCallback) -> Result<(), JobError> {
    let mut c = ledger_conn(&cb.ledger).await?;
    let children = ctx.child_results::<u32>().await?;
    let line: Vec<String> = children
        .iter()
        .map(|r| format!("{}={:?}", r.id, r.outcome))
        .collect();
    let _: () = c
        .hset("ledger:wf:typed", ctx.job_id().to_string(), line.join(","))
        .await?;
    Ok(())
}
