//! Identifiers: tenants, clients and limit ids, and the error every domain parser returns.
//!
//! An id is 1 to `MAX_ID_LEN` characters of `A-Z a-z 0-9 . _ ~ : @ -`; once parsed it is a
//! cheap-to-clone `Arc<str>` that the core never re-validates. `*` is outside the alphabet, which
//! is what lets `TENANT_SUBJECT` stand for "the whole tenant" where a client id would be.

use std::fmt;
use std::sync::Arc;

use serde::Serialize;

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

fn id_char_ok(c: u8) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, b'.' | b'_' | b'~' | b':' | b'@' | b'-')
}

/// Checks the contract's identifier rule: 1 to `MAX_ID_LEN` characters of `A-Z a-z 0-9 . _ ~ : @ -`.
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

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

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

    proptest! {
        #[test]
        fn id_parse_accepts_exactly_the_alphabet(s in "\\PC{0,140}") {
            let ok = !s.is_empty() && s.len() <= 128 && s.bytes().all(id_char_ok);
            prop_assert_eq!(TenantId::parse(&s).is_ok(), ok);
        }
    }
}
