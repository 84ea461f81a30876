//! Optional access token (`--auth-token-file`): every request but `/healthz`,
//! `/login` and the static assets must send `Authorization: Bearer <token>`
//! or the session cookie that the login form sets. Also names who made a
//! request (the [`Who`] extension the audit log records), with or without a
//! token.
//!
//! Sessions are random ids kept in memory (a restart logs everyone out); the
//! cookie never holds the token itself. A session lasts
//! `--session-max-age-secs` (12 hours by default) from its login: then its
//! cookie is refused and forgotten, so a stolen cookie does not stay valid
//! until the next restart and the set of sessions stays bounded.

use std::collections::HashMap;
use std::io::Read;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use axum::extract::{ConnectInfo, Request, State};
use axum::http::{header, HeaderMap, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{Html, IntoResponse, Redirect, Response};
use axum::Form;
use serde::Deserialize;

use super::escape::html;
use super::{pages, Shared};
use crate::error::CliError;

/// The session cookie's name.
const COOKIE: &str = "queue_dashboard_session";
/// A token shorter than this is refused at start.
const MIN_TOKEN_LEN: usize = 16;

/// The configured token and the sessions logged in with it.
pub struct Auth {
    token: String,
    /// Session id → when it was made (its login).
    sessions: Mutex<HashMap<String, Instant>>,
    /// How long a session lasts from its login.
    max_age: Duration,
}

/// Who made a request, as the audit log names them: how they
/// authenticated and from which address (`token@127.0.0.1:5040`,
/// `session:1a2b3c4d@…`, `anonymous@…` without `--auth-token-file`).
#[derive(Clone, Debug)]
pub struct Who(pub String);

impl Auth {
    /// Reads the token from the file's first line; sessions last `max_age`.
    pub fn from_file(path: &Path, max_age: Duration) -> Result<Auth, CliError> {
        let text = std::fs::read_to_string(path).map_err(|e| {
            CliError::Other(format!(
                "cannot read --auth-token-file {}: {e}",
                path.display()
            ))
        })?;
        let token = text.lines().next().unwrap_or("").trim().to_string();
        if token.len() < MIN_TOKEN_LEN {
            return Err(CliError::Other(format!(
                "--auth-token-file {}: the token (first line) must have at least {MIN_TOKEN_LEN} characters",
                path.display()
            )));
        }
        Ok(Auth {
            token,
            sessions: Mutex::new(HashMap::new()),
            max_age,
        })
    }

    /// Whether session `id` exists and is younger than the max age; an
    /// expired one is forgotten.
    fn session_live(&self, id: &str) -> bool {
        let mut sessions = self.sessions.lock().unwrap_or_else(|p| p.into_inner());
        match sessions.get(id) {
            Some(made) if made.elapsed() < self.max_age => true,
            Some(_) => {
                sessions.remove(id);
                false
            }
            None => false,
        }
    }

    /// Records a new session, forgetting the expired ones.
    fn add_session(&self, id: String) {
        let mut sessions = self.sessions.lock().unwrap_or_else(|p| p.into_inner());
        sessions.retain(|_, made| made.elapsed() < self.max_age);
        sessions.insert(id, Instant::now());
    }

    /// How the request authenticated, or `None`.
    fn principal(&self, headers: &HeaderMap) -> Option<String> {
        let bearer = headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "));
        if bearer.is_some_and(|t| same(t.trim(), &self.token)) {
            return Some("token".to_string());
        }
        let session = cookie(headers, COOKIE)?;
        self.session_live(session)
            .then(|| format!("session:{}", &session[..8.min(session.len())]))
    }
}

/// Constant-time string comparison (the token must not leak by timing).
fn same(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// The value of cookie `name` in the `Cookie` headers.
fn cookie<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .find_map(|kv| {
            let (k, v) = kv.trim().split_once('=')?;
            (k == name).then_some(v)
        })
}

/// A fresh random session id (128 bits from the OS).
fn new_session_id() -> std::io::Result<String> {
    let mut bytes = [0u8; 16];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut bytes)?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

/// Paths served without a token: the login form, the assets, the health check.
fn is_public(path: &str) -> bool {
    path == "/healthz" || path == "/login" || path.starts_with("/assets/")
}

/// Checks the token (when one is configured) and adds [`Who`] to the request.
pub async fn require(State(state): State<Shared>, mut req: Request, next: Next) -> Response {
    let peer = req
        .extensions()
        .get::<ConnectInfo<SocketAddr>>()
        .map(|c| c.0.to_string())
        .unwrap_or_else(|| "?".to_string());
    let principal = match &state.auth {
        None => Some("anonymous".to_string()),
        Some(auth) => auth.principal(req.headers()),
    };
    let Some(principal) = principal else {
        if is_public(req.uri().path()) {
            return next.run(req).await;
        }
        let wants_html = req.method() == Method::GET && !req.uri().path().starts_with("/api/");
        return if wants_html {
            Redirect::to("/login").into_response()
        } else {
            (
                StatusCode::UNAUTHORIZED,
                [(header::WWW_AUTHENTICATE, "Bearer")],
                axum::Json(serde_json::json!({"error": "log in: send Authorization: Bearer <token> or use /login"})),
            )
                .into_response()
        };
    };
    req.extensions_mut()
        .insert(Who(format!("{principal}@{peer}")));
    next.run(req).await
}

/// `GET /login`: the token form.
pub async fn login_page(State(state): State<Shared>) -> Html<String> {
    Html(login_html(state.auth.is_some(), None))
}

fn login_html(enabled: bool, error: Option<&str>) -> String {
    let body = if enabled {
        format!(
            r#"<h1>Log in</h1>{err}
<form method="post" action="/login" id="login" class="login">
<label>Access token <input type="password" name="token" autocomplete="current-password" autofocus required></label>
<button type="submit">Log in</button>
</form>
<p class="muted small">The token is in the file given to <code>--auth-token-file</code>. Scripts send <code>Authorization: Bearer &lt;token&gt;</code> instead.</p>"#,
            err = error
                .map(|e| format!(r#"<p class="banner bad" id="login-error">{}</p>"#, html(e)))
                .unwrap_or_default()
        )
    } else {
        r#"<h1>No login needed</h1><p>This dashboard runs without <code>--auth-token-file</code>. <a href="/">Queues</a></p>"#.to_string()
    };
    pages::layout("Log in", &body)
}

#[derive(Deserialize)]
pub struct LoginForm {
    token: String,
}

/// `POST /login`: a right token gets a session cookie and goes to `/`.
pub async fn login(State(state): State<Shared>, Form(form): Form<LoginForm>) -> Response {
    let Some(auth) = &state.auth else {
        return Redirect::to("/").into_response();
    };
    if !same(form.token.trim(), &auth.token) {
        tracing::warn!(target: "audit", action = "login", ok = false, "dashboard login refused: wrong token");
        return (
            StatusCode::UNAUTHORIZED,
            Html(login_html(true, Some("Wrong token."))),
        )
            .into_response();
    }
    let id = match new_session_id() {
        Ok(id) => id,
        Err(e) => {
            return (
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("cannot make a session id: {e}"),
            )
                .into_response()
        }
    };
    auth.add_session(id.clone());
    tracing::info!(target: "audit", action = "login", ok = true, session = &id[..8], "dashboard login");
    (
        StatusCode::SEE_OTHER,
        [
            (header::LOCATION, "/".to_string()),
            (
                header::SET_COOKIE,
                format!(
                    "{COOKIE}={id}; Path=/; HttpOnly; SameSite=Strict; Max-Age={}",
                    auth.max_age.as_secs()
                ),
            ),
        ],
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    #[test]
    fn token_and_cookie_parsing() {
        assert!(same("abc", "abc"));
        assert!(!same("abc", "abd"));
        assert!(!same("abc", "abcd"));
        let mut h = HeaderMap::new();
        h.insert(
            header::COOKIE,
            HeaderValue::from_static("a=1; queue_dashboard_session=xyz; b=2"),
        );
        assert_eq!(cookie(&h, COOKIE), Some("xyz"));
        assert_eq!(cookie(&h, "c"), None);
        assert!(is_public("/assets/app.js") && !is_public("/api/overview"));
    }
}
