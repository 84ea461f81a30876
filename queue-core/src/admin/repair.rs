//! Repairs of what the checker found, never losing a job: one small script
//! each (`repair_orphan.lua`, `repair_missing.lua`, `repair_lease.lua`,
//! `repair_group.lua`) that checks again, atomically, that the violation
//! still holds before it writes.

use serde::Serialize;

use super::check_rules::Violation;
use super::{admin_script, Admin, Result};
use crate::error::QueueError;
use crate::job::JobId;
use crate::keys::QueueKeys;

admin_script!(REPAIR_ORPHAN, "repair_orphan.lua", None);
admin_script!(REPAIR_MISSING, "repair_missing.lua", None);
admin_script!(REPAIR_LEASE, "repair_lease.lua", None);
admin_script!(REPAIR_GROUP, "repair_group.lua", None);

/// The dead-letter reason of an entry whose hash was gone.
pub const MISSING_HASH_REASON: &str =
    "job hash missing (found by queue-watchdog check; payload lost)";

/// What a repair did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RepairAction {
    /// A hash listed nowhere went back to main (state `queued`).
    RequeuedToMain,
    /// A delayed hash listed nowhere whose `run_at` is still ahead went back
    /// to the delayed set at that time (state `delayed` kept).
    RequeuedToDelayed,
    /// An active hash listed nowhere whose lease (in the leases set) had not
    /// expired went back to processing, token and lease kept: its worker is
    /// still running it, and its ack completes it (requeued, a second worker
    /// would run it at the same time). The watchdog returns it if the lease
    /// expires. Only a lease that is its delivery's: a token, the leases
    /// set's score equal to the hash's `lease_until`, and no further ahead
    /// than the longest lease a worker takes (7 days); any other (infinite,
    /// hand-written, another delivery's) is requeued to main.
    RestoredToProcessing,
    /// A dead hash listed nowhere went back to the dead list.
    RestoredToDead,
    /// An entry whose hash was gone was dead-lettered with
    /// [`MISSING_HASH_REASON`]; or an active hash listed nowhere, whose
    /// lost delivery was its last attempt (`attempts exhausted (n of m): …`,
    /// the watchdog's rule) or whose counts are corrupt, was dead-lettered
    /// instead of requeued.
    DeadLettered,
    /// An entry whose hash was gone belonged to a completed job: removed.
    RemovedCompleted,
    /// A lease without a processing entry was dropped.
    LeaseDropped,
    /// A group with waiting jobs, neither in the ring nor paused, was put
    /// back at the ring's tail: its jobs are served again.
    AddedToRing,
    /// The violation no longer held when the repair ran (a live move): nothing changed.
    Changed,
    /// Redis refused the repair for the data on its way (a key of another
    /// type it would have written to, say a corrupt group list): nothing
    /// changed, [`Repair::detail`] says why, and the other repairs ran.
    Refused,
}

/// One repair attempt.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Repair {
    /// The job repaired (`None` for a group's repair).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub id: Option<JobId>,
    /// The group repaired ([`Violation::GroupOutOfRing`]), else `None`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
    /// What was done.
    pub action: RepairAction,
    /// Why Redis refused the repair ([`RepairAction::Refused`]), else `None`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
}

impl Admin {
    /// Repairs `violation` when it is one a script can mend without losing a
    /// job (a hash listed nowhere, an entry whose hash is gone, a stray
    /// lease, a group with jobs out of the ring); `None` for the others,
    /// which need an operator.
    pub async fn repair(&self, queue: &str, violation: &Violation) -> Result<Option<Repair>> {
        if let Violation::GroupOutOfRing { group, .. } = violation {
            return self.repair_group(queue, group).await.map(Some);
        }
        let k = QueueKeys::new(queue);
        // Every place an id can be listed, then its hash (both repairs of a
        // job take these first).
        let listed = |id: &JobId| {
            vec![
                k.main.clone(),
                k.processing.clone(),
                k.delayed.clone(),
                k.dead.clone(),
                k.leases.clone(),
                k.job(id.as_str()),
            ]
        };
        let max_lease = crate::worker::MAX_LEASE.as_millis().to_string();
        let (script, id, keys, args): (_, _, Vec<String>, Vec<&str>) = match violation {
            Violation::OrphanHash { id, .. } => {
                let mut keys = listed(id);
                keys.extend([k.wake.clone(), k.guard.clone(), k.stats.clone()]);
                (&REPAIR_ORPHAN, id, keys, vec![max_lease.as_str()])
            }
            Violation::MissingHash { id, .. } => {
                let mut keys = listed(id);
                keys.extend([k.done(id.as_str()), k.stats.clone()]);
                (&REPAIR_MISSING, id, keys, vec![MISSING_HASH_REASON])
            }
            Violation::StrayLease { id } => (
                &REPAIR_LEASE,
                id,
                vec![k.processing.clone(), k.leases.clone()],
                vec![],
            ),
            _ => return Ok(None),
        };
        let mut inv = script.prepare_invoke();
        for key in &keys {
            inv.key(key);
        }
        inv.arg(id.as_str());
        for a in args {
            inv.arg(a);
        }
        let reply: String = inv
            .invoke_async(&mut self.queue.connection())
            .await
            .map_err(|e| QueueError::redis(queue, Some(id), e))?;
        let action = match reply.as_str() {
            "main" => RepairAction::RequeuedToMain,
            "delayed" => RepairAction::RequeuedToDelayed,
            "processing" => RepairAction::RestoredToProcessing,
            "dead" if matches!(violation, Violation::OrphanHash { .. }) => {
                RepairAction::RestoredToDead
            }
            "dead" | "exhausted" => RepairAction::DeadLettered,
            "removed" => RepairAction::RemovedCompleted,
            "dropped" => RepairAction::LeaseDropped,
            "changed" => RepairAction::Changed,
            other => {
                return Err(QueueError::protocol(
                    queue,
                    Some(id),
                    format!("repair reply {other:?}"),
                )
                .into())
            }
        };
        tracing::info!(queue, job_id = %id, ?action, "check: repaired {}", violation.kind());
        Ok(Some(Repair {
            id: Some(id.clone()),
            group: None,
            action,
            detail: None,
        }))
    }

    /// Puts group `group` back in the ring while its list has jobs and it is
    /// neither there nor paused (`repair_group.lua` checks that again).
    async fn repair_group(&self, queue: &str, group: &str) -> Result<Repair> {
        let k = QueueKeys::new(queue);
        let reply: String = REPAIR_GROUP
            .key(k.groups())
            .key(k.groups_paused())
            .key(k.group(group))
            .arg(group)
            .invoke_async(&mut self.queue.connection())
            .await
            .map_err(|e| QueueError::redis(queue, None, e))?;
        let action = match reply.as_str() {
            "ring" => RepairAction::AddedToRing,
            "changed" => RepairAction::Changed,
            other => {
                return Err(QueueError::protocol(
                    queue,
                    None,
                    format!("group {group}: repair reply {other:?}"),
                )
                .into())
            }
        };
        tracing::info!(queue, group, ?action, "check: repaired group_out_of_ring");
        Ok(Repair {
            id: None,
            group: Some(group.to_string()),
            action,
            detail: None,
        })
    }
}
