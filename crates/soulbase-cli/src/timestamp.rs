//! Timestamps for people: RFC 3339 in UTC (`2026-11-25T10:04:05.123Z`), or with
//! `--local` in the system's time zone (`2026-11-25T11:04:05.123+01:00`).
//!
//! Text output shows instants this way; `--json` keeps the raw Unix milliseconds.

/// Which clock text output shows instants in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Zone {
    /// UTC (`Z`), the default.
    Utc,
    /// The system's local time zone (`TZ`, else `/etc/localtime`), with its offset.
    Local,
}

/// `ms` (Unix milliseconds) as RFC 3339 in `zone`, with milliseconds.
pub fn human(ms: i64, zone: Zone) -> String {
    match zone {
        Zone::Utc => rfc3339_utc(ms),
        Zone::Local => rfc3339_at_offset(ms, local_offset_s(ms)),
    }
}

/// The local time zone's offset from UTC at `ms`, in seconds east, as the C
/// library's `localtime_r` computes it (daylight saving included); 0 when it
/// cannot tell.
#[allow(unsafe_code)]
fn local_offset_s(ms: i64) -> i64 {
    // 64-bit Linux: `time_t` is an `i64`.
    let secs: libc::time_t = ms.div_euclid(1_000);
    // SAFETY: `tm` is a plain C struct for which all-zero bytes are a valid value;
    // `localtime_r` only reads `secs` and writes `tm` (both live for the call) and is
    // the reentrant form, safe beside other threads; a null return leaves `tm` unused.
    unsafe {
        let mut tm: libc::tm = std::mem::zeroed();
        if libc::localtime_r(&secs, &mut tm).is_null() {
            return 0;
        }
        tm.tm_gmtoff
    }
}

/// `ms` as RFC 3339 at a fixed `offset_s` from UTC (`Z` for 0).
fn rfc3339_at_offset(ms: i64, offset_s: i64) -> String {
    if offset_s == 0 {
        return rfc3339_utc(ms);
    }
    let local = rfc3339_utc(ms + offset_s * 1_000);
    let sign = if offset_s < 0 { '-' } else { '+' };
    let abs = offset_s.abs();
    format!(
        "{}{sign}{:02}:{:02}",
        local.trim_end_matches('Z'),
        abs / 3_600,
        abs / 60 % 60
    )
}

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
    fn offsets_are_written_after_the_local_time() {
        assert_eq!(rfc3339_at_offset(0, 3_600), "1970-01-01T01:00:00.000+01:00");
        assert_eq!(
            rfc3339_at_offset(0, -(5 * 3_600 + 30 * 60)),
            "1969-12-31T18:30:00.000-05:30"
        );
        assert_eq!(rfc3339_at_offset(1, 0), "1970-01-01T00:00:00.001Z");
        // The local zone of this process: the same instant, whatever its offset.
        let shown = human(1_790_000_000_123, Zone::Local);
        assert!(shown.starts_with("2026-09-2"), "{shown}");
    }

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
