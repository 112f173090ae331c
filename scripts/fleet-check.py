#!/usr/bin/env python3
"""A fleet tried as a new user would: N identical quotad processes on one Cassandra/ScyllaDB.

Every instance gets the same configuration (no shard settings). The script migrates a fresh
keyspace, starts the instances, gives one client a sliding-window limit (and a daily one high
enough never to bind, which counts every admitted hit), and sends that client 10x its limit,
spread over the live instances, while it kills one instance with SIGKILL mid-run and starts a
fresh one. Then it stops the rest with SIGTERM and compares:

- the hits admitted (200 answers) in every span of one window with the limit: over-admission,
  which must stay within 1%;
- how long the fresh instance took to hold a shard (its /readyz), against one heartbeat;
- the store's count (read by one more instance) with the hits admitted: the difference must be
  at most what the killed instance admitted after its last sync round;
- the usage history (read by that instance) with the answers: admitted and denied each equal
  the 200s and 429s, less at most what the killed instance answered after its last history
  write (every HISTORY_MS, at the first sync round after it is due).

It talks only to 127.0.0.1. Usage (needs a reachable cluster and a built binary):

    cargo build --release
    QUOTAD_NODES=127.0.0.1:9042 python3 scripts/fleet-check.py

Environment: QUOTAD_BIN (default target/release/quotad), QUOTAD_NODES (127.0.0.1:9042),
FLEET_N (3), FLEET_MAX (100), FLEET_WINDOW_S (10), FLEET_SECONDS (40), FLEET_PORT (18180,
the first of N+2 ports).
Exit status 0 when every target holds.
"""

import secrets
import http.client
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time

BIN = os.environ.get("QUOTAD_BIN", "target/release/quotad")
NODES = os.environ.get("QUOTAD_NODES", "127.0.0.1:9042")
N = int(os.environ.get("FLEET_N", "3"))
MAX = int(os.environ.get("FLEET_MAX", "100"))
WINDOW_S = int(os.environ.get("FLEET_WINDOW_S", "10"))
SECONDS = float(os.environ.get("FLEET_SECONDS", "40"))
PORT = int(os.environ.get("FLEET_PORT", "18180"))
# A fresh admin token each run, as strong as quotad asks (128 bits).
TOKEN = secrets.token_hex(16)
KEYSPACE = f"quotad_fleet_{os.getpid()}"
SYNC_MS = 250
HISTORY_MS = 1000
HEARTBEAT_MS = 1000

LOGS = tempfile.mkdtemp(prefix="quotad-fleet-")


def env():
    e = dict(os.environ)
    e.update({
        "QUOTAD__STORE__KIND": "scylla",
        "QUOTAD__STORE__NODES": NODES,
        "QUOTAD__STORE__KEYSPACE": KEYSPACE,
        "QUOTAD__AUTH__ADMIN_TOKEN": TOKEN,
        "QUOTAD__SYNC__INTERVAL_MS": f"{SYNC_MS}ms",
        "QUOTAD__HISTORY__WRITE_INTERVAL_MS": f"{HISTORY_MS}ms",
        "QUOTAD__FLEET__HEARTBEAT_MS": f"{HEARTBEAT_MS}ms",
        "QUOTAD__QUOTAS__REFRESH_MS": "200ms",
    })
    return e


def start(port):
    e = env()
    e["QUOTAD__SERVER__BIND"] = f"127.0.0.1:{port}"
    log = open(os.path.join(LOGS, f"quotad-{port}.log"), "w")
    p = subprocess.Popen([BIN, "serve"], env=e, stdout=log, stderr=subprocess.STDOUT)
    p.port = port
    p.started = time.monotonic()
    return p


def request(port, method, path, body=None, timeout=5):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    headers = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
    c.request(method, path, body=json.dumps(body) if body is not None else None, headers=headers)
    r = c.getresponse()
    data = r.read()
    c.close()
    return r.status, (json.loads(data) if data else None)


def wait_ready(p, deadline=60):
    end = time.monotonic() + deadline
    while time.monotonic() < end:
        if p.poll() is not None:
            sys.exit(f"instance on {p.port} exited with {p.returncode}; see {LOGS}")
        try:
            status, body = request(p.port, "GET", "/readyz", timeout=1)
            if status == 200:
                return body, time.monotonic() - p.started
        except OSError:
            pass
        time.sleep(0.02)
    sys.exit(f"instance on {p.port} not ready in {deadline}s; see {LOGS}")


def join_ms(port):
    """From 'scylla store connected' to 'joined the fleet' in an instance's log."""
    from datetime import datetime

    stamps = {}
    with open(os.path.join(LOGS, f"quotad-{port}.log")) as f:
        for line in f:
            for key in ("scylla store connected", "joined the fleet"):
                if key in line and key not in stamps:
                    ts = line.split()[0].rstrip("Z")[:26]
                    stamps[key] = datetime.fromisoformat(ts)
    d = stamps["joined the fleet"] - stamps["scylla store connected"]
    return d.total_seconds() * 1000


class Load:
    """Sends checks to the live instances in turn at a fixed rate and records the answers."""

    def __init__(self, rate):
        self.rate = rate
        self.live = []
        self.lock = threading.Lock()
        self.answers = []  # (time, port, status)
        self.stop = False

    def run(self):
        conns = {}
        i = 0
        start = time.monotonic()
        while not self.stop:
            due = start + i / self.rate
            delay = due - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            with self.lock:
                live = list(self.live)
            if not live:
                i += 1
                continue
            port = live[i % len(live)]
            i += 1
            try:
                c = conns.get(port) or http.client.HTTPConnection("127.0.0.1", port, timeout=5)
                conns[port] = c
                c.request("POST", "/v1/check",
                          body=json.dumps({"tenant": "acme", "client": "k1"}),
                          headers={"Content-Type": "application/json"})
                r = c.getresponse()
                r.read()
                self.answers.append((time.monotonic(), port, r.status))
            except OSError:
                conns.pop(port, None)
                self.answers.append((time.monotonic(), port, None))


def main():
    out = subprocess.run([BIN, "migrate"], env=env(), capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"quotad migrate failed:\n{out.stdout}\n{out.stderr}")
    fleet = [start(PORT + i) for i in range(N)]
    shards = []
    for p in fleet:
        body, _ = wait_ready(p)
        shards.append(body["shard"])
    print(f"{N} instances, one configuration, shards {shards}; logs in {LOGS}")
    assert len(set(shards)) == N, f"two instances share a shard: {shards}"
    policy = {"limits": [
        {"id": "window", "max": MAX, "window": f"{WINDOW_S}s"},
        {"id": "total", "max": 1_000_000_000, "period": "day"},
    ]}
    status, _ = request(fleet[0].port, "PUT", "/v1/quotas/acme", policy)
    assert status in (200, 201), status
    time.sleep(0.5)  # every instance's policy cache refreshes within 200 ms

    rate = 10 * MAX / WINDOW_S  # 10x the limit's rate
    load = Load(rate)
    load.live = [p.port for p in fleet]
    t = threading.Thread(target=load.run)
    t.start()
    time.sleep(SECONDS * 0.4)

    victim = fleet[1]
    with load.lock:
        load.live.remove(victim.port)
    time.sleep(0.05)  # answers in flight land
    killed_at = time.monotonic()
    victim.send_signal(signal.SIGKILL)
    victim.wait()
    fresh = start(PORT + N)
    body, took = wait_ready(fresh)
    with load.lock:
        load.live.append(fresh.port)
    print(f"SIGKILL to the instance on shard {shards[1]}; a fresh instance held shard "
          f"{body['shard']} {took * 1000:.0f} ms after it started "
          f"(heartbeat {HEARTBEAT_MS} ms), members it saw: {body['members']}")
    time.sleep(SECONDS * 0.6)
    load.stop = True
    t.join()

    survivors = [p for p in fleet if p is not victim] + [fresh]
    for p in survivors:
        p.send_signal(signal.SIGTERM)
    for p in survivors:
        p.wait(timeout=60)
        assert p.returncode == 0, f"instance on {p.port} exited {p.returncode}"

    admitted = sum(1 for (_, _, s) in load.answers if s == 200)
    denied = sum(1 for (_, _, s) in load.answers if s == 429)
    errors = sum(1 for (_, _, s) in load.answers if s not in (200, 429))
    def victim_answered(status, ms):
        return sum(1 for (at, port, s) in load.answers
                   if port == victim.port and s == status and at >= killed_at - ms / 1000)
    victim_last = victim_answered(200, 2 * SYNC_MS)
    # The history is written less often than the hits: what it may miss is longer.
    history_ms = HISTORY_MS + 2 * SYNC_MS
    victim_hist = victim_answered(200, history_ms)
    victim_hist_denied = victim_answered(429, history_ms)
    reader = start(PORT + N + 1)
    wait_ready(reader)
    _, usage = request(reader.port, "GET", "/v1/usage/acme/k1")
    stored = next(l["count"] for l in usage["limits"] if l["limit_id"] == "total")
    # The usage history of the run (whole UTC days around it): what the answers said.
    day = 86400
    first = int(time.time() - 3 * day) // day * day
    span = (time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(first)),
            time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(first + 5 * day)))
    _, hist = request(reader.port, "GET",
                      f"/v1/usage/acme/k1/history?step=day&from={span[0]}&to={span[1]}")
    hist_admitted, hist_denied = hist["total"]["admitted"], hist["total"]["denied"]
    reader.send_signal(signal.SIGTERM)
    reader.wait(timeout=60)

    times = sorted(at for (at, _, s) in load.answers if s == 200)
    worst, lo = 0, 0
    for hi in range(len(times)):
        while times[hi] - times[lo] >= WINDOW_S:
            lo += 1
        worst = max(worst, hi - lo + 1)
    over = worst / MAX - 1
    print(f"offered {len(load.answers)} checks (10x max {MAX} per {WINDOW_S} s): admitted "
          f"{admitted}, denied {denied}, errors {errors}; most admitted in any {WINDOW_S} s: "
          f"{worst}, over-admission {over * 100:.2f}%")
    print(f"the store holds {stored}; admitted - stored = {admitted - stored}; the killed "
          f"instance admitted {victim_last} in its last {2 * SYNC_MS} ms")
    ok = True
    if over > 0.01:
        print("FAIL: over-admission above 1%")
        ok = False
    if errors:
        print("FAIL: answers other than 200/429")
        ok = False
    if not (0 <= admitted - stored <= victim_last):
        print("FAIL: the store does not hold every admitted hit")
        ok = False
    print(f"the usage history holds {hist_admitted} admitted and {hist_denied} denied; the "
          f"answers said {admitted} and {denied}; the killed instance answered "
          f"{victim_hist} and {victim_hist_denied} in its last {history_ms} ms")
    if not (0 <= admitted - hist_admitted <= victim_hist
            and 0 <= denied - hist_denied <= victim_hist_denied):
        print("FAIL: the usage history does not hold what the checks were answered")
        ok = False
    claim_ms = join_ms(fresh.port)
    print(f"the fresh instance claimed its shard {claim_ms:.0f} ms after connecting to the store")
    if claim_ms > HEARTBEAT_MS:
        print("FAIL: the fresh instance took more than one heartbeat to hold a shard")
        ok = False
    print(f"keyspace {KEYSPACE} is left for inspection")
    print("ok" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
