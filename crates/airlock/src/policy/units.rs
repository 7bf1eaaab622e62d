//! Human units for sizes and durations (`512MiB`, `90s`, `2m`), used by profiles and the CLI.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use serde::de::{self, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A byte count written as `512MiB`, `10MB`, `4096` or `1.5GiB`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct ByteSize(pub u64);

/// A duration written as `90s`, `2m`, `1500ms` or a bare number of seconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Seconds(pub Duration);

const SIZE_HELP: &str =
    "expected a byte size such as 512MiB, 10MB, 1.5GiB or a plain number of bytes";
const DURATION_HELP: &str =
    "expected a duration such as 90s, 2m, 1500ms or a plain number of seconds";

/// A size or duration that cannot be read, with the text and the accepted forms.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum UnitError {
    #[error("invalid size {text:?}: {SIZE_HELP}")]
    Size { text: String },
    #[error("invalid duration {text:?}: {DURATION_HELP}")]
    Duration { text: String },
    /// A well-formed duration beyond what a `Duration` holds (about 584 billion years).
    #[error("duration {text:?} is too long: give at most 18446744073709551615 seconds")]
    DurationTooLong { text: String },
}

impl FromStr for ByteSize {
    type Err = UnitError;

    fn from_str(text: &str) -> Result<Self, UnitError> {
        // KiB/MiB/GiB are powers of 1024 and KB/MB/GB powers of 1000, as written.
        parse_size::Config::new()
            .parse_size(text.trim())
            .map(ByteSize)
            .map_err(|_| UnitError::Size { text: text.into() })
    }
}

impl FromStr for Seconds {
    type Err = UnitError;

    fn from_str(text: &str) -> Result<Self, UnitError> {
        let text = text.trim();
        let too_long = || UnitError::DurationTooLong { text: text.into() };
        if let Ok(secs) = text.parse::<f64>() {
            if secs.is_finite() && secs >= 0.0 {
                return Duration::try_from_secs_f64(secs)
                    .map(Seconds)
                    .map_err(|_| too_long());
            }
        }
        humantime::parse_duration(text)
            .map(Seconds)
            .map_err(|e| match e {
                humantime::DurationError::NumberOverflow => too_long(),
                _ => UnitError::Duration { text: text.into() },
            })
    }
}

impl fmt::Display for ByteSize {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const UNITS: [(&str, u64); 4] = [
            ("TiB", 1 << 40),
            ("GiB", 1 << 30),
            ("MiB", 1 << 20),
            ("KiB", 1 << 10),
        ];
        for (unit, scale) in UNITS {
            if self.0 >= scale && self.0.is_multiple_of(scale) {
                return write!(f, "{}{unit}", self.0 / scale);
            }
        }
        write!(f, "{}B", self.0)
    }
}

impl fmt::Display for Seconds {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let millis = self.0.as_millis();
        if millis.is_multiple_of(1000) {
            write!(f, "{}s", millis / 1000)
        } else {
            write!(f, "{millis}ms")
        }
    }
}

impl Serialize for ByteSize {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl Serialize for Seconds {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

struct UnitVisitor<T>(std::marker::PhantomData<T>, &'static str);

impl<T: FromStr<Err = UnitError>> Visitor<'_> for UnitVisitor<T> {
    type Value = T;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.1)
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<T, E> {
        v.parse().map_err(E::custom)
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<T, E> {
        if v < 0 {
            return Err(E::custom(format!(
                "invalid value {v}: must not be negative; {}",
                self.1
            )));
        }
        v.to_string().parse().map_err(E::custom)
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<T, E> {
        v.to_string().parse().map_err(E::custom)
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<T, E> {
        v.to_string().parse().map_err(E::custom)
    }
}

impl<'de> Deserialize<'de> for ByteSize {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(UnitVisitor(std::marker::PhantomData, SIZE_HELP))
    }
}

impl<'de> Deserialize<'de> for Seconds {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(UnitVisitor(std::marker::PhantomData, DURATION_HELP))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_accept_binary_and_decimal_units() {
        assert_eq!("512MiB".parse::<ByteSize>(), Ok(ByteSize(512 << 20)));
        assert_eq!("10MB".parse::<ByteSize>(), Ok(ByteSize(10_000_000)));
        assert_eq!("4096".parse::<ByteSize>(), Ok(ByteSize(4096)));
        assert_eq!(ByteSize(256 << 20).to_string(), "256MiB");
        assert_eq!(ByteSize(1000).to_string(), "1000B");
    }

    #[test]
    fn bad_size_names_the_value_and_the_format() {
        let err = "12XB".parse::<ByteSize>().unwrap_err().to_string();
        assert!(err.contains("\"12XB\"") && err.contains("512MiB"), "{err}");
    }

    #[test]
    fn durations_accept_units_and_plain_seconds() {
        assert_eq!(
            "90s".parse::<Seconds>(),
            Ok(Seconds(Duration::from_secs(90)))
        );
        assert_eq!(
            "2m".parse::<Seconds>(),
            Ok(Seconds(Duration::from_secs(120)))
        );
        assert_eq!(
            "1.5".parse::<Seconds>(),
            Ok(Seconds(Duration::from_millis(1500)))
        );
        assert_eq!(Seconds(Duration::from_millis(1500)).to_string(), "1500ms");
        assert!("soon"
            .parse::<Seconds>()
            .unwrap_err()
            .to_string()
            .contains("90s"));
    }

    /// Found by fuzzing the daemon's API: `Duration::from_secs_f64` panics on these.
    #[test]
    fn huge_durations_are_typed_errors_not_panics() {
        for text in ["1e300", "18446744073709551616", "99999999999999999999999s"] {
            let err = text.parse::<Seconds>().unwrap_err();
            assert!(
                matches!(err, UnitError::DurationTooLong { .. }),
                "{text}: {err}"
            );
        }
        for json in ["1e300", "\"1e300\"", "18446744073709551615"] {
            let err = serde_json::from_str::<Seconds>(json).unwrap_err();
            assert!(err.to_string().contains("too long"), "{json}: {err}");
        }
        assert_eq!(
            "1e9".parse::<Seconds>(),
            Ok(Seconds(Duration::from_secs(1_000_000_000)))
        );
        assert!("1e30".parse::<Seconds>().is_err(), "no panic, an error");
    }
}
