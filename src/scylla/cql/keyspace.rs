//! The one rule for a keyspace name, used by the configuration, the store and the migrator.
//!
//! quotad never quotes the keyspace name in CQL, so the name must be an unquoted identifier
//! that means itself: the server folds unquoted names to lowercase, so a mixed-case setting
//! would silently name another keyspace. Hence lowercase only.

/// A keyspace name quotad accepts: a lowercase unquoted CQL identifier of at most 48
/// characters (Cassandra's limit): `a-z` first, then `a-z`, `0-9` or `_`.
pub fn validate_keyspace(ks: &str) -> Result<(), String> {
    let ok = (1..=48).contains(&ks.len())
        && ks.as_bytes()[0].is_ascii_lowercase()
        && ks
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_');
    if ok {
        Ok(())
    } else {
        Err(format!(
            "keyspace {ks:?} must be 1 to 48 characters of a-z 0-9 _, starting with a letter"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keyspace_names_are_plain_lowercase_identifiers() {
        assert!(validate_keyspace("quota").is_ok());
        assert!(validate_keyspace("quota_test_123").is_ok());
        assert!(validate_keyspace(&"a".repeat(48)).is_ok());
        for bad in [
            "",
            "Quota",
            "1quota",
            "quota-x",
            "q;drop",
            "q.x",
            &"a".repeat(49),
        ] {
            assert!(validate_keyspace(bad).is_err(), "{bad:?} accepted");
        }
    }
}
