//! UTC calendar arithmetic for the ledger's days, budget periods and report timestamps, on the
//! `time` crate. Every function is total: a time outside the calendar `time` supports (years
//! −9999..=9999) is clamped to its ends, which no real clock reaches.

use time::{Date, Month, OffsetDateTime};

const DAY_MS: i64 = 86_400_000;
const UNIX_EPOCH: Date = OffsetDateTime::UNIX_EPOCH.date();

/// The UTC date-time of a Unix-milliseconds instant, clamped to `time`'s calendar.
fn date_time(unix_ms: i64) -> OffsetDateTime {
    let nanos = i128::from(unix_ms) * 1_000_000;
    OffsetDateTime::from_unix_timestamp_nanos(nanos).unwrap_or(if unix_ms < 0 {
        Date::MIN.midnight().assume_utc()
    } else {
        Date::MAX
            .with_hms(23, 59, 59)
            .map_or(OffsetDateTime::UNIX_EPOCH, |t| t.assume_utc())
    })
}

fn clamp_ms(ms: u64) -> i64 {
    i64::try_from(ms).unwrap_or(i64::MAX)
}

/// Days since 1970-01-01 → (year, month, day), proleptic Gregorian.
pub fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let date = date_time(days.saturating_mul(DAY_MS)).date();
    (
        i64::from(date.year()),
        u32::from(u8::from(date.month())),
        u32::from(date.day()),
    )
}

/// (year, month, day) → days since 1970-01-01; `None` for a date the calendar does not have
/// (2026-02-30) or outside `time`'s years.
pub fn days_from_civil(y: i64, m: u32, d: u32) -> Option<i64> {
    let month = Month::try_from(u8::try_from(m).ok()?).ok()?;
    let date =
        Date::from_calendar_date(i32::try_from(y).ok()?, month, u8::try_from(d).ok()?).ok()?;
    Some(i64::from(date.to_julian_day()) - i64::from(UNIX_EPOCH.to_julian_day()))
}

/// `YYYY-MM-DD` for a Unix-milliseconds time.
pub fn day(unix_ms: u64) -> String {
    let (y, m, d) = civil_from_days(clamp_ms(unix_ms).div_euclid(DAY_MS));
    format!("{y:04}-{m:02}-{d:02}")
}

/// RFC 3339 at second precision: `YYYY-MM-DDTHH:MM:SSZ`.
pub fn rfc3339(unix_ms: u64) -> String {
    let t = date_time(clamp_ms(unix_ms));
    format!(
        "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}Z",
        t.year(),
        u8::from(t.month()),
        t.day(),
        t.hour(),
        t.minute(),
        t.second()
    )
}

/// Start (Unix ms, negative before 1970) of a `YYYY-MM-DD` UTC day; anything else (including
/// 2026-02-30) is `None`.
pub fn day_start_ms(text: &str) -> Option<i64> {
    let b = text.as_bytes();
    let well_formed = b.len() == 10
        && b[4] == b'-'
        && b[7] == b'-'
        && b.iter()
            .enumerate()
            .all(|(i, c)| i == 4 || i == 7 || c.is_ascii_digit());
    if !well_formed {
        return None;
    }
    let days = days_from_civil(
        text[0..4].parse().ok()?,
        text[5..7].parse().ok()?,
        text[8..10].parse().ok()?,
    )?;
    Some(days * DAY_MS)
}

/// Start (Unix ms) of the UTC month containing `unix_ms`.
pub fn month_start_ms(unix_ms: u64) -> u64 {
    let days = clamp_ms(unix_ms).div_euclid(DAY_MS);
    let (_, _, d) = civil_from_days(days);
    u64::try_from((days - i64::from(d) + 1) * DAY_MS).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn days_round_trip_and_refuse_what_the_calendar_lacks() {
        for days in [-1_000_000, -1, 0, 1, 11_016, 20_788, 2_932_896] {
            let (y, m, d) = civil_from_days(days);
            assert_eq!(days_from_civil(y, m, d), Some(days), "{days}");
        }
        assert_eq!(day_start_ms("2000-02-29"), Some(951_782_400_000));
        assert_eq!(day_start_ms("1969-12-31"), Some(-86_400_000));
        for bad in [
            "2026-02-30",
            "2026-13-01",
            "2026-00-10",
            "2026-1-01",
            "20260101xx",
        ] {
            assert_eq!(day_start_ms(bad), None, "{bad}");
        }
        assert_eq!(rfc3339(u64::MAX), "9999-12-31T23:59:59Z");
        assert_eq!(day(u64::MAX), "9999-12-31");
    }
}
