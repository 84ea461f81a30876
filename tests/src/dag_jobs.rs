//! The job of the DAG tests (tests/dag.rs): one step handler that reads its
//! dependencies' typed results (each the list of steps upstream of it),
//! records what it saw and how often it ran in the ledger (`ledger:dag:*`,
//! in the same Redis), may sleep or fail, and passes on its own lineage.

use std::time::Duration;

use queue_core::{job, Dag, JobContext, JobError};
use redis::AsyncCommands;
use serde::{Deserialize, Serialize};

use crate::ledger_conn;

/// The step job's registration when `TEST_WORKER_WORKFLOWS` is set, else none.
pub fn if_asked() -> Vec<queue_core::Registration> {
    if std::env::var_os(crate::workflow_jobs::ENV).is_none() {
        return Vec::new();
    }
    vec![dag_step::handler()]
}

/// A step's instructions.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct DagStep {
    /// Redis URL of the ledger.
    pub ledger: String,
    /// Sleep this long before finishing.
    pub sleep_ms: u64,
    /// Fail permanently (dead-lettered at once).
    pub fail: bool,
}

/// A DAG step: records `dep:ok|err` of each dependency, sorted
/// (`ledger:dag:inputs`), the batch its `batch_summary` reads
/// (`ledger:dag:summary`), its own finished runs (`ledger:dag:runs`), and
/// sets its result: the sorted, deduplicated steps upstream of it and itself.
#[job(queue = "wf", max_attempts = 5, timeout = "60s")]
pub async fn dag_step(ctx: JobContext, s: DagStep) -> Result<(), JobError> {
    step_body(ctx, s).await
}

/// [`dag_step`] on queue `emails` (another hash tag: a DAG across queues).
#[job(queue = "emails", max_attempts = 5, timeout = "60s")]
pub async fn dag_email_step(ctx: JobContext, s: DagStep) -> Result<(), JobError> {
    step_body(ctx, s).await
}

async fn step_body(ctx: JobContext, s: DagStep) -> Result<(), JobError> {
    let mut c = ledger_conn(&s.ledger).await?;
    let id = ctx.job_id().to_string();
    let deps = ctx.child_results::<Vec<String>>().await?;
    let mut lineage = vec![Dag::step_name(&id).to_string()];
    let mut inputs = Vec::new();
    for d in &deps {
        let step = Dag::step_name(&d.id);
        match &d.outcome {
            Ok(upstream) => {
                lineage.extend(upstream.clone().unwrap_or_default());
                inputs.push(format!("{step}:ok"));
            }
            Err(_) => inputs.push(format!("{step}:err")),
        }
    }
    lineage.sort();
    lineage.dedup();
    let _: () = c.hset("ledger:dag:inputs", &id, inputs.join(",")).await?;
    if s.sleep_ms > 0 {
        tokio::time::sleep(Duration::from_millis(s.sleep_ms)).await;
    }
    if s.fail {
        return Err(JobError::permanent("planned step failure"));
    }
    // The batch this step's `batch_summary` reads (`none`: it found none).
    let summary = ctx.batch_summary().await?.map(|b| b.id);
    let summary = summary.as_deref().unwrap_or("none");
    let _: () = c.hset("ledger:dag:summary", &id, summary).await?;
    let _: () = c.hincr("ledger:dag:runs", &id, 1).await?;
    let _: () = c.hset("ledger:dag:lineage", &id, lineage.join(",")).await?;
    ctx.set_child_result(&lineage)?;
    Ok(())
}
