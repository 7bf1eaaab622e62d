//! Durations in requests, read through a guard: the library's `Seconds` parser panics on a
//! number of seconds too large for a `Duration` (`1e300`), which a request must not be able to
//! trigger. Values above 10^12 seconds (about 31,700 years) are refused here first.

use airlock::policy::units::Seconds;
use serde::{Deserialize, Deserializer};

/// Larger numbers of seconds are refused before the library parses them.
const MAX_SECONDS: f64 = 1e12;

/// `#[serde(deserialize_with)]` for `Option<Seconds>`.
pub fn opt_seconds<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Seconds>, D::Error> {
    let value = Option::<serde_json::Value>::deserialize(d)?;
    let Some(value) = value else { return Ok(None) };
    let number = match &value {
        serde_json::Value::Number(n) => n.as_f64(),
        serde_json::Value::String(s) => s.trim().parse::<f64>().ok(),
        _ => None,
    };
    if number.is_some_and(|n| !n.is_finite() || n.abs() > MAX_SECONDS) {
        return Err(serde::de::Error::custom(format!(
            "invalid duration {value}: at most {MAX_SECONDS} seconds"
        )));
    }
    Seconds::deserialize(value)
        .map(Some)
        .map_err(serde::de::Error::custom)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Deserialize)]
    struct T {
        #[serde(default, deserialize_with = "opt_seconds")]
        d: Option<Seconds>,
    }

    #[test]
    fn huge_durations_are_errors_not_panics() {
        for text in [
            r#"{"d": 1e300}"#,
            r#"{"d": "1e300"}"#,
            r#"{"d": 18446744073709551615}"#,
        ] {
            assert!(serde_json::from_str::<T>(text).is_err(), "{text}");
        }
        let ok: T = serde_json::from_str(r#"{"d": "90s"}"#).unwrap();
        assert_eq!(ok.d.unwrap().0.as_secs(), 90);
        assert!(serde_json::from_str::<T>(r#"{}"#).unwrap().d.is_none());
    }
}
