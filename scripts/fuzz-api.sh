#!/usr/bin/env bash
# Fuzzes the HTTP API with schemathesis against its own OpenAPI document (/v1/openapi.json).
#
# Builds quotad (debug), starts it on 127.0.0.1 (a free port) with an embedded store in a temp
# directory and a known admin token, creates two quotas so that checks reach the limiter, then
# runs schemathesis for a bounded number of examples per operation. Fails on any 5xx, and on any
# answer whose status, content type, headers or body the document does not describe.
#
# Needs python3 (with venv) and cargo; schemathesis is installed from PyPI into a virtualenv
# under the cargo target directory, at a pinned version, on first use. Loopback only.
#
# Environment (all optional):
#   FUZZ_MAX_EXAMPLES  examples per operation and phase   (default 30)
#   FUZZ_MAX_SECONDS   wall-clock bound of the schemathesis run (default 600)
#   FUZZ_SEED          schemathesis seed, to replay a run  (default: random, printed)
#   FUZZ_CHECKS        schemathesis checks, comma-separated (default: the list below)
#   FUZZ_REPORT_DIR    where the JUnit report and a reproduction file go (default: a temp dir, kept on failure)
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD

SCHEMATHESIS_VERSION=4.32.5
MAX_EXAMPLES=${FUZZ_MAX_EXAMPLES:-30}
MAX_SECONDS=${FUZZ_MAX_SECONDS:-600}
SEED=${FUZZ_SEED:-$RANDOM$RANDOM}
TARGET=${CARGO_TARGET_DIR:-$ROOT/target}
VENV=$TARGET/fuzz-venv
# A fresh admin token each run, as strong as quotad asks (128 bits).
TOKEN=$(od -An -tx1 -N16 /dev/urandom | tr -d " \n")
# Answers match the document (status, content type, headers, body) and are never a 5xx; what the
# document calls invalid is refused with a 4xx; admin routes refuse a request without the token;
# a created policy can be read back, a deleted one is gone; a method the document does not list
# for a path gets 405 with an `Allow` header, and the `Allow` of an OPTIONS answer lists the
# path's documented methods.
CHECKS=${FUZZ_CHECKS:-not_a_server_error,status_code_conformance,content_type_conformance,response_headers_conformance,response_schema_conformance,negative_data_rejection,ignored_auth,use_after_free,ensure_resource_availability,unsupported_method,allow_header_conformance}

for tool in cargo python3 curl; do
    command -v "$tool" >/dev/null || { echo "fuzz-api: $tool is required" >&2; exit 1; }
done

WORK=$(mktemp -d)
REPORT_DIR=${FUZZ_REPORT_DIR:-$WORK/report}
PID=
cleanup() {
    status=$?
    if [[ -n $PID ]] && kill -0 "$PID" 2>/dev/null; then
        kill -TERM "$PID" 2>/dev/null || true
        wait "$PID" 2>/dev/null || true
    fi
    if [[ $status -ne 0 ]]; then
        echo "fuzz-api: FAILED; quotad's log: $WORK/quotad.log; reports: $REPORT_DIR" >&2
    else
        rm -rf "$WORK"
    fi
    exit "$status"
}
trap cleanup EXIT

echo "== building quotad (debug)"
cargo build --quiet --bin quotad
BIN=$TARGET/debug/quotad

echo "== schemathesis $SCHEMATHESIS_VERSION in $VENV"
if ! "$VENV/bin/st" --version 2>/dev/null | grep -qF "$SCHEMATHESIS_VERSION"; then
    rm -rf "$VENV"
    python3 -m venv "$VENV"
    "$VENV/bin/pip" install --quiet --disable-pip-version-check "schemathesis==$SCHEMATHESIS_VERSION"
fi

echo "== starting quotad"
# Port 0: the kernel picks a free port, which quotad logs ("quotad listening port=...").
QUOTAD__SERVER__BIND=127.0.0.1:0 \
QUOTAD__STORE__KIND=embedded \
QUOTAD__STORE__PATH="$WORK/data" \
QUOTAD__AUTH__ADMIN_TOKEN=$TOKEN \
QUOTAD__LOG__LEVEL=warn,quotad::startup=info \
NO_COLOR=1 \
    "$BIN" serve >"$WORK/quotad.log" 2>&1 &
PID=$!
PORT=
for _ in $(seq 1 200); do
    PORT=$(sed 's/\x1b\[[0-9;]*m//g' "$WORK/quotad.log" | sed -n 's/.*quotad listening.*port=\([0-9]\+\).*/\1/p' | head -n1)
    [[ -n $PORT ]] && break
    kill -0 "$PID" 2>/dev/null || { cat "$WORK/quotad.log" >&2; echo "fuzz-api: quotad did not start" >&2; exit 1; }
    sleep 0.1
done
[[ -n $PORT ]] || { cat "$WORK/quotad.log" >&2; echo "fuzz-api: quotad did not log its port" >&2; exit 1; }
BASE=http://127.0.0.1:$PORT
echo "quotad on $BASE (pid $PID)"

# Quotas for the tenants schemathesis' examples are likely to hit, so checks reach the limiter
# (the rest get 404, also documented): the document's examples use "acme", and short random ids
# often are "0" or "A".
put_quota() {
    curl -fsS -o /dev/null -X PUT "$BASE/v1/quotas/$1" -H "Authorization: Bearer $TOKEN" \
        -H 'Content-Type: application/json' -d "$2"
}
for tenant in acme 0 A a; do
    put_quota "$tenant" '{"limits": [
        {"id": "per-second", "max": 5, "window": "1s"},
        {"id": "monthly", "max": 100000, "period": "month", "scope": "tenant"},
        {"id": "writes", "max": 3, "window": "10s", "resource": "PUT /products/*"}]}'
done
put_quota dry '{"mode": "dry_run", "consistency": "strict", "limits": [{"id": "d", "max": 1, "period": "day"}]}'
curl -fsS -o /dev/null -X PUT "$BASE/v1/quotas/acme/clients/key-123" -H "Authorization: Bearer $TOKEN" \
    -H 'Content-Type: application/json' -d '{"limits": [{"id": "per-second", "max": 50, "window": "1s"}]}'

# One worker: with two, hypothesis parses sources in two threads at once, which CPython before
# 3.11.8 and 3.12.2 can fail with "SystemError: AST constructor recursion depth mismatch".
echo "== schemathesis: $MAX_EXAMPLES examples per operation, at most ${MAX_SECONDS}s, seed $SEED"
mkdir -p "$REPORT_DIR"
started=$(date +%s)
set +e
# The checks go in the config file, not on the command line, where a list would override the
# per-operation exception at the end. A batch of over 1000 checks can also be over the 64 KiB
# body limit: 413 refuses it as well as 400 does (statuses: the schemathesis default plus 413).
# /v1/forward-auth must take every header a proxy forwards, so the negative case "a header the
# document does not name" cannot be refused there: negative_data_rejection is off for it alone
# (its other checks stay, and tests/api/proxy.rs refuses its bad headers one by one).
{
    printf '[checks]\nenabled = false\n'
    IFS=',' read -ra list <<<"$CHECKS"
    for c in "${list[@]}"; do
        printf '[checks.%s]\nenabled = true\n' "$c"
        if [[ $c == negative_data_rejection ]]; then
            printf '%s\n' 'expected-statuses = ["400", "401", "403", "404", "405", "406", "409", "413", "415", "422", "428", "429", "5xx"]'
        fi
    done
    printf '[[operations]]\ninclude-path = "/v1/forward-auth"\nchecks.negative_data_rejection.enabled = false\n'
} >"$WORK/schemathesis.toml"
# From the temp dir: schemathesis keeps a cache in the working directory.
(cd "$WORK" && timeout --signal=INT --kill-after=30 "$MAX_SECONDS" \
    "$VENV/bin/st" --config-file "$WORK/schemathesis.toml" run "$BASE/v1/openapi.json" \
    --url "$BASE" \
    --header "Authorization: Bearer $TOKEN" \
    --max-examples "$MAX_EXAMPLES" \
    --seed "$SEED" \
    --workers 1 \
    --request-timeout 10 \
    --generation-database none \
    --no-color \
    --report junit \
    --report-dir "$REPORT_DIR")
st_status=$?
set -e
echo "== schemathesis exited $st_status after $(( $(date +%s) - started ))s"
if [[ $st_status -eq 124 ]]; then
    echo "fuzz-api: schemathesis did not finish within ${MAX_SECONDS}s" >&2
fi
if ! kill -0 "$PID" 2>/dev/null; then
    echo "fuzz-api: quotad died during the run" >&2
    exit 1
fi
if grep -qiE 'panicked|internal error' "$WORK/quotad.log"; then
    grep -iE -m 20 'panicked|internal error' "$WORK/quotad.log" >&2
    echo "fuzz-api: quotad logged a panic or an internal error" >&2
    exit 1
fi
exit "$st_status"
