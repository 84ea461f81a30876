//! `doctor`: reads the server, runs the checks, prints the report or JSON.
//! Exit 0 when safe for critical queues, 1 when a finding can lose data.

use std::process::ExitCode;

use serde_json::json;

use crate::cli::DoctorArgs;
use crate::doctor;
use crate::error::Result;

pub async fn doctor(url: &str, args: DoctorArgs) -> Result<ExitCode> {
    let facts = doctor::gather(url, args.scan_limit).await?;
    let findings = doctor::analyze(
        &facts,
        doctor::Options {
            strict: args.strict,
            max_lag_secs: args.max_lag_secs,
        },
    );
    let safe = doctor::is_safe(&findings);
    if args.json {
        println!(
            "{}",
            json!({"safe": safe, "strict": args.strict, "redis_version": facts.info.get("redis_version"),
                   "role": facts.info.get("role"), "queue_keys_checked": facts.scanned,
                   "findings": findings})
        );
    } else {
        print!("{}", doctor::render(&findings, &facts, url, args.strict));
    }
    Ok(if safe {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}
