#!/usr/bin/env python3
"""A fleet whose clocks disagree keeps one limit: three quotad processes on one Cassandra/ScyllaDB
keyspace, one of them started with its wall clock shifted by libfaketime (Debian's `faketime`;
its monotonic clock left alone, FAKETIME_DONT_FAKE_MONOTONIC=1).

For each skew of that instance (SKEWS, default +0.1 s, +1 s and -0.5 s) it starts the three,
reads the skewed one's `quotad_clock_offset_seconds` within a few seconds of start-up, then
for each limit (a 100-per-10-s and a 50-per-1-s sliding window, tenant-wide, a fresh tenant
each) sends one client's checks at 10x the limit's rate for DURATION_S seconds, spread evenly
over the three, and measures the most admitted in any span of the window's length, by the
checker's own (unshifted) clock at each answer.

It asserts that the offset shows (within 20 ms of minus the skew) and that no span admits more
than 1% over `max`. Talks only to 127.0.0.1. Usage (needs a node and a release build):

    cargo build --release
    python3 scripts/clock-skew-check.py
    SKEWS=+1 DURATION_S=20 python3 scripts/clock-skew-check.py

Environment: QUOTAD_BIN (target/release/quotad), QUOTAD_NODES (127.0.0.1:9042), FLEET_PORT
(18380, the first of three ports), SKEWS (comma-separated seconds), DURATION_S (30),
FAKETIME_LIB (Debian's libfaketime). Exit status 0 when every case holds.
"""

import http.client
import json
import os
import secrets
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from quotad_procs import Procs, stop, worst_span  # noqa: E402

BIN = os.environ.get("QUOTAD_BIN", "target/release/quotad")
NODES = os.environ.get("QUOTAD_NODES", "127.0.0.1:9042")
PORT = int(os.environ.get("FLEET_PORT", "18380"))
SKEWS = [s for s in os.environ.get("SKEWS", "+0.1,+1,-0.5").split(",") if s]
DURATION_S = float(os.environ.get("DURATION_S", "30"))
LIB = os.environ.get("FAKETIME_LIB", "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1")
TOKEN = secrets.token_hex(16)
KEYSPACE = f"quotad_skew_{os.getpid()}"
LOGS = tempfile.mkdtemp(prefix="quotad-skew-")
LIMITS = [("100 per 10 s", 100, 10.0, "10s"), ("50 per 1 s", 50, 1.0, "1s")]
SENDERS = 24
PROCS = Procs(BIN, NODES, KEYSPACE, TOKEN, LOGS)


def start(port, skew=None):
    env = PROCS.env()
    env["QUOTAD__SERVER__BIND"] = f"127.0.0.1:{port}"
    if skew is not None:
        env.update({"LD_PRELOAD": LIB, "FAKETIME": skew, "FAKETIME_DONT_FAKE_MONOTONIC": "1",
                    "FAKETIME_NO_CACHE": "1"})
    log = open(os.path.join(LOGS, f"quotad-{port}-{skew or 0}.log"), "w")
    p = subprocess.Popen([BIN, "serve"], env=env, stdout=log, stderr=subprocess.STDOUT)
    p.port = port
    return p


def metric(port, name):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        c.request("GET", "/metrics")
        for line in c.getresponse().read().decode().splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
    finally:
        c.close()
    return None


def load(ports, tenant, rate_per_s):
    """One client's checks at `rate_per_s`, spread evenly over `ports`, for DURATION_S: the
    checker's times of the admitted answers, and the other answers' statuses."""
    admitted, other, lock = [], {}, threading.Lock()
    body = json.dumps({"tenant": tenant, "client": "k1"})
    headers = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
    begin = time.time() + 0.5
    total = int(rate_per_s * DURATION_S)

    def sender(t):
        conns = {}
        for k in range(t, total, SENDERS):
            wait = begin + k / rate_per_s - time.time()
            if wait > 0:
                time.sleep(wait)
            port = ports[k % len(ports)]
            try:
                c = conns.get(port) or http.client.HTTPConnection("127.0.0.1", port, timeout=10)
                conns[port] = c
                c.request("POST", "/v1/check", body=body, headers=headers)
                r = c.getresponse()
                r.read()
                status = r.status
            except (OSError, http.client.HTTPException) as e:
                conns.pop(port, None)
                status = repr(e)
            at = time.time()
            with lock:
                if status == 200:
                    admitted.append(at)
                elif status != 429:
                    other[status] = other.get(status, 0) + 1

    threads = [threading.Thread(target=sender, args=(t,)) for t in range(SENDERS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sorted(admitted), other


def main():
    if not os.path.exists(BIN):
        sys.exit(f"{BIN} is missing: build it first (cargo build --release)")
    if not os.path.exists(LIB):
        sys.exit(f"{LIB} is missing: apt-get install faketime")
    PROCS.migrate()
    print(f"three instances, one skewed; keyspace {KEYSPACE}; logs in {LOGS}")
    row = "{:>6} {:>14} {:>10} {:>12} {:>10} {:>9} {:>7} {:>6}"
    print(row.format("skew", "limit", "offset", "most/window", "over", "admitted", "errors",
                     "result"))
    failures = 0
    for n, skew in enumerate(SKEWS):
        ports = [PORT + 3 * n + i for i in range(3)]
        fleet = [start(ports[0], skew)] + [start(p) for p in ports[1:]]
        try:
            started = time.monotonic()
            for p in fleet:
                PROCS.wait_ready(p)
            offset = metric(ports[0], "quotad_clock_offset_seconds")
            shown = time.monotonic() - started
            expected = -float(skew)
            offset_ok = offset is not None and abs(offset - expected) <= 0.02
            time.sleep(2)  # every instance counts the others
            for name, mx, window_s, window in LIMITS:
                tenant = f"skew{n}-{window}-{os.getpid()}"
                status, _, body = PROCS.request(ports[1], "PUT", f"/v1/quotas/{tenant}", {
                    "limits": [{"id": "w", "max": mx, "window": window, "scope": "tenant"}]})
                assert status in (200, 201), (status, body)
                time.sleep(3)  # every instance's policy cache refreshes
                admitted, other = load(ports, tenant, 10 * mx / window_s)
                most = worst_span(admitted, window_s)
                over = most / mx - 1
                ok = over <= 0.01 and not other and offset_ok
                failures += not ok
                print(row.format(skew, name, f"{offset:+.4f} s" if offset is not None else "-",
                                 most, f"{over * 100:+.1f}%", len(admitted),
                                 sum(other.values()), "ok" if ok else "FAIL"), flush=True)
            print(f"       (the offset showed {shown:.1f} s after start-up)")
        finally:
            stop(fleet)
    print(f"\n{failures} failed (keyspace {KEYSPACE} left; logs in {LOGS})")
    return 0 if failures == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
