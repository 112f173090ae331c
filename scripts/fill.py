#!/usr/bin/env python3
"""Drives N distinct clients of one tenant through POST /v1/check/batch (loopback only), so the
server holds N distinct active counters. Used by bench-http.sh for the memory measurement.

Usage: fill.py HOST:PORT TENANT N [BATCH] [THREADS]

With FLOOD=1 it does not stop at a denial: it counts the answers (a flood of invented ids, where
a client beyond a memory cap may be denied when the store is slow to answer).
"""
import os
import http.client
import json
import sys
import threading
import time

host, port = sys.argv[1].split(":")
tenant, n = sys.argv[2], int(sys.argv[3])
batch = int(sys.argv[4]) if len(sys.argv) > 4 else 1000
threads = int(sys.argv[5]) if len(sys.argv) > 5 else 4
assert host == "127.0.0.1", "load tests talk to 127.0.0.1 only"

failed = []
flood = os.environ.get("FLOOD") == "1"
counts = {"allowed": 0, "denied": 0}
lock = threading.Lock()


def worker(k):
    conn = http.client.HTTPConnection(host, int(port), timeout=60)
    for start in range(k * batch, n, batch * threads):
        checks = [{"tenant": tenant, "client": f"m-{i}", "cost": 1} for i in range(start, min(n, start + batch))]
        conn.request("POST", "/v1/check/batch", json.dumps({"checks": checks}),
                     {"Content-Type": "application/json"})
        r = conn.getresponse()
        body = r.read()
        if r.status != 200 or (not flood and b'"allowed":false' in body):
            failed.append((r.status, body[:200]))
            return
        denied = body.count(b'"allowed":false')
        with lock:
            counts["denied"] += denied
            counts["allowed"] += len(checks) - denied


t0 = time.time()
ts = [threading.Thread(target=worker, args=(k,)) for k in range(threads)]
for t in ts:
    t.start()
for t in ts:
    t.join()
if failed:
    sys.exit(f"fill failed: {failed[0]}")
print(f"fill: {n} distinct clients through /v1/check/batch in {time.time() - t0:.1f} s: "
      f"{counts['allowed']} allowed, {counts['denied']} denied")
