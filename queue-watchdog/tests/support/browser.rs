//! The dashboard tests' harness: start the dashboard binary, plain HTTP
//! requests, and a tiny DevTools client driving Debian's headless Chromium
//! (navigate, evaluate, click, full-page screenshots into `target/tmp` and,
//! with `QUEUE_UPDATE_SCREENSHOTS=1`, `docs/images`). Included by
//! `dashboard.rs` and `dashboard_oncall.rs` with `#[path]`.
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use base64::Engine;
use queue_testkit::RedisServer;
use serde_json::{json, Value};

pub const BIN: &str = env!("CARGO_BIN_EXE_queue-watchdog");

// ------------------------------------------------------------- helpers ----

pub fn find_chromium() -> Option<PathBuf> {
    if let Ok(p) = std::env::var("CHROMIUM") {
        return Some(PathBuf::from(p));
    }
    for name in ["chromium", "chromium-browser", "google-chrome"] {
        for dir in std::env::var("PATH").unwrap_or_default().split(':') {
            let p = Path::new(dir).join(name);
            if p.is_file() {
                return Some(p);
            }
        }
    }
    None
}

/// The browser for a test, or `None` (and a `SKIPPED` line) when there is
/// none; with `QUEUE_REQUIRE_CHROMIUM=1` a missing browser fails the test.
pub fn chromium_or_skip(test: &str) -> Option<PathBuf> {
    let found = find_chromium();
    if found.is_none() {
        let msg = format!(
            "SKIPPED {test}: no chromium found (apt-get install chromium, or set CHROMIUM)"
        );
        assert!(
            std::env::var("QUEUE_REQUIRE_CHROMIUM").as_deref() != Ok("1"),
            "{msg}; QUEUE_REQUIRE_CHROMIUM=1 makes this a failure"
        );
        eprintln!("{msg}");
    }
    found
}

/// Kills a child process we started when dropped.
pub struct Guard(pub Child);
impl Drop for Guard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// One HTTP/1.1 request over a fresh connection; returns (status, body).
pub fn http(port: u16, method: &str, path: &str, headers: &[(&str, &str)]) -> (u16, String) {
    let (status, _, body) = http_full(port, method, path, headers, "");
    (status, body)
}

/// One HTTP/1.1 request with a body; returns (status, response head, body).
pub fn http_full(
    port: u16,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> (u16, String, String) {
    let mut s = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(120))).unwrap();
    let mut req = format!(
        "{method} {path} HTTP/1.1\r\nConnection: close\r\nContent-Length: {}\r\n",
        body.len()
    );
    if !headers.iter().any(|(k, _)| k.eq_ignore_ascii_case("host")) {
        req.push_str(&format!("Host: 127.0.0.1:{port}\r\n"));
    }
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    req.push_str(body);
    s.write_all(req.as_bytes()).unwrap();
    // Read the head, then Content-Length bytes (Chromium's DevTools server
    // keeps the connection open), or to the end.
    let mut r = BufReader::new(s);
    let mut head = String::new();
    loop {
        let mut line = String::new();
        if r.read_line(&mut line).unwrap() == 0 || line == "\r\n" {
            break;
        }
        head.push_str(&line);
    }
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let length = head.lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        k.eq_ignore_ascii_case("content-length")
            .then(|| v.trim().parse::<usize>().ok())?
    });
    let mut body = Vec::new();
    match length {
        Some(n) => {
            body.resize(n, 0);
            r.read_exact(&mut body).unwrap();
        }
        None => {
            r.read_to_end(&mut body).unwrap();
        }
    }
    (status, head, String::from_utf8_lossy(&body).into_owned())
}

/// Starts `queue-watchdog dashboard --redis <url> --listen 127.0.0.1:0 <args>`
/// and reads the port it printed; the guard stops it.
pub fn start_dashboard(url: &str, args: &[&str]) -> (Guard, u16) {
    let mut dash = Command::new(BIN)
        .args(["dashboard", "--redis", url, "--listen", "127.0.0.1:0"])
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("start dashboard");
    let mut line = String::new();
    BufReader::new(dash.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let guard = Guard(dash);
    let port: u16 = line
        .trim()
        .trim_end_matches('/')
        .rsplit(':')
        .next()
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("no address in {line:?}"));
    (guard, port)
}

pub fn redis(server: &RedisServer, args: &[&str]) -> String {
    server.command(args).expect("redis command")
}

pub fn screenshot_dirs() -> Vec<PathBuf> {
    let mut dirs = vec![PathBuf::from(env!("CARGO_TARGET_TMPDIR"))];
    if std::env::var("QUEUE_UPDATE_SCREENSHOTS").as_deref() == Ok("1") {
        dirs.push(Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/images"));
    }
    dirs
}

// ------------------------------------------- a tiny DevTools client ----

pub type Socket = tungstenite::WebSocket<tungstenite::stream::MaybeTlsStream<TcpStream>>;

pub struct Browser {
    _child: Guard,
    _profile: TempDir,
    page: Socket,
    next_id: u64,
}

pub struct TempDir(PathBuf);
impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

impl Browser {
    pub fn launch(chromium: &Path) -> Browser {
        let profile = std::env::temp_dir().join(format!(
            "queue-dashboard-chromium-{}-{}",
            std::process::id(),
            queue_testkit::free_port().unwrap()
        ));
        std::fs::create_dir_all(&profile).unwrap();
        let child = Command::new(chromium)
            .args([
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-quic",
                "--no-first-run",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--disable-dev-shm-usage",
                "--hide-scrollbars",
                "--remote-debugging-port=0",
                "--window-size=1280,900",
            ])
            .arg(format!("--user-data-dir={}", profile.display()))
            .arg("about:blank")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start chromium");
        let child = Guard(child);
        // Chromium writes its DevTools port to the profile directory.
        let port_file = profile.join("DevToolsActivePort");
        let deadline = Instant::now() + Duration::from_secs(30);
        let port: u16 = loop {
            if let Ok(text) = std::fs::read_to_string(&port_file) {
                if let Some(p) = text.lines().next().and_then(|l| l.trim().parse().ok()) {
                    break p;
                }
            }
            assert!(
                Instant::now() < deadline,
                "chromium did not open its DevTools port"
            );
            std::thread::sleep(Duration::from_millis(100));
        };
        let ws_url = loop {
            let (_, body) = http(port, "GET", "/json/list", &[]);
            let targets: Value = serde_json::from_str(&body).unwrap_or(Value::Null);
            let page = targets.as_array().and_then(|a| {
                a.iter()
                    .find(|t| t["type"] == "page")
                    .and_then(|t| t["webSocketDebuggerUrl"].as_str().map(str::to_string))
            });
            if let Some(u) = page {
                break u;
            }
            assert!(Instant::now() < deadline, "no page target: {body}");
            std::thread::sleep(Duration::from_millis(100));
        };
        let (page, _) = tungstenite::connect(ws_url.as_str()).expect("DevTools websocket");
        if let tungstenite::stream::MaybeTlsStream::Plain(s) = page.get_ref() {
            s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
        }
        let mut b = Browser {
            _child: child,
            _profile: TempDir(profile),
            page,
            next_id: 1,
        };
        b.call("Page.enable", json!({}));
        b.call("Runtime.enable", json!({}));
        b.call(
            "Emulation.setDeviceMetricsOverride",
            json!({"width": 1280, "height": 900, "deviceScaleFactor": 1, "mobile": false}),
        );
        b
    }

    pub fn call(&mut self, method: &str, params: Value) -> Value {
        match self.try_call(method, params) {
            Ok(v) => v,
            Err(e) => panic!("{method} failed: {e}"),
        }
    }

    /// [`call`](Self::call), the protocol error returned instead of a panic.
    fn try_call(&mut self, method: &str, params: Value) -> Result<Value, Value> {
        let id = self.next_id;
        self.next_id += 1;
        let msg = json!({"id": id, "method": method, "params": params}).to_string();
        self.page
            .send(tungstenite::Message::text(msg))
            .expect("send to chromium");
        loop {
            let m = self.page.read().expect("read from chromium");
            let tungstenite::Message::Text(text) = m else {
                continue;
            };
            let v: Value = serde_json::from_str(text.as_str()).unwrap();
            if v["id"] == id {
                if let Some(e) = v.get("error") {
                    return Err(e.clone());
                }
                return Ok(v["result"].clone());
            }
        }
    }

    /// Evaluates `expr` in the page (promises awaited) and returns its value.
    pub fn eval(&mut self, expr: &str) -> Value {
        let r = self.call(
            "Runtime.evaluate",
            json!({"expression": expr, "returnByValue": true, "awaitPromise": true}),
        );
        if let Some(e) = r.get("exceptionDetails") {
            panic!("page script failed: {expr}\n{e}");
        }
        r["result"]["value"].clone()
    }

    /// Polls `expr` until it is truthy. A poll that lands while the page
    /// navigates (a form submit, a reload: Chromium answers "Inspected
    /// target navigated or closed" or that the context is gone) counts as
    /// not yet, and the next poll runs in the new page.
    pub fn wait_for(&mut self, what: &str, expr: &str) -> Value {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let params = json!({"expression": expr, "returnByValue": true, "awaitPromise": true});
            let v = match self.try_call("Runtime.evaluate", params) {
                Ok(r) => {
                    if let Some(e) = r.get("exceptionDetails") {
                        panic!("page script failed: {expr}\n{e}");
                    }
                    r["result"]["value"].clone()
                }
                Err(e) if e["code"] == json!(-32000) && Instant::now() < deadline => Value::Null,
                Err(e) => panic!("Runtime.evaluate failed: {e}"),
            };
            let truthy =
                !matches!(v, Value::Null | Value::Bool(false)) && v != json!(0) && v != json!("");
            if truthy {
                return v;
            }
            if Instant::now() > deadline {
                let text = self.eval("document.body ? document.body.innerText : ''");
                panic!("timed out waiting for {what} ({expr}); page text:\n{text}");
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    pub fn goto(&mut self, url: &str) {
        self.call("Page.navigate", json!({"url": url}));
        self.wait_for(
            &format!("{url} to load"),
            &format!(
                "location.href === {} && document.readyState === 'complete' && !!(window.dashboardState && window.dashboardState.ready)",
                json!(url)
            ),
        );
    }

    pub fn text(&mut self, selector: &str) -> String {
        self.eval(&format!(
            "(document.querySelector({0}) || {{innerText: ''}}).innerText",
            json!(selector)
        ))
        .as_str()
        .unwrap_or("")
        .to_string()
    }

    /// A real mouse click (trusted input events) in the middle of `selector`.
    pub fn click(&mut self, selector: &str) {
        let rect = self.eval(&format!(
            "(() => {{ const e = document.querySelector({0}); if (!e) return null; \
             e.scrollIntoView({{block: 'center'}}); const r = e.getBoundingClientRect(); \
             return {{x: r.x + r.width / 2, y: r.y + r.height / 2}}; }})()",
            json!(selector)
        ));
        assert!(!rect.is_null(), "nothing matches {selector}");
        for kind in ["mousePressed", "mouseReleased"] {
            self.call(
                "Input.dispatchMouseEvent",
                json!({"type": kind, "x": rect["x"], "y": rect["y"], "button": "left", "clickCount": 1}),
            );
        }
    }

    /// A full-page PNG, saved as `name` in each screenshot directory.
    pub fn screenshot(&mut self, name: &str) {
        let metrics = self.call("Page.getLayoutMetrics", json!({}));
        let height = metrics["cssContentSize"]["height"]
            .as_f64()
            .unwrap_or(900.0)
            .ceil()
            .max(900.0);
        let shot = self.call(
            "Page.captureScreenshot",
            json!({"format": "png", "captureBeyondViewport": true,
                   "clip": {"x": 0, "y": 0, "width": 1280, "height": height, "scale": 1}}),
        );
        let png = base64::engine::general_purpose::STANDARD
            .decode(shot["data"].as_str().expect("screenshot data"))
            .expect("base64 PNG");
        assert!(png.starts_with(b"\x89PNG"), "not a PNG");
        for dir in screenshot_dirs() {
            std::fs::create_dir_all(&dir).unwrap();
            let path = dir.join(name);
            std::fs::write(&path, &png).unwrap();
            eprintln!("screenshot: {}", path.display());
        }
    }
}
