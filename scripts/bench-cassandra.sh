#!/usr/bin/env bash
# quotad on a real Cassandra/ScyllaDB node against quotad on the embedded store, in one run,
# on loopback. Run by hand beside a node you started yourself (never in CI):
#
#   NODES=127.0.0.1:9042 scripts/bench-cassandra.sh
#   CLIENTS="1000 10000" DUR=15s scripts/bench-cassandra.sh
#   BUILT_DIR=target/release scripts/bench-cassandra.sh    # no build: the quotad found there
#   POLICY='{"limits": [...]}' scripts/bench-cassandra.sh   # another policy than the three limits below
#   SCYLLA_ENV="QUOTAD__SYNC__MAX_DELAY_MS=5s" scripts/bench-cassandra.sh   # settings (K=V ...),
#                                                   # for quotad migrate too (replication)
#                                                  # for the Cassandra runs only
#   EMBEDDED_ENV="QUOTAD__SYNC__MAX_DELAY_MS=2s" scripts/bench-cassandra.sh  # the same, embedded
#   NODE_PID=<the node's pid> NODE_CPUS=1 scripts/bench-cassandra.sh   # both layouts, below
#   LAYOUTS=own NODE_PID=<pid> scripts/bench-cassandra.sh   # one of them
#   WARM=15s scripts/bench-cassandra.sh   # also steady state: after the cold full-load run,
#                                         # $WARM more of it unmeasured, then a full-load run again
#
# Layouts: with NODE_PID (a node on this machine), every run is made twice. "own": the node's
# threads pinned to NODE_CPUS (taskset), quotad and wrk to the other cores, as a deployment has
# the cluster on machines of its own; "shared": the node, quotad and wrk all on every core.
# Without NODE_PID, one run as things are ("as-is"), nothing pinned.
#
# For each N in $CLIENTS (active clients of one tenant, checks spread over all of them by
# scripts/wrk/check.lua), and for each store (embedded first, then Cassandra on a fresh
# keyspace made by `quotad migrate`): one instance, the default settings of its store kind, a
# policy of three limits far from full (1 s and 1 min sliding windows, a calendar month);
# full wrk load for $DUR, then half that rate for $DUR. Printed per run:
#   checks/s, p50/p99/p99.9 (ms), non-200 answers;
#   checks decided by on_store_failure (quotad_store_failure_decisions_total);
#   sync writes and reads per second and their mean duration (quotad_store_operation_*),
#     against the rounds the interval asks for;
#   pending hits at the end of the load (quotad_sync_pending_hits), and the most of every
#     half-second sample, also as seconds of checks at the run's rate;
#   CQL requests per 1000 checks: Cassandra's own count of native-protocol requests
#     (system_views.thread_pools, Native-Transport-Requests, completed_tasks) before and after;
#   the quotad process's RSS at the end of the load.
# Results go to stdout and to $OUT (default: a temp dir).
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
. scripts/common.sh
NODES=${NODES:-127.0.0.1:9042}
CLIENTS=${CLIENTS:-1000 10000 100000}
DUR=${DUR:-15s}
CONNS=${CONNS:-64}
THREADS=${THREADS:-2}
PACE_MS=${PACE_MS:-20}
QPORT=${QPORT:-18090}
NODE_PID=${NODE_PID:-}
NODE_CPUS=${NODE_CPUS:-1}
WARM=${WARM:-}
ALL_CPUS=0-$(( $(nproc) - 1 ))
# The cores left to quotad and wrk when the node has NODE_CPUS ("own" layout).
REST_CPUS=$(python3 -c "
import sys
node = set()
for part in sys.argv[1].split(','):
    a, _, b = part.partition('-')
    node.update(range(int(a), int(b or a) + 1))
print(','.join(str(c) for c in range($(nproc)) if c not in node))" "$NODE_CPUS")
PIN=()
# A fresh admin token each run, as strong as quotad asks (128 bits).
TOKEN=$(od -An -tx1 -N16 /dev/urandom | tr -d " \n")
TARGET=${CARGO_TARGET_DIR:-$ROOT/target}
OUT=${OUT:-$(mktemp -d /tmp/quotad-cass.XXXXXX)}
mkdir -p "$OUT"
WORK=$(mktemp -d /tmp/quotad-cass-work.XXXXXX)
KEYSPACE=quotad_bench_$$
QPID=""

cleanup() {
  [ -z "$QPID" ] || { kill -TERM "$QPID" 2>/dev/null || true; wait "$QPID" 2>/dev/null || true; }
  cql "DROP KEYSPACE IF EXISTS $KEYSPACE" >/dev/null 2>&1 || true
  [ -n "${KEEP_WORK:-}" ] || rm -rf "$WORK"
}
trap cleanup EXIT
log() { printf '\n== %s\n' "$*" | tee -a "$OUT/summary.txt"; }

command -v wrk >/dev/null || apt_install wrk
# A CQL client for Cassandra's own counters: the Python driver, in a venv kept under target/.
VENV=$TARGET/bench-venv
if [ ! -x "$VENV/bin/python" ]; then
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q cassandra-driver
fi
cql() { # STATEMENT -> rows, one a line
  "$VENV/bin/python" - "$NODES" "$1" <<'EOF'
import sys
from cassandra.cluster import Cluster
host, port = sys.argv[1].split(",")[0].rsplit(":", 1)
c = Cluster([host], port=int(port))
s = c.connect()
for row in s.execute(sys.argv[2]):
    print(" ".join(str(v) for v in row))
c.shutdown()
EOF
}
cql_requests() {
  cql "SELECT completed_tasks FROM system_views.thread_pools WHERE name = 'Native-Transport-Requests'"
}

if [ -n "${BUILT_DIR:-}" ]; then
  QUOTAD=$BUILT_DIR/quotad
else
  cargo build --release --quiet
  QUOTAD=$TARGET/release/quotad
fi

DEFAULT_POLICY='{"limits": [
  {"id": "per-second", "max": 1000000, "window": "1s"},
  {"id": "per-minute", "max": 100000000, "window": "1m"},
  {"id": "per-month", "max": 1000000000000, "period": "month"}]}'
POLICY=${POLICY:-$DEFAULT_POLICY}

start_quotad() { # KIND
  local kind=$1
  local extra=()
  [ "$kind" = scylla ] && read -r -a extra <<<"${SCYLLA_ENV:-}"
  [ "$kind" = embedded ] && read -r -a extra <<<"${EMBEDDED_ENV:-}"
  rm -rf "$WORK/store"
  if [ "$kind" = scylla ]; then
    cql "DROP KEYSPACE IF EXISTS $KEYSPACE" >/dev/null
    env QUOTAD__STORE__NODES="$NODES" QUOTAD__STORE__KEYSPACE="$KEYSPACE" "${extra[@]}" \
      "$QUOTAD" migrate >"$WORK/migrate.log" 2>&1
  fi
  env QUOTAD__SERVER__BIND=127.0.0.1:$QPORT \
    QUOTAD__STORE__KIND="$kind" \
    QUOTAD__STORE__PATH="$WORK/store" \
    QUOTAD__STORE__NODES="$NODES" \
    QUOTAD__STORE__KEYSPACE="$KEYSPACE" \
    QUOTAD__AUTH__ADMIN_TOKEN=$TOKEN \
    QUOTAD__LOG__LEVEL=warn \
    QUOTAD__LIMITER__MAX_COUNTERS=4000000 \
    QUOTAD__LIMITER__MAX_CLIENTS_PER_TENANT=2000000 \
    "${extra[@]}" "${PIN[@]}" "$QUOTAD" serve >"$WORK/quotad.log" 2>&1 &
  QPID=$!
  for _ in $(seq 1 300); do
    curl -fsS -o /dev/null "http://127.0.0.1:$QPORT/readyz" 2>/dev/null && break
    sleep 0.1
  done
  curl -fsS -o /dev/null "http://127.0.0.1:$QPORT/readyz"
  local code
  code=$(curl -sS -o "$WORK/put.out" -w '%{http_code}' -X PUT \
    -H "Authorization: Bearer $TOKEN" -H 'Content-Type: application/json' \
    --data "$POLICY" "http://127.0.0.1:$QPORT/v1/quotas/bench")
  case "$code" in 200 | 201) ;; *) echo "PUT policy: $code $(cat "$WORK/put.out")" >&2; exit 1 ;; esac
  sleep 1.2
}
stop_quotad() {
  kill -TERM "$QPID" 2>/dev/null || true
  wait "$QPID" 2>/dev/null || true
  QPID=""
}
scrape() { curl -fsS "http://127.0.0.1:$QPORT/metrics" >"$1"; }

# One load run; prints its line. ARGS: LABEL KIND N CONNS PAUSE_MS
run() {
  local label=$1 kind=$2 n=$3 conns=$4 pause=$5
  local threads=$(( conns < THREADS ? conns : THREADS ))
  local q0=0 q1=0
  [ "$kind" = scylla ] && q0=$(cql_requests)
  scrape "$WORK/m0"
  local t0 t1
  # The hits pending, sampled every half second through the run.
  ( while :; do
      curl -fsS "http://127.0.0.1:$QPORT/metrics" 2>/dev/null | awk '/^quotad_sync_pending_hits / {print $2}'
      sleep 0.5
    done ) >"$WORK/pending" &
  local sampler=$!
  t0=$(date +%s.%N)
  "${PIN[@]}" wrk -t"$threads" -c"$conns" -d"$DUR" --latency -s scripts/wrk/check.lua \
    "http://127.0.0.1:$QPORT/v1/check" -- "$n" bench 0 "$pause" >"$OUT/wrk-$label.txt" 2>&1
  t1=$(date +%s.%N)
  kill "$sampler" 2>/dev/null || true
  wait "$sampler" 2>/dev/null || true
  scrape "$WORK/m1"
  [ "$kind" = scylla ] && q1=$(cql_requests)
  local rss
  rss=$(awk '/VmRSS/ {print $2}' "/proc/$QPID/status")
  python3 - "$label" "$OUT/wrk-$label.txt" "$WORK/m0" "$WORK/m1" "$t0" "$t1" "$q0" "$q1" "$rss" \
    "$WORK/pending" "$POLICY" <<'EOF' | tee -a "$OUT/summary.txt"
import json, re, sys
label, wrkf, m0f, m1f, t0, t1, q0, q1, rss, pendf, policy = sys.argv[1:]
w = open(wrkf).read()
rps = float(re.search(r"Requests/sec:\s+([\d.]+)", w).group(1))
p = [int(x) / 1000 for x in re.search(r"p50 (\d+) p99 (\d+) p99.9 (\d+)", w).groups()]
bad = int(re.search(r"non-200 answers: (\d+)", w).group(1))
def metrics(f):
    out = {}
    for line in open(f):
        if line.startswith("#"):
            continue
        k, _, v = line.rpartition(" ")
        out[k] = float(v)
    return out
a, b = metrics(m0f), metrics(m1f)
def delta(prefix):
    return sum(v - a.get(k, 0.0) for k, v in b.items() if k.startswith(prefix))
secs = float(t1) - float(t0)
checks = delta("quotad_checks_total")
failed = delta("quotad_store_failure_decisions_total")
def op(name):
    n = delta(f'quotad_store_operation_duration_seconds_count{{op="{name}"}}')
    s = delta(f'quotad_store_operation_duration_seconds_sum{{op="{name}"}}')
    return n / secs, (s / n * 1000 if n else 0.0)
wr, wms = op("increment")
rr, rms = op("read")
pending = b.get("quotad_sync_pending_hits", 0.0)
# The most pending at any sample, as seconds of checks at this run's rate (a hit per limit).
samples = [float(x) for x in open(pendf).read().split()] or [pending]
most = max(samples)
limits = len(json.loads(policy)["limits"])
most_s = most / (rps * limits) if rps else 0.0
cql = int(q1) - int(q0)
per1000 = f"{cql / checks * 1000:.0f}" if int(q1) and checks else "-"
print(f"{label:<28} {rps:>9.0f}/s p50 {p[0]:.2f} p99 {p[1]:.2f} p99.9 {p[2]:.2f} ms  "
      f"non-200 {bad}  failure-rule {failed:.0f}  writes {wr:.1f}/s ({wms:.1f} ms)  "
      f"reads {rr:.1f}/s ({rms:.1f} ms)  pending {pending:.0f} (most {most:.0f}, {most_s:.1f} s)  "
      f"CQL/1000 {per1000}  "
      f"RSS {int(rss) / 1024:.0f} MiB")
EOF
}

{
  echo "machine: $(nproc) cores, $(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo)"
  echo "store node: $NODES; $DUR a run, $CONNS connections, $THREADS wrk threads"
  echo "policy: $POLICY" | tr -s ' \n' ' '
  echo
} | tee "$OUT/summary.txt"

# Puts the node's threads on CPUS and sets where quotad and wrk run (see Layouts above).
layout() { # own | shared | as-is
  case $1 in
    own)
      taskset -apc "$NODE_CPUS" "$NODE_PID" >/dev/null
      PIN=(taskset -c "$REST_CPUS") ;;
    shared)
      taskset -apc "$ALL_CPUS" "$NODE_PID" >/dev/null
      PIN=() ;;
    *) PIN=() ;;
  esac
}
ASKED_LAYOUTS=${LAYOUTS:-}
LAYOUTS="as-is"
if [ -n "$NODE_PID" ]; then
  [ -n "$REST_CPUS" ] || { echo "NODE_CPUS=$NODE_CPUS leaves no core for quotad" >&2; exit 1; }
  LAYOUTS=${ASKED_LAYOUTS:-own shared}
  NODE_WAS=$(taskset -pc "$NODE_PID" | sed 's/.*: //')
fi

for lay in $LAYOUTS; do
  layout "$lay"
  [ "$lay" = as-is ] || log "layout $lay: node on $([ "$lay" = own ] && echo "$NODE_CPUS" || echo "$ALL_CPUS"), quotad and wrk on $([ "$lay" = own ] && echo "$REST_CPUS" || echo "$ALL_CPUS")"
  for n in $CLIENTS; do
    for kind in embedded scylla; do
      log "$n active clients, $kind store"
      start_quotad "$kind"
      run "$lay-$kind-$n-full" "$kind" "$n" "$CONNS" 0
      full=$(sed -n 's/Requests\/sec:[[:space:]]*//p' "$OUT/wrk-$lay-$kind-$n-full.txt")
      if [ -n "$WARM" ]; then
        # Steady state: every client checked again and again for $WARM (not measured), then
        # the same full load, measured.
        "${PIN[@]}" wrk -t"$THREADS" -c"$CONNS" -d"$WARM" -s scripts/wrk/check.lua \
          "http://127.0.0.1:$QPORT/v1/check" -- "$n" bench 0 0 >"$OUT/wrk-$lay-$kind-$n-warm.txt" 2>&1
        run "$lay-$kind-$n-steady" "$kind" "$n" "$CONNS" 0
      fi
      # Half the rate: each connection waits PACE_MS after each answer.
      conns=$(python3 -c "print(max($THREADS, round($full / 2 * $PACE_MS / 1000)))")
      run "$lay-$kind-$n-half" "$kind" "$n" "$conns" "$PACE_MS"
      stop_quotad
    done
  done
done
# The node's cores as they were found.
[ -z "$NODE_PID" ] || taskset -apc "$NODE_WAS" "$NODE_PID" >/dev/null
echo
echo "results in $OUT"
