//! Compile-time parsing of `timeout = "..."` strings.

/// Units accepted in duration strings, with their length in milliseconds.
/// `ms` comes before `m` so the longer suffix wins.
const UNITS: &[(&str, u64)] = &[("ms", 1), ("s", 1_000), ("m", 60_000), ("h", 3_600_000)];

/// Parses a duration such as `"500ms"`, `"30s"`, `"5m"`, `"1h"` or a sum of
/// parts such as `"1m30s"` into milliseconds.
///
/// Rejects empty strings, whitespace, missing or unknown units, a zero total
/// and values that overflow `u64` milliseconds. The error is a sentence to
/// show the user.
pub(crate) fn parse_millis(text: &str) -> Result<u64, String> {
    const HINT: &str =
        "expected a number followed by a unit (ms, s, m, h), e.g. \"30s\" or \"1m30s\"";

    if text.is_empty() {
        return Err(format!("empty timeout: {HINT}"));
    }
    if text.chars().any(char::is_whitespace) {
        return Err(format!(
            "invalid timeout {text:?}: whitespace is not allowed; {HINT}"
        ));
    }

    let mut rest = text;
    let mut total: u64 = 0;
    while !rest.is_empty() {
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        if digits == 0 {
            return Err(format!("invalid timeout {text:?}: {HINT}"));
        }
        let (number, after) = rest.split_at(digits);
        let letters = after.bytes().take_while(u8::is_ascii_alphabetic).count();
        let (unit, after) = after.split_at(letters);
        if unit.is_empty() {
            return Err(if after.is_empty() {
                format!(
                    "invalid timeout {text:?}: missing unit, write e.g. \"{number}s\" for seconds"
                )
            } else {
                format!("invalid timeout {text:?}: {HINT}")
            });
        }
        let Some(&(_, unit_ms)) = UNITS.iter().find(|(name, _)| *name == unit) else {
            return Err(format!(
                "invalid timeout {text:?}: unknown unit `{unit}`, expected one of ms, s, m, h"
            ));
        };
        let too_large = || format!("timeout {text:?} is too large");
        let value: u64 = number.parse().map_err(|_| too_large())?;
        let part = value.checked_mul(unit_ms).ok_or_else(too_large)?;
        total = total.checked_add(part).ok_or_else(too_large)?;
        rest = after;
    }

    if total == 0 {
        return Err(format!(
            "timeout {text:?} is zero: use a positive duration, or leave `timeout` out for no limit"
        ));
    }
    Ok(total)
}

#[cfg(test)]
mod tests {
    use super::parse_millis;

    #[test]
    fn single_units() {
        assert_eq!(parse_millis("500ms"), Ok(500));
        assert_eq!(parse_millis("30s"), Ok(30_000));
        assert_eq!(parse_millis("5m"), Ok(300_000));
        assert_eq!(parse_millis("1h"), Ok(3_600_000));
        assert_eq!(parse_millis("1ms"), Ok(1));
        assert_eq!(parse_millis("007s"), Ok(7_000));
    }

    #[test]
    fn compound() {
        assert_eq!(parse_millis("1m30s"), Ok(90_000));
        assert_eq!(parse_millis("1h0m5s250ms"), Ok(3_605_250));
        assert_eq!(parse_millis("0s1ms"), Ok(1));
    }

    #[test]
    fn rejects_zero() {
        for zero in ["0s", "0ms", "0h", "0m0s"] {
            let err = parse_millis(zero).unwrap_err();
            assert!(err.contains("is zero"), "{zero}: {err}");
        }
    }

    #[test]
    fn rejects_garbage() {
        for bad in [
            "", "s", "abc", "30", "30 s", " 30s", "30sec", "30S", "-5s", "1.5s", "30s!", "s30",
            "30ss",
        ] {
            assert!(parse_millis(bad).is_err(), "{bad:?} was accepted");
        }
        assert!(parse_millis("30").unwrap_err().contains("missing unit"));
        assert!(parse_millis("30sec")
            .unwrap_err()
            .contains("unknown unit `sec`"));
        assert!(parse_millis("1 s").unwrap_err().contains("whitespace"));
    }

    #[test]
    fn rejects_overflow() {
        let max_ms = u64::MAX.to_string();
        assert_eq!(parse_millis(&format!("{max_ms}ms")), Ok(u64::MAX));
        for big in [
            format!("{max_ms}s"),
            "99999999999999999999999ms".to_string(),
            format!("{max_ms}ms1ms"),
        ] {
            let err = parse_millis(&big).unwrap_err();
            assert!(err.contains("too large"), "{big}: {err}");
        }
    }
}
