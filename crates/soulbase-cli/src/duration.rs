//! Durations on the command line: `90s`, `15m`, `2h`, `7d`.

/// Parses `s` (a whole number and a unit: s, m, h or d) into milliseconds; an
/// error names `flag`.
pub fn parse_millis(flag: &str, s: &str) -> Result<i64, String> {
    let (num, unit) = s.split_at(s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len()));
    let n: i64 = num
        .parse()
        .map_err(|_| format!("{flag} {s:?}: expected a number and a unit (ms, s, m, h, d)"))?;
    let per = match unit {
        "ms" => 1,
        "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        "d" => 86_400_000,
        _ => return Err(format!("{flag} {s:?}: the unit must be ms, s, m, h or d")),
    };
    Ok(n.saturating_mul(per))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn units_parse_and_garbage_is_refused_naming_the_flag() {
        assert_eq!(parse_millis("--since", "90s").unwrap(), 90_000);
        assert_eq!(parse_millis("--since", "2h").unwrap(), 7_200_000);
        assert_eq!(parse_millis("--since", "7d").unwrap(), 604_800_000);
        assert!(
            parse_millis("--since", "7w")
                .unwrap_err()
                .contains("--since")
        );
        assert!(parse_millis("--ttl", "h").unwrap_err().contains("--ttl"));
    }
}
