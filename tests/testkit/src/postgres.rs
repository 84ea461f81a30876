//! PostgreSQL for tests: which server to use, whether it answers, throwaway
//! table names and schemas, and cleanup through `psql`.
//!
//! Unlike Redis, PostgreSQL is not started per test: tests share one server
//! (`DATABASE_URL`, default [`DEFAULT_URL`]) and isolate themselves by using
//! their own tables ([`unique_name`]), dropped by a [`DropTable`] guard even
//! when the test panics. No client library is needed here: the test brings
//! its own driver, and cleanup shells out to `psql`.
//!
//! ```
//! use queue_testkit::postgres;
//! let a = postgres::unique_name("outbox");
//! let b = postgres::unique_name("outbox");
//! assert!(a.starts_with("outbox_") && a != b);
//! assert_eq!(
//!     postgres::host_port("postgres://u:p@db.local:6543/app?sslmode=disable"),
//!     Some(("db.local".to_string(), 6543))
//! );
//! ```

use std::net::{TcpStream, ToSocketAddrs};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The server used when `DATABASE_URL` is not set.
pub const DEFAULT_URL: &str = "postgres://postgres@127.0.0.1:5432/test";

/// Set this variable to `1` to skip PostgreSQL tests when no server answers
/// (instead of failing them).
pub const SKIP_VAR: &str = "QUEUE_TEST_SKIP_POSTGRES";

static COUNTER: AtomicU32 = AtomicU32::new(0);

/// `DATABASE_URL`, or [`DEFAULT_URL`].
pub fn database_url() -> String {
    std::env::var("DATABASE_URL")
        .ok()
        .filter(|s| !s.trim().is_empty())
        .unwrap_or_else(|| DEFAULT_URL.to_string())
}

/// Host and port of a `postgres://` / `postgresql://` URL (port 5432 when
/// absent). `None` for other forms (`host=... port=...`) or a Unix socket.
pub fn host_port(url: &str) -> Option<(String, u16)> {
    let rest = url
        .strip_prefix("postgres://")
        .or_else(|| url.strip_prefix("postgresql://"))?;
    let authority = rest.split(['/', '?']).next()?;
    let hostport = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    if hostport.is_empty() {
        return None;
    }
    // [v6]:port or host:port or host
    let (host, port) = if let Some(v6) = hostport.strip_prefix('[') {
        let (h, tail) = v6.split_once(']')?;
        (h.to_string(), tail.strip_prefix(':'))
    } else {
        match hostport.rsplit_once(':') {
            Some((h, p)) => (h.to_string(), Some(p)),
            None => (hostport.to_string(), None),
        }
    };
    let port = match port {
        Some(p) => p.parse().ok()?,
        None => 5432,
    };
    Some((host, port))
}

/// True when a TCP connection to the URL's host and port succeeds within a
/// second (it does not log in). URLs [`host_port`] cannot read count as reachable.
pub fn reachable(url: &str) -> bool {
    let Some((host, port)) = host_port(url) else {
        return true;
    };
    let Ok(addrs) = (host.as_str(), port).to_socket_addrs() else {
        return false;
    };
    addrs
        .into_iter()
        .any(|addr| TcpStream::connect_timeout(&addr, Duration::from_secs(1)).is_ok())
}

/// The database URL for a test, or `None` when the test should be skipped.
///
/// Panics with instructions when no server answers, unless
/// `QUEUE_TEST_SKIP_POSTGRES=1` is set: then it prints a note and returns `None`.
pub fn require() -> Option<String> {
    let url = database_url();
    if reachable(&url) {
        return Some(url);
    }
    if std::env::var(SKIP_VAR)
        .map(|v| v == "1" || v == "true")
        .unwrap_or(false)
    {
        eprintln!(
            "skipping: no PostgreSQL answers at {} ({SKIP_VAR} is set)",
            redact(&url)
        );
        return None;
    }
    panic!(
        "no PostgreSQL answers at {}: start one, point DATABASE_URL at one, \
         or set {SKIP_VAR}=1 to skip these tests",
        redact(&url)
    );
}

/// A table (or other object) name no other test uses: `<prefix>_<pid>_<n>_<time>`,
/// lower-case ASCII, at most 40 bytes for a prefix of at most 12.
pub fn unique_name(prefix: &str) -> String {
    let n = COUNTER.fetch_add(1, Ordering::SeqCst);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.subsec_nanos() ^ (d.as_secs() as u32))
        .unwrap_or(0);
    format!("{prefix}_{}_{n}_{nanos:08x}", std::process::id())
}

/// Runs SQL through `psql` (`ON_ERROR_STOP`, unaligned, tuples only) and
/// returns its standard output.
pub fn psql(url: &str, sql: &str) -> std::io::Result<String> {
    let bin = std::env::var("PSQL").unwrap_or_else(|_| "psql".to_string());
    let out = Command::new(&bin)
        .arg(url)
        .args(["-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1", "-c", sql])
        .stdin(Stdio::null())
        .output()
        .map_err(|e| std::io::Error::new(e.kind(), format!("cannot run `{bin}`: {e}")))?;
    if !out.status.success() {
        return Err(std::io::Error::other(format!(
            "psql failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Drops a table when dropped (also when the test panics), through `psql`.
/// Errors are printed, not raised: cleanup must not hide the test's result.
/// It waits at most 10 s for locks (a session of the test still holding one).
#[derive(Debug)]
pub struct DropTable {
    url: String,
    table: String,
}

impl DropTable {
    /// Guards `table` (a plain identifier, e.g. from [`unique_name`]).
    pub fn new(url: &str, table: &str) -> Self {
        DropTable {
            url: url.to_string(),
            table: table.to_string(),
        }
    }

    /// The guarded table's name.
    pub fn table(&self) -> &str {
        &self.table
    }
}

impl Drop for DropTable {
    fn drop(&mut self) {
        let quoted = self
            .table
            .split('.')
            .map(|p| format!("\"{}\"", p.replace('"', "\"\"")))
            .collect::<Vec<_>>()
            .join(".");
        if let Err(e) = psql(
            &self.url,
            &format!("SET lock_timeout = '10s'; DROP TABLE IF EXISTS {quoted}"),
        ) {
            eprintln!("warning: could not drop test table {}: {e}", self.table);
        }
    }
}

/// A schema no other test uses, dropped with everything in it when the guard
/// is dropped (also when the test panics). Its [`url`](Self::url) connects
/// with `search_path` set to the schema, so code that uses plain table names
/// (a default `queue_outbox` or `queue_inbox` table, an `orders` table) runs
/// unchanged against throwaway tables: what runnable doc examples need.
///
/// ```
/// use queue_testkit::postgres::with_search_path;
/// assert_eq!(
///     with_search_path("postgres://u@h/db?sslmode=disable", "s1"),
///     "postgres://u@h/db?sslmode=disable&options=-csearch_path%3Ds1"
/// );
/// assert_eq!(with_search_path("host=h dbname=db", "s1"), "host=h dbname=db options=-csearch_path=s1");
/// ```
#[derive(Debug)]
pub struct TempSchema {
    base_url: String,
    name: String,
    url: String,
}

impl TempSchema {
    /// Creates a schema named by [`unique_name`] on the server at `base_url`
    /// (through `psql`).
    pub fn create(base_url: &str) -> std::io::Result<Self> {
        let name = unique_name("scratch");
        psql(base_url, &format!("CREATE SCHEMA \"{name}\""))?;
        Ok(TempSchema {
            url: with_search_path(base_url, &name),
            base_url: base_url.to_string(),
            name,
        })
    }

    /// The database URL with `search_path` set to this schema.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The schema's name.
    pub fn name(&self) -> &str {
        &self.name
    }
}

impl Drop for TempSchema {
    fn drop(&mut self) {
        if let Err(e) = psql(
            &self.base_url,
            &format!(
                "SET lock_timeout = '10s'; DROP SCHEMA IF EXISTS \"{}\" CASCADE",
                self.name
            ),
        ) {
            eprintln!("warning: could not drop test schema {}: {e}", self.name);
        }
    }
}

/// `url` with the server option `search_path=<schema>` added (`schema` a
/// plain identifier): a query parameter for a `postgres://` URL, a
/// `key=value` pair for the other form.
pub fn with_search_path(url: &str, schema: &str) -> String {
    if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        let sep = if url.contains('?') { '&' } else { '?' };
        format!("{url}{sep}options=-csearch_path%3D{schema}")
    } else {
        format!("{url} options=-csearch_path={schema}")
    }
}

/// The URL without its password.
pub fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            let userinfo = &url[scheme + 3..at];
            let user = userinfo.split(':').next().unwrap_or("");
            format!("{}://{user}@{}", &url[..scheme], &url[at + 1..])
        }
        _ => url.to_string(),
    }
}
