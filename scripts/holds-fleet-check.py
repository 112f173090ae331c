#!/usr/bin/env python3
"""Reservations on a fleet: an in-flight cap is never exceeded, and holds of a killed instance
expire once.

N quotad processes (default 2) with default settings (only the store's kind, nodes and keyspace,
and an admin token) share one fresh keyspace on one Cassandra/ScyllaDB node.

1. In flight. A tenant's policy caps each client at 4 reservations held at once
   ({"in_flight": "holds", "max": 4}) beside a generous token budget. 16 callers, each sending
   to the next instance in turn, reserve (cost 100), do "work" for 200 to 800 ms while a counter
   stands for the upstream (incremented after an admitted reservation, decremented before its
   settle), then settle at a cost of 50 to 150, for ROUNDS seconds. Asserts the counter never
   passed 4, that the cap was reached, and that every settle answered 200.
2. Killed. Instance 0 takes 3 reservations (hold "4s", cost 1,000 each) and is killed with
   SIGKILL. Asserts that within 20 s another instance reports all 3 expired (GET
   /v1/reservations/{id}), its `quotad_holds_total{event="expired"}` is 3, the client's budget
   count is exactly 3,000 (charged once, at the estimates), and its in-flight count is back to
   0, so that 4 new reservations are admitted.

It talks only to 127.0.0.1. Usage (needs a reachable node and a built binary):

    cargo build --release
    FLEET_N=2 python3 scripts/holds-fleet-check.py

Environment: QUOTAD_BIN (default target/release/quotad), QUOTAD_NODES (127.0.0.1:9042),
FLEET_N (2), FLEET_PORT (18380, the first of N ports), ROUNDS (20). The keyspace
(quotad_holds_<pid>) is left for inspection; the instances' logs are kept in a temporary
directory the script names. Exit status 0 when both parts hold.
"""

import os
import random
import secrets
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from quotad_procs import Procs  # noqa: E402

BIN = os.environ.get("QUOTAD_BIN", "target/release/quotad")
NODES = os.environ.get("QUOTAD_NODES", "127.0.0.1:9042")
N = int(os.environ.get("FLEET_N", "2"))
PORT = int(os.environ.get("FLEET_PORT", "18380"))
ROUNDS = int(os.environ.get("ROUNDS", "20"))
TOKEN = secrets.token_hex(16)
KEYSPACE = f"quotad_holds_{os.getpid()}"
LOGS = tempfile.mkdtemp(prefix="quotad-holds-")
CAP = 4
CALLERS = 16


PROCS = Procs(BIN, NODES, KEYSPACE, TOKEN, LOGS)
start, wait_ready = PROCS.start, PROCS.wait_ready


def request(port, method, path, body=None, timeout=10):
    """One request on a fresh connection: (status, JSON body or text)."""
    status, _, answer = PROCS.request(port, method, path, body, timeout)
    return status, answer


def metric(port, series):
    _, text = request(port, "GET", "/metrics")
    for line in text.splitlines():
        if line.startswith(series + " "):
            return float(line.split()[-1])
    return 0.0


def count(port, tenant, client, limit):
    _, u = request(port, "GET", f"/v1/usage/{tenant}/{client}?all=true")
    return next(l["count"] for l in u["limits"] if l["limit_id"] == limit)


def in_flight(ports):
    tenant = "inflight"
    policy = {"limits": [{"id": "tokens", "max": 100_000_000, "window": "1m"},
                         {"id": "slots", "max": CAP, "in_flight": "holds"}]}
    assert request(ports[0], "PUT", f"/v1/quotas/{tenant}", policy)[0] in (200, 201)
    time.sleep(2)  # every instance's policy cache has it
    lock = threading.Lock()
    state = {"at_upstream": 0, "most": 0, "admitted": 0, "denied": 0, "bad": []}
    end = time.monotonic() + ROUNDS

    def caller(t):
        i = t
        while time.monotonic() < end:
            port = ports[i % len(ports)]
            i += 1
            s, a = request(port, "POST", "/v1/check",
                           {"tenant": tenant, "client": "k", "cost": 100, "reserve": True})
            if s == 429:
                with lock:
                    state["denied"] += 1
                time.sleep(0.02)
                continue
            if s != 200:
                with lock:
                    state["bad"].append((s, a))
                continue
            with lock:
                state["admitted"] += 1
                state["at_upstream"] += 1
                state["most"] = max(state["most"], state["at_upstream"])
            time.sleep(random.uniform(0.2, 0.8))
            with lock:
                state["at_upstream"] -= 1
            rid = a["reservation"]["id"]
            s, b = request(ports[i % len(ports)], "POST", f"/v1/reservations/{rid}/settle",
                           {"cost": random.randint(50, 150)})
            if s != 200:
                with lock:
                    state["bad"].append((s, b))

    threads = [threading.Thread(target=caller, args=(t,)) for t in range(CALLERS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    print(f"in flight: at most {state['most']} at the upstream (cap {CAP}); "
          f"{state['admitted']} admitted, {state['denied']} refused, {len(state['bad'])} bad")
    ok = state["most"] <= CAP and state["most"] == CAP and not state["bad"]
    if state["bad"]:
        print("  e.g.", state["bad"][:3])
    return ok


def killed(procs):
    tenant = "killed"
    policy = {"limits": [{"id": "tokens", "max": 1_000_000, "window": "10m"},
                         {"id": "slots", "max": CAP, "in_flight": "holds"}]}
    ports = [p.port for p in procs]
    assert request(ports[0], "PUT", f"/v1/quotas/{tenant}", policy)[0] in (200, 201)
    time.sleep(2)
    ids = []
    for _ in range(3):
        s, a = request(ports[0], "POST", "/v1/check",
                       {"tenant": tenant, "client": "k", "cost": 1000, "reserve": True,
                        "hold": "4s"})
        assert s == 200, (s, a)
        ids.append(a["reservation"]["id"])
    procs[0].kill()
    procs[0].wait()
    other = ports[1]
    deadline = time.monotonic() + 20
    states = []
    while time.monotonic() < deadline:
        states = [request(other, "GET", f"/v1/reservations/{r}")[1].get("state") for r in ids]
        if all(s == "expired" for s in states):
            break
        time.sleep(0.5)
    time.sleep(1)
    expired = sum(metric(p, 'quotad_holds_total{event="expired"}') for p in ports[1:])
    tokens = count(other, tenant, "k", "tokens")
    slots = count(other, tenant, "k", "slots")
    fresh = [request(other, "POST", "/v1/check",
                     {"tenant": tenant, "client": "k", "cost": 1, "reserve": True})[0]
             for _ in range(CAP)]
    print(f"killed: states {states}, expired on the others {expired:.0f}, budget count {tokens}, "
          f"held {slots}, then {fresh.count(200)} of {CAP} new reservations admitted")
    return (states == ["expired"] * 3 and expired == 3 and tokens == 3000 and slots == 0
            and fresh == [200] * CAP)


def main():
    PROCS.migrate()
    procs = [start(PORT + i) for i in range(N)]
    try:
        for p in procs:
            wait_ready(p)
        ok_flight = in_flight([p.port for p in procs])
        ok_killed = killed(procs)
    finally:
        for p in procs:
            if p.poll() is None:
                p.terminate()
        for p in procs:
            p.wait()
    print(f"keyspace {KEYSPACE}, logs in {LOGS}")
    if not (ok_flight and ok_killed):
        sys.exit("FAILED")
    print("ok")


if __name__ == "__main__":
    main()
