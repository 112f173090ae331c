//! The migration files: compiled into the binary ([`MIGRATION_FILES`]), named `NNNN_name.cql`,
//! identified by the sha256 of their bytes, and split into statements.
//!
//! Conventions of the files (checked by the tests below):
//! - named `NNNN_name.cql` (at least four digits, lowercase name), applied by version;
//! - tables only, never a keyspace name, so `cqlsh -k <ks> -f <file>` applies one by hand;
//! - every statement `IF NOT EXISTS`: a file is recorded only after all its statements ran, so a
//!   run cut off half-way re-runs the whole file next time, and that must be harmless.

use sha2::{Digest, Sha256};

use super::MigrateError;

/// Every migration file, in the binary. A test asserts this list is exactly `migrations/*.cql`.
pub const MIGRATION_FILES: &[(&str, &str)] = &[
    (
        "0001_counters.cql",
        include_str!("../../../migrations/0001_counters.cql"),
    ),
    (
        "0002_policies.cql",
        include_str!("../../../migrations/0002_policies.cql"),
    ),
    (
        "0003_members.cql",
        include_str!("../../../migrations/0003_members.cql"),
    ),
    (
        "0004_history_audit.cql",
        include_str!("../../../migrations/0004_history_audit.cql"),
    ),
    (
        "0005_idempotency.cql",
        include_str!("../../../migrations/0005_idempotency.cql"),
    ),
    (
        "0006_client_counters.cql",
        include_str!("../../../migrations/0006_client_counters.cql"),
    ),
    (
        "0007_regions.cql",
        include_str!("../../../migrations/0007_regions.cql"),
    ),
    (
        "0008_holds.cql",
        include_str!("../../../migrations/0008_holds.cql"),
    ),
    (
        "0009_members_written.cql",
        include_str!("../../../migrations/0009_members_written.cql"),
    ),
];

/// One migration file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Migration {
    pub version: u32,
    /// The part of the file name after `NNNN_`, without `.cql`.
    pub name: String,
    pub file: &'static str,
    pub text: &'static str,
    /// sha256 of the file's bytes, lowercase hex.
    pub checksum: String,
}

/// Splits `NNNN_name.cql` into its version and name.
pub fn parse_file_name(file: &str) -> Result<(u32, &str), String> {
    let stem = file
        .strip_suffix(".cql")
        .ok_or("a migration file name ends in .cql")?;
    let (digits, name) = stem
        .split_once('_')
        .ok_or("a migration file is named NNNN_name.cql")?;
    if digits.len() < 4 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err("a migration file name starts with at least four digits".into());
    }
    if name.is_empty()
        || !name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
    {
        return Err("a migration name is lowercase letters, digits and _".into());
    }
    let version: u32 = digits
        .parse()
        .map_err(|_| "the version number is too large".to_string())?;
    if version == 0 {
        return Err("versions start at 1".into());
    }
    Ok((version, name))
}

/// sha256 of the file's bytes, lowercase hex. Bytes, not statements: any edit counts, even
/// one in a comment, because a file is history and history is not edited.
pub fn checksum(text: &str) -> String {
    hex::encode(Sha256::digest(text.as_bytes()))
}

/// Parses and orders a set of files; refuses bad names and duplicate versions.
pub fn load(files: &[(&'static str, &'static str)]) -> Result<Vec<Migration>, MigrateError> {
    let mut out = Vec::with_capacity(files.len());
    for &(file, text) in files {
        let (version, name) = parse_file_name(file).map_err(|message| MigrateError::BadFile {
            file: file.to_owned(),
            message,
        })?;
        if split_statements(text).is_empty() {
            return Err(MigrateError::BadFile {
                file: file.to_owned(),
                message: "holds no statement".into(),
            });
        }
        out.push(Migration {
            version,
            name: name.to_owned(),
            file,
            text,
            checksum: checksum(text),
        });
    }
    out.sort_by_key(|m| m.version);
    for pair in out.windows(2) {
        if pair[0].version == pair[1].version {
            return Err(MigrateError::BadFile {
                file: pair[1].file.to_owned(),
                message: format!(
                    "version {} is also used by {}",
                    pair[0].version, pair[0].file
                ),
            });
        }
    }
    Ok(out)
}

/// The migrations compiled into this binary, in order.
pub fn migrations() -> Result<Vec<Migration>, MigrateError> {
    load(MIGRATION_FILES)
}

/// Splits a CQL file into statements: `;` ends one, except inside '...' strings (with ''
/// escapes), "..." identifiers and $$...$$ blocks; `--` and `//` line comments and `/* */`
/// comments are dropped. Statements come back trimmed, without the `;`.
pub fn split_statements(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\'' | '"' => {
                cur.push(c);
                while let Some(d) = chars.next() {
                    cur.push(d);
                    if d == c {
                        // A doubled quote is an escaped quote, not the end.
                        if chars.peek() == Some(&c) {
                            cur.push(chars.next().unwrap_or(c));
                        } else {
                            break;
                        }
                    }
                }
            }
            '$' if chars.peek() == Some(&'$') => {
                chars.next();
                cur.push_str("$$");
                let mut prev = '\0';
                for d in chars.by_ref() {
                    cur.push(d);
                    if prev == '$' && d == '$' {
                        break;
                    }
                    prev = d;
                }
            }
            '-' if chars.peek() == Some(&'-') => skip_line(&mut chars),
            '/' if chars.peek() == Some(&'/') => skip_line(&mut chars),
            '/' if chars.peek() == Some(&'*') => {
                chars.next();
                let mut prev = '\0';
                for d in chars.by_ref() {
                    if prev == '*' && d == '/' {
                        break;
                    }
                    prev = d;
                }
                cur.push(' ');
            }
            ';' => {
                let s = cur.trim();
                if !s.is_empty() {
                    out.push(s.to_owned());
                }
                cur.clear();
            }
            _ => cur.push(c),
        }
    }
    let s = cur.trim();
    if !s.is_empty() {
        out.push(s.to_owned());
    }
    out
}

fn skip_line(chars: &mut std::iter::Peekable<std::str::Chars<'_>>) {
    for d in chars.by_ref() {
        if d == '\n' {
            break;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_names_give_version_and_name() {
        assert_eq!(parse_file_name("0001_counters.cql"), Ok((1, "counters")));
        assert_eq!(parse_file_name("0120_add_x_2.cql"), Ok((120, "add_x_2")));
        for bad in [
            "001_short.cql",
            "0001_counters.sql",
            "0001counters.cql",
            "0001_.cql",
            "0001_Upper.cql",
            "0000_zero.cql",
            "abcd_x.cql",
            "99999999999_big.cql",
        ] {
            assert!(parse_file_name(bad).is_err(), "{bad} accepted");
        }
    }

    #[test]
    fn load_orders_by_version_and_refuses_duplicates() {
        let files: &[(&str, &str)] = &[
            (
                "0010_b.cql",
                "CREATE TABLE IF NOT EXISTS b (k int PRIMARY KEY);",
            ),
            (
                "0002_a.cql",
                "CREATE TABLE IF NOT EXISTS a (k int PRIMARY KEY);",
            ),
        ];
        let m = load(files).unwrap();
        assert_eq!(m.iter().map(|m| m.version).collect::<Vec<_>>(), vec![2, 10]);
        let dup: &[(&str, &str)] = &[("0002_a.cql", "SELECT 1"), ("0002_b.cql", "SELECT 1")];
        match load(dup) {
            Err(MigrateError::BadFile { file, .. }) => assert_eq!(file, "0002_b.cql"),
            other => panic!("{other:?}"),
        }
        let empty: &[(&str, &str)] = &[("0001_a.cql", "-- nothing\n")];
        assert!(load(empty).is_err());
    }

    #[test]
    fn checksum_is_sha256_of_the_bytes() {
        assert_eq!(
            checksum(""),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
        assert_ne!(checksum("a;"), checksum("a; "));
    }

    #[test]
    fn statements_split_outside_strings_and_comments() {
        let text = "-- header; not a statement\n\
            CREATE TABLE a (k text PRIMARY KEY) WITH comment = 'x;y''z';\n\
            /* block; */ INSERT INTO a (k) VALUES ('a--b');  // tail; comment\n\
            SELECT \"we;ird\" FROM a; ;\n\
            CREATE FUNCTION f() RETURNS NULL ON NULL INPUT RETURNS int LANGUAGE java AS $$ return 1; $$\n";
        let s = split_statements(text);
        assert_eq!(
            s,
            vec![
                "CREATE TABLE a (k text PRIMARY KEY) WITH comment = 'x;y''z'",
                "INSERT INTO a (k) VALUES ('a--b')",
                "SELECT \"we;ird\" FROM a",
                "CREATE FUNCTION f() RETURNS NULL ON NULL INPUT RETURNS int LANGUAGE java AS $$ return 1; $$",
            ]
        );
    }

    #[test]
    fn the_embedded_list_is_exactly_the_migrations_directory() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/migrations");
        let mut on_disk: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .filter(|n| n.ends_with(".cql"))
            .collect();
        on_disk.sort();
        let mut embedded: Vec<String> =
            MIGRATION_FILES.iter().map(|(f, _)| f.to_string()).collect();
        embedded.sort();
        assert_eq!(on_disk, embedded, "add new files to MIGRATION_FILES");
        for (f, text) in MIGRATION_FILES {
            let disk = std::fs::read_to_string(format!("{dir}/{f}")).unwrap();
            assert_eq!(&disk, text);
        }
        migrations().unwrap();
    }

    #[test]
    fn shipped_migrations_are_rerunnable_and_keyspace_free() {
        for m in migrations().unwrap() {
            for s in split_statements(m.text) {
                let upper = s.to_ascii_uppercase();
                assert!(
                    upper.starts_with("CREATE ") && upper.contains(" IF NOT EXISTS "),
                    "{}: not an idempotent CREATE: {s}",
                    m.file
                );
                let head: String = upper.split('(').next().unwrap_or("").to_owned();
                assert!(!head.contains('.'), "{}: names a keyspace: {s}", m.file);
                assert!(!upper.contains("KEYSPACE"), "{}: {s}", m.file);
            }
        }
    }
}
