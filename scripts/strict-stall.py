#!/usr/bin/env python3
"""Strict mode tried as a new user would: two quotad processes on one Cassandra/ScyllaDB node,
16 concurrent callers against a strict limit of max 50, with the node paused now and then.

The script migrates a fresh keyspace, starts two instances with the default settings of the
scylla store (a check deadline of 1 s), gives tenant `stall` a strict policy (max 50 an hour,
`on_store_failure = "local"`) and runs, each time for a fresh client, 400 checks over HTTP from
16 callers (8 on each instance) while it stops the node's process (SIGSTOP) and continues it
(SIGCONT) as each run's schedule says:

- 5 runs without a pause: at most 50 admitted;
- 5 runs with the node paused twice for 300 ms (the first 5 ms into the run): at most 50, as
  pauses shorter than the deadline decide nothing by the failure rule;
- 3 runs with the node paused 3 s (past the deadline): at most the bound docs/accuracy.md
  states, 50 plus what the instances had not seen of each other's hits, here the 8 callers in
  flight on the other instance: 58.

It talks only to 127.0.0.1 and needs the node on this machine. Usage:

    cargo build --release
    STALL_PID=$(pgrep -f CassandraDaemon) QUOTAD_NODES=127.0.0.1:9042 python3 scripts/strict-stall.py

Environment: QUOTAD_BIN (default target/release/quotad), QUOTAD_NODES (127.0.0.1:9042),
STALL_PID (the node's process id; required), STALL_PORT (18190, the first of two ports).
Exit status 0 when every run holds its bound.
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
PID = int(os.environ.get("STALL_PID") or sys.exit("STALL_PID: the node's process id, please"))
PORT = int(os.environ.get("STALL_PORT", "18190"))
# A fresh admin token each run, as strong as quotad asks (128 bits).
TOKEN = secrets.token_hex(16)
KEYSPACE = f"quotad_stall_{os.getpid()}"
MAX, CALLERS, CHECKS = 50, 16, 400
LOGS = tempfile.mkdtemp(prefix="quotad-stall-")


def env(port):
    e = dict(os.environ)
    e.update({
        "QUOTAD__STORE__KIND": "scylla",
        "QUOTAD__STORE__NODES": NODES,
        "QUOTAD__STORE__KEYSPACE": KEYSPACE,
        "QUOTAD__AUTH__ADMIN_TOKEN": TOKEN,
        "QUOTAD__SERVER__BIND": f"127.0.0.1:{port}",
        "QUOTAD__QUOTAS__REFRESH_MS": "200ms",
    })
    return e


def request(port, method, path, body=None, timeout=10):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    headers = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
    c.request(method, path, body=json.dumps(body) if body is not None else None, headers=headers)
    r = c.getresponse()
    data = r.read()
    c.close()
    return r.status, data


def wait(port, path, ok, deadline=60):
    end = time.monotonic() + deadline
    while time.monotonic() < end:
        try:
            status, _ = request(port, "GET", path, timeout=1)
            if ok(status):
                return
        except OSError:
            pass
        time.sleep(0.1)
    sys.exit(f"127.0.0.1:{port}{path} never answered as expected; logs in {LOGS}")


def run(client, pauses):
    """400 checks of `client` from 16 callers while the node is paused as `pauses` says
    (ms, the first 5 ms in, each next 20 ms after the last); returns the checks admitted."""
    left = [CHECKS]
    admitted = [0]
    lock = threading.Lock()

    def caller(port):
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        body = json.dumps({"tenant": "stall", "client": client})
        while True:
            with lock:
                if left[0] == 0:
                    return
                left[0] -= 1
            c.request("POST", "/v1/check", body=body, headers={"Content-Type": "application/json"})
            r = c.getresponse()
            r.read()
            if r.status == 200:
                with lock:
                    admitted[0] += 1
            elif r.status != 429:
                sys.exit(f"a check answered {r.status}")

    threads = [threading.Thread(target=caller, args=(PORT + i % 2,)) for i in range(CALLERS)]
    for t in threads:
        t.start()
    time.sleep(0.005)
    for p in pauses:
        os.kill(PID, signal.SIGSTOP)
        time.sleep(p / 1000)
        os.kill(PID, signal.SIGCONT)
        time.sleep(0.02)
    for t in threads:
        t.join()
    return admitted[0]


def main():
    out = subprocess.run([BIN, "migrate"], env=env(PORT), capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"quotad migrate failed:\n{out.stdout}\n{out.stderr}")
    fleet = []
    for i in range(2):
        log = open(os.path.join(LOGS, f"quotad-{i}.log"), "w")
        fleet.append(subprocess.Popen([BIN, "serve"], env=env(PORT + i), stdout=log,
                                      stderr=subprocess.STDOUT))
    failed = []
    try:
        for i in range(2):
            wait(PORT + i, "/readyz", lambda s: s == 200)
        policy = {"consistency": "strict", "on_store_failure": "local",
                  "limits": [{"id": "h", "max": MAX, "window": "1h"}]}
        status, body = request(PORT, "PUT", "/v1/quotas/stall", policy)
        if status not in (200, 201):
            sys.exit(f"PUT policy: {status} {body!r}")
        for i in range(2):
            wait(PORT + i, "/v1/usage/stall/probe", lambda s: s == 200)
        print(f"two instances on {NODES}, strict max {MAX}, {CALLERS} callers, {CHECKS} checks a "
              f"run; logs in {LOGS}")
        plan = ([("no pause", [], MAX)] * 5 + [("paused 300 ms twice", [300, 300], MAX)] * 5
                + [("paused 3 s", [3000], MAX + CALLERS // 2)] * 3)
        for r, (what, pauses, bound) in enumerate(plan):
            n = run(f"run-{r}", pauses)
            verdict = "ok" if n <= bound else "OVER"
            print(f"run {r:2} {what:20} admitted {n:3} (at most {bound}) {verdict}")
            if n > bound:
                failed.append(r)
    finally:
        os.kill(PID, signal.SIGCONT)
        for p in fleet:
            p.send_signal(signal.SIGTERM)
        for p in fleet:
            p.wait(timeout=30)
        print(f"keyspace {KEYSPACE} left in place")
    if failed:
        sys.exit(f"runs over their bound: {failed}")


if __name__ == "__main__":
    main()
