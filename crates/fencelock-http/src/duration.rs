//! The one grammar of durations for every binary of the workspace: command
//! line flags and config files.

use std::time::Duration;

/// A duration on a command line or in a config file: `500ms`, `15s`, `2m`,
/// `1h`, a combination such as `1m30s`, or a bare number of seconds.
/// (A `String` error, as clap's `value_parser` wants.)
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    if s.is_empty() {
        return Err("empty duration".into());
    }
    if let Ok(secs) = s.parse::<u64>() {
        return Ok(Duration::from_secs(secs));
    }
    let mut total = Duration::ZERO;
    let mut rest = s;
    while !rest.is_empty() {
        let (part, after) = next_part(s, rest)?;
        total = total.saturating_add(part);
        rest = after;
    }
    Ok(total)
}

/// The first `<number><unit>` of `rest` (a tail of `s`), and what follows it.
fn next_part<'a>(s: &str, rest: &'a str) -> Result<(Duration, &'a str), String> {
    let digits = rest.find(|c: char| !c.is_ascii_digit()).unwrap_or(rest.len());
    if digits == 0 {
        return Err(format!("invalid duration {s:?}: expected a number, e.g. 500ms, 15s, 2m, 1h"));
    }
    let n: u64 = rest[..digits].parse().map_err(|_| format!("invalid duration {s:?}: number too large"))?;
    let rest = &rest[digits..];
    let unit_len = rest.find(|c: char| c.is_ascii_digit()).unwrap_or(rest.len());
    let part = match &rest[..unit_len] {
        "ms" => Duration::from_millis(n),
        "s" => Duration::from_secs(n),
        "m" => Duration::from_secs(n.saturating_mul(60)),
        "h" => Duration::from_secs(n.saturating_mul(3600)),
        u => return Err(format!("invalid duration {s:?}: unknown unit {u:?} (use ms, s, m or h)")),
    };
    Ok((part, &rest[unit_len..]))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Rule: one duration grammar: units, combinations, bare seconds; garbage
    /// is refused with a reason.
    #[test]
    fn durations_parse_and_bad_ones_say_why() {
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("15s"), Ok(Duration::from_secs(15)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("1h"), Ok(Duration::from_secs(3600)));
        assert_eq!(parse_duration("1m30s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration(" 7 "), Ok(Duration::from_secs(7)));
        assert_eq!(parse_duration("0s"), Ok(Duration::ZERO));
        assert!(parse_duration("").unwrap_err().contains("empty"));
        assert!(parse_duration("10x").unwrap_err().contains("unknown unit"));
        assert!(parse_duration("1.5s").unwrap_err().contains("unknown unit"));
        assert!(parse_duration("s").unwrap_err().contains("expected a number"));
        assert!(parse_duration("-5s").unwrap_err().contains("expected a number"));
        assert!(parse_duration("99999999999999999999s").unwrap_err().contains("too large"));
    }
}
