//! Resources: what a check says it touches, and the patterns a limit selects checks by.
//!
//! A resource is 1 to `MAX_RESOURCE_LEN` printable ASCII characters. A limit's pattern is a
//! resource, or a prefix when it ends in `*`; a check that names no resource is covered only by
//! limits without a pattern.

use super::FieldError;

/// Maximum length of a resource string.
pub const MAX_RESOURCE_LEN: usize = 256;

/// A resource built from what a proxy forwarded (a path, a descriptor value), as the rule
/// allows: printable ASCII kept, other bytes (raw UTF-8, control characters) percent-encoded,
/// cut to [`MAX_RESOURCE_LEN`]. Never refused: a limit's pattern matches a prefix anyway, and
/// refusing would let the request through a proxy that fails open.
pub fn resource_from_bytes(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len().min(MAX_RESOURCE_LEN));
    for &b in bytes {
        if (0x20..0x7f).contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
        if out.len() >= MAX_RESOURCE_LEN {
            break;
        }
    }
    out.truncate(MAX_RESOURCE_LEN);
    out
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
    pub(super) fn parse(s: &str, field: &str) -> Result<Self, FieldError> {
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

    /// The pattern as a policy document writes it (`/exports`, `PUT /products/*`).
    pub fn render(&self) -> String {
        match self {
            ResourceMatch::Exact(e) => e.clone(),
            ResourceMatch::Prefix(p) => format!("{p}*"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn forwarded_bytes_become_a_valid_resource() {
        assert_eq!(resource_from_bytes(b"POST /orders/1"), "POST /orders/1");
        let utf8 = resource_from_bytes("POST /orders/é".as_bytes());
        assert_eq!(utf8, "POST /orders/%C3%A9");
        assert_eq!(resource_from_bytes(b"a\tb"), "a%09b");
        let long = resource_from_bytes(&[0xff; 400]);
        assert_eq!(long.len(), MAX_RESOURCE_LEN);
        for r in [utf8, long] {
            assert!(validate_resource("r", &r).is_ok(), "{r}");
        }
    }

    #[test]
    fn resource_is_printable_ascii_up_to_256() {
        assert!(validate_resource("resource", "PUT /products/42").is_ok());
        assert!(validate_resource("resource", &"x".repeat(257)).is_err());
        assert!(validate_resource("resource", "a\tb").is_err());
        assert!(validate_resource("resource", "").is_err());
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
}
