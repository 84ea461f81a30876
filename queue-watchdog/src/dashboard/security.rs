//! Request safety: every request must carry an allowed `Host` (against DNS
//! rebinding), every response gets security headers, and a mutating request
//! must come from the dashboard's own page (custom header, same origin).

use std::net::SocketAddr;

use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::Shared;

/// The header the dashboard's own script sends with every mutating request.
pub const CSRF_HEADER: &str = "x-queue-dashboard";

pub fn allowed_hosts(local: SocketAddr, extra: &[String]) -> Vec<String> {
    let mut hosts = vec![
        "localhost".to_string(),
        "127.0.0.1".to_string(),
        "[::1]".to_string(),
    ];
    let ip = match local.ip() {
        std::net::IpAddr::V6(v6) => format!("[{v6}]"),
        v4 => v4.to_string(),
    };
    if !local.ip().is_unspecified() {
        hosts.push(ip);
    }
    hosts.extend(extra.iter().map(|h| h.to_ascii_lowercase()));
    hosts
}

/// Host check (DNS rebinding) on every request, and security headers on every response.
pub async fn guard(State(state): State<Shared>, req: Request, next: Next) -> Response {
    let host = req
        .headers()
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .unwrap_or("")
        .to_ascii_lowercase();
    let name = strip_port(&host);
    if !state.allowed_hosts.iter().any(|h| h == name) {
        return (
            StatusCode::MISDIRECTED_REQUEST,
            format!("host {host:?} is not allowed (use --allow-host)"),
        )
            .into_response();
    }
    let mut resp = next.run(req).await;
    let h = resp.headers_mut();
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(
            "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; \
             connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
        ),
    );
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    h.entry(header::CACHE_CONTROL)
        .or_insert(HeaderValue::from_static("no-store"));
    resp
}

/// `host:port` → `host` (`[::1]:9090` → `[::1]`).
fn strip_port(host: &str) -> &str {
    if host.starts_with('[') {
        return host.split_inclusive(']').next().unwrap_or(host);
    }
    host.split(':').next().unwrap_or(host)
}

/// Cross-site protection for mutating requests.
pub fn check_same_origin(headers: &HeaderMap) -> std::result::Result<(), &'static str> {
    if headers.get(CSRF_HEADER).is_none() {
        return Err("missing X-Queue-Dashboard header: mutating requests come from the dashboard's own page");
    }
    if let Some(site) = headers.get("sec-fetch-site").and_then(|v| v.to_str().ok()) {
        if site != "same-origin" && site != "none" {
            return Err("cross-site request refused (Sec-Fetch-Site)");
        }
    }
    if let Some(origin) = headers.get(header::ORIGIN).and_then(|v| v.to_str().ok()) {
        let host = headers
            .get(header::HOST)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("");
        let expected = [format!("http://{host}"), format!("https://{host}")];
        if !expected.iter().any(|e| e.eq_ignore_ascii_case(origin)) {
            return Err("cross-origin request refused (Origin)");
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(*k, HeaderValue::from_str(v).unwrap());
        }
        h
    }

    #[test]
    fn same_origin_rules() {
        assert!(check_same_origin(&headers(&[("host", "127.0.0.1:9090")])).is_err());
        assert!(
            check_same_origin(&headers(&[("host", "127.0.0.1:9090"), (CSRF_HEADER, "1")])).is_ok()
        );
        assert!(check_same_origin(&headers(&[
            ("host", "127.0.0.1:9090"),
            (CSRF_HEADER, "1"),
            ("origin", "http://127.0.0.1:9090"),
            ("sec-fetch-site", "same-origin"),
        ]))
        .is_ok());
        assert!(check_same_origin(&headers(&[
            ("host", "127.0.0.1:9090"),
            (CSRF_HEADER, "1"),
            ("origin", "http://evil.example"),
        ]))
        .is_err());
        assert!(check_same_origin(&headers(&[
            ("host", "127.0.0.1:9090"),
            (CSRF_HEADER, "1"),
            ("sec-fetch-site", "cross-site"),
        ]))
        .is_err());
    }

    #[test]
    fn host_names() {
        assert_eq!(strip_port("127.0.0.1:9090"), "127.0.0.1");
        assert_eq!(strip_port("[::1]:9090"), "[::1]");
        assert_eq!(strip_port("localhost"), "localhost");
        let hosts = allowed_hosts("127.0.0.2:1".parse().unwrap(), &["Queue.Example".into()]);
        assert!(hosts.contains(&"127.0.0.2".to_string()));
        assert!(hosts.contains(&"queue.example".to_string()));
    }
}
