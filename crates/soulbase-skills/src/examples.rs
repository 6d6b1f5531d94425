//! Builtin handlers for the example skills in the repository's `skills/` folder:
//! `zodiac` (a provider exporting `calculate_zodiac` and the free accessor
//! `get_chart_snapshot`) and `jungastro` (a consumer that imports
//! `calculate_zodiac` and interprets its chart). Small but real: the sun sign is
//! exact by date; the moon sign follows the mean sidereal month from a known
//! epoch; the rising sign uses the two-hours-per-sign rule of thumb from sunrise.

use serde_json::{Value, json};
use soulbase_errors::{ErrorCode, SoulError};
use soulbase_sandbox::{BuiltinExecutor, handler_fn};

use crate::model::Date;

const SIGNS: [&str; 12] = [
    "aries",
    "taurus",
    "gemini",
    "cancer",
    "leo",
    "virgo",
    "libra",
    "scorpio",
    "sagittarius",
    "capricorn",
    "aquarius",
    "pisces",
];

/// The handler names (the tool ids) this module registers.
pub const HANDLERS: [&str; 3] = [
    "skills.zodiac.calculate_zodiac",
    "skills.zodiac.get_chart_snapshot",
    "skills.jungastro.interpret_chart",
];

fn bad(msg: impl Into<String>) -> SoulError {
    SoulError::new(ErrorCode::SchemaValidationFailed, msg.into())
}

/// The tropical sun sign of a month and day.
pub fn sun_sign(month: u32, day: u32) -> &'static str {
    // The day each sign starts, from Capricorn's end in January.
    const STARTS: [(u32, u32, usize); 12] = [
        (1, 20, 10),
        (2, 19, 11),
        (3, 21, 0),
        (4, 20, 1),
        (5, 21, 2),
        (6, 21, 3),
        (7, 23, 4),
        (8, 23, 5),
        (9, 23, 6),
        (10, 23, 7),
        (11, 22, 8),
        (12, 22, 9),
    ];
    let mut sign = 9; // Capricorn until January 19
    for (m, d, s) in STARTS {
        if (month, day) >= (m, d) {
            sign = s;
        }
    }
    SIGNS[sign]
}

/// An approximate moon sign: mean sidereal month from the 2000-01-06 new moon.
fn moon_sign(date: Date) -> &'static str {
    const EPOCH: i64 = 10_962; // 2000-01-06, days since 1970-01-01
    const EPOCH_LONGITUDE: f64 = 285.0; // the moon near 15° Capricorn
    let days = (date.days - EPOCH) as f64;
    let lon = (EPOCH_LONGITUDE + days * 360.0 / 27.321_661).rem_euclid(360.0);
    SIGNS[(lon / 30.0) as usize % 12]
}

/// The rising sign by the rule of thumb: the sun's sign rises at 06:00, and the
/// ascendant moves one sign every two hours.
fn rising_sign(sun: &str, hh: u32, mm: u32) -> &'static str {
    let sun_idx = SIGNS.iter().position(|s| *s == sun).unwrap_or(0);
    let minutes = (hh * 60 + mm + 24 * 60 - 6 * 60) % (24 * 60);
    SIGNS[(sun_idx + (minutes / 120) as usize) % 12]
}

fn parse_date(s: &str) -> Result<(Date, u32, u32), SoulError> {
    let date = Date::parse(s).ok_or_else(|| bad(format!("birth_date {s:?} is not YYYY-MM-DD")))?;
    let mut it = s.split('-').skip(1);
    let month = it.next().and_then(|m| m.parse().ok()).unwrap_or(1);
    let day = it.next().and_then(|d| d.parse().ok()).unwrap_or(1);
    Ok((date, month, day))
}

fn parse_time(s: &str) -> Result<(u32, u32), SoulError> {
    let (h, m) = s
        .split_once(':')
        .ok_or_else(|| bad("birth_time must be HH:MM"))?;
    let (h, m): (u32, u32) = (
        h.parse().map_err(|_| bad("birth_time must be HH:MM"))?,
        m.parse().map_err(|_| bad("birth_time must be HH:MM"))?,
    );
    if h > 23 || m > 59 {
        return Err(bad("birth_time must be a time of day"));
    }
    Ok((h, m))
}

/// Computes a chart for `args` (`birth_date`, optional `birth_time`, `birth_place`).
pub fn calculate(args: &Value) -> Result<Value, SoulError> {
    let date = args
        .get("birth_date")
        .and_then(Value::as_str)
        .ok_or_else(|| bad("birth_date is required"))?;
    let (d, month, day) = parse_date(date)?;
    let (hh, mm) = match args.get("birth_time").and_then(Value::as_str) {
        Some(t) => parse_time(t)?,
        None => (12, 0),
    };
    let sun = sun_sign(month, day);
    let moon = moon_sign(d);
    let rising = rising_sign(sun, hh, mm);
    Ok(json!({
        "sun_sign": sun,
        "moon_sign": moon,
        "rising_sign": rising,
        "chart": {
            "birth_date": date,
            "birth_time": format!("{hh:02}:{mm:02}"),
            "birth_place": args.get("birth_place").cloned().unwrap_or(Value::Null),
        },
    }))
}

/// The Jungian reading of a chart's three signs.
pub fn interpret(args: &Value) -> Result<Value, SoulError> {
    let sign = |k: &str| {
        args.get(k)
            .and_then(Value::as_str)
            .filter(|s| SIGNS.contains(s))
            .ok_or_else(|| bad(format!("{k} must be a zodiac sign")))
    };
    let (sun, moon, rising) = (sign("sun_sign")?, sign("moon_sign")?, sign("rising_sign")?);
    let archetype = |s: &str| match s {
        "aries" | "leo" | "sagittarius" => "the Hero",
        "taurus" | "virgo" | "capricorn" => "the Builder",
        "gemini" | "libra" | "aquarius" => "the Sage",
        _ => "the Caregiver",
    };
    Ok(json!({
        "ego": format!("Sun in {sun}: the conscious self leans toward {}.", archetype(sun)),
        "anima": format!("Moon in {moon}: the inner life is shaped by {}.", archetype(moon)),
        "persona": format!("Rising {rising}: the face shown to the world is {}.", archetype(rising)),
    }))
}

/// The free `get_chart_snapshot`: the sun sign for `birth_date`, computed from
/// the arguments alone. Stateless on purpose: a process-wide "last chart" would
/// hand one tenant's chart to another.
fn snapshot(args: &Value) -> Result<Value, SoulError> {
    let Some(s) = args.get("birth_date").and_then(Value::as_str) else {
        return Ok(json!({}));
    };
    let (_, month, day) = parse_date(s)?;
    let mut snap = json!({ "sun_sign": sun_sign(month, day), "planets": [] });
    if args.get("include_aspects").and_then(Value::as_bool) == Some(true) {
        snap["aspects"] = json!([]);
    }
    Ok(snap)
}

/// Registers the example handlers on `builtin`.
pub fn register(builtin: &BuiltinExecutor) {
    builtin.register(
        HANDLERS[0],
        handler_fn(|args| async move { calculate(&args) }),
    );
    builtin.register(
        HANDLERS[1],
        handler_fn(|args| async move { snapshot(&args) }),
    );
    builtin.register(
        HANDLERS[2],
        handler_fn(|args| async move { interpret(&args) }),
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signs() {
        assert_eq!(sun_sign(1, 1), "capricorn");
        assert_eq!(sun_sign(1, 20), "aquarius");
        assert_eq!(sun_sign(3, 21), "aries");
        assert_eq!(sun_sign(12, 31), "capricorn");
        assert_eq!(sun_sign(7, 4), "cancer");
        let c = calculate(&json!({"birth_date": "1990-07-04", "birth_time": "06:30"})).unwrap();
        assert_eq!(c["sun_sign"], "cancer");
        assert_eq!(c["rising_sign"], "cancer");
        assert!(calculate(&json!({"birth_date": "1990-13-04"})).is_err());
        let r =
            interpret(&json!({"sun_sign": "leo", "moon_sign": "pisces", "rising_sign": "virgo"}))
                .unwrap();
        assert!(r["ego"].as_str().unwrap().contains("Hero"));
        assert!(interpret(&json!({"sun_sign": "x"})).is_err());
        assert_eq!(snapshot(&json!({})).unwrap(), json!({}));
        assert_eq!(
            snapshot(&json!({"birth_date": "1990-07-04"})).unwrap()["sun_sign"],
            "cancer"
        );
    }
}
