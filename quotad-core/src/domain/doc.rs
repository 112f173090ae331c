//! The JSON form of a policy (`PolicyDoc`), as admins send it and as it is stored, and its
//! conversion to and from a validated `Policy`.
//!
//! A document keeps the enum fields as strings so that a bad value is reported by
//! [`Policy::from_doc`] with the field's path (`limits[2].scope`) rather than as a serde error.
//! Fields are checked in document order and the first error is returned: a 400 names one field.

use serde::{Deserialize, Serialize};
use smol_str::SmolStr;

use super::cost::whole_u64;
use super::{
    fill_ms, format_duration_ms, parse_duration_ms, sliding_grain, token_grain, Consistency,
    FieldError, InFlight, Limit, LimitId, LimitKind, Mode, OnStoreFailure, Period, Policy,
    ResourceMatch, Scope, HOLD_MESSAGE, IN_FLIGHT_KIND, MAX_FILL_MS, MAX_HOLD_MS, MAX_LIMIT,
    MAX_LIMITS, MAX_PER_MS, MAX_WINDOW_MS, MIN_FILL_MS, MIN_HOLD_MS, MIN_WINDOW_MS,
};

/// The JSON form of a policy, as admins send it and as it is stored.
///
/// Unknown keys are refused: a typo such as `"windw"` must not silently turn a limit into
/// something else.
///
/// The `schema` attributes state for the OpenAPI document what [`Policy::from_doc`] enforces.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
#[cfg_attr(feature = "openapi", schema(as = Policy))]
pub struct PolicyDoc {
    /// Ids unique. All the limits that apply to a check must admit it.
    #[cfg_attr(feature = "openapi", schema(min_items = 1, max_items = 16))]
    pub limits: Vec<LimitDoc>,
    /// Absent (or null): `enforce`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<Mode>))]
    pub mode: Option<String>,
    /// Absent (or null): `cached`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<Consistency>))]
    pub consistency: Option<String>,
    /// Absent (or null): `local`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<OnStoreFailure>))]
    pub on_store_failure: Option<String>,
    /// A fleet in several regions (data centres): each region's fixed part of every limit
    /// while another region is unheard, by region name, e.g. `{"eu": 0.6, "us": 0.4}`. Parts
    /// are above 0, at most 1, and add up to at most 1; a region left out gets nothing then.
    /// Absent (or null): each region's part is the share of the limit its traffic earned.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<std::collections::BTreeMap<String, f64>>, example = json!({"eu": 0.6, "us": 0.4})))]
    pub regions: Option<std::collections::BTreeMap<String, f64>>,
    /// How long a reservation (`reserve` on a check) is held when the check does not say: 1s
    /// to 1h. Absent (or null): `5m`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<String>, example = "2m"))]
    pub hold: Option<String>,
}

/// One limit: a sliding `window`, a calendar `period` (UTC), or a token bucket (`burst`, `rate`,
/// `per`). A window or a period takes `max`; a token bucket takes `burst` instead. Optional
/// fields may also be null, which reads as absent.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
#[cfg_attr(feature = "openapi", schema(as = Limit))]
pub struct LimitDoc {
    /// The limit's identity: counts follow the id.
    #[cfg_attr(
        feature = "openapi",
        schema(pattern = "^[A-Za-z0-9._~:@-]{1,128}$", example = "per-second")
    )]
    pub id: String,
    /// The most a window or a period admits. Required with `window` or `period`; absent with a
    /// token bucket, whose size is `burst`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<u64>, minimum = 1, maximum = 9007199254740992.0, example = 100))]
    pub max: Option<serde_json::Number>,
    /// A sliding window from 1s to 31d, such as `1s`, `10m`, `1h 30m`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<String>, example = "10m"))]
    pub window: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<Period>))]
    pub period: Option<String>,
    /// A token bucket: the most tokens it holds, and so the largest burst. A client may spend
    /// them all at once; `rate` tokens come back every `per`. The time an empty bucket takes to
    /// fill (`burst / rate x per`) must be from 1s to 31d.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<u64>, minimum = 1, maximum = 9007199254740992.0, example = 50))]
    pub burst: Option<serde_json::Number>,
    /// A token bucket: tokens that come back every `per`. Given with `burst`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<u64>, minimum = 1, maximum = 9007199254740992.0, example = 10))]
    pub rate: Option<serde_json::Number>,
    /// A token bucket: the time in which `rate` tokens come back, 1ms to 31d. Absent (or
    /// null) with a token bucket: `1s`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<String>, example = "1s"))]
    pub per: Option<String>,
    /// Applies to checks whose resource equals this, or starts with it when it ends in `*`.
    /// Absent (or null): applies to every check.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<String>, pattern = "^[ -~]{1,256}$", example = "PUT /products/*"))]
    pub resource: Option<String>,
    /// Absent (or null): `client`. A client override holds client-scoped limits only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<Scope>))]
    pub scope: Option<String>,
    /// An in-flight limit, with `max` and no window, period or bucket: caps the reservations
    /// held at once, counting each one (`holds`) or their cost (`cost`). A hold counts from
    /// the check that takes it until it is settled, released or expires. Checks that reserve
    /// nothing do not meet it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<InFlight>))]
    pub in_flight: Option<String>,
}

impl Policy {
    /// Validates a policy document. `is_override` refuses tenant-scoped limits, which a single
    /// client's override cannot meaningfully own.
    pub fn from_doc(doc: &PolicyDoc, is_override: bool) -> Result<Policy, FieldError> {
        let p = Policy {
            limits: parse_limits(&doc.limits, is_override)?,
            mode: parse_named(doc.mode.as_deref(), "mode", Mode::from_name, Mode::expected)?,
            consistency: parse_named(
                doc.consistency.as_deref(),
                "consistency",
                Consistency::from_name,
                Consistency::expected,
            )?,
            on_store_failure: parse_named(
                doc.on_store_failure.as_deref(),
                "on_store_failure",
                OnStoreFailure::from_name,
                OnStoreFailure::expected,
            )?,
            regions: super::policy::parse_regions(doc.regions.as_ref())?,
            hold_ms: doc
                .hold
                .as_deref()
                .map(|h| {
                    parse_duration_ms(h)
                        .filter(|ms| (MIN_HOLD_MS..=MAX_HOLD_MS).contains(ms))
                        .ok_or_else(|| FieldError::new("hold", HOLD_MESSAGE))
                })
                .transpose()?,
        };
        if p.consistency == Consistency::Strict && p.limits.iter().any(|l| l.kind.is_tokens()) {
            return Err(FieldError::new(
                "consistency",
                "token buckets keep their level in memory: a policy with one must be cached",
            ));
        }
        Ok(p)
    }

    /// The canonical document of this policy, with every default spelled out.
    pub fn to_doc(&self) -> PolicyDoc {
        PolicyDoc {
            limits: self.limits.iter().map(limit_doc).collect(),
            mode: Some(self.mode.as_str().to_owned()),
            consistency: Some(self.consistency.as_str().to_owned()),
            on_store_failure: Some(self.on_store_failure.as_str().to_owned()),
            regions: (!self.regions.is_empty()).then(|| {
                self.regions
                    .iter()
                    .map(|(r, f)| (r.to_string(), *f))
                    .collect()
            }),
            hold: self.hold_ms.map(format_duration_ms),
        }
    }
}

/// The limits of a policy: 1 to `MAX_LIMITS`, ids unique.
fn parse_limits(docs: &[LimitDoc], is_override: bool) -> Result<Vec<Limit>, FieldError> {
    if docs.is_empty() || docs.len() > MAX_LIMITS {
        return Err(FieldError::new(
            "limits",
            format!("a policy has 1 to {MAX_LIMITS} limits"),
        ));
    }
    let mut limits: Vec<Limit> = Vec::with_capacity(docs.len());
    for (i, l) in docs.iter().enumerate() {
        let limit = parse_limit(l, &format!("limits[{i}]"), &limits, is_override)?;
        limits.push(limit);
    }
    Ok(limits)
}

/// One limit, at path `at` (`limits[2]`); `earlier` are the limits before it.
fn parse_limit(
    l: &LimitDoc,
    at: &str,
    earlier: &[Limit],
    is_override: bool,
) -> Result<Limit, FieldError> {
    let f = |name: &str| format!("{at}.{name}");
    // A struct expression evaluates its fields in the order written: the order errors win in.
    let id = parse_limit_id(&l.id, &f("id"), earlier)?;
    Ok(Limit {
        answer_id: SmolStr::new(id.as_str()),
        id,
        max: parse_size(l, at)?,
        kind: parse_kind(l, at)?,
        scope: parse_scope(l.scope.as_deref(), &f("scope"), is_override)?,
        resource: l
            .resource
            .as_deref()
            .map(|r| ResourceMatch::parse(r, &f("resource")))
            .transpose()?,
        in_flight: l
            .in_flight
            .as_deref()
            .map(|s| {
                InFlight::from_name(s).ok_or_else(|| {
                    FieldError::new(
                        f("in_flight"),
                        format!("in_flight must be {}", InFlight::expected()),
                    )
                })
            })
            .transpose()?,
    })
}

/// A limit id, unique in its policy: counts follow it.
fn parse_limit_id(s: &str, field: &str, earlier: &[Limit]) -> Result<LimitId, FieldError> {
    let id = LimitId::parse_field(s, field)?;
    if earlier.iter().any(|o| o.id == id) {
        return Err(FieldError::new(
            field,
            format!("limit id {id} appears twice"),
        ));
    }
    Ok(id)
}

/// Whether a limit document describes a token bucket (it names any of its fields).
fn is_token_bucket(l: &LimitDoc) -> bool {
    l.burst.is_some() || l.rate.is_some() || l.per.is_some()
}

/// A limit's size: `max` for a window or a period, `burst` for a token bucket, a whole number
/// from 1 to `MAX_LIMIT`.
fn parse_size(l: &LimitDoc, at: &str) -> Result<u64, FieldError> {
    let (given, other, name) = if is_token_bucket(l) {
        (&l.burst, &l.max, "burst")
    } else {
        (&l.max, &l.burst, "max")
    };
    if other.is_some() {
        return Err(FieldError::new(
            format!("{at}.max"),
            "a token bucket takes burst, not max",
        ));
    }
    given
        .as_ref()
        .and_then(whole_u64)
        .filter(|m| (1..=MAX_LIMIT).contains(m))
        .ok_or_else(|| {
            FieldError::new(
                format!("{at}.{name}"),
                format!("{name} must be an integer 1..={MAX_LIMIT}"),
            )
        })
}

/// The message of a bad `per`.
const PER_MESSAGE: &str = "per must be a duration from 1ms to 31d, such as 1s, 1m";

/// A token bucket's refill: `rate` tokens every `per`, with the bucket's grain.
fn parse_tokens(l: &LimitDoc, at: &str, burst: u64) -> Result<LimitKind, FieldError> {
    let rate = l
        .rate
        .as_ref()
        .and_then(whole_u64)
        .filter(|r| (1..=MAX_LIMIT).contains(r))
        .ok_or_else(|| {
            FieldError::new(
                format!("{at}.rate"),
                format!("rate must be an integer 1..={MAX_LIMIT}"),
            )
        })?;
    let per_ms = match &l.per {
        None => 1_000,
        Some(p) => parse_duration_ms(p)
            .filter(|ms| (1..=MAX_PER_MS).contains(ms))
            .ok_or_else(|| FieldError::new(format!("{at}.per"), PER_MESSAGE))?,
    };
    let fill = fill_ms(burst, rate, per_ms)
        .filter(|f| (MIN_FILL_MS..=MAX_FILL_MS).contains(f))
        .ok_or_else(|| {
            FieldError::new(
                format!("{at}.burst"),
                "burst / rate x per, the time an empty bucket takes to fill, must be from 1s to 31d",
            )
        })?;
    // Both at most 31 days (MAX_PER_MS, the ladder's widest grain): within a u32.
    let narrow =
        |ms: i64| u32::try_from(ms).map_err(|_| FieldError::new(format!("{at}.per"), PER_MESSAGE));
    Ok(LimitKind::Tokens {
        rate,
        per_ms: narrow(per_ms)?,
        grain_ms: narrow(token_grain(fill))?,
    })
}

/// The message of a bad window; `window_message_states_the_bounds` holds it to the constants.
const WINDOW_MESSAGE: &str = "window must be a duration from 1s to 31d, such as 1s, 10m, 1h";

/// The message of a limit with no kind, or more than one.
const ONE_KIND_MESSAGE: &str = "a limit has exactly one of window, period or rate (a token bucket)";

/// Exactly one of `window` (a sliding window and its grain), `period` or a token bucket; an
/// in-flight limit has none of them.
fn parse_kind(l: &LimitDoc, at: &str) -> Result<LimitKind, FieldError> {
    if l.in_flight.is_some() {
        if is_token_bucket(l) || l.window.is_some() || l.period.is_some() {
            return Err(FieldError::new(
                at,
                "an in-flight limit has max and no window, period or rate: it counts holds until they end",
            ));
        }
        return Ok(IN_FLIGHT_KIND);
    }
    if is_token_bucket(l) {
        if l.window.is_some() || l.period.is_some() {
            return Err(FieldError::new(at, ONE_KIND_MESSAGE));
        }
        // `parse_size` has checked the burst already.
        let burst = l.burst.as_ref().and_then(whole_u64).unwrap_or(1);
        return parse_tokens(l, at, burst);
    }
    match (&l.window, &l.period) {
        (Some(w), None) => {
            let window_ms = parse_duration_ms(w)
                .filter(|ms| (MIN_WINDOW_MS..=MAX_WINDOW_MS).contains(ms))
                .ok_or_else(|| FieldError::new(format!("{at}.window"), WINDOW_MESSAGE))?;
            Ok(LimitKind::Sliding {
                window_ms,
                grain_ms: sliding_grain(window_ms),
            })
        }
        (None, Some(p)) => Ok(LimitKind::Calendar(Period::parse(
            p,
            &format!("{at}.period"),
        )?)),
        _ => Err(FieldError::new(at, ONE_KIND_MESSAGE)),
    }
}

/// A limit's scope (absent: `client`); an override may hold client-scoped limits only.
fn parse_scope(s: Option<&str>, field: &str, is_override: bool) -> Result<Scope, FieldError> {
    match s.map(|s| (s, Scope::from_name(s))) {
        None => Ok(Scope::Client),
        Some((_, Some(Scope::Tenant))) if is_override => Err(FieldError::new(
            field,
            "a client override holds client-scoped limits only",
        )),
        Some((_, Some(scope))) => Ok(scope),
        Some((_, None)) => Err(FieldError::new(
            field,
            format!("scope must be {}", Scope::expected()),
        )),
    }
}

/// A policy-wide option by its wire name (absent: the default).
fn parse_named<T: Default>(
    s: Option<&str>,
    field: &str,
    from_name: fn(&str) -> Option<T>,
    expected: fn() -> String,
) -> Result<T, FieldError> {
    match s {
        None => Ok(T::default()),
        Some(s) => from_name(s)
            .ok_or_else(|| FieldError::new(field, format!("{field} must be {}", expected()))),
    }
}

/// The document of one limit, every default spelled out.
fn limit_doc(l: &Limit) -> LimitDoc {
    let (mut window, mut period, mut rate, mut per) = (None, None, None, None);
    match l.kind {
        _ if l.in_flight.is_some() => {}
        LimitKind::Sliding { window_ms, .. } => window = Some(format_duration_ms(window_ms)),
        LimitKind::Calendar(p) => period = Some(p.as_str().to_owned()),
        LimitKind::Tokens {
            rate: r, per_ms, ..
        } => {
            rate = Some(r.into());
            per = Some(format_duration_ms(per_ms.into()));
        }
    }
    let tokens = l.kind.is_tokens();
    LimitDoc {
        id: l.id.to_string(),
        max: (!tokens).then(|| l.max.into()),
        window,
        period,
        burst: tokens.then(|| l.max.into()),
        rate,
        per,
        resource: l.resource.as_ref().map(ResourceMatch::render),
        scope: Some(l.scope.as_str().to_owned()),
        in_flight: l.in_flight.map(|f| f.as_str().to_owned()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn doc(json: serde_json::Value) -> PolicyDoc {
        serde_json::from_value(json).unwrap()
    }

    #[test]
    fn the_contract_example_policy_parses() {
        let d = doc(serde_json::json!({"limits": [
           {"id": "per-second", "max": 10, "window": "1s"},
           {"id": "per-10min", "max": 500, "window": "10m"},
           {"id": "monthly", "max": 1000000, "period": "month"},
           {"id": "writes", "max": 100, "window": "10s", "resource": "PUT /products/*", "scope": "tenant"}
         ], "mode": "enforce", "consistency": "cached", "on_store_failure": "local"}));
        let p = Policy::from_doc(&d, false).unwrap();
        assert_eq!(p.limits.len(), 4);
        assert_eq!(
            p.limits[1].kind,
            LimitKind::Sliding {
                window_ms: 600_000,
                grain_ms: 60_000
            }
        );
        assert_eq!(p.limits[3].scope, Scope::Tenant);
        // The canonical document parses back to the same policy.
        assert_eq!(Policy::from_doc(&p.to_doc(), false).unwrap(), p);
    }

    #[test]
    fn invalid_policies_name_the_field() {
        let cases = [
            (serde_json::json!({"limits": []}), "limits"),
            (
                serde_json::json!({"limits": [{"id": "a", "max": 0, "window": "1s"}]}),
                "limits[0].max",
            ),
            (
                serde_json::json!({"limits": [{"id": "a", "max": 9007199254740993u64, "window": "1s"}]}),
                "limits[0].max",
            ),
            (
                serde_json::json!({"limits": [{"id": "a", "max": 1.5, "window": "1s"}]}),
                "limits[0].max",
            ),
            (
                serde_json::json!({"limits": [{"id": "a", "max": 1, "window": "500ms"}]}),
                "limits[0].window",
            ),
            (
                serde_json::json!({"limits": [{"id": "a", "max": 1, "window": "32d"}]}),
                "limits[0].window",
            ),
            (
                serde_json::json!({"limits": [{"id": "a", "max": 1}]}),
                "limits[0]",
            ),
            (
                serde_json::json!({"limits": [{"id": "a", "max": 1, "window": "1s", "period": "day"}]}),
                "limits[0]",
            ),
            (
                serde_json::json!({"limits": [{"id": "a", "max": 1, "period": "week"}]}),
                "limits[0].period",
            ),
            (
                serde_json::json!({"limits": [{"id": "a b", "max": 1, "period": "day"}]}),
                "limits[0].id",
            ),
            (
                serde_json::json!({"limits": [{"id": "a", "max": 1, "period": "day"}, {"id": "a", "max": 1, "period": "day"}]}),
                "limits[1].id",
            ),
            (
                serde_json::json!({"limits": [{"id": "a", "max": 1, "period": "day", "scope": "global"}]}),
                "limits[0].scope",
            ),
            (
                serde_json::json!({"limits": [{"id": "a", "max": 1, "period": "day"}], "mode": "shadow"}),
                "mode",
            ),
            (
                serde_json::json!({"limits": [{"id": "a", "max": 1, "period": "day"}], "consistency": "eventual"}),
                "consistency",
            ),
            (
                serde_json::json!({"limits": [{"id": "a", "max": 1, "period": "day"}], "on_store_failure": "panic"}),
                "on_store_failure",
            ),
        ];
        for (json, field) in cases {
            let err = Policy::from_doc(&doc(json.clone()), false).unwrap_err();
            assert_eq!(err.field, field, "{json}");
        }
        let many: Vec<_> = (0..17)
            .map(|i| serde_json::json!({"id": format!("l{i}"), "max": 1, "period": "day"}))
            .collect();
        assert_eq!(
            Policy::from_doc(&doc(serde_json::json!({ "limits": many })), false)
                .unwrap_err()
                .field,
            "limits"
        );
    }

    #[test]
    fn overrides_refuse_tenant_scope() {
        let d = doc(
            serde_json::json!({"limits": [{"id": "a", "max": 1, "period": "day", "scope": "tenant"}]}),
        );
        assert!(Policy::from_doc(&d, false).is_ok());
        assert_eq!(
            Policy::from_doc(&d, true).unwrap_err().field,
            "limits[0].scope"
        );
    }

    #[test]
    fn window_message_states_the_bounds() {
        assert_eq!(parse_duration_ms("1s"), Some(MIN_WINDOW_MS));
        assert_eq!(parse_duration_ms("31d"), Some(MAX_WINDOW_MS));
        assert!(WINDOW_MESSAGE.contains("from 1s to 31d"));
    }

    #[test]
    fn every_wire_name_parses_and_renders_back() {
        let limits: Vec<_> = Period::ALL
            .iter()
            .zip(Scope::ALL.iter().cycle())
            .enumerate()
            .map(|(i, (p, s))| {
                serde_json::json!({"id": format!("l{i}"), "max": 1, "period": p.as_str(), "scope": s.as_str()})
            })
            .collect();
        for &mode in Mode::ALL {
            for &consistency in Consistency::ALL {
                for &on_store_failure in OnStoreFailure::ALL {
                    let d = doc(serde_json::json!({"limits": limits, "mode": mode.as_str(),
                        "consistency": consistency.as_str(), "on_store_failure": on_store_failure.as_str()}));
                    let p = Policy::from_doc(&d, false).unwrap();
                    assert_eq!(
                        (p.mode, p.consistency, p.on_store_failure),
                        (mode, consistency, on_store_failure)
                    );
                    assert_eq!(p.to_doc(), d);
                }
            }
        }
    }
}
