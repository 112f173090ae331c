//! The plan: which migrations to apply, given what the keyspace records. Pure: it refuses
//! history that changed (a recorded file whose bytes differ) or that this binary does not know
//! (a newer binary migrated the keyspace), and otherwise returns what is missing, in order.

use super::{MigrateError, Migration};

/// A row of `schema_migrations`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AppliedMigration {
    pub version: u32,
    pub name: String,
    pub checksum: String,
}

/// What must be applied, given what the keyspace records. Refuses changed or unknown history.
pub fn plan<'a>(
    known: &'a [Migration],
    applied: &[AppliedMigration],
) -> Result<Vec<&'a Migration>, MigrateError> {
    for a in applied {
        match known.iter().find(|m| m.version == a.version) {
            None => {
                return Err(MigrateError::UnknownApplied {
                    version: a.version,
                    name: a.name.clone(),
                })
            }
            Some(m) if m.checksum != a.checksum => {
                return Err(MigrateError::ChecksumMismatch {
                    file: m.file.to_owned(),
                    recorded: a.checksum.clone(),
                    current: m.checksum.clone(),
                })
            }
            Some(_) => {}
        }
    }
    Ok(known
        .iter()
        .filter(|m| !applied.iter().any(|a| a.version == m.version))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scylla::migrate::{checksum, migrations};

    fn applied(m: &Migration) -> AppliedMigration {
        AppliedMigration {
            version: m.version,
            name: m.name.clone(),
            checksum: m.checksum.clone(),
        }
    }

    #[test]
    fn plan_applies_only_what_is_missing() {
        let known = migrations().unwrap();
        assert_eq!(plan(&known, &[]).unwrap().len(), known.len());
        let first = [applied(&known[0])];
        let pending = plan(&known, &first).unwrap();
        assert_eq!(
            pending.iter().map(|m| m.version).collect::<Vec<_>>(),
            known[1..].iter().map(|m| m.version).collect::<Vec<_>>()
        );
        let all: Vec<_> = known.iter().map(applied).collect();
        assert!(plan(&known, &all).unwrap().is_empty());
    }

    #[test]
    fn plan_refuses_a_changed_file_naming_it() {
        let known = migrations().unwrap();
        let mut a = applied(&known[0]);
        a.checksum = checksum("something else");
        let err = plan(&known, &[a]).unwrap_err();
        assert!(
            matches!(&err, MigrateError::ChecksumMismatch { file, .. } if file == known[0].file)
        );
        assert!(err.to_string().contains(known[0].file), "{err}");
    }

    #[test]
    fn plan_refuses_versions_from_a_newer_binary() {
        let known = migrations().unwrap();
        let newer = AppliedMigration {
            version: 9999,
            name: "future".into(),
            checksum: checksum("x"),
        };
        assert!(matches!(
            plan(&known, &[newer]),
            Err(MigrateError::UnknownApplied { version: 9999, .. })
        ));
    }
}
