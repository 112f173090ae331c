#!/usr/bin/env bash
# HTTP load benchmarks of quotad against a bare actix-web baseline, on loopback only.
#
#   scripts/bench-http.sh            # everything, ~3 minutes of load plus the build
#   DUR=5s scripts/bench-http.sh     # shorter runs
#   ONLY=memory scripts/bench-http.sh   # one part: throughput | ab | store | strict | memory | flood
#   SYSTEM_ALLOC=1 scripts/bench-http.sh   # quotad with the system allocator (mimalloc is the default)
#   PGO=0 scripts/bench-http.sh      # the plain `cargo build --release` instead of the PGO build
#   BUILT_DIR=target/pgo/x86_64-unknown-linux-gnu/release scripts/bench-http.sh   # no build:
#                                    # the quotad and examples/bench_baseline found there
#   PGO=0 CARGO_PROFILE_RELEASE_LTO=fat CARGO_PROFILE_RELEASE_CODEGEN_UNITS=1 scripts/bench-http.sh
#
# Both servers are built with profile-guided optimisation by default (scripts/build-pgo.sh:
# about 5 minutes more than the plain build on 2 cores; the build the speed figures are of),
# each trained on this script's load; PGO=0 (or SYSTEM_ALLOC=1) measures the plain release
# build of both.
#
# What it measures (all on 127.0.0.1, every run bounded by DUR):
#  1. /v1/check and /v1/check/batch (100 checks a request) on quotad (embedded store, cached
#     consistency, 3-tier policy, 10^4 clients of one tenant) and on examples/bench_baseline
#     (same actix-web, parses the same JSON, fixed answer): req/s, p50/p99/p99.9, ratio, and the
#     CPU a check of each server against wrk's own CPU a request.
#  2. p99 at half the maximum rate: wrk2 is not in Debian, so wrk's Lua `delay()` paces each
#     connection to about half the measured maximum (see half_rate below).
#  3. Store cost: quotad_store_operations_total before/after runs over 10^3 and 10^5 clients.
#  4. Sync and strict latency: a strict-consistency policy; sync op durations from /metrics.
#  5. Memory: VmRSS after 10^6 distinct active counters, bytes per counter.
#  6. A flood of invented client ids against the default memory caps.
# Printed last: this run's figures against the speed targets, from the alternating rounds where
# they ran (the /v1/check and /v1/check/batch ratios: the mean of the rounds'; p99 at full load
# against the bare server's: the mean of quotad's rounds over the mean of the bare server's;
# p99.9 at half the rate: the mean of the rounds').
# Results go to stdout and to $OUT (default: a temp dir), one file per part.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
. scripts/common.sh
DUR=${DUR:-10s}
CONNS=${CONNS:-64}
THREADS=${THREADS:-2}
CLIENTS=${CLIENTS:-10000}
ONLY=${ONLY:-all}
AB_ROUNDS=${AB_ROUNDS:-3}
QPORT=${QPORT:-18080}
BPORT=${BPORT:-18081}
# A fresh admin token each run, as strong as quotad asks (128 bits).
TOKEN=$(od -An -tx1 -N16 /dev/urandom | tr -d " \n")
TARGET=${CARGO_TARGET_DIR:-$ROOT/target}
OUT=${OUT:-$(mktemp -d /tmp/quotad-bench.XXXXXX)}
mkdir -p "$OUT"
# A reused OUT keeps nothing of an earlier run: the verdicts read every wrk file in it.
rm -f "$OUT"/wrk-*.txt "$OUT"/wrk-*.cpu
WORK=$(mktemp -d /tmp/quotad-bench-store.XXXXXX)
PIDS=()

cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
  rm -rf "$WORK"
}
trap cleanup EXIT

log() { printf '\n== %s\n' "$*"; }

# ---- Tools and build -------------------------------------------------------------------------
if ! command -v wrk >/dev/null; then
  log "installing wrk (apt)"
  apt_install wrk
fi
PGO=${PGO:-1}
[ -z "${SYSTEM_ALLOC:-}" ] || PGO=0
if [ -n "${BUILT_DIR:-}" ]; then
  # Binaries built already (e.g. by scripts/build-pgo.sh): measured as they are.
  BUILT=$BUILT_DIR
  BUILD_KIND="as found in $BUILT_DIR"
elif [ "$PGO" = 1 ]; then
  log "building both servers with profile-guided optimisation (scripts/build-pgo.sh)"
  scripts/build-pgo.sh
  BUILT=$TARGET/pgo/$(rustc -vV | sed -n 's/^host: //p')/release
  BUILD_KIND="release, profile-guided (scripts/build-pgo.sh)"
else
  log "building (release) into $TARGET${SYSTEM_ALLOC:+ with the system allocator}"
  cargo build --release --bin quotad --example bench_baseline ${SYSTEM_ALLOC:+--no-default-features}
  BUILT=$TARGET/release
  BUILD_KIND="release (plain cargo build)${SYSTEM_ALLOC:+, system allocator}"
fi
QUOTAD=$BUILT/quotad
BASELINE=$BUILT/examples/bench_baseline

{
  echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
  echo "kernel: $(uname -r); wrk: $(wrk --version 2>&1 | head -1)"
  echo "rustc: $(rustc --version)"
  echo "build: $BUILD_KIND"
} | tee "$OUT/machine.txt"

# ---- Helpers ---------------------------------------------------------------------------------

# Starts quotad on $QPORT with a fresh embedded store; extra env as arguments (K=V ...).
QPID=""
start_quotad() {
  stop_quotad
  rm -rf "$WORK/store"
  env QUOTAD__SERVER__BIND=127.0.0.1:$QPORT \
    QUOTAD__STORE__KIND=embedded \
    QUOTAD__STORE__PATH="$WORK/store" \
    QUOTAD__AUTH__ADMIN_TOKEN=$TOKEN \
    QUOTAD__LOG__LEVEL=warn \
    QUOTAD__LIMITER__MAX_COUNTERS=4000000 \
    QUOTAD__LIMITER__MAX_CLIENTS_PER_TENANT=2000000 \
    "$@" "$QUOTAD" serve >"$WORK/quotad.log" 2>&1 &
  QPID=$!
  PIDS+=("$QPID")
  wait_up "http://127.0.0.1:$QPORT/healthz"
}
stop_quotad() {
  if [ -n "$QPID" ]; then
    kill -TERM "$QPID" 2>/dev/null || true
    wait "$QPID" 2>/dev/null || true
    QPID=""
  fi
}

put_policy() { # TENANT JSON
  local code
  code=$(curl -sS -o "$WORK/put.out" -w '%{http_code}' -X PUT \
    -H "Authorization: Bearer $TOKEN" -H 'Content-Type: application/json' \
    --data "$2" "http://127.0.0.1:$QPORT/v1/quotas/$1")
  case "$code" in 200 | 201) ;; *) echo "PUT policy $1: $code $(cat "$WORK/put.out")" >&2; exit 1 ;; esac
  sleep 1.2 # quotas.refresh_ms: let every cache see it
}

metric() { # NAME-WITH-LABELS-PREFIX -> sum of matching series
  curl -fsS "http://127.0.0.1:$QPORT/metrics" |
    awk -v m="$1" 'index($0, m) == 1 { s += $NF } END { printf "%.6f\n", s + 0 }'
}

# Runs wrk and prints a one-line summary: name rps p50 p99 p99.9 (ms) non2xx.
run_wrk() { # NAME URL SCRIPT CONNS DUR -- script args
  local name=$1 url=$2 script=$3 conns=$4 dur=$5
  shift 5
  local f="$OUT/wrk-$name.txt"
  local threads=$(( conns < THREADS ? conns : THREADS ))
  # wrk's own CPU (user and system seconds) goes beside its output: on two shared cores, what
  # the load generator spends a request is what the server competes with (see cpu_per_check).
  local TIMEFORMAT='%3U %3S'
  { time wrk -t"$threads" -c"$conns" -d"$dur" --latency -s "$script" "$url" "$@" >"$f" 2>&1; } 2>"$OUT/wrk-$name.cpu"
  python3 - "$f" "$name" <<'EOF' | tee -a "$OUT/summary.txt"
import re, sys
t = open(sys.argv[1]).read()
rps = float(re.search(r"Requests/sec:\s+([\d.]+)", t).group(1))
p = re.search(r"percentiles us: p50 (\d+) p99 (\d+) p99.9 (\d+) max (\d+)", t)
p50, p99, p999, mx = (int(x) / 1000 for x in p.groups())
bad = re.search(r"non-200 answers: (\d+)", t)
errs = re.search(r"Socket errors: .*", t)
print(f"{sys.argv[2]:<24} {rps:>9.0f} req/s  p50 {p50:.3f} ms  p99 {p99:.3f} ms  p99.9 {p999:.3f} ms"
      f"  max {mx:.1f} ms  non-200 {bad.group(1) if bad else '?'}" + (f"  [{errs.group(0)}]" if errs else ""))
EOF
}
rps_of() { grep -oP 'Requests/sec:\s+\K[\d.]+' "$OUT/wrk-$1.txt"; }

# CPU time (ms) of a process so far: in all (every thread, exited ones too) and in actix's
# worker threads, which serve the requests; in quotad the rest is the sync task, the store's
# writes and the runtime. Taken around a run to say what a check costs on each side.
cpu_snapshot() { # PID FILE
  python3 - "$1" >"$2" <<'EOF'
import os, sys
pid, hz = sys.argv[1], os.sysconf("SC_CLK_TCK")
def ms(stat):
    f = stat.rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) * 1000 / hz
workers = 0.0
for t in os.listdir(f"/proc/{pid}/task"):
    try:
        if open(f"/proc/{pid}/task/{t}/comm").read().startswith("actix-server wo"):
            workers += ms(open(f"/proc/{pid}/task/{t}/stat").read())
    except OSError:
        pass
print(ms(open(f"/proc/{pid}/stat").read()), workers)
EOF
}
# Also wrk's CPU a request in that run: at full load on two shared cores, when the server's CPU a
# request comes near wrk's, its p99 jumps from about 1 ms to 3-8 ms (docs/performance.md, "the
# full-load p99 is a threshold").
cpu_per_check() { # NAME BEFORE AFTER CHECKS-PER-REQUEST (NAME's wrk run between the two)
  python3 - "$OUT/wrk-$1.txt" "$@" "$OUT/wrk-$1.cpu" <<'EOF' | tee -a "$OUT/summary.txt"
import re, sys
requests = int(re.search(r"(\d+) requests in", open(sys.argv[1]).read()).group(1))
name, per = sys.argv[2], int(sys.argv[5])
a, b = (open(f).read().split() for f in sys.argv[3:5])
total, workers = float(b[0]) - float(a[0]), float(b[1]) - float(a[1])
load = sum(map(float, open(sys.argv[6]).read().split())) * 1e6
checks = requests * per
print(f"{name:<24} CPU a check: {total * 1000 / checks:.2f} us (actix workers {workers * 1000 / checks:.2f},"
      f" other threads {max(0.0, total - workers) * 1000 / checks:.2f});"
      f" wrk {load / requests:.2f} us a request")
EOF
}

# Half the maximum rate without wrk2: every connection waits PACE_MS after each answer, so
# CONNS = rate * PACE_MS / 1000 connections send about `rate` requests a second (a little less:
# the answer's own latency adds to each period). The achieved rate is printed with the result.
PACE_MS=2
half_rate() { # NAME URL FULL_RPS TENANT
  local conns
  conns=$(python3 -c "print(max($THREADS, round($3 / 2 * $PACE_MS / 1000)))")
  echo "pacing: target $(python3 -c "print(int($3/2))") req/s = $conns connections x 1 request per ${PACE_MS} ms + latency" | tee -a "$OUT/summary.txt"
  run_wrk "$1" "$2" scripts/wrk/check.lua "$conns" "$DUR" -- "$CLIENTS" "$4" 0 "$PACE_MS"
}

# The 99.9th percentile of quotad's own time to decide a check (quotad_check_duration_seconds,
# from parsed request to answer) between two scrapes of /metrics: the upper bound of its bucket.
decision_quantile() { # BEFORE AFTER
  python3 - "$1" "$2" <<'EOF'
import re, sys
def buckets(path):
    return {float(le): float(v) for le, v in re.findall(
        r'^quotad_check_duration_seconds_bucket\{le="([^"]+)"\} (\S+)', open(path).read(), re.M)}
a, b = buckets(sys.argv[1]), buckets(sys.argv[2])
d = sorted((le, b[le] - a.get(le, 0)) for le in b)
total = d[-1][1]
le = next(le for le, n in d if n >= 0.999 * total)
print(f"  quotad's decision time (its histogram) at p99.9 over that run: <= {le * 1e6:.0f} us ({int(total)} checks)")
EOF
}

POLICY3_STRICT='{"limits": [
  {"id": "per-second", "max": 100000, "window": "1s"},
  {"id": "per-hour", "max": 1000000000, "period": "hour"},
  {"id": "tenant-per-minute", "max": 1000000000000, "window": "1m", "scope": "tenant"}],
  "consistency": "strict"}'
POLICY1='{"limits": [{"id": "per-minute", "max": 1000000, "window": "1m"}]}'

want() { [ "$ONLY" = all ] || [ "$ONLY" = "$1" ]; }

: >"$OUT/summary.txt"

# ---- 1 + 2: throughput and latency against the baseline ---------------------------------------
if want throughput; then
  log "baseline (examples/bench_baseline) on :$BPORT"
  "$BASELINE" "127.0.0.1:$BPORT" >"$WORK/baseline.log" 2>&1 &
  BPID=$!
  PIDS+=("$BPID")
  wait_up "http://127.0.0.1:$BPORT/healthz"
  run_wrk baseline-check "http://127.0.0.1:$BPORT/v1/check" scripts/wrk/check.lua "$CONNS" 3s -- "$CLIENTS" bench >/dev/null
  cpu_snapshot "$BPID" "$WORK/cpu0"
  run_wrk baseline-check "http://127.0.0.1:$BPORT/v1/check" scripts/wrk/check.lua "$CONNS" "$DUR" -- "$CLIENTS" bench
  cpu_snapshot "$BPID" "$WORK/cpu1"
  run_wrk baseline-batch100 "http://127.0.0.1:$BPORT/v1/check/batch" scripts/wrk/batch.lua "$CONNS" "$DUR" -- "$CLIENTS" bench 100
  cpu_snapshot "$BPID" "$WORK/cpu2"
  cpu_per_check baseline-check "$WORK/cpu0" "$WORK/cpu1" 1
  cpu_per_check baseline-batch100 "$WORK/cpu1" "$WORK/cpu2" 100
  half_rate baseline-check-half "http://127.0.0.1:$BPORT/v1/check" "$(rps_of baseline-check)" bench
  kill "$BPID"; wait "$BPID" 2>/dev/null || true

  log "quotad on :$QPORT (embedded store, cached, 3-tier, $CLIENTS clients)"
  start_quotad
  put_policy bench "$POLICY3"
  # Warm-up: the first check of each client reads the store; steady state is what counts.
  run_wrk quotad-warmup "http://127.0.0.1:$QPORT/v1/check" scripts/wrk/check.lua "$CONNS" 3s -- "$CLIENTS" bench >/dev/null
  cpu_snapshot "$QPID" "$WORK/cpu0"
  run_wrk quotad-check "http://127.0.0.1:$QPORT/v1/check" scripts/wrk/check.lua "$CONNS" "$DUR" -- "$CLIENTS" bench
  cpu_snapshot "$QPID" "$WORK/cpu1"
  run_wrk quotad-batch100 "http://127.0.0.1:$QPORT/v1/check/batch" scripts/wrk/batch.lua "$CONNS" "$DUR" -- "$CLIENTS" bench 100
  cpu_snapshot "$QPID" "$WORK/cpu2"
  cpu_per_check quotad-check "$WORK/cpu0" "$WORK/cpu1" 1
  cpu_per_check quotad-batch100 "$WORK/cpu1" "$WORK/cpu2" 100
  half_rate quotad-check-half "http://127.0.0.1:$QPORT/v1/check" "$(rps_of quotad-check)" bench
  python3 - "$OUT" <<'EOF' | tee -a "$OUT/summary.txt"
import re, sys
def rps(n): return float(re.search(r"Requests/sec:\s+([\d.]+)", open(f"{sys.argv[1]}/wrk-{n}.txt").read()).group(1))
print(f"ratio quotad/baseline  /v1/check: {rps('quotad-check')/rps('baseline-check'):.2f}"
      f"   /v1/check/batch: {rps('quotad-batch100')/rps('baseline-batch100'):.2f}")
EOF
  echo "check metrics: checks_total $(metric 'quotad_checks_total{decision="allowed"}') allowed, $(metric 'quotad_checks_total{decision="denied"}') denied" | tee -a "$OUT/summary.txt"
  stop_quotad
fi

# ---- 1b: the ratio again, baseline and quotad alternating (less exposed to drifting load) -------
if want ab; then
  log "alternating baseline and quotad, $AB_ROUNDS rounds of $DUR each"
  "$BASELINE" "127.0.0.1:$BPORT" >"$WORK/baseline.log" 2>&1 &
  BPID=$!
  PIDS+=("$BPID")
  wait_up "http://127.0.0.1:$BPORT/healthz"
  start_quotad
  put_policy bench "$POLICY3"
  run_wrk quotad-warmup "http://127.0.0.1:$QPORT/v1/check" scripts/wrk/check.lua "$CONNS" 3s -- "$CLIENTS" bench >/dev/null
  for i in $(seq 1 "$AB_ROUNDS"); do
    cpu_snapshot "$BPID" "$WORK/cpu0"
    run_wrk "ab-baseline-$i" "http://127.0.0.1:$BPORT/v1/check" scripts/wrk/check.lua "$CONNS" "$DUR" -- "$CLIENTS" bench
    cpu_snapshot "$BPID" "$WORK/cpu1"
    cpu_snapshot "$QPID" "$WORK/cpu2"
    run_wrk "ab-quotad-$i" "http://127.0.0.1:$QPORT/v1/check" scripts/wrk/check.lua "$CONNS" "$DUR" -- "$CLIENTS" bench
    cpu_snapshot "$QPID" "$WORK/cpu3"
    cpu_per_check "ab-baseline-$i" "$WORK/cpu0" "$WORK/cpu1" 1
    cpu_per_check "ab-quotad-$i" "$WORK/cpu2" "$WORK/cpu3" 1
    python3 -c "print(f'ratio round $i: {$(rps_of "ab-quotad-$i") / $(rps_of "ab-baseline-$i"):.2f}')" | tee -a "$OUT/summary.txt"
    # Each server at half its own maximum of this round; quotad's decision times around its run.
    half_rate "ab-baseline-half-$i" "http://127.0.0.1:$BPORT/v1/check" "$(rps_of "ab-baseline-$i")" bench
    curl -fsS "http://127.0.0.1:$QPORT/metrics" >"$OUT/metrics-half-$i-before.txt"
    half_rate "ab-quotad-half-$i" "http://127.0.0.1:$QPORT/v1/check" "$(rps_of "ab-quotad-$i")" bench
    curl -fsS "http://127.0.0.1:$QPORT/metrics" >"$OUT/metrics-half-$i-after.txt"
    decision_quantile "$OUT/metrics-half-$i-before.txt" "$OUT/metrics-half-$i-after.txt" | tee -a "$OUT/summary.txt"
    # The batch path too, side by side: run apart, the two batch runs of part 1 are 30 s or more
    # apart, and this machine's speed can change by 15 % in that time.
    run_wrk "ab-baseline-batch-$i" "http://127.0.0.1:$BPORT/v1/check/batch" scripts/wrk/batch.lua "$CONNS" "$DUR" -- "$CLIENTS" bench 100
    run_wrk "ab-quotad-batch-$i" "http://127.0.0.1:$QPORT/v1/check/batch" scripts/wrk/batch.lua "$CONNS" "$DUR" -- "$CLIENTS" bench 100
    python3 -c "print(f'batch ratio round $i: {$(rps_of "ab-quotad-batch-$i") / $(rps_of "ab-baseline-batch-$i"):.2f}')" | tee -a "$OUT/summary.txt"
  done
  kill "$BPID"; wait "$BPID" 2>/dev/null || true
  stop_quotad
fi

# ---- 3: store cost at 10^3 and 10^5 active keys -------------------------------------------------
store_cost() { # KEYS
  local keys=$1 tenant="store$1"
  put_policy "$tenant" "$POLICY3"
  # Warm: load every key once (first-touch reads happen on the check path, not in the sync).
  run_wrk "store-warm-$keys" "http://127.0.0.1:$QPORT/v1/check/batch" scripts/wrk/batch.lua 8 3s -- "$keys" "$tenant" 100 >/dev/null
  sleep 1
  local c0 i0 r0 t0 c1 i1 r1 t1
  c0=$(metric 'quotad_checks_total'); i0=$(metric 'quotad_store_operations_total{op="increment"')
  r0=$(metric 'quotad_store_operations_total{op="read"'); t0=$(date +%s.%N)
  run_wrk "store-$keys" "http://127.0.0.1:$QPORT/v1/check" scripts/wrk/check.lua "$CONNS" "$DUR" -- "$keys" "$tenant"
  c1=$(metric 'quotad_checks_total'); i1=$(metric 'quotad_store_operations_total{op="increment"')
  r1=$(metric 'quotad_store_operations_total{op="read"'); t1=$(date +%s.%N)
  python3 - "$keys" "$c0" "$c1" "$i0" "$i1" "$r0" "$r1" "$t0" "$t1" <<'EOF' | tee -a "$OUT/summary.txt"
import sys
k, c0, c1, i0, i1, r0, r1, t0, t1 = (float(x) for x in sys.argv[1:])
dt, checks, inc, rd = t1 - t0, c1 - c0, i1 - i0, r1 - r0
print(f"store cost, {int(k)} active keys: {checks/dt:.0f} checks/s; store ops/s: increment {inc/dt:.1f}, "
      f"read {rd/dt:.1f}; per 10^6 checks: {1e6*(inc+rd)/checks:.1f} ops "
      f"(metric counts batched calls: one increment + one read per sync round)")
EOF
}
if want store; then
  log "store cost (quotad_store_operations_total)"
  start_quotad
  store_cost 1000
  store_cost 100000
  stop_quotad
fi

# ---- 4: sync and strict latency ----------------------------------------------------------------
if want strict; then
  log "strict consistency on the embedded store"
  start_quotad
  put_policy strict "$POLICY3_STRICT"
  run_wrk strict-warmup "http://127.0.0.1:$QPORT/v1/check" scripts/wrk/check.lua 8 2s -- "$CLIENTS" strict >/dev/null
  run_wrk strict-check-c8 "http://127.0.0.1:$QPORT/v1/check" scripts/wrk/check.lua 8 "$DUR" -- "$CLIENTS" strict
  run_wrk strict-check-c1 "http://127.0.0.1:$QPORT/v1/check" scripts/wrk/check.lua 1 "$DUR" -- "$CLIENTS" strict
  put_policy cached "$POLICY3"
  run_wrk cached-warmup "http://127.0.0.1:$QPORT/v1/check" scripts/wrk/check.lua 8 2s -- "$CLIENTS" cached >/dev/null
  run_wrk cached-check-c1 "http://127.0.0.1:$QPORT/v1/check" scripts/wrk/check.lua 1 "$DUR" -- "$CLIENTS" cached
  curl -fsS "http://127.0.0.1:$QPORT/metrics" >"$OUT/metrics-strict.txt"
  python3 - "$OUT/metrics-strict.txt" <<'EOF' | tee -a "$OUT/summary.txt"
import re, sys
t = open(sys.argv[1]).read()
for op in ("increment", "read"):
    s = re.search(r'quotad_store_operation_duration_seconds_sum\{op="%s"\} ([\d.e+-]+)' % op, t)
    n = re.search(r'quotad_store_operation_duration_seconds_count\{op="%s"\} ([\d.e+-]+)' % op, t)
    if s and n and float(n.group(1)) > 0:
        print(f"sync {op}: {int(float(n.group(1)))} batched calls, mean {1000*float(s.group(1))/float(n.group(1)):.3f} ms")
EOF
  stop_quotad
fi

# ---- 5: memory per active counter --------------------------------------------------------------
if want memory; then
  log "memory: 10^6 distinct active counters (1-tier policy: one counter per client)"
  start_quotad QUOTAD__LIMITER__IDLE_MS=10m
  put_policy mem "$POLICY1"
  rss() { awk '/VmRSS/ { print $2 * 1024 }' "/proc/$QPID/status"; }
  R0=$(rss)
  python3 scripts/fill.py "127.0.0.1:$QPORT" mem 1000000 | tee -a "$OUT/summary.txt"
  # A sync round sets quotad_active_counters, and the round that writes a million new counters
  # takes a while: wait (at most 60 s) until it counts them all, so RSS and count agree.
  for _ in $(seq 1 120); do
    N=$(metric 'quotad_active_counters')
    python3 -c "import sys; sys.exit(0 if $N >= 1000000 else 1)" && break
    sleep 0.5
  done
  R1=$(rss)
  N=$(metric 'quotad_active_counters')
  python3 -c "
r0, r1, n = $R0, $R1, $N
print(f'memory: VmRSS {r0/2**20:.1f} MiB -> {r1/2**20:.1f} MiB with {int(n)} active counters: '
      f'{(r1-r0)/n:.0f} bytes per counter')" | tee -a "$OUT/summary.txt"
  stop_quotad
fi

# ---- 6: a flood of invented client ids against the default memory caps --------------------------
if want flood; then
  log "flood: 10^6 distinct client ids of one tenant, default caps (10^6 counters, 10^5 clients a tenant)"
  start_quotad QUOTAD__LIMITER__MAX_COUNTERS=1000000 QUOTAD__LIMITER__MAX_CLIENTS_PER_TENANT=100000
  put_policy flood "$POLICY1"
  rss() { awk '/VmRSS/ { print $2 * 1024 }' "/proc/$QPID/status"; }
  R0=$(rss)
  FLOOD=1 python3 scripts/fill.py "127.0.0.1:$QPORT" flood 1000000 | tee -a "$OUT/summary.txt"
  sleep 1
  echo "flood: VmRSS $(python3 -c "print(f'{$R0/2**20:.1f} MiB -> {$(rss)/2**20:.1f} MiB')"), " \
    "active counters $(metric 'quotad_active_counters'), " \
    "checks through the store at the tenant cap $(metric 'quotad_memory_cap_checks_total{cap="tenant_clients"}'), " \
    "uncertain hits $(metric 'quotad_store_uncertain_hits_total')" | tee -a "$OUT/summary.txt"
  stop_quotad
fi

# ---- last: the speed issue's targets, from this run's files (parts not run are left out) -------
python3 - "$OUT" >"$OUT/targets.txt" <<'EOF'
import os, re, sys
out = sys.argv[1]

def wrk(name):
    """(req/s, {p50, p99, p99.9, max} in ms) of one wrk run of this script, or None."""
    path = f"{out}/wrk-{name}.txt"
    if not os.path.exists(path):
        return None
    text = open(path).read()
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", text).group(1))
    line = re.search(r"percentiles us:(.*)", text).group(1)
    return rps, {k: int(v) / 1000 for k, v in re.findall(r"(p[\d.]+|max) (\d+)", line)}

def verdict(ok):
    return "met" if ok else "NOT met"

def alternating(part):
    """quotad's rate over the bare server's in each alternating round of `part` ("" or "batch-")."""
    ratios, i = [], 1
    while wrk(f"ab-quotad-{part}{i}") and wrk(f"ab-baseline-{part}{i}"):
        ratios.append(wrk(f"ab-quotad-{part}{i}")[0] / wrk(f"ab-baseline-{part}{i}")[0])
        i += 1
    return ratios

print("against the speed targets (issue 15), from this run:")
rounds = alternating("")
if rounds:
    mean = sum(rounds) / len(rounds)
    print(f"  /v1/check vs the bare server, alternating: {' '.join(f'{r:.2f}' for r in rounds)}, "
          f"mean {mean:.2f} (>= 0.85: {verdict(mean >= 0.85)})")
q, b = wrk("quotad-batch100"), wrk("baseline-batch100")
seq = f"; sequential run {q[0] / b[0]:.2f}" if q and b else ""
batch = alternating("batch-")
if batch:
    mean = sum(batch) / len(batch)
    print(f"  /v1/check/batch vs the bare server, alternating: {' '.join(f'{r:.2f}' for r in batch)}, "
          f"mean {mean:.2f}{seq} (>= 0.70: {verdict(mean >= 0.7)})")
elif q and b:
    print(f"  /v1/check/batch vs the bare server: {q[0] / b[0]:.2f} (>= 0.70: {verdict(q[0] / b[0] >= 0.7)})")
# The tails are judged on the alternating rounds, as the ratio is: a single run of each server
# is exposed to whatever else the machine did in those seconds (the bare server's own full-load
# p99 moved from 2.1 to 4.2 ms within one run). The single runs are printed beside them.
ab = [(wrk(f"ab-quotad-{i}"), wrk(f"ab-baseline-{i}")) for i in range(1, len(rounds) + 1)]
q, b = wrk("quotad-check"), wrk("baseline-check")
single = f"; single runs {q[1]['p99']:.2f} against {b[1]['p99']:.2f} ms" if q and b else ""
if ab:
    # Judged on each server's p99 over the run (the mean of its rounds'), one over the other.
    # Not on the mean of the rounds' ratios: the bare server's p99 moves by 8x from round to
    # round here (0.55-4.6 ms, by where requests queue, docs/performance.md), and a mean of
    # ratios weighs a round where it is low far above the others (one round at 0.60 ms made
    # 4.88x of a run whose p99s were 2.67 against 2.46 ms on average). Both are printed.
    r = [qq[1]["p99"] / bb[1]["p99"] for qq, bb in ab]
    qm = sum(qq[1]["p99"] for qq, _ in ab) / len(ab)
    bm = sum(bb[1]["p99"] for _, bb in ab) / len(ab)
    print("  p99 at full load, alternating: " + ", ".join(
        f"{qq[1]['p99']:.2f} against {bb[1]['p99']:.2f} ms" for qq, bb in ab)
        + f" ({' '.join(f'{x:.2f}x' for x in r)}, mean of the ratios {sum(r) / len(r):.2f}x);"
        + f" over the run {qm:.2f} against {bm:.2f} ms, {qm / bm:.2f}x{single}"
        + f" (<= 2x: {verdict(qm / bm <= 2)})")
    # What decides this tail on two shared cores: each server's CPU a request against wrk's.
    cpu = {}
    for line in open(f"{out}/summary.txt"):
        m = re.match(r"(ab-\S+)\s+CPU a check: ([\d.]+) us .*wrk ([\d.]+) us", line)
        if m:
            cpu[m.group(1)] = f"{float(m.group(2)):.1f}/{float(m.group(3)):.1f}"
    if cpu:
        print("    CPU a request, the server's/wrk's, per round: " + ", ".join(
            f"bare {cpu.get(f'ab-baseline-{i}', '?')} quotad {cpu.get(f'ab-quotad-{i}', '?')} us"
            for i in range(1, len(ab) + 1)))
elif q and b:
    r = q[1]["p99"] / b[1]["p99"]
    print(f"  p99 at full load: {q[1]['p99']:.2f} ms against {b[1]['p99']:.2f} ms, {r:.1f}x "
          f"(<= 2x: {verdict(r <= 2)})")
half = [(wrk(f"ab-quotad-half-{i}"), wrk(f"ab-baseline-half-{i}")) for i in range(1, len(rounds) + 1)]
half = [(qq, bb) for qq, bb in half if qq and bb]
q, b = wrk("quotad-check-half"), wrk("baseline-check-half")
single = f"; single runs {q[1]['p99.9']:.2f} (bare {b[1]['p99.9']:.2f}) ms" if q and b else ""
if half:
    mean = sum(qq[1]["p99.9"] for qq, _ in half) / len(half)
    print("  p99.9 at half the rate, alternating: " + ", ".join(
        f"{qq[1]['p99.9']:.2f} (bare {bb[1]['p99.9']:.2f})" for qq, bb in half)
        + f" ms, mean {mean:.2f} ms{single} (<= 2 ms: {verdict(mean <= 2)})")
elif q and b:
    print(f"  p99.9 at half the rate: {q[1]['p99.9']:.2f} ms (the bare server {b[1]['p99.9']:.2f} ms; "
          f"<= 2 ms: {verdict(q[1]['p99.9'] <= 2)})")
print("  heap per counter at 10^6 keys: from `cargo bench --bench decision` (<= 250 B), not this script")
EOF

log "summary ($OUT)"
cat "$OUT/summary.txt"
echo
cat "$OUT/targets.txt"
