//! The connection every part of the store shares ([`Cql`]): one session, the prepared
//! statements, and the ways the parts run them: a lightweight transaction, the counter updates
//! of one partition, repeatable writes in parallel, reads whole or page by page, and the months
//! of usage history or the audit log to read or delete.
//!
//! [`Cql::connect`] builds it from the options; with several data centres and no
//! `store.local_dc`, the session prefers the data centre of the contact points.
//!
//! Routing. A request about partitions that share a replica goes to that replica first, so
//! that no coordinator forwards it and the coordinator leads its own counter updates; when
//! that node cannot take it, it goes on wherever the session's own policy would send it
//! ([`NodeFirst`]). The driver moves to the next node of that plan by itself when a node has
//! no connection (nothing was sent); after a request was sent, only the retry policy decides,
//! and it never resends a counter update. A replica that has no connection, or that let a
//! request time out in the last [`SUSPECT_FOR`], is not chosen first ([`Suspects`]): a node
//! that was killed is seen at once (its connections close), one that is paused only by its
//! silence.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::stream::{self, StreamExt, TryStreamExt};
use scylla::client::execution_profile::{ExecutionProfile, ExecutionProfileHandle};
use scylla::client::session::Session;
use scylla::cluster::{ClusterState, Node, NodeRef};
use scylla::policies::load_balancing::{FallbackPlan, LoadBalancingPolicy, RoutingInfo};
use scylla::policies::speculative_execution::SimpleSpeculativeExecutionPolicy;
use scylla::routing::Shard;
use scylla::statement::batch::{Batch, BatchType};
use scylla::statement::prepared::PreparedStatement;
use scylla::statement::SerialConsistency;

use super::errors::{internal, map_exec, map_new_session, map_next_row, map_pager, Op};
use super::partition::{month_end, months_between, months_spanned};
use super::statements::{MonthNameValues, MonthRow, NameRow, Statements};
use crate::scylla::cql::{lwt_applied, session_builder, ScyllaOptions};
use crate::store::{StoreError, StoreResult};

/// The widest range of months read month by month; a wider one goes through the month index
/// ([`Cql::months_to_read`]). 13: a year of daily points, whatever day it starts on.
const CALENDAR_WALK_MONTHS: i64 = 13;

/// The session and its prepared statements; the parts share it behind an `Arc`.
pub(super) struct Cql {
    pub(super) session: Session,
    pub(super) st: Statements,
    /// Most requests one call of a part has in flight at once (`store.max_concurrency`).
    pub(super) max_concurrency: usize,
    /// The keyspace, to find a partition's replicas in the driver's token map.
    keyspace: String,
    /// The local data centre: a request sent to one replica goes to one of it.
    local_dc: Option<String>,
    /// An execution profile per node (by address) that sends a request to that node first
    /// ([`NodeFirst`]), with the default profile's settings otherwise: for requests about
    /// many partitions that all live there ([`Cql::replica_for`]). At most one per node.
    to_node: Mutex<HashMap<SocketAddr, ExecutionProfileHandle>>,
    /// Nodes not to send requests to first for a while.
    suspects: Suspects,
}

/// How long a node that let a request time out is not chosen first: about a paused node's
/// silence, after which one request finds out whether it answers again.
pub(super) const SUSPECT_FOR: Duration = Duration::from_secs(5);

/// How long an idempotent request (a read) waits for its node before the same request is
/// also sent to the next node of its plan: a paused replica then costs a read this much.
const SPECULATE_AFTER: Duration = Duration::from_millis(200);

/// Nodes that let a request time out lately, until when (monotonic).
#[derive(Debug, Default)]
struct Suspects(Mutex<HashMap<SocketAddr, Instant>>);

impl Suspects {
    fn mark(&self, addr: SocketAddr) {
        let mut map = self.0.lock().unwrap_or_else(|p| p.into_inner());
        map.insert(addr, Instant::now() + SUSPECT_FOR);
    }

    fn holds(&self, addr: SocketAddr) -> bool {
        let mut map = self.0.lock().unwrap_or_else(|p| p.into_inner());
        match map.get(&addr) {
            Some(until) if *until > Instant::now() => true,
            Some(_) => {
                map.remove(&addr);
                false
            }
            None => false,
        }
    }
}

/// A node's address as the maps above key it.
fn addr_of(node: &Node) -> SocketAddr {
    SocketAddr::new(node.address.ip(), node.address.port())
}

/// A load-balancing policy that tries one node first and then the nodes `then` would try,
/// in its order (the first statement's replicas in the local data centre, when token-aware).
#[derive(Debug)]
struct NodeFirst {
    node: Arc<Node>,
    then: Arc<dyn LoadBalancingPolicy>,
}

impl LoadBalancingPolicy for NodeFirst {
    fn pick<'a>(
        &'a self,
        _request: &'a RoutingInfo,
        _cluster: &'a ClusterState,
    ) -> Option<(NodeRef<'a>, Option<Shard>)> {
        Some((&self.node, None))
    }

    fn fallback<'a>(
        &'a self,
        request: &'a RoutingInfo,
        cluster: &'a ClusterState,
    ) -> FallbackPlan<'a> {
        let rest = self.then.fallback(request, cluster);
        Box::new(
            std::iter::once((&self.node, None))
                .chain(rest.filter(move |(n, _)| !Arc::ptr_eq(n, &self.node))),
        )
    }

    fn name(&self) -> String {
        format!("NodeFirst({})", self.node.address)
    }
}

/// The table whose partitions [`Cql::replica_for`] locates.
const COUNTER_TABLE: &str = "client_counters";

/// The data centre of the contact points, as the session's view of the cluster names it, and
/// whether the cluster has several. Contact points in several data centres: an error asking
/// for `store.local_dc`.
async fn contact_dc(
    session: &Session,
    nodes: &[String],
) -> Result<(Option<String>, bool), StoreError> {
    let state = session.get_cluster_state();
    let all = state.get_nodes_info();
    let mut dcs: Vec<&str> = all.iter().filter_map(|n| n.datacenter.as_deref()).collect();
    dcs.sort_unstable();
    dcs.dedup();
    if dcs.len() <= 1 {
        return Ok((dcs.first().map(|d| d.to_string()), false));
    }
    let mut contact = Vec::new();
    for host in nodes {
        if let Ok(addrs) = tokio::net::lookup_host(host.as_str()).await {
            contact.extend(addrs);
        }
    }
    let mut theirs: Vec<&str> = all
        .iter()
        .filter(|n| {
            contact
                .iter()
                .any(|c| c.ip() == n.address.ip() && c.port() == n.address.port())
        })
        .filter_map(|n| n.datacenter.as_deref())
        .collect();
    theirs.sort_unstable();
    theirs.dedup();
    match theirs.as_slice() {
        [one] => Ok((Some(one.to_string()), true)),
        _ => Err(StoreError::Internal(format!(
            "the cluster has several data centres ({}): set store.local_dc to this instance's",
            dcs.join(", ")
        ))),
    }
}

impl Cql {
    /// Connects to the keyspace (which `quotad migrate` must have created) and prepares every
    /// statement. Returns the connection and the local data centre: `store.local_dc`, else
    /// the data centre of the contact points. Fails with `Internal` on bad options or a
    /// missing schema, `Unavailable` when the cluster cannot be reached.
    pub(super) async fn connect(opts: &ScyllaOptions) -> StoreResult<(Cql, Option<String>)> {
        opts.validate().map_err(StoreError::Internal)?;
        // Speculative execution applies to idempotent statements only (reads, deletes): a
        // counter update is sent once.
        let speculate = SimpleSpeculativeExecutionPolicy {
            max_retry_count: 2,
            retry_interval: SPECULATE_AFTER,
        };
        let profile = ExecutionProfile::builder()
            .consistency(opts.consistency)
            .serial_consistency(Some(SerialConsistency::LocalSerial))
            .request_timeout(Some(opts.request_timeout))
            .speculative_execution_policy(Some(Arc::new(speculate)))
            .build()
            .into_handle();
        let build = |dc: Option<String>| {
            let mut builder = session_builder(opts)
                .use_keyspace(&opts.keyspace, false)
                .default_execution_profile_handle(profile.clone());
            if let Some(dc) = dc {
                builder = builder.prefer_datacenter(dc);
            }
            async move { builder.build().await }
        };
        let mut session = build(opts.local_dc.clone())
            .await
            .map_err(|e| map_new_session(e, opts.tls.as_ref()))?;
        let mut local_dc = opts.local_dc.clone();
        if local_dc.is_none() {
            // Unset: the data centre of the contact points. With several data centres the
            // session must prefer it, or LOCAL_* levels would be local to whichever node
            // coordinated each request, and leases and strict counts would split.
            let (dc, several) = contact_dc(&session, &opts.nodes).await?;
            if several {
                session = build(dc.clone())
                    .await
                    .map_err(|e| map_new_session(e, opts.tls.as_ref()))?;
            }
            local_dc = dc;
        }
        let st = Statements::prepare(&session).await?;
        let cql = Cql {
            session,
            st,
            max_concurrency: opts.max_concurrency,
            keyspace: opts.keyspace.clone(),
            local_dc: local_dc.clone(),
            to_node: Mutex::default(),
            suspects: Suspects::default(),
        };
        Ok((cql, local_dc))
    }

    /// The replica a request about the counters of (tenant, subject) is best sent to first:
    /// the first of the partition's replicas in the local data centre (of any, without one)
    /// in the driver's ring order that has a connection and is not a suspect, so that the
    /// partitions of one token range go to the same node and the ranges' first replicas
    /// spread the load over the nodes; while none qualifies, the first. None when the
    /// driver's token map does not know the table (yet): the request is then sent as the
    /// driver routes it.
    pub(super) fn replica_for(&self, tenant: &str, subject: &str) -> Option<Arc<Node>> {
        let state = self.session.get_cluster_state();
        let replicas = state
            .get_endpoints(&self.keyspace, COUNTER_TABLE, &(tenant, subject))
            .ok()?;
        let local = |n: &&(Arc<Node>, _)| {
            self.local_dc.is_none() || n.0.datacenter.as_deref() == self.local_dc.as_deref()
        };
        let healthy = |n: &&(Arc<Node>, _)| {
            local(n) && n.0.is_connected() && !self.suspects.holds(addr_of(&n.0))
        };
        replicas
            .iter()
            .find(healthy)
            .or_else(|| replicas.iter().find(local))
            .or(replicas.first())
            .map(|(n, _)| n.clone())
    }

    /// `st`, sent first to the replica of (tenant, subject) that [`Cql::replica_for`] names
    /// (as the driver routes it, when none is known).
    pub(super) fn to_replica(
        &self,
        st: &PreparedStatement,
        tenant: &str,
        subject: &str,
    ) -> PreparedStatement {
        let mut st = st.clone();
        if let Some(node) = self.replica_for(tenant, subject) {
            st.set_execution_profile_handle(Some(self.on_node(&node)));
        }
        st
    }

    /// The profile that sends a request to `node` first and then where the default profile's
    /// policy would ([`NodeFirst`]), with the default profile's settings otherwise.
    pub(super) fn on_node(&self, node: &Arc<Node>) -> ExecutionProfileHandle {
        let mut map = self.to_node.lock().unwrap_or_else(|p| p.into_inner());
        map.entry(addr_of(node))
            .or_insert_with(|| {
                let default = self.session.get_default_execution_profile_handle();
                let then = default.to_profile().get_load_balancing_policy().clone();
                default
                    .pointee_to_builder()
                    .load_balancing_policy(Arc::new(NodeFirst {
                        node: node.clone(),
                        then,
                    }))
                    .build()
                    .into_handle()
            })
            .clone()
    }

    /// Notes that a request sent to `node` first had no answer in time: it is not chosen
    /// first for [`SUSPECT_FOR`].
    pub(super) fn suspect(&self, node: &Node) {
        self.suspects.mark(addr_of(node));
    }

    /// Runs a prepared lightweight transaction; returns its `[applied]`.
    pub(super) async fn lwt(
        &self,
        st: &PreparedStatement,
        values: impl scylla::serialize::row::SerializeRow,
    ) -> StoreResult<bool> {
        let res = self
            .session
            .execute_unpaged(st, values)
            .await
            .map_err(|e| map_exec(e, Op::Write))?;
        let rows = res.into_rows_result().map_err(internal)?;
        lwt_applied(&rows).map_err(StoreError::Internal)
    }

    /// Applies counter updates of ONE partition: a single statement, or a COUNTER batch (one
    /// partition, so it is applied atomically on its replicas and routed right). Never
    /// retried: the statements are non-idempotent, and a timeout is `Uncertain`.
    pub(super) async fn counter_batch<V>(
        &self,
        st: &PreparedStatement,
        values: &[V],
    ) -> StoreResult<()>
    where
        V: scylla::serialize::row::SerializeRow,
    {
        self.counter_batch_on(st, values, None).await
    }

    /// [`Cql::counter_batch`] of rows of any partitions, sent to `node` when given (a replica
    /// of every one of them, so that none is forwarded).
    pub(super) async fn counter_batch_on<V>(
        &self,
        st: &PreparedStatement,
        values: &[V],
        node: Option<&Arc<Node>>,
    ) -> StoreResult<()>
    where
        V: scylla::serialize::row::SerializeRow,
    {
        let profile = node.map(|n| self.on_node(n));
        let res = match values {
            [] => Ok(()),
            [one] => {
                let res = match profile {
                    Some(p) => {
                        let mut st = st.clone();
                        st.set_execution_profile_handle(Some(p));
                        self.session.execute_unpaged(&st, one).await
                    }
                    None => self.session.execute_unpaged(st, one).await,
                };
                res.map(|_| ()).map_err(|e| map_exec(e, Op::Write))
            }
            _ => {
                let mut batch = Batch::new(BatchType::Counter);
                for _ in values {
                    batch.append_statement(st.clone());
                }
                batch.set_execution_profile_handle(profile);
                self.session
                    .batch(&batch, values)
                    .await
                    .map(|_| ())
                    .map_err(|e| map_exec(e, Op::Write))
            }
        };
        // Sent and not answered: the node it went to first may be paused or overloaded.
        if let (Err(StoreError::Uncertain(_)), Some(n)) = (&res, node) {
            self.suspect(n);
        }
        res
    }

    /// Runs statements that are safe to repeat (deletes, index rows) in parallel; the first
    /// error, as a write's.
    pub(super) async fn run_all<V>(&self, st: &PreparedStatement, values: Vec<V>) -> StoreResult<()>
    where
        V: scylla::serialize::row::SerializeRow,
    {
        stream::iter(values)
            .map(|v| async move {
                self.session
                    .execute_unpaged(st, v)
                    .await
                    .map(|_| ())
                    .map_err(|e| map_exec(e, Op::Write))
            })
            .buffer_unordered(self.max_concurrency)
            .try_collect()
            .await
    }

    /// The months an index statement lists (rows of one `int` month) that ended at or before
    /// `before`, oldest first: what retention deletes.
    pub(super) async fn months_ended_by(
        &self,
        st: &PreparedStatement,
        before: i64,
    ) -> StoreResult<Vec<i32>> {
        let listed: Vec<MonthRow> = self.read_all(st, ()).await?;
        let mut months: Vec<i32> = listed
            .into_iter()
            .map(|(m,)| m)
            .filter(|m| month_end(*m).is_some_and(|end| end <= before))
            .collect();
        months.sort_unstable();
        Ok(months)
    }

    /// Every row of one unpaged read (a partition small enough for one answer).
    pub(super) async fn read_rows<R>(
        &self,
        st: &PreparedStatement,
        values: impl scylla::serialize::row::SerializeRow,
    ) -> StoreResult<Vec<R>>
    where
        R: for<'f, 'm> scylla::deserialize::row::DeserializeRow<'f, 'm>,
    {
        let res = self
            .session
            .execute_unpaged(st, values)
            .await
            .map_err(|e| map_exec(e, Op::Read))?;
        let rows = res.into_rows_result().map_err(internal)?;
        let out = rows
            .rows::<R>()
            .map_err(internal)?
            .map(|r| r.map_err(internal))
            .collect();
        out
    }

    /// Every row a read returns, page by page (for partitions that may hold more rows than
    /// one answer should carry).
    pub(super) async fn read_all<R>(
        &self,
        st: &PreparedStatement,
        values: impl scylla::serialize::row::SerializeRow,
    ) -> StoreResult<Vec<R>>
    where
        R: for<'f, 'm> scylla::deserialize::row::DeserializeRow<'f, 'm> + 'static,
    {
        let pager = self
            .session
            .execute_iter(st.clone(), values)
            .await
            .map_err(map_pager)?;
        pager
            .rows_stream::<R>()
            .map_err(internal)?
            .map_err(map_next_row)
            .try_collect()
            .await
    }

    /// The months of `first..=last` (yyyymm, oldest first) that may hold `name`'s partitions
    /// of usage history or the audit log. A short range is walked month by month (an empty
    /// partition costs one cheap read); a longer one, e.g. "since 1970", visits only the months
    /// that the month index lists (`list`: its partition keys, one per month kept) and that
    /// hold `name` (`find`).
    pub(super) async fn months_to_read(
        &self,
        first: i32,
        last: i32,
        list: &PreparedStatement,
        find: &PreparedStatement,
        name: &str,
    ) -> StoreResult<Vec<i32>> {
        if months_spanned(first, last) <= CALENDAR_WALK_MONTHS {
            return Ok(months_between(first, last));
        }
        let listed: Vec<MonthRow> = self.read_all(list, ()).await?;
        let mut months: Vec<i32> = listed
            .into_iter()
            .map(|(m,)| m)
            .filter(|m| (first..=last).contains(m))
            .collect();
        months.sort_unstable();
        let held: Vec<Option<i32>> = stream::iter(months.into_iter().map(|m| async move {
            let values: MonthNameValues<'_> = (m, name);
            let rows: Vec<NameRow> = self.read_all(find, values).await?;
            Ok::<_, StoreError>((!rows.is_empty()).then_some(m))
        }))
        .buffered(self.max_concurrency)
        .try_collect()
        .await?;
        Ok(held.into_iter().flatten().collect())
    }
}
