//! Workflows (issue #14, docs/WORKFLOWS.md): [`Batch`] (members with
//! success / complete callbacks) and [`Flow`] (a parent that waits for its
//! children), built on one engine. A member job carries its batch key in the
//! `batch` field; `ack.lua`, `fail.lua`, `reclaim.lua`, `defer.lua`,
//! `cancel.lua` and `finish_cancel.lua` count it (once per job id) in the
//! same script as the job's own state change, and the one that finishes the
//! batch enqueues the callbacks there (`wf_*` in `scripts/prelude.lua`).

mod batch;
mod context;
#[cfg(test)]
mod cross_queue_tests;
mod dag;
mod engine;
mod flow;
pub(crate) mod relay;
mod spec;
mod summary;

pub use batch::{Batch, BatchCreated};
pub use dag::{Dag, DagCreated, DagError, DEFAULT_OPEN_TTL};
pub(crate) use engine::parse_key;
#[cfg(test)]
pub(crate) use engine::BatchRef;
pub use flow::{ChildPolicy, Flow, FlowCreated};
pub use relay::{DeadNotice, RelayReport, RelayRetryReport};
pub use spec::JobSpec;
pub use summary::{BatchSummary, ChildResult};
