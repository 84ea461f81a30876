//! `GET /search?id=ID`: find a job by id in every queue the dashboard knows
//! (the named ones, or those discovered). One match redirects to the job's
//! page; several (an id reused across queues) are listed; none says so.

use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::{Html, IntoResponse, Redirect, Response};
use serde::Deserialize;

use super::escape::{html, url_segment};
use super::handlers::{discovery, queues as known_queues, AppError};
use super::{pages, Discovery, Shared};
use crate::views::describe_where;

#[derive(Deserialize)]
pub struct SearchQuery {
    #[serde(default)]
    id: String,
}

/// The search result (or a redirect to the one job found).
pub async fn page(
    State(state): State<Shared>,
    Query(q): Query<SearchQuery>,
) -> Result<Response, AppError> {
    let id = q.id.trim();
    let discovery = discovery(&state);
    let queues = known_queues(&state).await;
    if id.is_empty() {
        return Ok(Html(result_page("", &queues, "", &discovery)).into_response());
    }
    let found = state.admin.find_job(&queues, id).await?;
    if let [one] = found.as_slice() {
        return Ok(Redirect::to(&format!(
            "/queues/{}/jobs/{}",
            url_segment(&one.queue),
            url_segment(one.id.as_str())
        ))
        .into_response());
    }
    let mut rows = String::new();
    for d in &found {
        rows.push_str(&format!(
            r#"<li><a href="/queues/{qu}/jobs/{idu}">{qa}</a>: {where_}</li>"#,
            qu = url_segment(&d.queue),
            idu = url_segment(d.id.as_str()),
            qa = html(&d.queue),
            where_ = html(&describe_where(d)),
        ));
    }
    let status = if found.is_empty() {
        StatusCode::NOT_FOUND
    } else {
        StatusCode::OK
    };
    Ok((status, Html(result_page(id, &queues, &rows, &discovery))).into_response())
}

fn result_page(id: &str, queues: &[String], rows: &str, discovery: &Discovery) -> String {
    let mut searched = queues
        .iter()
        .map(|q| html(q))
        .collect::<Vec<_>>()
        .join(", ");
    // Before the first discovery the list is not known yet: a miss says so
    // instead of reading as "in no queue".
    if let Discovery::InProgress { .. } = discovery {
        if queues.is_empty() {
            searched = "no queue yet (queue discovery in progress: try again when it ends, or name the queues with --queue)".to_string();
        }
    }
    let result = if id.is_empty() {
        String::new()
    } else if rows.is_empty() {
        format!(
            r#"<p class="banner bad" id="search-result">No job {} in {searched} (never enqueued, purged, or completed longer ago than the retention).</p>"#,
            html(id)
        )
    } else {
        format!(
            r#"<p id="search-result">Job {} is in several queues:</p><ul class="found">{rows}</ul>"#,
            html(id)
        )
    };
    pages::layout(
        "Search",
        &format!(
            r#"<div id="page" data-page="search"></div><h1>Find a job</h1>
<form method="get" action="/search" class="filter"><label>job id <input name="id" value="{}" required></label> <button type="submit">Find</button></form>
{result}<p class="muted small">Searched: {searched}.</p>"#,
            html(id)
        ),
    )
}
