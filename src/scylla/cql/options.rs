//! How to reach the cluster: [`ScyllaOptions`], checked
//! by [`ScyllaOptions::validate`] before anything connects, and the consistency names of the
//! configuration ([`parse_consistency`]).

use std::fmt;
use std::time::Duration;

use scylla::statement::Consistency;

use super::{validate_keyspace, StoreTls};

/// How to reach the cluster. Which shard an instance writes is not configured: it claims
/// one through the store (`store::lease`).
#[derive(Clone)]
pub struct ScyllaOptions {
    /// Contact points, `host:port`.
    pub nodes: Vec<String>,
    /// Validated by [`super::validate_keyspace`].
    pub keyspace: String,
    /// For every request; LOCAL_QUORUM unless configured.
    pub consistency: Consistency,
    /// Client-side timeout of one request. A counter write that runs out of it is uncertain.
    pub request_timeout: Duration,
    /// Timeout of opening a connection.
    pub connect_timeout: Duration,
    /// CQL replication map for a keyspace `quotad migrate` creates.
    pub replication: String,
    /// The local datacenter: requests go to its nodes first (LOCAL_QUORUM is local to the
    /// coordinator, so with several datacenters set this).
    pub local_dc: Option<String>,
    /// Password authentication, when both are set.
    pub username: Option<String>,
    pub password: Option<String>,
    /// TLS to the nodes (`store.tls_*`); none: plain text.
    pub tls: Option<StoreTls>,
    /// Most requests in flight for one store call (read fan-out, partition writes).
    pub max_concurrency: usize,
}

impl Default for ScyllaOptions {
    fn default() -> Self {
        Self {
            nodes: vec!["127.0.0.1:9042".into()],
            keyspace: "quota".into(),
            consistency: Consistency::LocalQuorum,
            request_timeout: Duration::from_millis(6_000),
            connect_timeout: Duration::from_secs(5),
            replication: "{'class': 'SimpleStrategy', 'replication_factor': 1}".into(),
            local_dc: None,
            username: None,
            password: None,
            tls: None,
            max_concurrency: 32,
        }
    }
}

/// Hand-written so the password never reaches a log.
impl fmt::Debug for ScyllaOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ScyllaOptions")
            .field("nodes", &self.nodes)
            .field("keyspace", &self.keyspace)
            .field("consistency", &self.consistency)
            .field("request_timeout", &self.request_timeout)
            .field("connect_timeout", &self.connect_timeout)
            .field("replication", &self.replication)
            .field("local_dc", &self.local_dc)
            .field("username", &self.username)
            .field("password", &self.password.as_ref().map(|_| "<redacted>"))
            .field("tls", &self.tls.is_some())
            .field("max_concurrency", &self.max_concurrency)
            .finish()
    }
}

impl ScyllaOptions {
    /// A session builder with these contact points, credentials and TLS, the one quotad's
    /// store and migrator start from.
    pub fn session_builder(&self) -> scylla::client::session_builder::SessionBuilder {
        super::session_builder(self)
    }

    /// Checks what the server cannot check for us; the message starts with the name of the
    /// option in the `store` section of the configuration.
    pub fn validate(&self) -> Result<(), String> {
        validate_keyspace(&self.keyspace).map_err(|e| format!("keyspace: {e}"))?;
        if self.nodes.is_empty() || self.nodes.iter().any(|n| n.trim().is_empty()) {
            return Err("nodes: at least one host:port is needed".into());
        }
        if self.request_timeout.is_zero() {
            return Err("request_timeout_ms: must be positive".into());
        }
        if self.max_concurrency == 0 {
            return Err("max_concurrency: must be positive".into());
        }
        if matches!(
            self.consistency,
            Consistency::Any | Consistency::Serial | Consistency::LocalSerial
        ) {
            return Err(
                "consistency: ANY and SERIAL levels cannot serve both reads and writes".into(),
            );
        }
        Ok(())
    }
}

/// Parses a consistency level as written in CQL (`LOCAL_QUORUM`, `quorum`, `one`...).
pub fn parse_consistency(s: &str) -> Result<Consistency, String> {
    Ok(match s.trim().to_ascii_uppercase().as_str() {
        "ONE" => Consistency::One,
        "TWO" => Consistency::Two,
        "THREE" => Consistency::Three,
        "QUORUM" => Consistency::Quorum,
        "ALL" => Consistency::All,
        "LOCAL_QUORUM" => Consistency::LocalQuorum,
        "EACH_QUORUM" => Consistency::EachQuorum,
        "LOCAL_ONE" => Consistency::LocalOne,
        _ => {
            return Err(format!(
                "consistency {s:?}: one of ONE, TWO, THREE, QUORUM, ALL, LOCAL_QUORUM, \
                 EACH_QUORUM, LOCAL_ONE"
            ))
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_are_validated_and_the_password_never_printed() {
        let ok = ScyllaOptions::default();
        assert!(ok.validate().is_ok());
        let with = |f: fn(&mut ScyllaOptions)| {
            let mut o = ScyllaOptions::default();
            f(&mut o);
            o.validate()
        };
        assert!(with(|o| o.nodes.clear()).unwrap_err().starts_with("nodes"));
        assert!(with(|o| o.keyspace = "Bad-Name".into())
            .unwrap_err()
            .starts_with("keyspace"));
        assert!(with(|o| o.request_timeout = Duration::ZERO)
            .unwrap_err()
            .starts_with("request_timeout_ms"));
        assert!(with(|o| o.consistency = Consistency::Serial).is_err());
        let o = ScyllaOptions {
            username: Some("quotad".into()),
            password: Some("hunter2".into()),
            ..ScyllaOptions::default()
        };
        let printed = format!("{o:?}");
        assert!(
            !printed.contains("hunter2") && printed.contains("<redacted>"),
            "{printed}"
        );
    }

    #[test]
    fn consistency_names_parse_as_in_cql() {
        assert_eq!(
            parse_consistency("LOCAL_QUORUM"),
            Ok(Consistency::LocalQuorum)
        );
        assert_eq!(parse_consistency("quorum"), Ok(Consistency::Quorum));
        assert_eq!(parse_consistency(" local_one "), Ok(Consistency::LocalOne));
        assert!(parse_consistency("serial").is_err());
        assert!(parse_consistency("").is_err());
    }
}
