# Shell functions and the policy the benchmark and build scripts share (sourced, not run).

# The benchmark's policy: 3 tiers, maxes high enough that every check is admitted, so the
# steady state is measured (scripts/bench-http.sh; scripts/build-pgo.sh trains on it).
POLICY3='{"limits": [
  {"id": "per-second", "max": 100000, "window": "1s"},
  {"id": "per-hour", "max": 1000000000, "period": "hour"},
  {"id": "tenant-per-minute", "max": 1000000000000, "window": "1m", "scope": "tenant"}]}'

# Waits until URL answers (at most 10 s).
wait_up() { # URL
  for _ in $(seq 1 100); do
    curl -fsS -o /dev/null "$1" 2>/dev/null && return 0
    sleep 0.1
  done
  echo "server at $1 did not come up" >&2
  return 1
}

# Installs Debian packages, with sudo when not root.
apt_install() { # PACKAGE...
  local sudo=""
  [ "$(id -u)" = 0 ] || sudo=sudo
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "$@" >/dev/null
}
