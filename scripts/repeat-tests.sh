#!/usr/bin/env bash
# Runs one test binary many times in a row beside CPU burners, as CI on a busy 2-core machine
# would see it, and names every test that failed in any run: the way to find a flaky test.
#
#   scripts/repeat-tests.sh                    # the HTTP suite (tests/api), 20 runs, 2 burners
#   RUNS=50 BURNERS=3 scripts/repeat-tests.sh
#   TEST=simulation scripts/repeat-tests.sh    # another test binary
#   FILTER=outage scripts/repeat-tests.sh      # only the tests whose names contain "outage"
#
# Each run's output goes to $OUT/run-N.txt (default: a temp dir). It exits 1 if any run failed.
# Set QUOTAD_TEST_REQUIRE_NGINX=1, as .ci/run does, so that the proxy test runs rather than
# skips. The browser tests are ignored unless asked for: FILTER="console -- --ignored".
set -euo pipefail
cd "$(dirname "$0")/.."

RUNS=${RUNS:-20}
BURNERS=${BURNERS:-2}
TEST=${TEST:-api}
FILTER=${FILTER:-}
OUT=${OUT:-$(mktemp -d /tmp/quotad-repeat.XXXXXX)}
mkdir -p "$OUT"

cargo test --test "$TEST" --no-run

BURN=()
stop_burners() {
    for p in "${BURN[@]}"; do kill "$p" 2>/dev/null || true; done
}
trap stop_burners EXIT
for _ in $(seq 1 "$BURNERS"); do
    # A busy loop of the shell itself, bounded so that it never outlives a forgotten run.
    timeout 3h bash -c 'while :; do :; done' &
    BURN+=($!)
done

failed=0
for i in $(seq 1 "$RUNS"); do
    start=$(date +%s)
    if cargo test --test "$TEST" -- $FILTER >"$OUT/run-$i.txt" 2>&1; then
        verdict=ok
    else
        verdict=FAILED
        failed=$((failed + 1))
    fi
    summary=$(grep -E '^test result:' "$OUT/run-$i.txt" | tail -1 || true)
    echo "run $i/$RUNS: $verdict in $(($(date +%s) - start)) s: $summary"
    grep -E '^test .* FAILED$' "$OUT/run-$i.txt" | sed 's/^/    /' || true
done

echo
echo "$((RUNS - failed)) of $RUNS runs passed beside $BURNERS burners; output in $OUT"
if [ "$failed" -gt 0 ]; then
    echo "tests that failed, with how many runs each:"
    cat "$OUT"/run-*.txt | grep -E '^test .* FAILED$' | sort | uniq -c | sort -rn
    exit 1
fi
