//! `fencelock run --once-per SLOT`: the name of the slot a job runs once in.
//!
//! `day` and `hour` name the current UTC day (`2026-11-23`) or hour
//! (`2026-11-23T14`); anything else is the slot's name as given. The wall
//! clock only *names* the slot: whether it ran, and for how long that is
//! remembered, is the server's (its monotonic clock), never this host's.

/// The slot `arg` names at `unix_secs` (seconds since 1970, UTC).
pub fn slot_name(arg: &str, unix_secs: u64) -> String {
    let days = i64::try_from(unix_secs / 86_400).unwrap_or(i64::MAX / 2);
    let (y, m, d) = civil_from_days(days);
    match arg {
        "day" => format!("{y:04}-{m:02}-{d:02}"),
        "hour" => format!("{y:04}-{m:02}-{d:02}T{:02}", unix_secs % 86_400 / 3600),
        other => other.to_string(),
    }
}

/// The slot `arg` names now.
#[allow(clippy::disallowed_methods)] // the wall clock names the slot; it decides no expiry
pub fn slot_now(arg: &str) -> String {
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
    slot_name(arg, now)
}

/// The proleptic Gregorian (year, month, day) of `days` since 1970-01-01
/// (Howard Hinnant's `civil_from_days`).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Rule: `day` and `hour` are the UTC day and hour of the instant, leap
    /// days and year ends included; any other text is the slot itself.
    #[test]
    fn day_and_hour_name_the_utc_slot_and_other_text_is_kept() {
        // 2026-11-23T14:05:00Z
        let t = 1_795_442_700;
        assert_eq!(slot_name("day", t), "2026-11-23");
        assert_eq!(slot_name("hour", t), "2026-11-23T14");
        assert_eq!(slot_name("day", 0), "1970-01-01");
        // 2024-02-29T23:59:59Z, then the next second.
        assert_eq!(slot_name("hour", 1_709_251_199), "2024-02-29T23");
        assert_eq!(slot_name("day", 1_709_251_200), "2024-03-01");
        assert_eq!(slot_name("day", 1_798_761_599), "2026-12-31");
        assert_eq!(slot_name("2026-W48", t), "2026-W48");
    }
}
