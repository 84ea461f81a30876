//! Bulk replay / purge of a filtered set of dead letters, in two steps:
//!
//! 1. `POST /api/queues/{q}/bulk-dead/preview` with `{"type", "contains"}`
//!    counts the matching dead letters (the list read in chunks, see
//!    `dead_scan.rs`) and the page shows that count for confirmation;
//! 2. `POST /api/queues/{q}/bulk-dead/replay` (or `/purge`) with the same
//!    filter and `"expect": <count>` selects again and acts only when the
//!    count is still the one confirmed (409 with the new count otherwise),
//!    then replays (`replay.lua`) or purges (`purge.lua`, only the
//!    dead-lettering that was selected) each job: one script per job, so a
//!    big set never blocks Redis. The action is written to the audit log.

use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use queue_core::admin::{PurgeOutcome, ReplayOutcome};
use serde::Deserialize;
use serde_json::json;

use super::audit::Entry;
use super::auth::Who;
use super::dead_scan::{scan, DeadFilter, Scan};
use super::security::check_same_origin;
use super::Shared;

/// Ids listed in a preview.
const SAMPLE: usize = 5;

#[derive(Deserialize)]
pub struct BulkRequest {
    #[serde(flatten)]
    filter: DeadFilter,
    /// The count the user confirmed (required by the action).
    #[serde(default)]
    expect: Option<u64>,
}

fn error(status: StatusCode, msg: impl std::fmt::Display) -> Response {
    (status, Json(json!({"error": msg.to_string()}))).into_response()
}

/// The dead letters a bulk action counts and acts on: entries whose job key
/// cannot be read (corrupt data, `DeadRow::unreadable`) are left out, since
/// a replay or purge of one would be refused.
async fn select(state: &Shared, queue: &str, filter: &DeadFilter) -> Result<Scan, Response> {
    let mut found = scan(state, queue, filter, 0, usize::MAX, u64::MAX)
        .await
        .map_err(|e| error(StatusCode::BAD_GATEWAY, e))?;
    found.rows.retain(|r| r.unreadable.is_none());
    Ok(found)
}

/// Step 1: how many dead letters the filter selects.
pub async fn preview(
    State(state): State<Shared>,
    Path(queue): Path<String>,
    headers: HeaderMap,
    Json(req): Json<BulkRequest>,
) -> Response {
    if let Err(why) = check_same_origin(&headers) {
        return error(StatusCode::FORBIDDEN, why);
    }
    let filter = req.filter.normalized();
    let found = match select(&state, &queue, &filter).await {
        Ok(f) => f,
        Err(r) => return r,
    };
    let sample: Vec<&str> = found
        .rows
        .iter()
        .take(SAMPLE)
        .map(|r| r.id.as_str())
        .collect();
    Json(json!({
        "queue": queue,
        "filter": filter.describe(),
        "count": found.rows.len(),
        "total": found.total,
        "sample": sample,
    }))
    .into_response()
}

/// Step 2: replay or purge the confirmed set.
pub async fn act(
    State(state): State<Shared>,
    Path((queue, action)): Path<(String, String)>,
    Extension(who): Extension<Who>,
    headers: HeaderMap,
    Json(req): Json<BulkRequest>,
) -> Response {
    if let Err(why) = check_same_origin(&headers) {
        return error(StatusCode::FORBIDDEN, why);
    }
    if action != "replay" && action != "purge" {
        return error(
            StatusCode::NOT_FOUND,
            format!("unknown bulk action {action:?}"),
        );
    }
    let Some(expect) = req.expect else {
        return error(
            StatusCode::BAD_REQUEST,
            "\"expect\" (the confirmed count from the preview) is required",
        );
    };
    let filter = req.filter.normalized();
    let found = match select(&state, &queue, &filter).await {
        Ok(f) => f,
        Err(r) => return r,
    };
    let count = found.rows.len() as u64;
    if count != expect {
        return (
            StatusCode::CONFLICT,
            Json(json!({"count": count, "error": format!(
                "the selection changed: {count} dead letters match now, not {expect}; confirm again"
            )})),
        )
            .into_response();
    }
    let (mut done, mut skipped) = (0u64, 0u64);
    let mut failure = None;
    for row in &found.rows {
        let changed = if action == "replay" {
            state
                .admin
                .replay_dead(&queue, row.id.as_str(), false)
                .await
                .map(|o| o == ReplayOutcome::Replayed)
        } else {
            state
                .admin
                .purge_dead(&queue, row.id.as_str(), row.dead_at.as_deref())
                .await
                .map(|o| o == PurgeOutcome::Purged)
        };
        match changed {
            Ok(true) => done += 1,
            Ok(false) => skipped += 1,
            Err(e) => {
                failure = Some(e.to_string());
                break;
            }
        }
    }
    state.audit.record(Entry {
        who: &who.0,
        action: if action == "replay" {
            "bulk_replay"
        } else {
            "bulk_purge"
        },
        queue: &queue,
        what: &filter.describe(),
        count: done,
    });
    let body = json!({"action": action, "done": done, "skipped": skipped,
        "filter": filter.describe(), "error": failure});
    let status = if failure.is_some() {
        StatusCode::BAD_GATEWAY
    } else {
        StatusCode::OK
    };
    (status, Json(body)).into_response()
}
