//! The `auth` section: the admin and check tokens, and scoped tokens with a role.

use serde::Deserialize;

use super::Secret;

#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AuthSettings {
    /// Bearer token for the admin API; a random one is made (and logged once) when empty and
    /// no `admin` entry is in `tokens`.
    pub admin_token: Secret,
    /// Bearer token for `/v1/check`; empty (and no `check` entry in `tokens`) = checks need none.
    pub check_token: Secret,
    /// The same two, read from files at start (a mounted Kubernetes Secret); one trailing
    /// newline is dropped. Each excludes its inline form.
    pub admin_token_file: Option<std::path::PathBuf>,
    pub check_token_file: Option<std::path::PathBuf>,
    /// Checks need no token although quotad listens beyond loopback: only where something
    /// else (a network policy, a proxy) decides who reaches the port. Off, such a
    /// configuration stops start-up.
    pub open_checks: bool,
    /// Tokens with a role and optionally a tenant scope, stored as salted hashes
    /// (`quotad hash-token` prints one).
    pub tokens: Vec<TokenSettings>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// Everything, for every tenant.
    Admin,
    /// Manage and read the listed tenants' quotas and usage (and check them).
    TenantAdmin,
    /// Call `/v1/check` for the listed tenants (all when none are listed).
    Check,
}

impl Role {
    /// As the configuration spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Admin => "admin",
            Role::TenantAdmin => "tenant_admin",
            Role::Check => "check",
        }
    }
}

#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TokenSettings {
    /// Who the token is, for logs and the audit log (never the token). Unique; when empty,
    /// the token is named `<role>-<first 8 hex digits of sha256>`.
    #[serde(default)]
    pub name: String,
    /// The token's salted hash (argon2id, PHC string), as `quotad hash-token` prints it.
    #[serde(default)]
    pub hash: String,
    /// Deprecated: the token's unsalted SHA-256 in hex, accepted with a warning at start.
    /// Exactly one of `hash` and `sha256` is set.
    #[serde(default)]
    pub sha256: String,
    pub role: Role,
    /// The tenants this token may act on; required for `tenant_admin`, optional for `check`.
    #[serde(default)]
    pub tenants: Option<Vec<String>>,
}
