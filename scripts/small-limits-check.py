#!/usr/bin/env python3
"""A fleet admits every unit of a small limit, never one more, and its 429s tell the truth.

N identical quotad processes with default settings (only the store's kind, nodes and keyspace,
and an admin token) share one fresh keyspace on one Cassandra/ScyllaDB node. Each case below
gets fresh tenants, one per traffic mode, so no case sees another's counts:

- client-M: M (1, 5, 10, 60) per hour, a client-scoped sliding window ("window": "1h");
- tenant-M: the same, "scope": "tenant", the checks rotating over 4 clients of the tenant;
- day-5:    5 per calendar day ("period": "day");
- bucket-5: a token bucket of burst 5 refilling 1 token an hour.

Traffic modes, each followed by an 8 s pause and then 10 more checks one at a time:

- a: one check at a time, round-robin over the instances, 20 ms apart, 2*max+5 checks;
- b: 16 concurrent callers, each sending to the next instance in turn, 10*max+20 checks in all.

For every case and mode it asserts:

- the checks admitted (200) are exactly max (a token bucket's burst): every unit, never one more;
- every 429's binding limit has `remaining` below the cost (0), in its body and in its
  RateLimit-Remaining header, and a Retry-After of at least 60 s (these limits free nothing
  sooner, so a shorter wait, such as a sync interval, is not the truth; day-5 fails by design
  in the last minute of a UTC day);
- every 200's `remaining` (body and header agree) is at most max minus the checks admitted so
  far, this one included, in the order the answers arrived (mode a only: concurrent answers
  have no such order);
- no answer is other than 200 or 429.

It talks only to 127.0.0.1. Usage (needs a reachable node and a built binary):

    cargo build --release
    FLEET_N=2 python3 scripts/small-limits-check.py
    FLEET_N=3 CASES=tenant,bucket python3 scripts/small-limits-check.py

Environment: QUOTAD_BIN (default target/release/quotad), QUOTAD_NODES (127.0.0.1:9042),
FLEET_N (2), FLEET_PORT (18280, the first of N ports), CASES (comma-separated case names or
their kinds: client-5, tenant, day, bucket; default every case). The keyspace
(quotad_small_<pid>) is left for inspection; the instances' logs are kept in a temporary
directory the script names. A failed case prints example answers (with UTC times).
Exit status 0 when every case holds.
"""

import secrets
import json
import os
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from quotad_procs import Procs, stop  # noqa: E402

BIN = os.environ.get("QUOTAD_BIN", "target/release/quotad")
NODES = os.environ.get("QUOTAD_NODES", "127.0.0.1:9042")
N = int(os.environ.get("FLEET_N", "2"))
PORT = int(os.environ.get("FLEET_PORT", "18280"))
ONLY = [c for c in os.environ.get("CASES", "").split(",") if c]
# A fresh admin token each run, as strong as quotad asks (128 bits).
TOKEN = secrets.token_hex(16)
KEYSPACE = f"quotad_small_{os.getpid()}"
PAUSE_S = 8
CALLERS = 16
MIN_RETRY_S = 60
LOGS = tempfile.mkdtemp(prefix="quotad-small-")


def cases():
    """(name, limit, tenant-scoped, expected admitted)."""
    out = []
    for m in (1, 5, 10, 60):
        out.append((f"client-{m}", {"id": "hourly", "max": m, "window": "1h"}, False, m))
    for m in (1, 5, 10, 60):
        out.append((f"tenant-{m}", {"id": "hourly", "max": m, "window": "1h", "scope": "tenant"},
                    True, m))
    out.append(("day-5", {"id": "daily", "max": 5, "period": "day"}, False, 5))
    out.append(("bucket-5", {"id": "bucket", "burst": 5, "rate": 1, "per": "1h"}, False, 5))
    return [c for c in out
            if not ONLY or any(c[0] == w or c[0].startswith(w + "-") for w in ONLY)]


PROCS = Procs(BIN, NODES, KEYSPACE, TOKEN, LOGS)
start, request, wait_ready = PROCS.start, PROCS.request, PROCS.wait_ready


def run(ports, tenant, clients, mode, count):
    """Sends the checks of one case and mode; returns the answers in the order they arrived."""
    answers, lock = [], threading.Lock()

    def send(i, port):
        client = clients[(i // len(ports)) % len(clients)]
        a = {"i": i, "port": port, "client": client}
        try:
            a["status"], a["headers"], a["body"] = request(
                port, "POST", "/v1/check", {"tenant": tenant, "client": client})
        except (OSError, ValueError) as err:
            a["status"], a["headers"], a["body"] = None, {}, repr(err)
        a["at"] = time.time()
        with lock:
            answers.append(a)

    def one_at_a_time(first, n):
        for i in range(first, first + n):
            send(i, ports[i % len(ports)])
            time.sleep(0.02)

    if mode == "a":
        one_at_a_time(0, count)
    else:
        sent = [0]

        def caller(t):
            k = 0
            while True:
                with lock:
                    if sent[0] >= count:
                        return
                    i = sent[0]
                    sent[0] += 1
                send(i, ports[(t + k) % len(ports)])
                k += 1

        threads = [threading.Thread(target=caller, args=(t,)) for t in range(CALLERS)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    time.sleep(PAUSE_S)
    one_at_a_time(count, 10)
    return answers


def judge(answers, expected, mode):
    """Counts and problems of one case's answers (cost 1 throughout)."""
    r = {"admitted": 0, "denied": 0, "bad429": [], "bad200": [], "errors": [], "min_retry": None}
    for a in answers:
        body, h = a["body"], a["headers"]
        if a["status"] not in (200, 429) or not isinstance(body, dict):
            r["errors"].append(a)
            continue
        rem, hrem = body.get("remaining"), h.get("ratelimit-remaining")
        why = []
        if hrem is None or rem is None or str(rem) != hrem:
            why.append("remaining: body and header differ")
        if body.get("allowed") != (a["status"] == 200):
            why.append("allowed does not match the status")
        if a["status"] == 200:
            r["admitted"] += 1
            if mode == "a" and rem is not None and rem > expected - r["admitted"]:
                why.append(f"remaining {rem} > {expected - r['admitted']} (max - admitted so far)")
            if why:
                r["bad200"].append((a, why))
            continue
        r["denied"] += 1
        retry = h.get("retry-after")
        retry = int(retry) if retry is not None and retry.isdigit() else None
        if retry is not None:
            r["min_retry"] = retry if r["min_retry"] is None else min(r["min_retry"], retry)
        ms = body.get("retry_after_ms")
        if rem is None or rem >= 1 or hrem is None or not hrem.isdigit() or int(hrem) >= 1:
            why.append("remaining not below the cost")
        if retry is None or retry < MIN_RETRY_S:
            why.append(f"Retry-After {retry} < {MIN_RETRY_S}")
        if ms is None or -(-ms // 1000) < MIN_RETRY_S:
            why.append(f"retry_after_ms {ms} < {MIN_RETRY_S} s")
        if why:
            r["bad429"].append((a, why))
    r["expected"], r["answers"] = expected, answers
    r["ok"] = (r["admitted"] == expected and not r["bad429"] and not r["bad200"]
               and not r["errors"])
    return r


def show(a, why=()):
    h = {k: v for k, v in a["headers"].items() if k.startswith("ratelimit") or k == "retry-after"}
    at = time.strftime("%H:%M:%S", time.gmtime(a["at"])) + f".{int(a['at'] % 1 * 1000):03d}"
    return (f"    {at} #{a['i']} to :{a['port']} ({a['client']}): {a['status']} "
            f"{json.dumps(a['body'])} {h} {'; '.join(why)}")


def main():
    if not os.path.exists(BIN):
        sys.exit(f"{BIN} is missing: build it first (cargo build --release)")
    PROCS.migrate()
    fleet = [start(PORT + i) for i in range(N)]
    try:
        shards = [wait_ready(p)["shard"] for p in fleet]
        ports = [p.port for p in fleet]
        print(f"{N} instances, default settings, shards {shards}, keyspace {KEYSPACE}; "
              f"logs in {LOGS}")
        assert len(set(shards)) == N, f"two instances share a shard: {shards}"
        # Members: every instance should count the others before shares are judged.
        time.sleep(2)
        runs = []
        for name, limit, tenant_scoped, expected in cases():
            for mode in ("a", "b"):
                tenant = f"{name}-{mode}-{os.getpid()}"
                status, _, body = request(ports[0], "PUT", f"/v1/quotas/{tenant}",
                                          {"limits": [limit]})
                assert status in (200, 201), (status, body)
                runs.append((name, mode, tenant, tenant_scoped, expected))
        time.sleep(3)  # every instance's policy cache refreshes within quotas.refresh_ms (1 s)

        row = "{:<10} {:<4} {:>2} {:>8} {:>8} {:>5} {:>8} {:>8} {:>8} {:>6} {:>15}"
        print(row.format("case", "mode", "N", "admitted", "expected", "429s", "bad 429s",
                         "bad 200s", "errors", "result", "min Retry-After"))
        results = []
        for name, mode, tenant, tenant_scoped, expected in runs:
            clients = [f"k{i}" for i in range(1, 5)] if tenant_scoped else ["k1"]
            count = 2 * expected + 5 if mode == "a" else 10 * expected + 20
            answers = run(ports, tenant, clients, mode, count)
            r = judge(answers, expected, mode)
            results.append((name, mode, r))
            print(row.format(name, mode, N, r["admitted"], expected, r["denied"],
                             len(r["bad429"]), len(r["bad200"]), len(r["errors"]),
                             "ok" if r["ok"] else "FAIL",
                             "-" if r["min_retry"] is None else f"{r['min_retry']} s"), flush=True)
    finally:
        stop(fleet)
    exits = [p.returncode for p in fleet]

    failed = [(name, mode, r) for (name, mode, r) in results if not r["ok"]]
    for name, mode, r in failed:
        print(f"\n{name} mode {mode}: admitted {r['admitted']} of {r['expected']}; examples:")
        for a, why in (r["bad429"][:3] + r["bad200"][:3]):
            print(show(a, why))
        for a in r["errors"][:3]:
            print(show(a, ["not a 200 or 429"]))
        if r["admitted"] != r["expected"]:
            admitted = [a for a in r["answers"] if a["status"] == 200]
            if admitted:
                print(show(admitted[-1], ["the last admitted"]))
            for a in r["answers"][-10:][:3]:
                print(show(a, ["after the pause"]))
    if any(rc != 0 for rc in exits):
        print(f"FAIL: instances exited with {exits} after SIGTERM; see {LOGS}")
    print(f"\n{len(results) - len(failed)} passed, {len(failed)} failed "
          f"(keyspace {KEYSPACE} left; logs in {LOGS})")
    return 0 if not failed and all(rc == 0 for rc in exits) else 1


if __name__ == "__main__":
    sys.exit(main())
