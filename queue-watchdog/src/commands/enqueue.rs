//! `enqueue`: one job from the command line. The JSON arguments become the
//! MessagePack a Rust handler decodes (what `rmp_serde::to_vec_named` of the
//! handler's serde type would have produced: maps with field names, enums
//! externally tagged, `null` as nil, integers as integers), then
//! `Queue::enqueue_raw` writes it through the enqueue script like any Rust
//! producer (docs/PROTOCOL.md).

use std::io::Read;
use std::process::ExitCode;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use queue_core::{EnqueueOptions, EnqueueOutcome, Queue};

use crate::cli::EnqueueArgs;
use crate::error::{CliError, Result};

pub async fn enqueue(url: &str, args: EnqueueArgs) -> Result<ExitCode> {
    let text = if args.json == "-" {
        let mut text = String::new();
        std::io::stdin()
            .read_to_string(&mut text)
            .map_err(|e| CliError::Other(format!("cannot read the JSON from stdin: {e}")))?;
        text
    } else {
        args.json.clone()
    };
    let payload = json_to_msgpack(&text).map_err(|e| {
        CliError::Other(format!(
            "job type {:?} on queue {:?}: {e}",
            args.job_type, args.queue
        ))
    })?;
    let mut opts = EnqueueOptions::new();
    if let Some(id) = &args.id {
        opts = opts.id(id.as_str());
    }
    if let Some(delay) = args.delay {
        opts = opts.delay(delay);
    }
    if let Some(at) = args.run_at {
        opts = opts.run_at(at);
    }
    let queue = Queue::connect(url).await?;
    let done = queue
        .enqueue_raw(
            &args.queue,
            &args.job_type,
            args.schema_version,
            args.max_attempts,
            opts,
            &payload,
        )
        .await?;
    match done.outcome {
        EnqueueOutcome::Created => println!("created {}", done.id),
        EnqueueOutcome::Duplicate { state } => println!("duplicate {} state={state}", done.id),
        EnqueueOutcome::AlreadyCompleted => println!("already-completed {}", done.id),
    }
    Ok(ExitCode::SUCCESS)
}

/// JSON text → the MessagePack bytes `rmp_serde::to_vec_named` writes for
/// the same value: serde's data model is shared, so a JSON document shaped
/// like a type's `serde_json` form decodes as that type from these bytes.
/// Integers stay integers (a `u64` up to 2^64-1, negatives as `i64`), numbers
/// with a fraction or exponent become float64.
pub fn json_to_msgpack(text: &str) -> std::result::Result<Vec<u8>, String> {
    let value: serde_json::Value =
        serde_json::from_str(text).map_err(|e| format!("the --json argument is not JSON: {e}"))?;
    rmp_serde::to_vec_named(&value).map_err(|e| format!("cannot encode the payload: {e}"))
}

/// `--delay`: a number with a unit (`ms`, `s`, `m`, `h`, `d`).
pub fn parse_delay(text: &str) -> std::result::Result<Duration, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .ok_or_else(|| format!("{text:?}: give a unit (500ms, 30s, 5m, 2h, 1d)"))?;
    let (n, unit) = text.split_at(split);
    let n: u64 = n
        .parse()
        .map_err(|_| format!("{text:?}: expected a whole number before the unit"))?;
    let ms_per = match unit {
        "ms" => 1,
        "s" => 1000,
        "m" => 60_000,
        "h" => 3_600_000,
        "d" => 86_400_000,
        other => return Err(format!("{text:?}: unknown unit {other:?} (ms, s, m, h, d)")),
    };
    n.checked_mul(ms_per)
        .map(Duration::from_millis)
        .ok_or_else(|| format!("{text:?}: too long"))
}

/// Bare Unix milliseconds `--run-at` takes: from 1973-03-03 up to the year
/// 5138. A smaller number is Unix seconds taken for milliseconds (a date in
/// 1970: the job ran at once), a bigger one microseconds or nanoseconds.
const BARE_MS: std::ops::Range<u64> = 100_000_000_000..100_000_000_000_000;

/// `--run-at`: RFC 3339, or Unix time with its unit (`1700000000s`,
/// `1700000000000ms`), or a bare number of Unix milliseconds within
/// [`BARE_MS`]: a bare number in seconds (or micro-, nanoseconds) is refused
/// saying so. Before, `1700000000` (seconds) was taken as milliseconds, a
/// time in January 1970: the job ran at once, without a word.
pub fn parse_run_at(text: &str) -> std::result::Result<SystemTime, String> {
    let text = text.trim();
    let unix = |digits: &str, ms_per: u64| {
        digits
            .parse::<u64>()
            .ok()
            .and_then(|n| n.checked_mul(ms_per))
            .map(|ms| UNIX_EPOCH + Duration::from_millis(ms))
    };
    if let Some(at) = text.strip_suffix("ms").and_then(|d| unix(d, 1)) {
        return Ok(at);
    }
    if let Some(at) = text.strip_suffix('s').and_then(|d| unix(d, 1000)) {
        return Ok(at);
    }
    if let Ok(n) = text.parse::<u64>() {
        if BARE_MS.contains(&n) {
            return Ok(UNIX_EPOCH + Duration::from_millis(n));
        }
        let unit = if n < BARE_MS.start {
            "Unix seconds"
        } else {
            "micro- or nanoseconds"
        };
        return Err(format!(
            "{text:?}: a bare number is Unix milliseconds, and this one looks like {unit}; \
             give the unit (`{text}s`, `{text}ms`) or an RFC 3339 time"
        ));
    }
    let at = chrono::DateTime::parse_from_rfc3339(text).map_err(|e| {
        format!(
            "{text:?}: expected RFC 3339 (2030-01-02T03:04:05Z), Unix seconds (1700000000s) \
             or Unix milliseconds (1700000000000 or 1700000000000ms): {e}"
        )
    })?;
    let ms = u64::try_from(at.timestamp_millis())
        .map_err(|_| format!("{text:?}: before 1970 is not a run time"))?;
    Ok(UNIX_EPOCH + Duration::from_millis(ms))
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, UNIX_EPOCH};

    use serde::Deserialize;

    use super::{json_to_msgpack, parse_delay, parse_run_at};

    #[derive(Debug, PartialEq, Deserialize)]
    enum Shape {
        Dot,
        Circle(f64),
        Rect { w: u32, h: u32 },
        Pair(i8, i8),
    }

    #[derive(Debug, PartialEq, Deserialize)]
    struct Args {
        big: u64,
        neg: i64,
        ratio: f64,
        flag: bool,
        name: Option<String>,
        shapes: Vec<Shape>,
    }

    #[test]
    fn json_becomes_the_messagepack_a_serde_type_decodes() {
        let bytes = json_to_msgpack(
            r#"{"big": 1099511627776, "neg": -3, "ratio": 2, "flag": true, "name": null,
                "shapes": ["Dot", {"Circle": 1.5}, {"Rect": {"w": 2, "h": 3}}, {"Pair": [1, -1]}]}"#,
        )
        .unwrap();
        let args: Args = rmp_serde::from_slice(&bytes).unwrap();
        assert_eq!(
            args,
            Args {
                big: 1 << 40,
                neg: -3,
                ratio: 2.0,
                flag: true,
                name: None,
                shapes: vec![
                    Shape::Dot,
                    Shape::Circle(1.5),
                    Shape::Rect { w: 2, h: 3 },
                    Shape::Pair(1, -1)
                ],
            }
        );
        assert!(json_to_msgpack("{oops").unwrap_err().contains("not JSON"));
    }

    #[test]
    fn delays_and_run_times_parse() {
        assert_eq!(parse_delay("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_delay("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_delay("2h"), Ok(Duration::from_secs(7200)));
        assert!(parse_delay("30").is_err() && parse_delay("3x").is_err());
        assert_eq!(
            parse_run_at("1700000000000"),
            Ok(UNIX_EPOCH + Duration::from_millis(1_700_000_000_000))
        );
        assert_eq!(
            parse_run_at("2023-11-14T22:13:20Z"),
            Ok(UNIX_EPOCH + Duration::from_millis(1_700_000_000_000))
        );
        assert!(parse_run_at("tomorrow").is_err());
        // Seconds given where milliseconds are expected are refused (they
        // were a time in January 1970: the job ran at once); with a unit
        // both are taken.
        let seconds = parse_run_at("1700000000").unwrap_err();
        assert!(
            seconds.contains("Unix seconds") && seconds.contains("1700000000s"),
            "{seconds}"
        );
        assert!(parse_run_at("1700000000000000")
            .unwrap_err()
            .contains("micro"));
        assert_eq!(
            parse_run_at("1700000000s"),
            Ok(UNIX_EPOCH + Duration::from_millis(1_700_000_000_000))
        );
        assert_eq!(
            parse_run_at("1700000000000ms"),
            Ok(UNIX_EPOCH + Duration::from_millis(1_700_000_000_000))
        );
        assert_eq!(parse_run_at("0s"), Ok(UNIX_EPOCH));
        assert!(parse_run_at("12xs").is_err() && parse_run_at("s").is_err());
    }
}
