//! What can stop a migration, each case naming the file or the option at fault.

#[derive(Debug, thiserror::Error)]
pub enum MigrateError {
    #[error("invalid configuration: {0}")]
    Config(String),
    #[error("invalid migration file {file}: {message}")]
    BadFile { file: String, message: String },
    #[error("cannot connect to the cluster: {0}")]
    Connect(String),
    #[error("{file}: statement {statement} failed: {message}")]
    Statement {
        file: String,
        statement: usize,
        message: String,
    },
    #[error(
        "{file} was applied with checksum {recorded} but the file now has {current}: applied \
         migrations must never change; add a new migration instead"
    )]
    ChecksumMismatch {
        file: String,
        recorded: String,
        current: String,
    },
    #[error(
        "the keyspace has migration {version} ({name}) that this binary does not know: it was \
         migrated by a newer quotad"
    )]
    UnknownApplied { version: u32, name: String },
    #[error("cluster error: {0}")]
    Cql(String),
    #[error("cannot write the report: {0}")]
    Io(#[from] std::io::Error),
}

pub(super) fn cql_err(e: impl std::fmt::Display) -> MigrateError {
    MigrateError::Cql(e.to_string())
}
