//! Domain types: identifiers, limits and policies that can only hold valid values.
//!
//! Everything that crosses the HTTP edge or comes out of the store is parsed into these types
//! once; the limiter and the sync task never re-validate. A parse failure names the offending
//! field with a JSON-pointer-like path (`limits[2].window`) so the API can answer a 400 that says
//! exactly what is wrong.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Datelike, TimeZone, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// A validation failure: which field, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldError {
    pub field: String,
    pub message: String,
}

impl FieldError {
    pub fn new(field: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            field: field.into(),
            message: message.into(),
        }
    }
}

impl fmt::Display for FieldError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.field, self.message)
    }
}

impl std::error::Error for FieldError {}

/// Maximum length of a tenant, client or limit identifier.
pub const MAX_ID_LEN: usize = 128;
/// Maximum length of a resource string.
pub const MAX_RESOURCE_LEN: usize = 256;
/// Largest cost a single check may carry.
pub const MAX_COST: u64 = 1_000_000;
/// Largest `max` a limit may have (2^53, so it survives a JSON double round trip).
pub const MAX_LIMIT: u64 = 1 << 53;
/// Most limits in one policy.
pub const MAX_LIMITS: usize = 16;
/// Shortest and longest sliding window.
pub const MIN_WINDOW_MS: i64 = 1_000;
pub const MAX_WINDOW_MS: i64 = 31 * 86_400_000;

fn id_char_ok(c: u8) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, b'.' | b'_' | b'~' | b':' | b'@' | b'-')
}

/// Checks the contract's identifier rule: 1 to 128 characters of `A-Z a-z 0-9 . _ ~ : @ -`.
pub fn validate_id(field: &str, s: &str) -> Result<(), FieldError> {
    if s.is_empty() || s.len() > MAX_ID_LEN {
        return Err(FieldError::new(
            field,
            format!("{field} must be 1 to {MAX_ID_LEN} characters"),
        ));
    }
    if !s.bytes().all(id_char_ok) {
        return Err(FieldError::new(
            field,
            format!("{field} may only contain A-Z a-z 0-9 . _ ~ : @ -"),
        ));
    }
    Ok(())
}

macro_rules! id_type {
    ($(#[$doc:meta])* $name:ident, $field:literal) => {
        $(#[$doc])*
        #[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub struct $name(Arc<str>);

        impl $name {
            /// Parses an identifier; the error names the field.
            pub fn parse(s: &str) -> Result<Self, FieldError> {
                Self::parse_field(s, $field)
            }

            /// Parses an identifier whose error names `field` (e.g. `limits[3].id`).
            pub fn parse_field(s: &str, field: &str) -> Result<Self, FieldError> {
                validate_id(field, s)?;
                Ok(Self(Arc::from(s)))
            }

            pub fn as_str(&self) -> &str {
                &self.0
            }

            /// The shared string, cheap to clone into keys.
            pub fn as_arc(&self) -> &Arc<str> {
                &self.0
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                fmt::Debug::fmt(&*self.0, f)
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl Serialize for $name {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_str(&self.0)
            }
        }
    };
}

id_type!(
    /// A tenant: the owner of a quota policy.
    TenantId,
    "tenant"
);
id_type!(
    /// A client of a tenant (an API key, a user id...).
    ClientId,
    "client"
);
id_type!(
    /// The identity of a limit inside a policy; counts follow the id, not the values.
    LimitId,
    "id"
);

/// The subject a counter belongs to: one client, or the whole tenant.
///
/// Stored as the client id or `*` (a character no client id may contain).
pub const TENANT_SUBJECT: &str = "*";

/// A validated resource string (1 to 256 printable ASCII characters).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Resource(String);

impl Resource {
    pub fn parse(s: &str, field: &str) -> Result<Self, FieldError> {
        validate_resource(field, s)?;
        Ok(Self(s.to_owned()))
    }
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// Checks the contract's resource rule without allocating.
pub fn validate_resource(field: &str, s: &str) -> Result<(), FieldError> {
    if s.is_empty() || s.len() > MAX_RESOURCE_LEN {
        return Err(FieldError::new(
            field,
            format!("{field} must be 1 to {MAX_RESOURCE_LEN} characters"),
        ));
    }
    if !s.bytes().all(|c| (0x20..0x7f).contains(&c)) {
        return Err(FieldError::new(
            field,
            format!("{field} must be printable ASCII"),
        ));
    }
    Ok(())
}

/// Which checks a limit applies to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ResourceMatch {
    Exact(String),
    /// The pattern without its trailing `*`.
    Prefix(String),
}

impl ResourceMatch {
    fn parse(s: &str, field: &str) -> Result<Self, FieldError> {
        validate_resource(field, s)?;
        Ok(match s.strip_suffix('*') {
            Some(prefix) => ResourceMatch::Prefix(prefix.to_owned()),
            None => ResourceMatch::Exact(s.to_owned()),
        })
    }

    /// Whether a check on `resource` (None = the check named no resource) is covered.
    ///
    /// A check without a resource is only covered by limits without a resource filter: a limit
    /// on `PUT /products/*` says nothing about a request that did not say what it touches.
    pub fn matches(&self, resource: Option<&str>) -> bool {
        match (self, resource) {
            (_, None) => false,
            (ResourceMatch::Exact(e), Some(r)) => e == r,
            (ResourceMatch::Prefix(p), Some(r)) => r.starts_with(p.as_str()),
        }
    }

    fn render(&self) -> String {
        match self {
            ResourceMatch::Exact(e) => e.clone(),
            ResourceMatch::Prefix(p) => format!("{p}*"),
        }
    }
}

/// Calendar periods, aligned in UTC.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, ToSchema)]
#[schema(rename_all = "snake_case")]
pub enum Period {
    Second,
    Minute,
    Hour,
    Day,
    Month,
}

impl Period {
    fn parse(s: &str, field: &str) -> Result<Self, FieldError> {
        Ok(match s {
            "second" => Period::Second,
            "minute" => Period::Minute,
            "hour" => Period::Hour,
            "day" => Period::Day,
            "month" => Period::Month,
            _ => {
                return Err(FieldError::new(
                    field,
                    "period must be one of second, minute, hour, day, month",
                ))
            }
        })
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Period::Second => "second",
            Period::Minute => "minute",
            Period::Hour => "hour",
            Period::Day => "day",
            Period::Month => "month",
        }
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

/// The width of a counter bucket. Unix time has no leap seconds, so fixed widths that divide a
/// day are aligned with the UTC calendar; months are not fixed and get their own grain.
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
    /// A sliding window spans at most `MAX_BUCKETS_PER_WINDOW` buckets of its grain plus the
    /// partly expired one; a calendar period needs only its own bucket. One more grain of slack
    /// covers clock skew between instances. After this the janitor deletes the bucket.
    pub fn retention_ms(self) -> i64 {
        match self {
            Grain::Fixed(w) => w * (MAX_BUCKETS_PER_WINDOW + 2),
            Grain::Month => 63 * 86_400_000,
        }
    }
}

fn utc(t_ms: i64) -> DateTime<Utc> {
    DateTime::<Utc>::from_timestamp_millis(t_ms).unwrap_or_default()
}

/// Bucket widths a sliding window may be cut into. A window gets the widest one that still cuts
/// it into at least `MIN_BUCKETS_PER_WINDOW` buckets; the ladder's steps are at most 2.5x apart,
/// so a window has between 10 and 25 buckets (31 for the longest windows on the 1-day grain).
const GRAIN_LADDER_MS: [i64; 21] = [
    100, 200, 500, 1_000, 2_000, 5_000, 10_000, 15_000, 30_000, 60_000, 120_000, 300_000, 600_000,
    900_000, 1_800_000, 3_600_000, 7_200_000, 10_800_000, 21_600_000, 43_200_000, 86_400_000,
];
pub const MIN_BUCKETS_PER_WINDOW: i64 = 10;
/// The most buckets any sliding window spans (31 days on the 1-day grain), plus the partial one.
pub const MAX_BUCKETS_PER_WINDOW: i64 = 32;

/// The bucket grain of a sliding window of `window_ms`.
pub fn sliding_grain(window_ms: i64) -> i64 {
    let mut g = GRAIN_LADDER_MS[0];
    for &step in GRAIN_LADDER_MS.iter() {
        if step * MIN_BUCKETS_PER_WINDOW <= window_ms {
            g = step;
        }
    }
    g
}

/// How a limit counts: a sliding window or a calendar period.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LimitKind {
    Sliding { window_ms: i64, grain_ms: i64 },
    Calendar(Period),
}

impl LimitKind {
    pub fn grain(self) -> Grain {
        match self {
            LimitKind::Sliding { grain_ms, .. } => Grain::Fixed(grain_ms),
            LimitKind::Calendar(p) => p.grain(),
        }
    }
}

/// Whose count a limit keeps: each client its own, or one for all of the tenant's clients.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, ToSchema)]
#[schema(rename_all = "snake_case")]
pub enum Scope {
    Client,
    Tenant,
}

/// One limit of a policy.
#[derive(Clone, Debug, PartialEq)]
pub struct Limit {
    pub id: LimitId,
    pub max: u64,
    pub kind: LimitKind,
    pub scope: Scope,
    pub resource: Option<ResourceMatch>,
}

impl Limit {
    pub fn applies_to(&self, resource: Option<&str>) -> bool {
        match &self.resource {
            None => true,
            Some(m) => m.matches(resource),
        }
    }
}

/// `dry_run` always admits, and flags what enforcing would have denied.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, ToSchema)]
#[schema(rename_all = "snake_case")]
pub enum Mode {
    #[default]
    Enforce,
    DryRun,
}

/// `cached`: in-memory pre-check, hits synced every sync interval; `strict`: admitted only once
/// the store has counted the hit.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, ToSchema)]
#[schema(rename_all = "snake_case")]
pub enum Consistency {
    #[default]
    Cached,
    Strict,
}

/// What a check decides while the store fails: `local` enforces this instance's own view.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, ToSchema)]
#[schema(rename_all = "snake_case")]
pub enum OnStoreFailure {
    #[default]
    Local,
    Allow,
    Deny,
}

/// A validated policy: what an admin PUTs for a tenant or a client override.
#[derive(Clone, Debug, PartialEq)]
pub struct Policy {
    pub limits: Vec<Limit>,
    pub mode: Mode,
    pub consistency: Consistency,
    pub on_store_failure: OnStoreFailure,
}

/// The JSON form of a policy, as admins send it and as it is stored.
///
/// Unknown keys are refused: a typo such as `"windw"` must not silently turn a limit into
/// something else.
///
/// The `schema` attributes state for the OpenAPI document what [`Policy::from_doc`] enforces.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(as = Policy)]
pub struct PolicyDoc {
    /// Ids unique. All the limits that apply to a check must admit it.
    #[schema(min_items = 1, max_items = 16)]
    pub limits: Vec<LimitDoc>,
    /// Absent (or null): `enforce`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Mode>)]
    pub mode: Option<String>,
    /// Absent (or null): `cached`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Consistency>)]
    pub consistency: Option<String>,
    /// Absent (or null): `local`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<OnStoreFailure>)]
    pub on_store_failure: Option<String>,
}

/// One limit: exactly one of `window` (sliding) or `period` (calendar-aligned, UTC). Optional
/// fields may also be null, which reads as absent.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(as = Limit)]
pub struct LimitDoc {
    /// The limit's identity: counts follow the id.
    #[schema(pattern = "^[A-Za-z0-9._~:@-]{1,128}$", example = "per-second")]
    pub id: String,
    #[schema(value_type = u64, minimum = 1, maximum = 9007199254740992.0, example = 100)]
    pub max: serde_json::Number,
    /// A sliding window from 1s to 31d, such as `1s`, `10m`, `1h 30m`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<String>, example = "10m")]
    pub window: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Period>)]
    pub period: Option<String>,
    /// Applies to checks whose resource equals this, or starts with it when it ends in `*`.
    /// Absent (or null): applies to every check.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<String>, pattern = "^[ -~]{1,256}$", example = "PUT /products/*")]
    pub resource: Option<String>,
    /// Absent (or null): `client`. A client override holds client-scoped limits only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Scope>)]
    pub scope: Option<String>,
}

/// Parses a duration such as `250ms`, `1s`, `10m`, `1h 30m` into milliseconds.
pub fn parse_duration_ms(s: &str) -> Option<i64> {
    let d: Duration = humantime::parse_duration(s.trim()).ok()?;
    i64::try_from(d.as_millis()).ok()
}

/// Renders milliseconds the way `parse_duration_ms` reads them (`10m`, `1s 500ms`).
pub fn format_duration_ms(ms: i64) -> String {
    humantime::format_duration(Duration::from_millis(ms.max(0) as u64)).to_string()
}

impl Policy {
    /// Validates a policy document. `is_override` refuses tenant-scoped limits, which a single
    /// client's override cannot meaningfully own.
    pub fn from_doc(doc: &PolicyDoc, is_override: bool) -> Result<Policy, FieldError> {
        if doc.limits.is_empty() || doc.limits.len() > MAX_LIMITS {
            return Err(FieldError::new(
                "limits",
                format!("a policy has 1 to {MAX_LIMITS} limits"),
            ));
        }
        let mut limits: Vec<Limit> = Vec::with_capacity(doc.limits.len());
        for (i, l) in doc.limits.iter().enumerate() {
            let f = |name: &str| format!("limits[{i}].{name}");
            let id = LimitId::parse_field(&l.id, &f("id"))?;
            if limits.iter().any(|o| o.id == id) {
                return Err(FieldError::new(
                    f("id"),
                    format!("limit id {id} appears twice"),
                ));
            }
            let max = whole_u64(&l.max)
                .filter(|m| (1..=MAX_LIMIT).contains(m))
                .ok_or_else(|| {
                    FieldError::new(f("max"), format!("max must be an integer 1..={MAX_LIMIT}"))
                })?;
            let kind = match (&l.window, &l.period) {
                (Some(w), None) => {
                    let window_ms = parse_duration_ms(w)
                        .filter(|ms| (MIN_WINDOW_MS..=MAX_WINDOW_MS).contains(ms))
                        .ok_or_else(|| {
                            FieldError::new(
                                f("window"),
                                "window must be a duration from 1s to 31d, such as 1s, 10m, 1h",
                            )
                        })?;
                    LimitKind::Sliding {
                        window_ms,
                        grain_ms: sliding_grain(window_ms),
                    }
                }
                (None, Some(p)) => LimitKind::Calendar(Period::parse(p, &f("period"))?),
                _ => {
                    return Err(FieldError::new(
                        format!("limits[{i}]"),
                        "a limit has exactly one of window or period",
                    ))
                }
            };
            let scope = match l.scope.as_deref() {
                None | Some("client") => Scope::Client,
                Some("tenant") if !is_override => Scope::Tenant,
                Some("tenant") => {
                    return Err(FieldError::new(
                        f("scope"),
                        "a client override holds client-scoped limits only",
                    ))
                }
                Some(_) => {
                    return Err(FieldError::new(
                        f("scope"),
                        "scope must be client or tenant",
                    ))
                }
            };
            let resource = l
                .resource
                .as_deref()
                .map(|r| ResourceMatch::parse(r, &f("resource")))
                .transpose()?;
            limits.push(Limit {
                id,
                max,
                kind,
                scope,
                resource,
            });
        }
        let mode = match doc.mode.as_deref() {
            None | Some("enforce") => Mode::Enforce,
            Some("dry_run") => Mode::DryRun,
            Some(_) => return Err(FieldError::new("mode", "mode must be enforce or dry_run")),
        };
        let consistency = match doc.consistency.as_deref() {
            None | Some("cached") => Consistency::Cached,
            Some("strict") => Consistency::Strict,
            Some(_) => {
                return Err(FieldError::new(
                    "consistency",
                    "consistency must be cached or strict",
                ))
            }
        };
        let on_store_failure = match doc.on_store_failure.as_deref() {
            None | Some("local") => OnStoreFailure::Local,
            Some("allow") => OnStoreFailure::Allow,
            Some("deny") => OnStoreFailure::Deny,
            Some(_) => {
                return Err(FieldError::new(
                    "on_store_failure",
                    "on_store_failure must be local, allow or deny",
                ))
            }
        };
        Ok(Policy {
            limits,
            mode,
            consistency,
            on_store_failure,
        })
    }

    /// The canonical document of this policy, with every default spelled out.
    pub fn to_doc(&self) -> PolicyDoc {
        PolicyDoc {
            limits: self
                .limits
                .iter()
                .map(|l| LimitDoc {
                    id: l.id.to_string(),
                    max: l.max.into(),
                    window: match l.kind {
                        LimitKind::Sliding { window_ms, .. } => Some(format_duration_ms(window_ms)),
                        LimitKind::Calendar(_) => None,
                    },
                    period: match l.kind {
                        LimitKind::Calendar(p) => Some(p.as_str().to_owned()),
                        LimitKind::Sliding { .. } => None,
                    },
                    resource: l.resource.as_ref().map(ResourceMatch::render),
                    scope: Some(
                        match l.scope {
                            Scope::Client => "client",
                            Scope::Tenant => "tenant",
                        }
                        .to_owned(),
                    ),
                })
                .collect(),
            mode: Some(
                match self.mode {
                    Mode::Enforce => "enforce",
                    Mode::DryRun => "dry_run",
                }
                .to_owned(),
            ),
            consistency: Some(
                match self.consistency {
                    Consistency::Cached => "cached",
                    Consistency::Strict => "strict",
                }
                .to_owned(),
            ),
            on_store_failure: Some(
                match self.on_store_failure {
                    OnStoreFailure::Local => "local",
                    OnStoreFailure::Allow => "allow",
                    OnStoreFailure::Deny => "deny",
                }
                .to_owned(),
            ),
        }
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
        Policy {
            limits,
            mode: over.mode,
            consistency: over.consistency,
            on_store_failure: over.on_store_failure,
        }
    }
}

/// A JSON number as a non-negative integer, when it is one: `7`, and also `7.0` or `7e0`, which
/// JSON Schema's `integer` (what the API document says) includes. Not `7.5` or `-1`; and not a
/// float above 2^53, where floats stop being exact (no bound here is higher).
fn whole_u64(n: &serde_json::Number) -> Option<u64> {
    if let Some(u) = n.as_u64() {
        return Some(u);
    }
    let f = n.as_f64()?;
    // `-0.0` is 0: the range test below holds for it, and the cast gives 0.
    (f.fract() == 0.0 && (0.0..=MAX_LIMIT as f64).contains(&f)).then_some(f as u64)
}

/// A check's cost: 0 (peek) to 1,000,000.
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
    use proptest::prelude::*;

    fn doc(json: serde_json::Value) -> PolicyDoc {
        serde_json::from_value(json).unwrap()
    }

    #[test]
    fn ids_accept_the_contract_alphabet_and_refuse_the_rest() {
        assert!(TenantId::parse("acme.Corp_1~:@-").is_ok());
        assert_eq!(TenantId::parse("").unwrap_err().field, "tenant");
        assert!(TenantId::parse(&"a".repeat(128)).is_ok());
        assert!(TenantId::parse(&"a".repeat(129)).is_err());
        for bad in ["a b", "a/b", "a*", "é", "a\u{0}"] {
            assert!(ClientId::parse(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn resource_is_printable_ascii_up_to_256() {
        assert!(Resource::parse("PUT /products/42", "resource").is_ok());
        assert!(Resource::parse(&"x".repeat(257), "resource").is_err());
        assert!(Resource::parse("a\tb", "resource").is_err());
        assert!(Resource::parse("", "resource").is_err());
    }

    #[test]
    fn resource_patterns_match_exact_or_prefix() {
        let p = ResourceMatch::parse("PUT /products/*", "r").unwrap();
        assert!(p.matches(Some("PUT /products/42")));
        assert!(!p.matches(Some("GET /products/42")));
        assert!(!p.matches(None));
        let e = ResourceMatch::parse("GET /a", "r").unwrap();
        assert!(e.matches(Some("GET /a")));
        assert!(!e.matches(Some("GET /ab")));
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

    #[test]
    fn sliding_grains_cut_windows_into_10_to_32_buckets() {
        for w in [
            1_000,
            1_500,
            10_000,
            60_000,
            600_000,
            3_600_000,
            86_400_000,
            MAX_WINDOW_MS,
        ] {
            let g = sliding_grain(w);
            let n = w / g;
            assert!(
                (MIN_BUCKETS_PER_WINDOW..MAX_BUCKETS_PER_WINDOW).contains(&n),
                "{w}: {n}"
            );
        }
    }

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

    #[test]
    fn cost_defaults_to_one_and_is_bounded() {
        assert_eq!(parse_cost(None).unwrap(), 1);
        assert_eq!(parse_cost(Some(&0u64.into())).unwrap(), 0);
        assert_eq!(parse_cost(Some(&1_000_000u64.into())).unwrap(), 1_000_000);
        assert!(parse_cost(Some(&1_000_001u64.into())).is_err());
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
        for bad in [7.5, 0.5, -1.0, -0.5, 1_000_001.0, 1e300, f64::MIN_POSITIVE] {
            let e = cost(bad).unwrap_err();
            assert_eq!(
                (e.field.as_str(), e.message.as_str()),
                ("cost", "cost must be 0..=1000000")
            );
        }
        let max = |f: f64| {
            let doc = serde_json::json!({"limits": [{"id": "a", "max": f, "window": "1s"}]});
            let doc: PolicyDoc = serde_json::from_value(doc).unwrap();
            assert!(doc.limits[0].max.is_f64(), "the test sends a float");
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

    proptest! {
        #[test]
        fn id_parse_accepts_exactly_the_alphabet(s in "\\PC{0,140}") {
            let ok = !s.is_empty() && s.len() <= 128 && s.bytes().all(id_char_ok);
            prop_assert_eq!(TenantId::parse(&s).is_ok(), ok);
        }

        #[test]
        fn bucket_start_contains_the_instant(t in 0i64..4_000_000_000_000, gi in 0usize..21) {
            for g in [Grain::Fixed(GRAIN_LADDER_MS[gi]), Grain::Month] {
                let s = g.bucket_start(t);
                prop_assert!(s <= t && t < g.bucket_end(s));
            }
        }
    }
}
