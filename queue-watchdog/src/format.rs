//! Small formatting helpers shared by the CLI and the dashboard: timestamps,
//! durations, hash fields, payload decoding.

use queue_core::admin::parse_ms;

/// `1733144701123` → `2024-12-02 13:05:01.123Z` (UTC, from Redis-clock milliseconds).
pub fn fmt_ts(ms: i64) -> String {
    let secs = ms.div_euclid(1000);
    let millis = ms.rem_euclid(1000);
    let days = secs.div_euclid(86_400);
    let sod = secs.rem_euclid(86_400);
    let (y, m, d) = civil_from_days(days);
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02}.{millis:03}Z",
        sod / 3600,
        (sod / 60) % 60,
        sod % 60
    )
}

/// Days since 1970-01-01 → (year, month, day), proleptic Gregorian (H. Hinnant).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (if m <= 2 { y + 1 } else { y }, m, d)
}

/// A duration in ms as `850ms`, `12.3s`, `4m05s`, `3h02m`, `2d04h`.
pub fn fmt_dur(ms: u64) -> String {
    let s = ms / 1000;
    if ms < 1000 {
        format!("{ms}ms")
    } else if s < 60 {
        format!("{:.1}s", ms as f64 / 1000.0)
    } else if s < 3600 {
        format!("{}m{:02}s", s / 60, s % 60)
    } else if s < 86_400 {
        format!("{}h{:02}m", s / 3600, (s / 60) % 60)
    } else {
        format!("{}d{:02}h", s / 86_400, (s / 3600) % 24)
    }
}

/// `ts` relative to `now` (both ms): `12.3s ago` or `in 4m05s`. Any two
/// values (a hand-edited timestamp of `i64::MIN`): the distance is taken
/// without overflow (before, `now - ts` overflowed: a panic in a debug build).
pub fn fmt_rel(ts: i64, now: i64) -> String {
    let distance = fmt_dur(ts.abs_diff(now));
    if ts <= now {
        format!("{distance} ago")
    } else {
        format!("in {distance}")
    }
}

/// Job hash fields that hold a Redis-clock timestamp in ms.
pub const TIMESTAMP_FIELDS: &[&str] = &[
    "enqueued_at",
    "delivered_at",
    "lease_until",
    "failed_at",
    "run_at",
    "dead_at",
    "replayed_at",
    "finished_at",
    "cancel_requested",
];

/// The MessagePack payload as JSON when it decodes, else `{"hex": ...}`.
pub fn payload_json(bytes: &[u8]) -> serde_json::Value {
    if bytes.is_empty() {
        return serde_json::Value::Null;
    }
    use serde::Deserialize;
    let mut de = rmp_serde::Deserializer::new(std::io::Cursor::new(bytes));
    let decoded = serde_json::Value::deserialize(&mut de)
        .ok()
        .filter(|_| de.get_ref().position() == bytes.len() as u64);
    match decoded {
        Some(v) => v,
        None => {
            let hex: String = bytes.iter().take(512).map(|b| format!("{b:02x}")).collect();
            serde_json::json!({ "undecodable_msgpack_hex": hex, "bytes": bytes.len() })
        }
    }
}

/// A hash field for display: timestamps become `UTC time (ms)`; control
/// characters are escaped ([`printable`]).
pub fn display_field(name: &str, value: &str) -> String {
    if let Some(json) = typed_result_json(value) {
        return format!("{json} (MessagePack)");
    }
    if TIMESTAMP_FIELDS.contains(&name) {
        if let Some(ms) = parse_ms(value) {
            return format!("{} ({value})", fmt_ts(ms));
        }
    }
    printable(value).into_owned()
}

/// Text read from Redis (an error message, a job type, a worker name, a job
/// id) made safe for a terminal: control characters (an ESC sequence that
/// would rewrite the operator's screen, a newline that would break a
/// line-per-job listing), format characters (bidi overrides and isolates
/// such as U+202E, which reorder the rest of the line as shown: "Trojan
/// Source"; zero-width characters) and the line and paragraph separators
/// U+2028/U+2029 are written as escapes (`\u{1b}`, `\n`, `\u{202e}`). Text
/// without any is returned as it is.
pub fn printable(s: &str) -> std::borrow::Cow<'_, str> {
    if !s.chars().any(escaped) {
        return std::borrow::Cow::Borrowed(s);
    }
    std::borrow::Cow::Owned(
        s.chars()
            .map(|c| {
                if escaped(c) {
                    c.escape_default().collect()
                } else {
                    c.to_string()
                }
            })
            .collect(),
    )
}

/// Whether [`printable`] escapes `c`: general category Cc (`char::is_control`),
/// Cf ([`FORMAT`]), Zl or Zp (U+2028, U+2029).
fn escaped(c: char) -> bool {
    c.is_control()
        || c == '\u{2028}'
        || c == '\u{2029}'
        || FORMAT.iter().any(|&(lo, hi)| (lo..=hi).contains(&c))
}

/// The code points of general category Cf (format), as of Unicode 18 (the
/// table of the unicode-properties crate); a later Unicode version adding
/// one would leave it unescaped until it is added here.
const FORMAT: &[(char, char)] = &[
    ('\u{ad}', '\u{ad}'),
    ('\u{600}', '\u{605}'),
    ('\u{61c}', '\u{61c}'),
    ('\u{6dd}', '\u{6dd}'),
    ('\u{70f}', '\u{70f}'),
    ('\u{890}', '\u{891}'),
    ('\u{8e2}', '\u{8e2}'),
    ('\u{180e}', '\u{180e}'),
    ('\u{200b}', '\u{200f}'),
    ('\u{202a}', '\u{202e}'),
    ('\u{2060}', '\u{2064}'),
    ('\u{2066}', '\u{206f}'),
    ('\u{feff}', '\u{feff}'),
    ('\u{fff9}', '\u{fffb}'),
    ('\u{110bd}', '\u{110bd}'),
    ('\u{110cd}', '\u{110cd}'),
    ('\u{13430}', '\u{1343f}'),
    ('\u{1bca0}', '\u{1bca3}'),
    ('\u{1d173}', '\u{1d17a}'),
    ('\u{e0001}', '\u{e0001}'),
    ('\u{e0020}', '\u{e007f}'),
];

/// `ctx.progress(n, message)` of a running job (docs/RESULTS.md), from its
/// fields: `50 — half way (at 2026-…Z)`; `None` when it reported none.
pub fn progress_line<'a>(field: impl Fn(&str) -> Option<&'a str>) -> Option<String> {
    let done = field("progress")?;
    let mut line = done.to_string();
    if let Some(msg) = field("progress_message").filter(|m| !m.is_empty()) {
        line.push_str(&format!(" — {msg}"));
    }
    if let Some(ms) = field("progress_at").and_then(parse_ms) {
        line.push_str(&format!(" (at {})", fmt_ts(ms)));
    }
    Some(line)
}

/// A typed job result as the completion record reads (`msgpack:<hex>`,
/// docs/RESULTS.md), decoded to JSON; `None` for any other value.
pub fn typed_result_json(value: &str) -> Option<serde_json::Value> {
    let hex = value.strip_prefix("msgpack:")?;
    let bytes = (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(hex.get(i..i + 2)?, 16).ok())
        .collect::<Option<Vec<u8>>>()?;
    Some(payload_json(&bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn typed_results_read_as_json() {
        // {"n": 7} as MessagePack.
        assert_eq!(
            display_field("result", "msgpack:81a16e07"),
            r#"{"n":7} (MessagePack)"#
        );
        assert_eq!(display_field("result", "invoice-7"), "invoice-7");
    }

    #[test]
    fn timestamps_are_utc_iso() {
        assert_eq!(fmt_ts(0), "1970-01-01 00:00:00.000Z");
        assert_eq!(fmt_ts(951_782_400_000), "2000-02-29 00:00:00.000Z");
        assert_eq!(fmt_ts(1_733_144_701_123), "2024-12-02 13:05:01.123Z");
    }

    #[test]
    fn durations_read_well() {
        assert_eq!(fmt_dur(850), "850ms");
        assert_eq!(fmt_dur(12_340), "12.3s");
        assert_eq!(fmt_dur(245_000), "4m05s");
        assert_eq!(fmt_dur(3 * 3600 * 1000 + 120_000), "3h02m");
        assert_eq!(fmt_rel(1000, 3000), "2.0s ago");
        assert_eq!(fmt_rel(3000, 1000), "in 2.0s");
    }

    /// A timestamp at either end of i64 (a hand edit) is shown, not a
    /// panic: before, `now - ts` overflowed.
    #[test]
    fn a_relative_time_of_any_timestamp_does_not_overflow() {
        let now = 1_733_144_701_123;
        assert_eq!(fmt_rel(i64::MIN, now), "106752011226d20h ago");
        assert_eq!(fmt_rel(i64::MAX, now), "in 106751971107d18h");
        assert_eq!(fmt_rel(i64::MAX, i64::MIN), "in 213503982334d14h");
        assert_eq!(fmt_rel(i64::MIN, i64::MAX), "213503982334d14h ago");
    }

    #[test]
    fn timestamp_fields_read_as_utc() {
        assert_eq!(
            display_field("enqueued_at", "1000"),
            "1970-01-01 00:00:01.000Z (1000)"
        );
        assert_eq!(display_field("type", "send"), "send");
        assert_eq!(
            display_field("dead_reason", "bad\u{1b}[2J\nline"),
            "bad\\u{1b}[2J\\nline"
        );
        assert!(matches!(printable("plain"), std::borrow::Cow::Borrowed(_)));
    }

    /// Bidi overrides and isolates, other format characters and the line and
    /// paragraph separators are escaped like control characters: a job id
    /// `a\u{202e}b` would otherwise reverse the rest of the operator's line.
    #[test]
    fn format_characters_and_separators_are_escaped() {
        assert_eq!(printable("a\u{202e}b"), "a\\u{202e}b");
        assert_eq!(
            printable("\u{2066}x\u{2069}\u{200b}\u{feff}\u{e0041}"),
            "\\u{2066}x\\u{2069}\\u{200b}\\u{feff}\\u{e0041}"
        );
        assert_eq!(printable("a\u{2028}b\u{2029}c"), "a\\u{2028}b\\u{2029}c");
        // Not format characters: letters of any script, marks, U+2065 (unassigned).
        for s in [
            "é", "日本", "ع", "e\u{301}", "\u{2065}", "\u{2027}", "\u{202f}",
        ] {
            assert!(
                matches!(printable(s), std::borrow::Cow::Borrowed(_)),
                "{s:?}"
            );
        }
    }

    #[test]
    fn payloads_decode_or_show_hex() {
        #[derive(serde::Serialize)]
        struct P {
            email: String,
        }
        let bytes = rmp_serde::to_vec_named(&P {
            email: "a@b".into(),
        })
        .unwrap();
        assert_eq!(payload_json(&bytes), serde_json::json!({"email": "a@b"}));
        assert!(payload_json(&[0xc1])
            .get("undecodable_msgpack_hex")
            .is_some());
    }
}
