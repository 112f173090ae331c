//! The keyspace statement, the only CQL built from configuration: the name is validated
//! ([`crate::scylla::cql::validate_keyspace`]) and the replication map is parsed and re-rendered
//! ([`render_replication`]) so neither can carry anything but a name and a map. Which server
//! answers decides whether the keyspace gets the `tablets` option.

use scylla::client::session::Session;
use scylla::errors::{DbError, ExecutionError, RequestAttemptError};

use super::{cql_err, MigrateError};

/// The keyspace statement for people who create the keyspace by hand; the tests check that
/// [`create_keyspace_cql`] renders the same statement for the default options.
pub const KEYSPACE_FILE: &str = include_str!("../../../cql/keyspace.cql");
/// ScyllaDB has this table, Apache Cassandra does not.
const SCYLLA_PROBE_CQL: &str = "SELECT * FROM system.versions LIMIT 1";

/// Which server answers; decides whether the keyspace gets the `tablets` option.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ServerKind {
    Scylla,
    Cassandra,
}

impl ServerKind {
    /// The product name, for the migrator's log.
    pub fn product(self) -> &'static str {
        match self {
            ServerKind::Scylla => "ScyllaDB",
            ServerKind::Cassandra => "Apache Cassandra",
        }
    }
}

/// Parses a CQL replication map such as `{'class': 'SimpleStrategy', 'replication_factor': 1}`
/// and renders it canonically. Keys and values are restricted to `A-Z a-z 0-9 . _ -` (values
/// may also be bare integers), so the result can be put into DDL without risk.
pub fn render_replication(s: &str) -> Result<String, String> {
    let bad = |why: &str| format!("replication {s:?}: {why}");
    let inner = s
        .trim()
        .strip_prefix('{')
        .and_then(|r| r.strip_suffix('}'))
        .ok_or_else(|| bad("must be a map in braces"))?;
    let mut pairs: Vec<(String, String)> = Vec::new();
    for part in inner.split(',') {
        let (k, v) = part
            .split_once(':')
            .ok_or_else(|| bad("entries are 'key': value"))?;
        let key = quoted_word(k.trim()).ok_or_else(|| bad("a key is a quoted name"))?;
        let v = v.trim();
        let value = if !v.is_empty() && v.bytes().all(|b| b.is_ascii_digit()) {
            v.to_owned()
        } else {
            format!(
                "'{}'",
                quoted_word(v).ok_or_else(|| bad("a value is a quoted name or a number"))?
            )
        };
        if pairs.iter().any(|(k, _)| *k == key) {
            return Err(bad("a key appears twice"));
        }
        pairs.push((key, value));
    }
    if !pairs.iter().any(|(k, _)| k == "class") {
        return Err(bad("'class' is required"));
    }
    let body: Vec<String> = pairs.iter().map(|(k, v)| format!("'{k}': {v}")).collect();
    Ok(format!("{{{}}}", body.join(", ")))
}

/// The replication map of `--datacenters eu:3,us:3`: NetworkTopologyStrategy with each data
/// centre's replication factor, for a fleet in several regions.
pub fn datacenters_replication(spec: &str) -> Result<String, String> {
    let bad = |why: &str| format!("--datacenters {spec:?}: {why}");
    let mut map = vec!["'class': 'NetworkTopologyStrategy'".to_owned()];
    let mut names: Vec<&str> = Vec::new();
    for part in spec.split(',').map(str::trim) {
        let (dc, rf) = part
            .split_once(':')
            .ok_or_else(|| bad("each entry is name:replicas, e.g. eu:3"))?;
        let dc = dc.trim();
        let rf: u8 = rf
            .trim()
            .parse()
            .ok()
            .filter(|n| *n >= 1)
            .ok_or_else(|| bad("replicas are a whole number from 1"))?;
        quoted_word(&format!("'{dc}'"))
            .ok_or_else(|| bad("a data centre is named with A-Z a-z 0-9 . _ -"))?;
        if names.contains(&dc) {
            return Err(bad("a data centre appears twice"));
        }
        names.push(dc);
        map.push(format!("'{dc}': {rf}"));
    }
    render_replication(&format!("{{{}}}", map.join(", ")))
}

fn quoted_word(s: &str) -> Option<String> {
    let w = s.strip_prefix('\'')?.strip_suffix('\'')?;
    let ok = !w.is_empty()
        && w.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
    ok.then(|| w.to_owned())
}

/// Refuses a replication map that cannot serve the cluster's data centres (`dcs`, as its
/// nodes name them): `SimpleStrategy` on a cluster of several places replicas with no regard
/// to data centres, so that `LOCAL_QUORUM` finds too few replicas in a data centre and
/// `quotad serve` fails ("alive: 0"). The message names the `--datacenters` to use.
pub fn check_replication(replication: &str, dcs: &[String]) -> Result<(), String> {
    if dcs.len() > 1 && replication.contains("'SimpleStrategy'") {
        let spec: Vec<String> = dcs.iter().map(|d| format!("{d}:3")).collect();
        return Err(format!(
            "the cluster has several data centres ({}), and SimpleStrategy ignores them: \
             LOCAL_QUORUM would find too few replicas in each; create the keyspace with \
             `quotad migrate --datacenters {}` (each data centre's replication factor)",
            dcs.join(", "),
            spec.join(",")
        ));
    }
    Ok(())
}

/// The keyspace statement. `replication` must come from [`render_replication`] and `ks` must
/// have passed [`crate::scylla::cql::validate_keyspace`].
pub fn create_keyspace_cql(ks: &str, replication: &str, server: ServerKind) -> String {
    match server {
        ServerKind::Scylla => format!(
            "CREATE KEYSPACE IF NOT EXISTS {ks}\n    WITH replication = {replication}\n    \
             AND tablets = {{'enabled': false}}"
        ),
        ServerKind::Cassandra => {
            format!("CREATE KEYSPACE IF NOT EXISTS {ks}\n    WITH replication = {replication}")
        }
    }
}

/// Whether an error from CREATE KEYSPACE says the server does not know the `tablets` option
/// (ScyllaDB before 6.0 has no tablets at all; such a keyspace is fine for counters).
pub(super) fn is_unknown_tablets_option(e: &ExecutionError) -> bool {
    match e {
        ExecutionError::LastAttemptError(RequestAttemptError::DbError(
            DbError::SyntaxError | DbError::Invalid | DbError::ConfigError,
            msg,
        )) => msg.to_ascii_lowercase().contains("tablets"),
        _ => false,
    }
}

/// Asks the server what it is: ScyllaDB nodes announce their shard layout to the driver and
/// have a `system.versions` table; Cassandra has neither.
pub async fn detect_server(session: &Session) -> Result<ServerKind, MigrateError> {
    let state = session.get_cluster_state();
    if state.get_nodes_info().iter().any(|n| n.sharder().is_some()) {
        return Ok(ServerKind::Scylla);
    }
    match session.query_unpaged(SCYLLA_PROBE_CQL, ()).await {
        Ok(_) => Ok(ServerKind::Scylla),
        Err(ExecutionError::LastAttemptError(RequestAttemptError::DbError(
            DbError::Invalid,
            _,
        ))) => Ok(ServerKind::Cassandra),
        Err(e) => Err(cql_err(e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scylla::cql::ScyllaOptions;
    use crate::scylla::migrate::split_statements;

    #[test]
    fn simple_strategy_is_refused_on_a_cluster_of_several_data_centres() {
        let simple = "{'class': 'SimpleStrategy', 'replication_factor': 3}";
        let dcs = |names: &[&str]| names.iter().map(|n| n.to_string()).collect::<Vec<_>>();
        assert!(check_replication(simple, &dcs(&["dc1"])).is_ok());
        let e = check_replication(simple, &dcs(&["eu", "us"])).unwrap_err();
        assert!(e.contains("--datacenters eu:3,us:3"), "{e}");
        let nts = "{'class': 'NetworkTopologyStrategy', 'eu': 3, 'us': 3}";
        assert!(check_replication(nts, &dcs(&["eu", "us"])).is_ok());
    }

    #[test]
    fn replication_is_parsed_and_rendered_canonically() {
        assert_eq!(
            render_replication("{ 'class' : 'SimpleStrategy','replication_factor':1 }").unwrap(),
            "{'class': 'SimpleStrategy', 'replication_factor': 1}"
        );
        assert_eq!(
            render_replication("{'class': 'NetworkTopologyStrategy', 'dc-1': '3', 'dc2': 2}")
                .unwrap(),
            "{'class': 'NetworkTopologyStrategy', 'dc-1': '3', 'dc2': 2}"
        );
        for bad in [
            "",
            "'class': 'SimpleStrategy'",
            "{'replication_factor': 1}",
            "{'class': 'SimpleStrategy'}; DROP KEYSPACE quota",
            "{'class': 'Simple'' OR 1=1'}",
            "{'class': SimpleStrategy}",
            "{'class': 'a', 'class': 'b'}",
            "{'class': 'a b'}",
        ] {
            assert!(render_replication(bad).is_err(), "{bad:?} accepted");
        }
        assert_eq!(
            datacenters_replication("dc1:1, dc2:3").unwrap(),
            "{'class': 'NetworkTopologyStrategy', 'dc1': 1, 'dc2': 3}"
        );
        for bad in ["dc1", "dc1:0", "dc1:x", "dc1:1,dc1:2", "d c:1", ""] {
            assert!(datacenters_replication(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn the_keyspace_file_matches_what_migrate_creates_by_default() {
        let opts = ScyllaOptions::default();
        let rendered = create_keyspace_cql(
            &opts.keyspace,
            &render_replication(&opts.replication).unwrap(),
            ServerKind::Scylla,
        );
        let norm = |s: &str| s.split_whitespace().collect::<Vec<_>>().join(" ");
        let file = split_statements(KEYSPACE_FILE);
        assert_eq!(file.len(), 1);
        assert_eq!(norm(&file[0]), norm(&rendered));
        let cassandra = create_keyspace_cql("quota", "{'class': 'x'}", ServerKind::Cassandra);
        assert!(!cassandra.contains("tablets"));
    }
}
