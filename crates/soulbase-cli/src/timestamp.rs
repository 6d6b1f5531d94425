//! Timestamps for people: RFC 3339 in UTC (`2026-11-25T10:04:05.123Z`).
//!
//! Text output shows instants this way; `--json` keeps the raw Unix milliseconds.
//! Only UTC is offered: the workspace has no time-zone database, and a local time
//! would need one.

/// `ms` (Unix milliseconds) as RFC 3339 in UTC, with milliseconds.
pub fn rfc3339_utc(ms: i64) -> String {
    let days = ms.div_euclid(86_400_000);
    let in_day = ms.rem_euclid(86_400_000);
    let (year, month, day) = civil_from_days(days);
    let (hour, minute) = (in_day / 3_600_000, in_day / 60_000 % 60);
    let (second, milli) = (in_day / 1_000 % 60, in_day % 1_000);
    format!("{year:04}-{month:02}-{day:02}T{hour:02}:{minute:02}:{second:02}.{milli:03}Z")
}

/// The proleptic Gregorian (year, month, day) of a day number (days since
/// 1970-01-01), after Howard Hinnant's `civil_from_days`.
fn civil_from_days(days: i64) -> (i64, i64, i64) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097); // [0, 146096]
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365; // [0, 399]
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100); // [0, 365]
    let mp = (5 * doy + 2) / 153; // [0, 11], March first
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_known_instants() {
        assert_eq!(rfc3339_utc(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(rfc3339_utc(1), "1970-01-01T00:00:00.001Z");
        assert_eq!(rfc3339_utc(-1), "1969-12-31T23:59:59.999Z");
        // `date -u -d @1790000000.123 +%FT%T.%3NZ`
        assert_eq!(rfc3339_utc(1_790_000_000_123), "2026-09-21T14:13:20.123Z");
        // Leap days, a century that is not a leap year, and one that is.
        assert_eq!(rfc3339_utc(1_709_164_800_000), "2024-02-29T00:00:00.000Z");
        assert_eq!(rfc3339_utc(4_107_542_400_000), "2100-03-01T00:00:00.000Z");
        assert_eq!(rfc3339_utc(951_782_400_000), "2000-02-29T00:00:00.000Z");
        assert_eq!(rfc3339_utc(253_402_300_799_999), "9999-12-31T23:59:59.999Z");
    }

    #[test]
    fn every_day_follows_the_previous_one() {
        // Day by day over four centuries: the calendar never skips or repeats a day.
        let mut prev = civil_from_days(-146_097);
        for d in -146_096..146_097 {
            let (y, m, day) = civil_from_days(d);
            let (py, pm, pday) = prev;
            let next_day = (y, m, day) == (py, pm, pday + 1);
            let next_month = (y, m, day) == (py, pm + 1, 1) && pm < 12;
            let next_year = (y, m, day) == (py + 1, 1, 1) && pm == 12 && pday == 31;
            assert!(
                next_day || next_month || next_year,
                "{prev:?} -> {:?}",
                (y, m, day)
            );
            prev = (y, m, day);
        }
    }
}
