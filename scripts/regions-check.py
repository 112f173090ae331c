#!/usr/bin/env python3
"""One limit across regions, tried as a user would: two quotad instances in each of two data
centres of one Cassandra/ScyllaDB cluster, one client at 10x its limit spread over all four.

The script migrates a fresh keyspace across both data centres (`quotad migrate --datacenters`),
starts the instances (each with `store.local_dc` and a contact point of its own data centre),
gives the client a sliding-window limit (and a daily one high enough never to bind, which counts
every admitted hit), and sends it 10x the limit's rate, spread over the four instances, for three
phases: connected, the link between the data centres cut, and healed. The cut and the heal are
commands you give (the script never touches the network itself), e.g. iptables rules that drop
the nodes' inter-node port between them. It then compares:

- connected: the most hits admitted in any span of one window, against `max` + 1%;
- cut: the same, against the partition bound of docs/accuracy.md, `max + R x H_D`, where H_D is
  the headroom the window had at the cut plus what left it until every instance knew (here
  measured from the instances' `/readyz`), plus the fleet's 1%;
- latency: each region's p99 while cut, against 20 ms;
- after the heal: the store's count in each data centre (read by a fresh instance there, from
  its own data centre's replicas) against the hits admitted.

It talks only to 127.0.0.1 and the contact points given. Usage:

    cargo build --release
    REGION_NODES=127.0.0.1:9042,127.0.0.2:9042 REGION_DCS=dc1,dc2 \\
      CUT_CMD='iptables -I INPUT -p tcp -s 127.0.0.1 -d 127.0.0.2 --dport 7000 -j DROP; ...' \\
      HEAL_CMD='iptables -D INPUT ...' python3 scripts/regions-check.py

Environment: QUOTAD_BIN (target/release/quotad), REGION_NODES (a contact point per data centre),
REGION_DCS (their names), REGION_MAX (1000), REGION_WINDOW_S (10), PHASE_S (30: the length of
each phase), REGION_PORT (18280, the first of six ports), CUT_CMD, HEAL_CMD (without them the
run stays connected). Exit status 0 when every target holds.
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

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from quotad_procs import worst_span  # noqa: E402

BIN = os.environ.get("QUOTAD_BIN", "target/release/quotad")
NODES = os.environ.get("REGION_NODES", "127.0.0.1:9042,127.0.0.2:9042").split(",")
DCS = os.environ.get("REGION_DCS", "dc1,dc2").split(",")
MAX = int(os.environ.get("REGION_MAX", "1000"))
WINDOW_S = int(os.environ.get("REGION_WINDOW_S", "10"))
PHASE_S = float(os.environ.get("PHASE_S", "30"))
PORT = int(os.environ.get("REGION_PORT", "18280"))
CUT_CMD = os.environ.get("CUT_CMD")
HEAL_CMD = os.environ.get("HEAL_CMD")
PER_REGION = 2
# A fresh admin token each run, as strong as quotad asks (128 bits).
TOKEN = secrets.token_hex(16)
KEYSPACE = f"quotad_regions_{os.getpid()}"
LOGS = tempfile.mkdtemp(prefix="quotad-regions-")


def env(region):
    e = dict(os.environ)
    e.update({
        "QUOTAD__STORE__KIND": "scylla",
        "QUOTAD__STORE__NODES": NODES[region],
        "QUOTAD__STORE__LOCAL_DC": DCS[region],
        "QUOTAD__STORE__KEYSPACE": KEYSPACE,
        "QUOTAD__AUTH__ADMIN_TOKEN": TOKEN,
        "QUOTAD__QUOTAS__REFRESH_MS": "200ms",
    })
    return e


def start(region, port):
    e = env(region)
    e["QUOTAD__SERVER__BIND"] = f"127.0.0.1:{port}"
    log = open(os.path.join(LOGS, f"quotad-{DCS[region]}-{port}.log"), "w")
    p = subprocess.Popen([BIN, "serve"], env=e, stdout=log, stderr=subprocess.STDOUT)
    p.port, p.region = port, region
    return p


def request(port, method, path, body=None, timeout=5):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    headers = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
    c.request(method, path, body=json.dumps(body) if body is not None else None, headers=headers)
    r = c.getresponse()
    data = r.read()
    c.close()
    return r.status, (json.loads(data) if data else None)


def wait_ready(p, deadline=90):
    end = time.monotonic() + deadline
    while time.monotonic() < end:
        if p.poll() is not None:
            sys.exit(f"instance on {p.port} exited with {p.returncode}; see {LOGS}")
        try:
            status, body = request(p.port, "GET", "/readyz", timeout=1)
            if status == 200:
                return body
        except OSError:
            pass
        time.sleep(0.05)
    sys.exit(f"instance on {p.port} not ready in {deadline}s; see {LOGS}")


class Sender(threading.Thread):
    """Sends checks to one instance at a fixed rate; records (time, status, latency)."""

    def __init__(self, port, rate):
        super().__init__()
        self.port, self.rate = port, rate
        self.answers = []
        self.stop = False

    def run(self):
        conn = None
        i, start = 0, time.monotonic()
        while not self.stop:
            due = start + i / self.rate
            delay = due - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            i += 1
            t0 = time.monotonic()
            try:
                conn = conn or http.client.HTTPConnection("127.0.0.1", self.port, timeout=5)
                conn.request("POST", "/v1/check",
                             body=json.dumps({"tenant": "acme", "client": "k1"}),
                             headers={"Content-Type": "application/json"})
                r = conn.getresponse()
                r.read()
                status = r.status
            except OSError:
                conn, status = None, None
            t1 = time.monotonic()
            self.answers.append((t1, status, t1 - t0))


class Watcher(threading.Thread):
    """Polls every instance's /readyz: when each first saw another region cut off."""

    def __init__(self, fleet):
        super().__init__()
        self.fleet, self.stop = fleet, False
        self.first_cut = {}
        self.lags = []

    def run(self):
        while not self.stop:
            for p in self.fleet:
                try:
                    _, body = request(p.port, "GET", "/readyz", timeout=1)
                except OSError:
                    continue
                for r in (body or {}).get("regions", []):
                    if r["cut_off"] and p.port not in self.first_cut:
                        self.first_cut[p.port] = time.monotonic()
                    if not r["local"] and not r["cut_off"]:
                        self.lags.append(r["lag_ms"])
            time.sleep(0.05)


def worst_window(times):
    return worst_span(times, WINDOW_S)


def p99(xs):
    xs = sorted(xs)
    return xs[int(0.99 * (len(xs) - 1))] if xs else float("nan")


def main():
    spec = ",".join(f"{dc}:1" for dc in DCS)
    out = subprocess.run([BIN, "migrate", "--datacenters", spec], env=env(0),
                         capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"quotad migrate failed:\n{out.stdout}\n{out.stderr}")
    fleet = [start(r, PORT + r * PER_REGION + k) for r in range(len(DCS)) for k in range(PER_REGION)]
    for p in fleet:
        body = wait_ready(p)
        print(f"instance {p.port}: region {body.get('region')}, shard {body['shard']}")
    time.sleep(2)  # every instance reads every region's heartbeat and lease
    _, body = request(fleet[0].port, "GET", "/readyz")
    print(f"the fleet as {DCS[0]} sees it: {json.dumps(body['regions'])}")
    policy = {"limits": [
        {"id": "window", "max": MAX, "window": f"{WINDOW_S}s"},
        {"id": "total", "max": 1_000_000_000, "period": "day"},
    ]}
    status, _ = request(fleet[0].port, "PUT", "/v1/quotas/acme", policy)
    assert status in (200, 201), status
    time.sleep(1.5)  # the policy reaches the other data centre and every cache

    rate = 10 * MAX / WINDOW_S / len(fleet)  # 10x the limit's rate, spread over all
    senders = [Sender(p.port, rate) for p in fleet]
    watcher = Watcher(fleet)
    for s in senders + [watcher]:
        s.start()
    time.sleep(PHASE_S)
    cut_at = heal_at = None
    if CUT_CMD and HEAL_CMD:
        cut_at = time.monotonic()
        subprocess.run(CUT_CMD, shell=True, check=True)
        time.sleep(PHASE_S)
        heal_at = time.monotonic()
        subprocess.run(HEAL_CMD, shell=True, check=True)
        time.sleep(PHASE_S)
    for s in senders + [watcher]:
        s.stop = True
    for s in senders + [watcher]:
        s.join()
    for p in fleet:
        p.send_signal(signal.SIGTERM)
    for p in fleet:
        p.wait(timeout=60)
        assert p.returncode == 0, f"instance on {p.port} exited {p.returncode}"

    answers = [a for s in senders for a in s.answers]
    admitted = sorted(t for (t, st, _) in answers if st == 200)
    errors = sum(1 for (_, st, _) in answers if st not in (200, 429))
    ok = True
    print(f"offered {len(answers)} checks, admitted {len(admitted)}, errors {errors}; "
          f"replication lag seen (heartbeat age, ms): p50 {sorted(watcher.lags)[len(watcher.lags) // 2] if watcher.lags else '-'}")
    if errors:
        print("FAIL: answers other than 200/429")
        ok = False
    first = min(t for (t, _, _) in answers)
    connected = [t for t in admitted if first + WINDOW_S <= t < (cut_at or float("inf"))]
    over = worst_window(connected) / MAX - 1
    print(f"connected: most admitted in any {WINDOW_S} s: {worst_window(connected)} "
          f"(max {MAX}), over {over * 100:.2f}%")
    if over > 0.01:
        print("FAIL: connected over-admission above 1%")
        ok = False
    if cut_at:
        detected = max(watcher.first_cut.get(p.port, float("inf")) for p in fleet) - cut_at
        held = sum(1 for t in admitted if cut_at - WINDOW_S < t <= cut_at)
        freed = sum(1 for t in admitted if cut_at - WINDOW_S < t <= cut_at - WINDOW_S + detected)
        bound = MAX + len(DCS) * (max(0, MAX - held) + freed)
        around = [t for t in admitted if cut_at - WINDOW_S < t < heal_at + WINDOW_S]
        worst = worst_window(around)
        print(f"cut: every instance knew after {detected * 1000:.0f} ms; the window held {held} "
              f"at the cut, {freed} left it meanwhile: bound {bound} (+1%); most admitted in "
              f"any window around the cut: {worst} ({(worst / MAX - 1) * 100:.2f}% over)")
        if worst > bound * 1.01:
            print("FAIL: the partition bound does not hold")
            ok = False
        for r, dc in enumerate(DCS):
            ports = {p.port for p in fleet if p.region == r}
            lat = [l for s in senders if s.port in ports for (t, st, l) in s.answers
                   if cut_at <= t < heal_at]
            adm = sum(1 for s in senders if s.port in ports for (t, st, _) in s.answers
                      if cut_at <= t < heal_at and st == 200)
            print(f"cut, {dc}: {len(lat)} checks answered, {adm} admitted, "
                  f"p99 {p99(lat) * 1000:.1f} ms")
            if not p99(lat) < 0.020:
                print(f"FAIL: {dc} p99 at or above 20 ms while cut")
                ok = False
        after = [t for t in admitted if t >= heal_at + WINDOW_S]
        over_after = worst_window(after) / MAX - 1
        print(f"healed: most admitted in any window that began {WINDOW_S} s after the heal: "
              f"{worst_window(after)} ({over_after * 100:.2f}% over)")
    time.sleep(15)  # hints reach the other data centre
    for r, dc in enumerate(DCS):
        reader = start(r, PORT + 4 + r)
        wait_ready(reader)
        _, usage = request(reader.port, "GET", "/v1/usage/acme/k1")
        stored = next(l["count"] for l in usage["limits"] if l["limit_id"] == "total")
        reader.send_signal(signal.SIGTERM)
        reader.wait(timeout=60)
        print(f"{dc}'s replicas hold {stored}; admitted {len(admitted)}")
        if stored != len(admitted):
            print(f"FAIL: {dc} does not hold every admitted hit")
            ok = False
    print(f"keyspace {KEYSPACE} is left for inspection; logs in {LOGS}")
    print("ok" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
