//! A check's cost, and the rule that reads a JSON number as a whole number (costs, and limits'
//! `max`).

use super::{FieldError, MAX_LIMIT};

/// Largest cost a single check may carry.
pub const MAX_COST: u64 = 1_000_000_000;

/// A JSON number as a non-negative integer, when it is one: `7`, and also `7.0` or `7e0`, which
/// JSON Schema's `integer` (what the API document says) includes. Not `7.5` or `-1`; and not a
/// float above `MAX_LIMIT` (2^53), where floats stop being exact (no bound here is higher).
pub fn whole_u64(n: &serde_json::Number) -> Option<u64> {
    if let Some(u) = n.as_u64() {
        return Some(u);
    }
    let f = n.as_f64()?;
    // `-0.0` is 0: the range test below holds for it, and the cast gives 0.
    (f.fract() == 0.0 && (0.0..=MAX_LIMIT as f64).contains(&f)).then_some(f as u64)
}

/// A check's cost: 0 (peek) to `MAX_COST`; absent, 1.
pub fn parse_cost(n: Option<&serde_json::Number>) -> Result<u64, FieldError> {
    match n {
        None => Ok(1),
        Some(n) => whole_u64(n)
            .filter(|c| *c <= MAX_COST)
            .ok_or_else(|| FieldError::new("cost", format!("cost must be 0..={MAX_COST}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::{Policy, PolicyDoc};

    #[test]
    fn cost_defaults_to_one_and_is_bounded() {
        assert_eq!(parse_cost(None).unwrap(), 1);
        assert_eq!(parse_cost(Some(&0u64.into())).unwrap(), 0);
        assert_eq!(parse_cost(Some(&MAX_COST.into())).unwrap(), MAX_COST);
        assert!(parse_cost(Some(&(MAX_COST + 1).into())).is_err());
        assert!(parse_cost(Some(&(-1i64).into())).is_err());
        let f = serde_json::Number::from_f64(1.5).unwrap();
        assert!(parse_cost(Some(&f)).is_err());
    }

    #[test]
    fn whole_number_floats_are_integers_and_nothing_else_is() {
        let float = |f: f64| serde_json::Number::from_f64(f).unwrap();
        let cost = |f: f64| parse_cost(Some(&float(f)));
        assert_eq!(cost(7.0).unwrap(), 7);
        assert_eq!(cost(0.0).unwrap(), 0);
        assert_eq!(cost(-0.0).unwrap(), 0);
        assert_eq!(cost(1e6).unwrap(), 1_000_000);
        assert_eq!(cost(1e9).unwrap(), 1_000_000_000);
        for bad in [
            7.5,
            0.5,
            -1.0,
            -0.5,
            1_000_000_001.0,
            1e300,
            f64::MIN_POSITIVE,
        ] {
            let e = cost(bad).unwrap_err();
            assert_eq!(
                (e.field.as_str(), e.message.as_str()),
                ("cost", "cost must be 0..=1000000000")
            );
        }
        let max = |f: f64| {
            let doc = serde_json::json!({"limits": [{"id": "a", "max": f, "window": "1s"}]});
            let doc: PolicyDoc = serde_json::from_value(doc).unwrap();
            assert!(
                doc.limits[0].max.as_ref().unwrap().is_f64(),
                "the test sends a float"
            );
            Policy::from_doc(&doc, false).map(|p| p.limits[0].max)
        };
        assert_eq!(max(3.0).unwrap(), 3);
        assert_eq!(max(MAX_LIMIT as f64).unwrap(), MAX_LIMIT);
        for bad in [0.0, 2.5, -3.0, MAX_LIMIT as f64 * 2.0, 1e300] {
            let e = max(bad).unwrap_err();
            assert_eq!(e.field, "limits[0].max", "{bad}");
            assert_eq!(e.message, format!("max must be an integer 1..={MAX_LIMIT}"));
        }
    }
}
