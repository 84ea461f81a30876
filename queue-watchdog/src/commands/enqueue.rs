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

/// `--run-at`: RFC 3339 or Unix milliseconds.
pub fn parse_run_at(text: &str) -> std::result::Result<SystemTime, String> {
    let text = text.trim();
    if let Ok(ms) = text.parse::<u64>() {
        return Ok(UNIX_EPOCH + Duration::from_millis(ms));
    }
    let at = chrono::DateTime::parse_from_rfc3339(text).map_err(|e| {
        format!("{text:?}: expected RFC 3339 (2030-01-02T03:04:05Z) or Unix milliseconds: {e}")
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
    }
}
