//! Dead-letter actions that are not in queue-core: picking the jobs a replay
//! or purge acts on, and the purge itself (one script, DESIGN rule 1).

use std::sync::LazyLock;

use queue_core::{Queue, QueueKeys};
use serde::Serialize;

use crate::cli::DeadTarget;
use crate::error::{CliError, Result};

static PURGE: LazyLock<redis::Script> =
    LazyLock::new(|| redis::Script::new(include_str!("lua/purge.lua")));

/// A dead-lettered job picked for a replay or purge.
#[derive(Debug, Clone, Serialize)]
pub struct Picked {
    pub id: String,
    pub job_type: Option<String>,
    pub reason: Option<String>,
    /// `dead_at` when the job was listed: a purge only deletes the job if it
    /// is still that dead-lettering (not replayed and dead again since).
    pub dead_at: Option<String>,
    /// False when an id given on the command line is not dead-lettered.
    pub dead: bool,
}

/// The jobs `target` names. Ids are looked up (and reported when not dead);
/// `--filter` and `--all` read the whole dead-letter list.
pub async fn pick(queue: &Queue, name: &str, target: &DeadTarget) -> Result<Vec<Picked>> {
    if !target.ids.is_empty() {
        let mut out = Vec::new();
        for id in &target.ids {
            let info = queue.job(name, id.as_str()).await?;
            let dead = info.as_ref().and_then(|i| i.state()) == Some("dead");
            out.push(Picked {
                id: id.clone(),
                job_type: info
                    .as_ref()
                    .and_then(|i| i.field("type"))
                    .map(str::to_string),
                reason: info
                    .as_ref()
                    .and_then(|i| i.field("dead_reason"))
                    .map(str::to_string),
                dead_at: info
                    .as_ref()
                    .and_then(|i| i.field("dead_at"))
                    .map(str::to_string),
                dead,
            });
        }
        return Ok(out);
    }
    let filter = if target.all {
        None
    } else {
        target.filter.as_deref()
    };
    let (_, jobs) = crate::inspect::dead_letters(queue, name, filter, 0, u64::MAX).await?;
    Ok(jobs
        .into_iter()
        .map(|j| Picked {
            id: j.id.to_string(),
            job_type: j.field("type").map(str::to_string),
            reason: j.field("dead_reason").map(str::to_string),
            dead_at: j.field("dead_at").map(str::to_string),
            dead: true,
        })
        .collect())
}

/// What a purge of one id did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum PurgeOutcome {
    Purged,
    NotDead,
    /// Replayed and dead-lettered again since it was listed: left alone.
    Changed,
}

/// Deletes dead-lettered job `id` (dead-list entry, hash, step results) in
/// one script. With `expected_dead_at`, only if it is still that dead-lettering.
pub async fn purge(
    queue: &Queue,
    name: &str,
    id: &str,
    expected_dead_at: Option<&str>,
) -> Result<PurgeOutcome> {
    let k = QueueKeys::new(name);
    let r: i64 = PURGE
        .key(&k.dead)
        .key(k.job(id))
        .key(k.steps(id))
        .key(&k.stats)
        .arg(id)
        .arg(expected_dead_at.unwrap_or(""))
        .invoke_async(&mut queue.connection())
        .await
        .map_err(CliError::redis(format!(
            "purging job `{id}` of queue `{name}`"
        )))?;
    Ok(match r {
        1 => PurgeOutcome::Purged,
        -1 => PurgeOutcome::Changed,
        _ => PurgeOutcome::NotDead,
    })
}
