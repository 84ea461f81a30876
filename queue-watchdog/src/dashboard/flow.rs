//! The dashboard's flow-control actions (docs/FLOW-CONTROL.md):
//! `POST /api/queues/{q}/pause`, `.../resume` and `.../jobs/{id}/cancel`,
//! each behind the same same-origin check as the replay.

use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use queue_core::CancelOutcome;
use serde_json::json;
use tracing::info;

use super::audit::Entry;
use super::auth::Who;
use super::security::check_same_origin;
use super::Shared;

fn forbidden(why: &str) -> Response {
    (StatusCode::FORBIDDEN, Json(json!({"error": why}))).into_response()
}

fn failed(e: impl std::fmt::Display) -> Response {
    (
        StatusCode::BAD_GATEWAY,
        Json(json!({"error": e.to_string()})),
    )
        .into_response()
}

pub async fn api_pause(
    State(state): State<Shared>,
    Path(queue): Path<String>,
    Extension(who): Extension<Who>,
    headers: HeaderMap,
) -> Response {
    set_paused(&state, queue, headers, true, who).await
}

pub async fn api_resume(
    State(state): State<Shared>,
    Path(queue): Path<String>,
    Extension(who): Extension<Who>,
    headers: HeaderMap,
) -> Response {
    set_paused(&state, queue, headers, false, who).await
}

async fn set_paused(
    state: &Shared,
    queue: String,
    headers: HeaderMap,
    pause: bool,
    who: Who,
) -> Response {
    if let Err(why) = check_same_origin(&headers) {
        return forbidden(why);
    }
    let change = if pause {
        state.admin.pause(&queue).await
    } else {
        state.admin.resume(&queue).await
    };
    match change {
        Ok(change) => {
            info!(queue = %queue, pause, was_paused = change.was_paused, "pause/resume from the dashboard");
            let action = if pause { "pause" } else { "resume" };
            state.audit.record(Entry {
                who: &who.0,
                action,
                queue: &queue,
                what: &queue,
                count: 1,
            });
            Json(json!({"paused": pause, "change": change})).into_response()
        }
        Err(e) => failed(e),
    }
}

pub async fn api_cancel(
    State(state): State<Shared>,
    Path((queue, id)): Path<(String, String)>,
    Extension(who): Extension<Who>,
    headers: HeaderMap,
) -> Response {
    if let Err(why) = check_same_origin(&headers) {
        return forbidden(why);
    }
    match state.admin.cancel(&queue, id.as_str()).await {
        Ok(outcome) => {
            info!(queue = %queue, job_id = %id, outcome = ?outcome, "cancel from the dashboard");
            let ok = matches!(
                outcome,
                CancelOutcome::Cancelled { .. } | CancelOutcome::Requested { .. }
            );
            state.audit.record(Entry {
                who: &who.0,
                action: "cancel",
                queue: &queue,
                what: &id,
                count: u64::from(ok),
            });
            let status = if ok {
                StatusCode::OK
            } else {
                StatusCode::CONFLICT
            };
            let body = json!({"cancelled": ok, "id": id, "outcome": outcome,
                "message": crate::commands::describe_cancel(&outcome)});
            (status, Json(body)).into_response()
        }
        Err(e) => failed(e),
    }
}
