//! Rate limits as written in configuration and skill contracts: `N/sec|min|hour|day`.

use std::fmt;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::IdError;

/// A rate such as `50/day` or `100/min`: at most `count` events per `period`.
///
/// Units: `s`/`sec`/`second`, `m`/`min`/`minute`, `h`/`hour`, `d`/`day` (plural forms too).
/// The count is at least 1; a zero rate is written by disabling the tool instead.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Rate {
    count: u64,
    period: Duration,
}

impl Rate {
    /// `count` events per `period`; `None` when either is zero.
    pub fn new(count: u64, period: Duration) -> Option<Self> {
        (count > 0 && !period.is_zero()).then_some(Self { count, period })
    }

    /// Parses `N/unit`.
    pub fn parse(s: &str) -> Result<Self, IdError> {
        let bad = |reason| IdError::new("rate", s, reason);
        let (n, unit) = s
            .split_once('/')
            .ok_or_else(|| bad("must look like N/sec, N/min, N/hour or N/day"))?;
        let count: u64 = n
            .trim()
            .parse()
            .map_err(|_| bad("the count must be a whole number"))?;
        let secs = match unit.trim() {
            "s" | "sec" | "secs" | "second" | "seconds" => 1,
            "m" | "min" | "mins" | "minute" | "minutes" => 60,
            "h" | "hour" | "hours" => 3_600,
            "d" | "day" | "days" => 86_400,
            _ => return Err(bad("the unit must be sec, min, hour or day")),
        };
        Self::new(count, Duration::from_secs(secs))
            .ok_or_else(|| bad("the count must be at least 1"))
    }

    /// How many events the rate allows per period.
    pub fn count(&self) -> u64 {
        self.count
    }

    /// The period the count applies to.
    pub fn period(&self) -> Duration {
        self.period
    }

    /// The steady-state interval between events (`period / count`), at least 1 ns.
    pub fn interval(&self) -> Duration {
        let nanos = self.period.as_nanos() / u128::from(self.count);
        Duration::from_nanos(u64::try_from(nanos).unwrap_or(u64::MAX).max(1))
    }
}

impl fmt::Display for Rate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let unit = match self.period.as_secs() {
            1 => "sec",
            60 => "min",
            3_600 => "hour",
            86_400 => "day",
            other => return write!(f, "{}/{}s", self.count, other),
        };
        write!(f, "{}/{unit}", self.count)
    }
}

impl std::str::FromStr for Rate {
    type Err = IdError;
    fn from_str(s: &str) -> Result<Self, IdError> {
        Self::parse(s)
    }
}

impl Serialize for Rate {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Rate {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        Self::parse(&s).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_units() {
        assert_eq!(
            Rate::parse("50/day").unwrap().period(),
            Duration::from_secs(86_400)
        );
        assert_eq!(Rate::parse("100/min").unwrap().count(), 100);
        assert_eq!(Rate::parse(" 5 / sec ").unwrap().to_string(), "5/sec");
        assert_eq!(Rate::parse("2/hours").unwrap().to_string(), "2/hour");
        assert_eq!(
            Rate::parse("4/s").unwrap().interval(),
            Duration::from_millis(250)
        );
    }

    #[test]
    fn refuses_bad_rates() {
        for bad in ["", "50", "0/min", "-1/min", "x/min", "5/week", "5/"] {
            assert!(Rate::parse(bad).is_err(), "{bad:?}");
        }
        assert!(serde_json::from_str::<Rate>("\"5/fortnight\"").is_err());
    }
}
