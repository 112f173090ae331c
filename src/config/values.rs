//! Value types of the configuration: durations with units, secrets that never print, and
//! lists that environment variables give comma-separated.

use std::fmt;
use std::time::Duration;

use serde::{Deserialize, Deserializer};

/// A duration read from configuration.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DurationMs(pub u64);

impl DurationMs {
    pub fn get(self) -> Duration {
        Duration::from_millis(self.0)
    }
}

impl<'de> Deserialize<'de> for DurationMs {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl serde::de::Visitor<'_> for V {
            type Value = DurationMs;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a duration such as 250ms, 1s, 10m (or a number of milliseconds)")
            }
            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<DurationMs, E> {
                Ok(DurationMs(v))
            }
            fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<DurationMs, E> {
                u64::try_from(v)
                    .map(DurationMs)
                    .map_err(|_| E::custom("a duration cannot be negative"))
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<DurationMs, E> {
                let v = v.trim();
                if let Ok(ms) = v.parse::<u64>() {
                    return Ok(DurationMs(ms));
                }
                humantime::parse_duration(v)
                    .map(|d| DurationMs(d.as_millis() as u64))
                    .map_err(|e| E::custom(format!("invalid duration {v:?}: {e}")))
            }
        }
        d.deserialize_any(V)
    }
}

/// A secret value that never prints.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    pub fn new(s: impl Into<String>) -> Self {
        Self(s.into())
    }
    pub fn expose(&self) -> &str {
        &self.0
    }
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(if self.0.is_empty() { "\"\"" } else { "***" })
    }
}

impl<'de> Deserialize<'de> for Secret {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        String::deserialize(d).map(Secret)
    }
}

/// A comma-separated list in a string (as environment variables give it) or a list.
pub(super) fn comma_list<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum L {
        S(String),
        V(Vec<String>),
    }
    Ok(match L::deserialize(d)? {
        L::S(s) => s
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(String::from)
            .collect(),
        L::V(v) => v,
    })
}
