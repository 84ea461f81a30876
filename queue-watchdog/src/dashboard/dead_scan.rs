//! Reading a (possibly huge) dead-letter list in bounded pieces for the
//! dashboard: `Admin::scan_dead` reads at most 1000 entries per call and
//! filters them inside Redis, so a 100k-entry list never blocks Redis and a
//! page never reads the whole list. Used by the paged dead-letter page
//! (`dead_page.rs`) and bulk actions (`bulk.rs`).

pub use queue_core::admin::DeadRow;
use queue_core::admin::{DeadReasons, DeadScanQuery, DEAD_SCAN_CHUNK};
use serde::{Deserialize, Serialize};

use super::AppState;
use crate::error::CliError;

/// Which dead letters a page or bulk action selects. Empty: all of them.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
pub struct DeadFilter {
    /// Job type, exact.
    #[serde(default, rename = "type")]
    pub job_type: Option<String>,
    /// Text the dead reason (last error) contains, case-insensitive.
    #[serde(default)]
    pub contains: Option<String>,
}

impl DeadFilter {
    /// The filter without blank parts (an empty form field means "any").
    pub fn normalized(self) -> DeadFilter {
        let keep = |s: Option<String>| s.map(|s| s.trim().to_string()).filter(|s| !s.is_empty());
        DeadFilter {
            job_type: keep(self.job_type),
            contains: keep(self.contains).map(|s| s.to_lowercase()),
        }
    }

    /// No condition: every dead letter.
    pub fn is_empty(&self) -> bool {
        self.job_type.is_none() && self.contains.is_none()
    }

    /// For the audit log and the page: `type=… contains=…` or `all`.
    pub fn describe(&self) -> String {
        let mut parts = Vec::new();
        if let Some(t) = &self.job_type {
            parts.push(format!("type={t}"));
        }
        if let Some(c) = &self.contains {
            parts.push(format!("error contains {c:?}"));
        }
        if parts.is_empty() {
            "all".to_string()
        } else {
            parts.join(", ")
        }
    }
}

/// What one scan found.
pub struct Scan {
    /// Matching rows, in list order (newest first).
    pub rows: Vec<DeadRow>,
    /// The list position to continue from, `None` at the end of the list.
    pub next: Option<u64>,
    /// Entries read.
    pub scanned: u64,
    /// Length of the dead-letter list when the scan began.
    pub total: u64,
}

/// Reads the dead-letter list of `queue` from position `from`, keeping rows
/// that match `filter`, until `want` rows are found, `max_scan` entries were
/// read, or the list ends. Each call to Redis reads at most
/// [`DEAD_SCAN_CHUNK`] entries and filters them there
/// (`Admin::scan_dead_rows`); each row's reason comes back as a preview
/// (its first 200 characters, `…` marking a cut: the page's listing line),
/// not whole.
pub async fn scan(
    state: &AppState,
    queue: &str,
    filter: &DeadFilter,
    from: u64,
    want: usize,
    max_scan: u64,
) -> Result<Scan, CliError> {
    scan_with(
        state,
        queue,
        (filter, DeadReasons::Preview),
        from,
        want,
        max_scan,
        |r| r,
    )
    .await
}

/// [`scan`] sending back `reasons` of each row (a bulk selection asks for
/// none: it keeps ids and `dead_at`), each row passed through `shape` as its
/// chunk arrives (at most one chunk's rows are held at a time).
pub async fn scan_with(
    state: &AppState,
    queue: &str,
    (filter, reasons): (&DeadFilter, DeadReasons),
    from: u64,
    want: usize,
    max_scan: u64,
    shape: impl Fn(DeadRow) -> DeadRow,
) -> Result<Scan, CliError> {
    let (mut rows, mut pos, mut scanned) = (Vec::new(), from, 0u64);
    let mut total = 0;
    while rows.len() < want && scanned < max_scan {
        let query = DeadScanQuery {
            from: pos,
            count: DEAD_SCAN_CHUNK.min(max_scan - scanned),
            job_type: filter.job_type.as_deref(),
            contains: filter.contains.as_deref(),
            want: (want - rows.len()) as u64,
            reasons,
        };
        let chunk = state.admin.scan_dead_rows(queue, &query).await?;
        total = chunk.total;
        scanned += chunk.read;
        pos += chunk.read;
        rows.extend(chunk.rows.into_iter().map(&shape));
        if chunk.read == 0 || pos >= total {
            return Ok(Scan {
                rows,
                next: None,
                scanned,
                total,
            });
        }
    }
    Ok(Scan {
        rows,
        next: (pos < total).then_some(pos),
        scanned,
        total,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blank_filter_parts_mean_any() {
        let f = DeadFilter {
            job_type: Some(" render ".into()),
            contains: Some("TimeOut".into()),
        }
        .normalized();
        assert_eq!(f.job_type.as_deref(), Some("render"));
        assert_eq!(f.contains.as_deref(), Some("timeout"));
        assert_eq!(f.describe(), "type=render, error contains \"timeout\"");
        let any = DeadFilter {
            job_type: Some("".into()),
            contains: None,
        }
        .normalized();
        assert!(any.is_empty());
        assert_eq!(any.describe(), "all");
    }
}
