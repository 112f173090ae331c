//! Time buckets: the calendar periods, the grain (width) of a counter bucket, and the
//! arithmetic that aligns buckets on UTC.
//!
//! Unix time has no leap seconds, so fixed widths that divide a day are aligned with the UTC
//! calendar by plain remainders; months are not fixed and get their own grain. Every instance
//! cuts the same instant into the same bucket, which is what lets the store sum their counts.

use chrono::{DateTime, Datelike, TimeZone, Utc};

use super::wire::wire_enum;
use super::{FieldError, MAX_BUCKETS_READ};

wire_enum! {
    /// Calendar periods, aligned in UTC.
    pub enum Period {
        Second = "second",
        Minute = "minute",
        Hour = "hour",
        Day = "day",
        Month = "month",
    }
}

impl Period {
    pub(super) fn parse(s: &str, field: &str) -> Result<Self, FieldError> {
        Self::from_name(s).ok_or_else(|| {
            let names: Vec<&str> = Self::ALL.iter().map(|p| p.as_str()).collect();
            FieldError::new(field, format!("period must be one of {}", names.join(", ")))
        })
    }

    pub fn grain(self) -> Grain {
        match self {
            Period::Second => Grain::Fixed(1_000),
            Period::Minute => Grain::Fixed(60_000),
            Period::Hour => Grain::Fixed(3_600_000),
            Period::Day => Grain::Fixed(86_400_000),
            Period::Month => Grain::Month,
        }
    }
}

/// The width of a counter bucket: a fixed number of milliseconds, or a calendar month.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Grain {
    Fixed(i64),
    Month,
}

/// The code a grain is stored under (bucket width in ms; -1 for calendar months).
pub const MONTH_GRAIN_CODE: i64 = -1;

impl Grain {
    pub fn code(self) -> i64 {
        match self {
            Grain::Fixed(ms) => ms,
            Grain::Month => MONTH_GRAIN_CODE,
        }
    }

    pub fn from_code(code: i64) -> Option<Self> {
        match code {
            MONTH_GRAIN_CODE => Some(Grain::Month),
            ms if ms > 0 => Some(Grain::Fixed(ms)),
            _ => None,
        }
    }

    /// Start (Unix ms) of the bucket that holds instant `t_ms`.
    pub fn bucket_start(self, t_ms: i64) -> i64 {
        match self {
            Grain::Fixed(w) => t_ms - t_ms.rem_euclid(w),
            Grain::Month => {
                let t = utc(t_ms);
                Utc.with_ymd_and_hms(t.year(), t.month(), 1, 0, 0, 0)
                    .single()
                    .map(|d| d.timestamp_millis())
                    .unwrap_or(t_ms)
            }
        }
    }

    /// End (exclusive, Unix ms) of the bucket that starts at `start_ms`.
    pub fn bucket_end(self, start_ms: i64) -> i64 {
        match self {
            Grain::Fixed(w) => start_ms + w,
            Grain::Month => {
                let t = utc(start_ms);
                let (y, m) = if t.month() == 12 {
                    (t.year() + 1, 1)
                } else {
                    (t.year(), t.month() + 1)
                };
                Utc.with_ymd_and_hms(y, m, 1, 0, 0, 0)
                    .single()
                    .map(|d| d.timestamp_millis())
                    .unwrap_or(start_ms + 31 * 86_400_000)
            }
        }
    }

    /// How long after its start a bucket of this grain may still be needed by some window.
    ///
    /// A sliding window reads at most [`MAX_BUCKETS_READ`] buckets of its grain, so a bucket is
    /// needed for less than that many grains after its start; a calendar period needs only its
    /// own bucket. One more grain of slack covers clock skew between instances. After this the
    /// janitor deletes the bucket.
    pub fn retention_ms(self) -> i64 {
        match self {
            Grain::Fixed(w) => w * (MAX_BUCKETS_READ + 1),
            Grain::Month => 63 * 86_400_000,
        }
    }
}

fn utc(t_ms: i64) -> DateTime<Utc> {
    DateTime::<Utc>::from_timestamp_millis(t_ms).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::window::GRAIN_LADDER_MS;
    use proptest::prelude::*;

    #[test]
    fn calendar_months_follow_the_real_calendar() {
        let t = |s: &str| DateTime::parse_from_rfc3339(s).unwrap().timestamp_millis();
        let g = Grain::Month;
        let start = g.bucket_start(t("2024-02-29T13:00:00Z"));
        assert_eq!(start, t("2024-02-01T00:00:00Z"));
        assert_eq!(g.bucket_end(start), t("2024-03-01T00:00:00Z"));
        let dec = g.bucket_start(t("2023-12-31T23:59:59.999Z"));
        assert_eq!(g.bucket_end(dec), t("2024-01-01T00:00:00Z"));
        let d = Period::Day.grain();
        assert_eq!(
            d.bucket_start(t("2024-03-10T05:00:00Z")),
            t("2024-03-10T00:00:00Z")
        );
    }

    proptest! {
        #[test]
        fn bucket_start_contains_the_instant(t in 0i64..4_000_000_000_000, gi in 0..GRAIN_LADDER_MS.len()) {
            for g in [Grain::Fixed(GRAIN_LADDER_MS[gi]), Grain::Month] {
                let s = g.bucket_start(t);
                prop_assert!(s <= t && t < g.bucket_end(s));
            }
        }
    }
}
