//! Policies: the limits a tenant (or one client's override) is held to, and how checks are
//! decided under them.
//!
//! A `Policy` holds only valid values: it is made from a `PolicyDoc` by [`Policy::from_doc`]
//! (see `doc.rs`). An override is merged with its tenant's policy once, when the policy cache is
//! built, so a check reads one merged policy.

use super::wire::wire_enum;
use smol_str::SmolStr;

use super::{FieldError, Limit, Scope};

/// Most limits in one policy.
pub const MAX_LIMITS: usize = 16;

wire_enum! {
    /// `dry_run` always admits, and flags what enforcing would have denied.
    #[derive(Default)]
    pub enum Mode {
        #[default]
        Enforce = "enforce",
        DryRun = "dry_run",
    }
}

wire_enum! {
    /// `cached`: in-memory pre-check, hits synced every sync interval; `strict`: admitted only once
    /// the store has counted the hit.
    #[derive(Default)]
    pub enum Consistency {
        #[default]
        Cached = "cached",
        Strict = "strict",
    }
}

wire_enum! {
    /// What a check decides while the store fails: `local` enforces this instance's own view.
    #[derive(Default)]
    pub enum OnStoreFailure {
        #[default]
        Local = "local",
        Allow = "allow",
        Deny = "deny",
    }
}

/// A validated policy: what an admin PUTs for a tenant or a client override.
#[derive(Clone, Debug, PartialEq)]
pub struct Policy {
    pub limits: Vec<Limit>,
    pub mode: Mode,
    pub consistency: Consistency,
    pub on_store_failure: OnStoreFailure,
    /// Each region's fixed part of the limits while another region is unheard, by name;
    /// empty: each region's part is what its traffic earned (`limiter::share`).
    pub regions: Vec<(SmolStr, f64)>,
    /// How long a reservation of this policy is held when the check does not say (ms); None:
    /// [`super::DEFAULT_HOLD_MS`].
    pub hold_ms: Option<i64>,
}

impl Policy {
    /// This region's fixed part of the limits while another is unheard, if the policy splits
    /// them: 0 for a region it leaves out.
    pub fn region_split(&self, region: &str) -> Option<f32> {
        if self.regions.is_empty() {
            return None;
        }
        let part = self.regions.iter().find(|(r, _)| r == region);
        Some(part.map_or(0.0, |(_, f)| *f as f32))
    }

    /// The policy that applies to one client: the tenant's, with the override's limits replacing
    /// the tenant's client-scoped limits of the same id and adding the others. The override's
    /// mode, consistency and store-failure rule apply to that client.
    pub fn merged_with(&self, over: &Policy) -> Policy {
        let mut limits: Vec<Limit> = self
            .limits
            .iter()
            .map(|l| {
                if l.scope == Scope::Client {
                    over.limits
                        .iter()
                        .find(|o| o.id == l.id)
                        .cloned()
                        .unwrap_or_else(|| l.clone())
                } else {
                    l.clone()
                }
            })
            .collect();
        for o in &over.limits {
            if !limits.iter().any(|l| l.id == o.id) {
                limits.push(o.clone());
            }
        }
        // A token bucket keeps its level in memory (see `limiter::tokens`): a policy holding
        // one is decided `cached`, even when the override asks for `strict`.
        let consistency = if limits.iter().any(|l| l.kind.is_tokens()) {
            Consistency::Cached
        } else {
            over.consistency
        };
        Policy {
            limits,
            mode: over.mode,
            consistency,
            on_store_failure: over.on_store_failure,
            regions: if over.regions.is_empty() {
                self.regions.clone()
            } else {
                over.regions.clone()
            },
            hold_ms: over.hold_ms.or(self.hold_ms),
        }
    }
}

/// Most regions a policy splits its limits between.
pub const MAX_REGION_SPLIT: usize = 16;

/// A policy's split between regions: names of 1 to 64 characters `[A-Za-z0-9._-]` (Cassandra
/// data centre names), parts in (0, 1], adding up to at most 1.
pub(super) fn parse_regions(
    split: Option<&std::collections::BTreeMap<String, f64>>,
) -> Result<Vec<(SmolStr, f64)>, FieldError> {
    let Some(split) = split else {
        return Ok(Vec::new());
    };
    if split.is_empty() || split.len() > MAX_REGION_SPLIT {
        return Err(FieldError::new(
            "regions",
            format!("name 1 to {MAX_REGION_SPLIT} regions, or leave it out"),
        ));
    }
    let mut sum = 0.0;
    for (name, &part) in split {
        let ok = (1..=64).contains(&name.len())
            && name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b));
        if !ok {
            return Err(FieldError::new(
                "regions",
                format!("{name:?} is not a region name: 1 to 64 of A-Z a-z 0-9 . _ -"),
            ));
        }
        if !(part.is_finite() && part > 0.0 && part <= 1.0) {
            return Err(FieldError::new(
                format!("regions.{name}"),
                "a region's part is above 0 and at most 1".to_owned(),
            ));
        }
        sum += part;
    }
    if sum > 1.0 + 1e-9 {
        return Err(FieldError::new(
            "regions",
            format!("the parts add up to {sum}: at most 1, or regions could admit more than max together"),
        ));
    }
    Ok(split.iter().map(|(n, f)| (SmolStr::new(n), *f)).collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::PolicyDoc;

    fn doc(json: serde_json::Value) -> PolicyDoc {
        serde_json::from_value(json).unwrap()
    }

    #[test]
    fn a_split_between_regions_is_checked_and_read_by_region() {
        let one = |regions: serde_json::Value| {
            Policy::from_doc(
                &doc(
                    serde_json::json!({"limits": [{"id": "a", "max": 10, "window": "1s"}],
                    "regions": regions}),
                ),
                false,
            )
        };
        let p = one(serde_json::json!({"eu": 0.6, "us": 0.4})).unwrap();
        assert_eq!(p.region_split("eu"), Some(0.6));
        assert_eq!(
            p.region_split("ap"),
            Some(0.0),
            "a region left out gets nothing"
        );
        // The canonical document keeps it; a policy without one has none.
        let back = Policy::from_doc(&p.to_doc(), false).unwrap();
        assert_eq!(back, p);
        let none = one(serde_json::Value::Null).unwrap();
        assert_eq!(none.region_split("eu"), None);
        assert!(none.to_doc().regions.is_none());
        for (bad, field) in [
            (serde_json::json!({"eu": 0.6, "us": 0.5}), "regions"),
            (serde_json::json!({"eu": 0.0}), "regions.eu"),
            (serde_json::json!({"eu": 1.5}), "regions.eu"),
            (serde_json::json!({"e u": 0.5}), "regions"),
            (serde_json::json!({}), "regions"),
        ] {
            let e = one(bad.clone()).unwrap_err();
            assert_eq!(e.field, field, "{bad}");
        }
        // An override's split replaces the tenant's; without one, the tenant's holds.
        let over = Policy::from_doc(
            &doc(
                serde_json::json!({"limits": [{"id": "a", "max": 5, "window": "1s"}],
                "regions": {"us": 1.0}}),
            ),
            true,
        )
        .unwrap();
        assert_eq!(p.merged_with(&over).region_split("us"), Some(1.0));
        assert_eq!(p.merged_with(&none).region_split("us"), Some(0.4));
    }

    #[test]
    fn overrides_replace_same_id_client_limits_and_add_the_rest() {
        let tenant = Policy::from_doc(
            &doc(serde_json::json!({"limits": [
                {"id": "a", "max": 10, "window": "1s"},
                {"id": "t", "max": 100, "window": "1s", "scope": "tenant"},
                {"id": "b", "max": 5, "period": "day"}]})),
            false,
        )
        .unwrap();
        let over = Policy::from_doc(
            &doc(serde_json::json!({"limits": [
                {"id": "a", "max": 50, "window": "1s"},
                {"id": "c", "max": 7, "period": "hour"}], "mode": "dry_run"})),
            true,
        )
        .unwrap();
        let m = tenant.merged_with(&over);
        let maxes: Vec<(&str, u64)> = m.limits.iter().map(|l| (l.id.as_str(), l.max)).collect();
        assert_eq!(maxes, vec![("a", 50), ("t", 100), ("b", 5), ("c", 7)]);
        assert_eq!(m.mode, Mode::DryRun);
    }
}
