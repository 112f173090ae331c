//! Driver errors as [`StoreError`]s: the one decision a caller needs is whether trying again
//! is safe (`Unavailable`: nothing was written), unsafe (`Uncertain`: a write may have landed,
//! and counter writes are never resent) or pointless (`Internal`).

use std::fmt;

use scylla::errors::{
    DbError, ExecutionError, NewSessionError, NextPageError, NextRowError, PagerExecutionError,
    PrepareError, RequestAttemptError, RequestError, UseKeyspaceError, WriteType,
};
use scylla::statement::Consistency;

use crate::scylla::cql::{explain_connect_error, StoreTls};
use crate::store::{StoreError, StoreResult};

/// Whether the failed request could have changed data: decides between "nothing written,
/// retry safe" and "may have landed".
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Op {
    Read,
    Write,
}

impl Op {
    /// The error for an outcome we cannot know: a write may have landed, a read changed nothing.
    fn unknown(self, msg: String) -> StoreError {
        match self {
            Op::Read => StoreError::Unavailable(msg),
            Op::Write => StoreError::Uncertain(msg),
        }
    }
}

fn map_db(db: &DbError, msg: &str, op: Op) -> StoreError {
    let mut text = format!("{db}: {msg}");
    if let DbError::WriteTimeout {
        write_type: WriteType::Counter,
        consistency: Consistency::One,
        ..
    } = db
    {
        // Cassandra reports a counter update whose leading replica did not answer at ONE,
        // the leader's own write, whatever the request's consistency was.
        text.push_str(
            " (the replica leading this counter update did not answer; ONE is its own write, \
             the request was at store.consistency)",
        );
    }
    match db {
        // The coordinator refused before anything ran.
        DbError::Unavailable { .. } | DbError::Overloaded | DbError::IsBootstrapping => {
            StoreError::Unavailable(text)
        }
        DbError::RateLimitReached {
            rejected_by_coordinator: true,
            ..
        } => StoreError::Unavailable(text),
        // A read part timed out (including the read phase of a lightweight transaction):
        // nothing was written.
        DbError::ReadTimeout { .. } | DbError::ReadFailure { .. } => StoreError::Unavailable(text),
        DbError::Unprepared { .. } => StoreError::Unavailable(text),
        DbError::SyntaxError
        | DbError::Invalid
        | DbError::AlreadyExists { .. }
        | DbError::FunctionFailure { .. }
        | DbError::AuthenticationError
        | DbError::Unauthorized
        | DbError::ConfigError
        | DbError::ProtocolError
        | DbError::TruncateError => StoreError::Internal(text),
        // WriteTimeout, WriteFailure, ServerError, a replica's rate limit, and codes this
        // driver version does not know: some replica may have applied a write.
        _ => op.unknown(text),
    }
}

fn map_attempt(e: &RequestAttemptError, op: Op) -> StoreError {
    match e {
        RequestAttemptError::DbError(db, msg) => map_db(db, msg, op),
        // Failed before anything was sent.
        RequestAttemptError::SerializationError(_)
        | RequestAttemptError::CqlRequestSerialization(_) => StoreError::Internal(e.to_string()),
        RequestAttemptError::UnableToAllocStreamId => StoreError::Unavailable(e.to_string()),
        // Sent, then the connection broke or the answer was garbled.
        _ => op.unknown(e.to_string()),
    }
}

pub(crate) fn map_exec(e: ExecutionError, op: Op) -> StoreError {
    match &e {
        ExecutionError::LastAttemptError(a) => map_attempt(a, op),
        ExecutionError::BadQuery(_) => StoreError::Internal(e.to_string()),
        ExecutionError::EmptyPlan
        | ExecutionError::ConnectionPoolError(_)
        | ExecutionError::PrepareError(_) => StoreError::Unavailable(e.to_string()),
        // The client stopped waiting; the request may still run on the server.
        ExecutionError::RequestTimeout(_) => op.unknown(e.to_string()),
        _ => op.unknown(e.to_string()),
    }
}

fn map_request(e: &RequestError) -> StoreError {
    match e {
        RequestError::LastAttemptError(a) => map_attempt(a, Op::Read),
        _ => StoreError::Unavailable(e.to_string()),
    }
}

fn map_next_page(e: &NextPageError) -> StoreError {
    match e {
        NextPageError::RequestFailure(r) => map_request(r),
        _ => StoreError::Internal(e.to_string()),
    }
}

pub(crate) fn map_pager(e: PagerExecutionError) -> StoreError {
    match &e {
        PagerExecutionError::NextPageError(n) => map_next_page(n),
        PagerExecutionError::SerializationError(_) => StoreError::Internal(e.to_string()),
        _ => StoreError::Unavailable(e.to_string()),
    }
}

pub(crate) fn map_next_row(e: NextRowError) -> StoreError {
    match &e {
        NextRowError::NextPageError(n) => map_next_page(n),
        _ => StoreError::Internal(e.to_string()),
    }
}

pub(crate) fn map_prepare(cql: &str, e: PrepareError) -> StoreError {
    match &e {
        PrepareError::AllAttemptsFailed {
            first_attempt: RequestAttemptError::DbError(DbError::Invalid | DbError::SyntaxError, _),
        } => StoreError::Internal(format!(
            "preparing `{cql}`: {e}; is the keyspace migrated? run `quotad migrate`"
        )),
        _ => StoreError::Unavailable(format!("preparing `{cql}`: {e}")),
    }
}

pub(crate) fn map_new_session(e: NewSessionError, tls: Option<&StoreTls>) -> StoreError {
    match &e {
        NewSessionError::EmptyKnownNodesList | NewSessionError::IllegalConfig(_) => {
            StoreError::Internal(e.to_string())
        }
        NewSessionError::UseKeyspaceError(UseKeyspaceError::RequestError(
            RequestAttemptError::DbError(_, _),
        ))
        | NewSessionError::UseKeyspaceError(UseKeyspaceError::BadKeyspaceName(_)) => {
            StoreError::Internal(format!(
                "{e}; does the keyspace exist? run `quotad migrate`"
            ))
        }
        _ => StoreError::Unavailable(explain_connect_error(&e.to_string(), tls)),
    }
}

pub(crate) fn internal(e: impl fmt::Display) -> StoreError {
    StoreError::Internal(e.to_string())
}

/// The outcome of a multi-partition write as one [`StoreError`]: once any partition landed,
/// or any outcome is unknown, a resend would double-count, so the whole call is `Uncertain`.
pub(crate) fn combine_write_outcomes(outcomes: Vec<StoreResult<()>>) -> StoreResult<()> {
    let n = outcomes.len();
    let mut landed = 0;
    let mut errors = Vec::new();
    for o in outcomes {
        match o {
            Ok(()) => landed += 1,
            Err(e) => errors.push(e),
        }
    }
    let Some(first) = errors.first() else {
        return Ok(());
    };
    if landed > 0 || errors.iter().any(|e| matches!(e, StoreError::Uncertain(_))) {
        return Err(StoreError::Uncertain(format!(
            "{landed} of {n} partition writes landed, the others failed or are unknown: {first}"
        )));
    }
    Err(
        match errors
            .iter()
            .find(|e| matches!(e, StoreError::Internal(_)))
            .unwrap_or(first)
        {
            StoreError::Internal(m) => StoreError::Internal(m.clone()),
            e => StoreError::Unavailable(e.to_string()),
        },
    )
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use scylla::statement::Consistency;

    use super::*;

    #[test]
    fn a_partly_landed_write_is_uncertain_never_retryable() {
        let un = || Err(StoreError::Unavailable("down".into()));
        assert!(combine_write_outcomes(vec![Ok(()), Ok(())]).is_ok());
        assert!(combine_write_outcomes(vec![]).is_ok());
        assert!(matches!(
            combine_write_outcomes(vec![un(), un()]),
            Err(StoreError::Unavailable(_))
        ));
        assert!(matches!(
            combine_write_outcomes(vec![Ok(()), un()]),
            Err(StoreError::Uncertain(_))
        ));
        assert!(matches!(
            combine_write_outcomes(vec![un(), Err(StoreError::Uncertain("t".into()))]),
            Err(StoreError::Uncertain(_))
        ));
        assert!(matches!(
            combine_write_outcomes(vec![un(), Err(StoreError::Internal("bug".into()))]),
            Err(StoreError::Internal(_))
        ));
    }

    #[test]
    fn driver_errors_map_to_what_a_caller_may_do() {
        let wt = DbError::WriteTimeout {
            consistency: Consistency::LocalQuorum,
            received: 1,
            required: 2,
            write_type: scylla::errors::WriteType::Counter,
        };
        assert!(matches!(
            map_db(&wt, "", Op::Write),
            StoreError::Uncertain(_)
        ));
        let unavailable = DbError::Unavailable {
            consistency: Consistency::LocalQuorum,
            required: 2,
            alive: 1,
        };
        assert!(matches!(
            map_db(&unavailable, "", Op::Write),
            StoreError::Unavailable(_)
        ));
        assert!(matches!(
            map_db(&DbError::Overloaded, "", Op::Write),
            StoreError::Unavailable(_)
        ));
        assert!(matches!(
            map_db(&DbError::Invalid, "unconfigured table", Op::Read),
            StoreError::Internal(_)
        ));
        assert!(matches!(
            map_db(&DbError::ServerError, "", Op::Write),
            StoreError::Uncertain(_)
        ));
        assert!(matches!(
            map_db(&DbError::ServerError, "", Op::Read),
            StoreError::Unavailable(_)
        ));
        let rl = |by_coordinator| DbError::RateLimitReached {
            op_type: scylla::errors::OperationType::Write,
            rejected_by_coordinator: by_coordinator,
        };
        assert!(matches!(
            map_db(&rl(true), "", Op::Write),
            StoreError::Unavailable(_)
        ));
        assert!(matches!(
            map_db(&rl(false), "", Op::Write),
            StoreError::Uncertain(_)
        ));
        let timeout = || ExecutionError::RequestTimeout(Duration::from_millis(5));
        assert!(matches!(
            map_exec(timeout(), Op::Write),
            StoreError::Uncertain(_)
        ));
        assert!(matches!(
            map_exec(timeout(), Op::Read),
            StoreError::Unavailable(_)
        ));
        assert!(matches!(
            map_exec(ExecutionError::EmptyPlan, Op::Write),
            StoreError::Unavailable(_)
        ));
        let leader = DbError::WriteTimeout {
            consistency: Consistency::One,
            received: 0,
            required: 1,
            write_type: scylla::errors::WriteType::Counter,
        };
        let said = map_db(&leader, "", Op::Write).to_string();
        assert!(said.contains("leading this counter update"), "{said}");
        assert!(!map_db(&wt, "", Op::Write)
            .to_string()
            .contains("leading this counter update"));
        let db =
            |e| ExecutionError::LastAttemptError(RequestAttemptError::DbError(e, String::new()));
        assert!(matches!(
            map_exec(db(wt.clone()), Op::Write),
            StoreError::Uncertain(_)
        ));
    }
}
