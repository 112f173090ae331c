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

/// A request path as forward-auth compares it, so that no spelling of a path walks past a limit
/// on it: `%XX` of an unreserved character (letters, digits, `-._~`) decoded and other escapes'
/// hex upper-cased; a segment's parameters (`;...`, which servlet containers strip) dropped;
/// empty segments (`//`) and `.` dropped, `..` taking the segment before it away (RFC 3986
/// 5.2.4, never above the root); no trailing slash but the root's; letters in lower case, since
/// many backends (Express by default, IIS) route `/LOGIN` as `/login`, and a limiter that errs
/// errs toward limiting. `path` is printable ASCII (see [`resource_from_bytes`]).
pub fn normalize_path(path: &str) -> String {
    let mut segments: Vec<String> = Vec::new();
    for raw in path.split('/') {
        let raw = raw.split(';').next().unwrap_or("");
        let seg = decode_unreserved(raw);
        match seg.as_str() {
            "" | "." => {}
            ".." => {
                segments.pop();
            }
            _ => segments.push(seg),
        }
    }
    let mut out = String::with_capacity(path.len());
    for seg in &segments {
        out.push('/');
        out.push_str(seg);
    }
    if out.is_empty() {
        out.push('/');
    }
    out
}

/// A check's resource as limits compare it: when it is a request (`METHOD /path`, the method
/// in capitals), its path normalised as [`normalize_path`] does, the query after `?` kept as
/// given; anything else as given. Borrowed, with no allocation, when nothing changes.
pub fn normalize_resource(resource: &str) -> std::borrow::Cow<'_, str> {
    use std::borrow::Cow;
    let Some((method, rest)) = resource.split_once(' ') else {
        return Cow::Borrowed(resource);
    };
    if method.is_empty()
        || !method.bytes().all(|b| b.is_ascii_uppercase())
        || !rest.starts_with('/')
    {
        return Cow::Borrowed(resource);
    }
    match normalize_target(rest) {
        Cow::Borrowed(_) => Cow::Borrowed(resource),
        Cow::Owned(target) => Cow::Owned(format!("{method} {target}")),
    }
}

/// A request target (a path, then any `?query` or `#fragment`) as limits compare it: the path
/// normalised as [`normalize_path`] does, the rest kept as given. Borrowed when nothing changes.
pub fn normalize_target(target: &str) -> std::borrow::Cow<'_, str> {
    use std::borrow::Cow;
    let cut = target.find(['?', '#']).unwrap_or(target.len());
    let (path, query) = target.split_at(cut);
    if is_normal(path) {
        return Cow::Borrowed(target);
    }
    Cow::Owned(format!("{}{query}", normalize_path(path)))
}

/// Whether [`normalize_path`] would leave `path` as it is (no escape, parameter, empty or dot
/// segment, or trailing slash).
fn is_normal(path: &str) -> bool {
    path.starts_with('/')
        && !path.contains(['%', ';'])
        && !path.bytes().any(|b| b.is_ascii_uppercase())
        && (path == "/" || !path.ends_with('/'))
        && path[1..]
            .split('/')
            .all(|seg| !matches!(seg, "" | "." | ".."))
}

/// `%XX` of an unreserved character decoded, other escapes' hex upper-cased, letters lowered.
fn decode_unreserved(seg: &str) -> String {
    let b = seg.as_bytes();
    let mut out = String::with_capacity(seg.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' && i + 2 < b.len() {
            let hex = |c: u8| (c as char).to_digit(16);
            if let (Some(h), Some(l)) = (hex(b[i + 1]), hex(b[i + 2])) {
                let c = (h * 16 + l) as u8;
                if c.is_ascii_alphanumeric() || b"-._~".contains(&c) {
                    out.push(c.to_ascii_lowercase() as char);
                } else {
                    out.push('%');
                    out.push((b[i + 1] as char).to_ascii_uppercase());
                    out.push((b[i + 2] as char).to_ascii_uppercase());
                }
                i += 3;
                continue;
            }
        }
        out.push(b[i].to_ascii_lowercase() as char);
        i += 1;
    }
    out
}

/// A pattern of the form `METHOD /path` with its path's letters lowered, as checks' resources
/// are ([`normalize_resource`]); the hex of `%XX` escapes upper-cased, as they are. Anything
/// else as given.
fn fold_path_case(pattern: &str) -> std::borrow::Cow<'_, str> {
    use std::borrow::Cow;
    let Some((method, path)) = pattern.split_once(' ') else {
        return Cow::Borrowed(pattern);
    };
    let request = !method.is_empty()
        && method.bytes().all(|b| b.is_ascii_uppercase())
        && path.starts_with('/');
    if !request || !path.bytes().any(|b| b.is_ascii_uppercase()) {
        return Cow::Borrowed(pattern);
    }
    let mut out = String::with_capacity(pattern.len());
    out.push_str(method);
    out.push(' ');
    let b = path.as_bytes();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' && i + 2 < b.len() {
            out.push('%');
            out.push(b[i + 1].to_ascii_uppercase() as char);
            out.push(b[i + 2].to_ascii_uppercase() as char);
            i += 3;
            continue;
        }
        out.push(b[i].to_ascii_lowercase() as char);
        i += 1;
    }
    Cow::Owned(out)
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
        // A request's pattern (`METHOD /path`) in the case its resources are compared in.
        let s = fold_path_case(s);
        Ok(match s.strip_suffix('*') {
            Some(prefix) => ResourceMatch::Prefix(prefix.to_owned()),
            None => ResourceMatch::Exact(s.into_owned()),
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
    fn every_spelling_of_a_path_is_one_path() {
        for p in [
            "/login",
            "/%6Cogin",
            "/%6cogin",
            "//login",
            "/./login",
            "/login/",
            "/login;x",
            "/login;jsessionid=1/",
            "/a/../login",
            "/../login",
            "/%2E/login",
            "/a/%2e%2E/login",
        ] {
            assert_eq!(normalize_path(p), "/login", "{p}");
        }
        assert_eq!(normalize_path("/"), "/");
        assert_eq!(normalize_path(""), "/");
        assert_eq!(normalize_path("/LOGIN"), "/login", "case is folded");
        assert_eq!(normalize_path("/%4Cogin"), "/login");
        // An escape of a reserved character stays one (a slash inside a segment is not a
        // separator), its hex upper-cased.
        assert_eq!(normalize_path("/a%2fb/"), "/a%2Fb");
        assert_eq!(normalize_path("/a%"), "/a%");
        assert_eq!(normalize_path("/a%4"), "/a%4");
    }

    #[test]
    fn a_check_resource_that_is_a_request_has_its_path_normalised() {
        for r in [
            "POST /login",
            "POST /LOGIN",
            "POST /Login/",
            "POST /%6Cogin",
            "POST //login",
            "POST /./login",
            "POST /login/",
            "POST /login;x",
            "POST /a/../login",
        ] {
            assert_eq!(normalize_resource(r), "POST /login", "{r}");
        }
        assert!(matches!(
            normalize_resource("POST /login"),
            std::borrow::Cow::Borrowed(_)
        ));
        assert_eq!(normalize_resource("GET /a//b/?x=1//"), "GET /a/b?x=1//");
        assert_eq!(
            normalize_resource("POST /LOGIN"),
            "POST /login",
            "case is folded"
        );
        assert_eq!(
            normalize_resource("GET /A?Q=X"),
            "GET /a?Q=X",
            "the query as given"
        );
        for opaque in ["export", "reports:daily", "get //x", "POST login/", "/a//b"] {
            assert_eq!(normalize_resource(opaque), opaque);
        }
        assert_eq!(normalize_resource("GET /"), "GET /");
    }

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
        // A request's pattern is in the case its resources are compared in; others as given.
        let f = ResourceMatch::parse("POST /Login%2fX", "r").unwrap();
        assert_eq!(f, ResourceMatch::Exact("POST /login%2Fx".into()));
        assert!(f.matches(Some(&normalize_resource("POST /LOGIN%2Fx"))));
        let o = ResourceMatch::parse("Reports:Daily", "r").unwrap();
        assert_eq!(o, ResourceMatch::Exact("Reports:Daily".into()));
    }
}
