//! Domain types: identifiers, limits and policies that can only hold valid values.
//!
//! Everything that crosses the HTTP edge or comes out of the store is parsed into these types
//! once; the limiter and the sync task never re-validate. A parse failure names the offending
//! field with a JSON-pointer-like path (`limits[2].window`) so the API can answer a 400 that says
//! exactly what is wrong.
//!
//! - `ids`: `FieldError`, and tenant, client and limit ids;
//! - `resource`: resource strings and the patterns limits select them by;
//! - `grain`: calendar periods and bucket grains, aligned on UTC;
//! - `window`: sliding windows, their grain ladder and how many buckets they take;
//! - `limit`, `policy`: the validated limit and policy;
//! - `hold`: reservations (holds) and in-flight limits;
//! - `doc`: the JSON policy document and its conversion to and from a `Policy`;
//! - `cost`: a check's cost, and JSON numbers as whole numbers;
//! - `wire`: the one table of names each policy enum is written with.
//!
//! Every item is re-exported here: use `crate::domain::X`.

mod wire;

mod cost;
mod doc;
mod grain;
mod hold;
mod ids;
mod limit;
mod policy;
mod resource;
mod window;

pub use cost::{parse_cost, whole_u64, MAX_COST};
pub use doc::{LimitDoc, PolicyDoc};
pub use grain::{Grain, Period, MONTH_GRAIN_CODE};
pub use hold::{
    hold_ms, HoldState, InFlight, DEFAULT_HOLD_MS, HOLD_MESSAGE, IN_FLIGHT_GRAIN_MS,
    IN_FLIGHT_KIND, MAX_HOLD_MS, MIN_HOLD_MS,
};
pub use ids::{validate_id, ClientId, FieldError, LimitId, TenantId, MAX_ID_LEN, TENANT_SUBJECT};
pub use limit::{Limit, LimitKind, Scope, MAX_LIMIT};
pub use policy::{Consistency, Mode, OnStoreFailure, Policy, MAX_LIMITS};
pub use resource::{
    normalize_path, normalize_resource, normalize_target, resource_from_bytes, validate_resource,
    ResourceMatch, MAX_RESOURCE_LEN,
};
pub use window::{
    fill_ms, format_duration_ms, parse_duration_ms, sliding_grain, token_grain,
    MAX_BUCKETS_PER_WINDOW, MAX_BUCKETS_READ, MAX_BUCKETS_SPANNED, MAX_FILL_MS, MAX_PER_MS,
    MAX_WINDOW_MS, MIN_BUCKETS_PER_WINDOW, MIN_FILL_MS, MIN_WINDOW_MS, TOKEN_BUCKETS_PER_FILL,
};
