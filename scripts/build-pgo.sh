#!/usr/bin/env bash
# A profile-guided (PGO) release build of quotad and of the bare baseline server.
#
#   scripts/build-pgo.sh        # -> target/pgo/<host triple>/release/quotad
#                               #    and .../release/examples/bench_baseline
#
# On this project's 2-core machine quotad built this way spent 1.4-2.3 us less CPU a check
# than the plain `cargo build --release` under the benchmark's load (docs/performance.md,
# "The profile-guided build"): the compiler lays out the hot path (actix's, serde's and the limiter's code)
# from what a real load ran. It costs two release builds instead of one (8 minutes in all on
# 2 cores, training included, against about 3.5 for the plain build) and a training run of
# 40 s (10 s a route and a server).
#
# Steps, each in its own target directory under target/:
#  1. both binaries instrumented (-Cprofile-generate), in target/pgo-gen;
#  2. each serves the benchmark's load on 127.0.0.1 (quotad on an embedded store in a temp
#     dir, the 3-tier policy of scripts/bench-http.sh, wrk with scripts/wrk/check.lua and
#     batch.lua over 10^4 clients) and writes its profile when it exits;
#  3. both again, optimised with the merged profile (-Cprofile-use), in target/pgo.
# The baseline is built the same way as quotad so that the benchmark's ratio compares like
# with like: the HTTP stack the two share gains as much in both.
#
# Needs llvm-profdata of rustc's own LLVM version: rustup's llvm-tools when installed, else
# Debian's llvm-<major> (installed with apt when missing), and wrk (likewise).
# RUSTFLAGS apply to the named --target only, so build scripts and proc macros are neither
# instrumented nor optimised with the profile.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
. scripts/common.sh
TRAIN=${TRAIN:-10s}
QPORT=${PGO_QPORT:-18098}
BPORT=${PGO_BPORT:-18099}
BASE=${CARGO_TARGET_DIR:-$ROOT/target}
HOST=$(rustc -vV | sed -n 's/^host: //p')
MAJOR=$(rustc -vV | sed -n 's/^LLVM version: \([0-9]*\).*/\1/p')
WORK=$(mktemp -d /tmp/quotad-pgo.XXXXXX)
# The profiles and the merged profile keep fixed paths, so that the instrumented build's flags
# stay the same from one run to the next and a second run reuses it (the optimised build is
# made again whenever the profile changes: rustc tracks the file).
DATA=$BASE/pgo-gen/profiles
MERGED=$BASE/pgo-gen/merged.profdata
rm -rf "$DATA"
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  rm -rf "$WORK"
}
trap cleanup EXIT
log() { printf '\n== %s\n' "$*"; }

PROFDATA=$(ls "$(rustc --print sysroot)"/lib/rustlib/*/bin/llvm-profdata 2>/dev/null | head -1 || true)
if [ -z "$PROFDATA" ]; then
  if ! command -v "llvm-profdata-$MAJOR" >/dev/null; then
    log "installing llvm-$MAJOR (apt) for llvm-profdata: rustc's LLVM is $MAJOR"
    apt_install "llvm-$MAJOR"
  fi
  PROFDATA=$(command -v "llvm-profdata-$MAJOR")
fi
command -v wrk >/dev/null || { log "installing wrk (apt)"; apt_install wrk; }

build() { # TARGET-DIR RUSTFLAGS
  CARGO_TARGET_DIR=$1 RUSTFLAGS=$2 \
    cargo build --release --target "$HOST" --bin quotad --example bench_baseline
}


log "1/3 instrumented build into $BASE/pgo-gen"
build "$BASE/pgo-gen" "-Cprofile-generate=$DATA"
GEN=$BASE/pgo-gen/$HOST/release

log "2/3 training: the benchmark's load for $TRAIN on each route, on each server"
train() { # PORT
  wrk -t2 -c64 -d"$TRAIN" -s scripts/wrk/check.lua "http://127.0.0.1:$1/v1/check" -- 10000 bench | grep Requests/sec
  wrk -t2 -c64 -d"$TRAIN" -s scripts/wrk/batch.lua "http://127.0.0.1:$1/v1/check/batch" -- 10000 bench 100 | grep Requests/sec
}
LLVM_PROFILE_FILE="$DATA/quotad-%p-%m.profraw" \
  QUOTAD__SERVER__BIND=127.0.0.1:$QPORT QUOTAD__STORE__KIND=embedded \
  QUOTAD__STORE__PATH="$WORK/store" QUOTAD__AUTH__ADMIN_TOKEN=$(od -An -tx1 -N16 /dev/urandom | tr -d " \n") QUOTAD__LOG__LEVEL=warn \
  QUOTAD__LIMITER__MAX_COUNTERS=4000000 QUOTAD__LIMITER__MAX_CLIENTS_PER_TENANT=2000000 \
  "$GEN/quotad" serve >"$WORK/quotad.log" 2>&1 &
QPID=$!
PIDS+=("$QPID")
wait_up "http://127.0.0.1:$QPORT/healthz"
curl -fsS -o /dev/null -X PUT -H 'Authorization: Bearer pgo-admin' -H 'Content-Type: application/json' \
  --data "$POLICY3" "http://127.0.0.1:$QPORT/v1/quotas/bench"
sleep 1.2 # quotas.refresh_ms
train "$QPORT"
kill -TERM "$QPID"
wait "$QPID" # the profile is written at exit
LLVM_PROFILE_FILE="$DATA/baseline-%p-%m.profraw" "$GEN/examples/bench_baseline" "127.0.0.1:$BPORT" \
  >"$WORK/baseline.log" 2>&1 &
BPID=$!
PIDS+=("$BPID")
wait_up "http://127.0.0.1:$BPORT/healthz"
train "$BPORT"
kill -TERM "$BPID"
wait "$BPID" || true
"$PROFDATA" merge -o "$MERGED" "$DATA"/quotad-*.profraw "$DATA"/baseline-*.profraw

log "3/3 optimised build into $BASE/pgo"
build "$BASE/pgo" "-Cprofile-use=$MERGED"
log "built: $BASE/pgo/$HOST/release/quotad and $BASE/pgo/$HOST/release/examples/bench_baseline"
