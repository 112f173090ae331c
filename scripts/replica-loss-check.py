#!/usr/bin/env python3
"""A fleet on a three-replica cluster loses a node: every admitted hit still counted, every
limit still held.

Two quotad instances (release build, default settings but the store) share a fresh keyspace
of replication factor 3 (`quotad migrate --datacenters DC:3`) on a cluster of three nodes of
one data centre. 16 callers send four kinds of traffic for DUR seconds, half to each instance:

- far:    FAR_CLIENTS clients of 1,000,000 an hour, paced to FAR_RATE checks a second in all
          (4 callers): what is admitted must reach the store;
- strict: one client of 200 an hour, `"consistency": "strict"` (2 callers);
- small:  SMALL_CLIENTS clients of 5 an hour (2 callers, turn about): none may get a 6th;
- hot:    one client of 1000 per sliding 10 s, as fast as 8 callers go (about 10x): within
          1% of 1000 in every 10 s span, and admitted all the while (at least 500 in every
          12 s span while the node is down: see HOT_WAIT).

A fault, at FAULT_AT seconds: `kill` (SIGKILL the node NODE, start it again DOWN_FOR seconds
later), `kill-first` (the same to the first contact point), `pause` (SIGSTOP the node NODE for
DOWN_FOR seconds), or `none`. FAULTS runs several, one after another, each in a keyspace of
its own. After the traffic the script waits for the node to answer again, scrapes the
instances' metrics, stops them with SIGTERM (their exit status and last words are kept), and
waits (up to SETTLE_WAIT, 120 s) until no hit is in doubt, reads what the store counted
through a fresh instance (`GET /v1/usage`). It prints a table:

    fault | far admitted/stored | strict admitted/stored | small 4/5/6/7/8 | hot worst span;
    least in 12 s while down | 5xx | /readyz not ready/degraded | hits in doubt: settled | exits

It talks only to 127.0.0.x. Usage (needs the cluster and a built binary):

    cargo build --release
    NODE_PID_CMD='pid-of-node {n}' NODE_START_CMD='start-node {n}' \\
        FAULTS=none,kill,kill-first,pause python3 scripts/replica-loss-check.py

`{n}` in NODE_PID_CMD and NODE_START_CMD is the last number of the node's address (3 for
127.0.0.3); NODE_PID_CMD prints the node's process id, NODE_START_CMD starts it again and
returns once it answers CQL. Environment: QUOTAD_BIN (target/release/quotad), QUOTAD_NODES
(127.0.0.3:9042,127.0.0.4:9042,127.0.0.5:9042; the first is the first contact point), DC
(dc1), NODE (the node `kill` and `pause` take: 127.0.0.4 for kill, 127.0.0.5 for pause), DUR
(90), FAULT_AT (30), DOWN_FOR (25 for a kill, 10 for a pause), FAR_CLIENTS (2000), FAR_RATE
(250), SMALL_CLIENTS (45), PORT (18380, the first of three), QUOTAD_CPUS (a `taskset` list
for the instances, e.g. 0). Exit status 0 when every row holds.
"""

import http.client
import json
import os
import secrets
import signal
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from quotad_procs import Procs  # noqa: E402

BIN = os.environ.get("QUOTAD_BIN", "target/release/quotad")
NODES = os.environ.get("QUOTAD_NODES", "127.0.0.3:9042,127.0.0.4:9042,127.0.0.5:9042")
DC = os.environ.get("DC", "dc1")
DUR = float(os.environ.get("DUR", "90"))
SETTLE_WAIT = float(os.environ.get("SETTLE_WAIT", "120"))
FAULT_AT = float(os.environ.get("FAULT_AT", "30"))
FAR_CLIENTS = int(os.environ.get("FAR_CLIENTS", "2000"))
FAR_RATE = float(os.environ.get("FAR_RATE", "250"))
SMALL_CLIENTS = int(os.environ.get("SMALL_CLIENTS", "45"))
PORT = int(os.environ.get("PORT", "18380"))
CPUS = os.environ.get("QUOTAD_CPUS", "")
PID_CMD = os.environ.get("NODE_PID_CMD", "")
START_CMD = os.environ.get("NODE_START_CMD", "")
FAULTS = [f for f in os.environ.get("FAULTS", os.environ.get("FAULT", "kill")).split(",") if f]
TOKEN = secrets.token_hex(16)
HOT_MAX, HOT_SPAN = 1000, 10.0
# Kept admitted while the node is down: at least half of HOT_MAX in every span of the window
# and two of its 1 s buckets. A window that a burst fills reopens once the burst's bucket has
# left it, up to a bucket after the burst's hits have (a bucket after an empty one counts in
# full: docs/accuracy.md), so with no fault at all a 10 s span can fall between two bursts.
HOT_WAIT = HOT_SPAN + 2.0
STRICT_MAX, SMALL_MAX = 200, 5


def node_of(addr):
    """The last number of a node's address (`127.0.0.4:9042` -> 4)."""
    return addr.split(":")[0].rsplit(".", 1)[1]


def fault_node(fault):
    if fault == "kill-first":
        return node_of(NODES.split(",")[0])
    default = "127.0.0.4" if fault == "kill" else "127.0.0.5"
    return node_of(os.environ.get("NODE", default))


def node_pid(n):
    out = subprocess.run(PID_CMD.format(n=n), shell=True, capture_output=True, text=True)
    pid = out.stdout.strip()
    if out.returncode != 0 or not pid.isdigit():
        sys.exit(f"NODE_PID_CMD gave no pid for node {n}: {out.stdout} {out.stderr}")
    return int(pid)


class Caller:
    """One caller: a kept-alive connection per instance, a request at a time."""

    def __init__(self, ports):
        self.ports, self.conns = ports, {}

    def check(self, port, tenant, client):
        body = json.dumps({"tenant": tenant, "client": client})
        for attempt in (0, 1):
            c = self.conns.get(port)
            if c is None:
                c = self.conns[port] = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
            try:
                c.request("POST", "/v1/check", body=body,
                          headers={"Content-Type": "application/json"})
                r = c.getresponse()
                r.read()
                return r.status
            except (OSError, http.client.HTTPException):
                c.close()
                self.conns.pop(port, None)
                if attempt:
                    return None
        return None


def run_traffic(ports, tenants, t0, stop_at):
    """The 16 callers; returns what each kind saw."""
    seen = {k: {"admitted": 0, "statuses": {}} for k in ("far", "strict", "small", "hot")}
    seen["small"]["per_client"] = {}
    seen["hot"]["times"] = []
    # Each admitted hot check as (sent, answered, port), in seconds since t0: the instance
    # decided it in between.
    seen["hot"]["spans"] = []
    lock = threading.Lock()

    def note(kind, status, client=None, at=None, span=None):
        with lock:
            s = seen[kind]
            s["statuses"][status] = s["statuses"].get(status, 0) + 1
            if status == 200:
                s["admitted"] += 1
                if kind == "small":
                    s["per_client"][client] = s["per_client"].get(client, 0) + 1
                if kind == "hot":
                    s["times"].append(at)
                    s["spans"].append(span)

    def far(i):
        c, k, every = Caller(ports), 0, 4 / FAR_RATE
        nxt = time.monotonic()
        while time.monotonic() < stop_at:
            client = f"c{(k * 4 + i) % FAR_CLIENTS}"
            note("far", c.check(ports[(k + i) % 2], tenants["far"], client))
            k += 1
            nxt += every
            time.sleep(max(0.0, nxt - time.monotonic()))

    def strict(i):
        c, k = Caller(ports), 0
        while time.monotonic() < stop_at:
            note("strict", c.check(ports[(k + i) % 2], tenants["strict"], "s1"))
            k += 1
            time.sleep(0.1)

    def small(i):
        c, k = Caller(ports), 0
        while time.monotonic() < stop_at:
            client = f"k{(k * 2 + i) % SMALL_CLIENTS}"
            note("small", c.check(ports[(k + i) % 2], tenants["small"], client), client)
            k += 1
            time.sleep(0.05)

    def hot(i):
        c, k = Caller(ports), 0
        while time.monotonic() < stop_at:
            port = ports[(k + i) % 2]
            sent = time.monotonic() - t0
            st = c.check(port, tenants["hot"], "hot")
            answered = time.monotonic() - t0
            note("hot", st, at=answered, span=(sent, answered, port))
            k += 1

    threads = ([threading.Thread(target=far, args=(i,)) for i in range(4)]
               + [threading.Thread(target=strict, args=(i,)) for i in range(2)]
               + [threading.Thread(target=small, args=(i,)) for i in range(2)]
               + [threading.Thread(target=hot, args=(i,)) for i in range(8)])
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return seen


def watch_ready(procs, ports, stop, out):
    """Polls /readyz of every instance each second: counts of 200 ready, 200 degraded, other."""
    while not stop.is_set():
        for p in ports:
            try:
                status, _, body = procs.request(p, "GET", "/readyz", timeout=2)
                key = (body.get("status") if status == 200 and isinstance(body, dict)
                       else str(status))
            except OSError:
                key = "no answer"
            out[key] = out.get(key, 0) + 1
        stop.wait(1)


def inject(fault, t0, times):
    """Runs the fault; records (down from, back at) in seconds since t0."""
    if fault == "none":
        return
    n = fault_node(fault)
    time.sleep(max(0.0, t0 + FAULT_AT - time.monotonic()))
    pid = node_pid(n)
    down_for = float(os.environ.get("DOWN_FOR", "10" if fault == "pause" else "25"))
    if fault == "pause":
        os.kill(pid, signal.SIGSTOP)
        times["down"] = time.monotonic() - t0
        time.sleep(down_for)
        os.kill(pid, signal.SIGCONT)
        times["back"] = time.monotonic() - t0
        return
    os.kill(pid, signal.SIGKILL)
    times["down"] = time.monotonic() - t0
    time.sleep(down_for)
    subprocess.run(START_CMD.format(n=n), shell=True, capture_output=True)
    times["back"] = time.monotonic() - t0


def metric(procs, port, name):
    try:
        status, _, text = procs.request(port, "GET", "/metrics", timeout=5)
    except OSError:
        return 0.0
    for line in (text or "").splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return 0.0


def worst_certain_span(spans, span):
    """The most admitted checks that were certainly decided within one span of `span` seconds
    (sent at or after its start, answered before its end), when that span began, and how many
    of them each instance decided."""
    spans = sorted(spans)
    longest = max((a - s for s, a, _ in spans), default=0.0)
    worst, best, hi = 0, None, 0
    for lo in range(len(spans)):
        end = spans[lo][0] + span
        hi = max(hi, lo)
        while hi < len(spans) and spans[hi][0] < end:
            hi += 1
        late, k = 0, hi - 1
        while k >= lo and spans[k][0] >= end - longest:
            late += spans[k][1] >= end
            k -= 1
        if hi - lo - late > worst:
            worst, best = hi - lo - late, (lo, hi, end)
    by_port = {}
    if best:
        lo, hi, end = best
        for _, answered, port in spans[lo:hi]:
            if answered < end:
                by_port[port] = by_port.get(port, 0) + 1
    return worst, (spans[best[0]][0] if best else 0.0), by_port


SAMPLED = ("quotad_fleet_members", "quotad_last_units_checks_total", "quotad_sync_pending_hits",
           "quotad_store_operation_duration_seconds_sum",
           "quotad_store_operation_duration_seconds_count", "quotad_store_failure_decisions_total")


def sample_metrics(procs, ports, t0, stop, out):
    """Every half second, each instance's metrics named in SAMPLED: (t, port, {line: value})."""
    while not stop.is_set():
        for p in ports:
            try:
                status, _, text = procs.request(p, "GET", "/metrics", timeout=2)
            except OSError:
                continue
            got = {}
            for line in (text or "").splitlines():
                if line.startswith(SAMPLED):
                    name, _, value = line.rpartition(" ")
                    got[name] = float(value)
            out.append((time.monotonic() - t0, p, got))
        stop.wait(0.5)


def around(samples, port, lo, hi):
    """What the samples of one instance say of [lo, hi]: the fewest members seen, the checks
    decided at the last units, and each store operation's mean time."""
    mine = [(t, m) for t, p, m in samples if p == port and lo - 0.5 <= t <= hi + 0.5]
    if len(mine) < 2:
        return {}
    first, last = mine[0][1], mine[-1][1]

    def delta(name):
        return last.get(name, 0.0) - first.get(name, 0.0)

    members = [m.get("quotad_fleet_members") for _, m in mine if "quotad_fleet_members" in m]
    ops = {}
    for name in last:
        if name.startswith("quotad_store_operation_duration_seconds_sum"):
            count = delta(name.replace("_sum", "_count", 1))
            if count:
                label = name[name.find("{"):]
                ops[label] = f"{count:.0f} x {1000 * delta(name) / count:.0f} ms"
    return {
        "members": (min(members), max(members)) if members else None,
        "last_units": delta("quotad_last_units_checks_total"),
        "ops": ops,
    }


def worst_span_at(times, span):
    """The most of the sorted `times` in any span of `span` seconds, and when that span began."""
    worst, at, lo = 0, 0.0, 0
    for hi in range(len(times)):
        while times[hi] - times[lo] >= span:
            lo += 1
        if hi - lo + 1 > worst:
            worst, at = hi - lo + 1, times[lo]
    return worst, at


def least_in_spans(times, lo, hi, span):
    """The fewest of `times` in any span of `span` seconds that starts in [lo, hi - span]
    (the one starting at lo when the range is shorter than a span)."""
    starts = [lo + i * 0.5 for i in range(max(1, int((hi - span - lo) / 0.5) + 1))]
    return min(sum(1 for t in times if s <= t < s + span) for s in starts)


def trial(fault, run):
    """One fault's run; `run` numbers the runs of one invocation (each its own keyspace)."""
    ks = f"quotad_loss_{fault.replace('-', '_')}_{os.getpid()}_{run}"
    logs = tempfile.mkdtemp(prefix=f"quotad-loss-{fault}-")
    procs = Procs(BIN, NODES, ks, TOKEN, logs, cpus=CPUS)
    procs.migrate("--datacenters", f"{DC}:3")
    fleet = [procs.start(PORT), procs.start(PORT + 1)]
    ports = [PORT, PORT + 1]
    for p in fleet:
        procs.wait_ready(p)
    tag = f"{os.getpid()}-{run}"
    tenants = {k: f"{k}-{tag}" for k in ("far", "strict", "small", "hot")}
    policies = {
        "far": {"limits": [{"id": "hour", "max": 1_000_000, "window": "1h"}]},
        "strict": {"limits": [{"id": "hour", "max": STRICT_MAX, "window": "1h"}],
                   "consistency": "strict"},
        "small": {"limits": [{"id": "hour", "max": SMALL_MAX, "window": "1h"}]},
        "hot": {"limits": [{"id": "ten", "max": HOT_MAX, "window": "10s"}]},
    }
    for k, body in policies.items():
        status, _, answer = procs.request(PORT, "PUT", f"/v1/quotas/{tenants[k]}", body)
        assert status in (200, 201), (status, answer)
    time.sleep(3)  # both instances see the policies (quotas.refresh_ms) and each other
    t0 = time.monotonic()
    times, ready, stop = {}, {}, threading.Event()
    faulting = threading.Thread(target=inject, args=(fault, t0, times))
    watching = threading.Thread(target=watch_ready, args=(procs, ports, stop, ready))
    samples = []
    sampling = threading.Thread(target=sample_metrics, args=(procs, ports, t0, stop, samples))
    faulting.start()
    watching.start()
    sampling.start()
    seen = run_traffic(ports, tenants, t0, t0 + DUR)
    faulting.join()  # the node answers CQL again
    time.sleep(5)
    stop.set()
    watching.join()
    sampling.join()

    def total(name):
        return sum(metric(procs, p, name) for p in ports)

    # Writes in doubt are settled once every replica answers again: wait for that.
    settle_by = time.monotonic() + SETTLE_WAIT
    while total("quotad_store_doubtful_hits") > 0 and time.monotonic() < settle_by:
        time.sleep(1)
    settled = "quotad_store_doubtful_hits_settled_total{outcome=\"%s\"}"
    uncertain = "%s: %s landed, %s resent, %s left" % tuple(
        f"{n:,.0f}" for n in (total("quotad_store_uncertain_hits_total"),
                              total(settled % "landed"), total(settled % "resent"),
                              total("quotad_store_doubtful_hits")))
    for p in fleet:
        p.send_signal(signal.SIGTERM)
    exits = []
    for p in fleet:
        try:
            exits.append(p.wait(timeout=120))
        except subprocess.TimeoutExpired:
            p.kill()
            exits.append("killed")
    # What the store counted, through an instance that admitted none of it.
    reader = procs.start(PORT + 2)
    procs.wait_ready(reader)

    def count(tenant, client):
        status, _, body = procs.request(PORT + 2, "GET", f"/v1/usage/{tenant}/{client}")
        assert status == 200, (status, body)
        return sum(lim["count"] for lim in body["limits"])

    stored = {
        "far": sum(count(tenants["far"], f"c{i}") for i in range(FAR_CLIENTS)),
        "strict": count(tenants["strict"], "s1"),
    }
    reader.send_signal(signal.SIGTERM)
    reader.wait(timeout=60)
    last_words = []
    for port in ports:
        with open(os.path.join(logs, f"quotad-{port}.log")) as f:
            words = [ln for ln in f if "every admitted hit written" in ln or "shutdown:" in ln]
        last_words.append(words[-1].strip()[-160:] if words else "(nothing said)")
    with open(os.path.join(logs, "hot-admitted.json"), "w") as f:
        json.dump(sorted(seen["hot"]["spans"]), f)
    hot = sorted(seen["hot"]["times"])
    loose, loose_at = worst_span_at(hot, HOT_SPAN)
    worst, worst_at, worst_by_port = worst_certain_span(seen["hot"]["spans"], HOT_SPAN)
    worst_diag = {p: around(samples, p, worst_at, worst_at + HOT_SPAN) for p in ports}
    tens = [sum(1 for t in hot if k * HOT_SPAN <= t < (k + 1) * HOT_SPAN)
            for k in range(int(DUR // HOT_SPAN))]
    # While the node was down, within the traffic's time.
    lo = times.get("down", FAULT_AT)
    hi = min(times.get("back", FAULT_AT + HOT_SPAN), DUR)
    least = least_in_spans(hot, lo, hi, HOT_WAIT) if fault != "none" else None
    small_hist = [sum(1 for n in seen["small"]["per_client"].values() if n == k)
                  for k in range(4, 9)]
    fivexx = sum(n for s in seen.values() for st, n in s["statuses"].items()
                 if st is None or st >= 500)
    row = {
        "fault": fault,
        "far": (seen["far"]["admitted"], stored["far"]),
        "strict": (seen["strict"]["admitted"], stored["strict"]),
        "small": small_hist,
        "small_over": max(seen["small"]["per_client"].values(), default=0),
        "hot": (worst, least, len(hot), sum(seen["hot"]["statuses"].values())),
        "hot_worst_at": round(worst_at, 1),
        "hot_worst_by_instance": worst_by_port,
        "hot_worst_diag": worst_diag,
        "hot_by_answer_time": (loose, round(loose_at, 1)),
        "hot_by_10s": tens,
        "5xx": fivexx,
        "ready": ready,
        "uncertain": uncertain,
        "exits": exits,
        "words": last_words,
        "times": times,
        "logs": logs,
    }
    far_a, far_s = row["far"]
    row["ok"] = {
        "far stored within 0.1%": abs(far_a - far_s) <= 0.001 * max(far_a, 1),
        "strict at most 200": row["strict"][0] <= STRICT_MAX,
        "no 6th of 5": row["small_over"] <= SMALL_MAX,
        "hot within 1%": worst <= HOT_MAX * 1.01,
        "hot admitted while down": least is None or least >= HOT_MAX * 0.5,
        "no 5xx": fivexx == 0,
    }
    return row


def main():
    if not os.path.exists(BIN):
        sys.exit(f"{BIN} is missing: build it first (cargo build --release)")
    if any(f != "none" for f in FAULTS) and not (PID_CMD and START_CMD):
        sys.exit("NODE_PID_CMD and NODE_START_CMD are needed for a fault")
    rows = []
    for run, fault in enumerate(FAULTS):
        r = trial(fault, run)
        rows.append(r)
        print(json.dumps({k: v for k, v in r.items()}, default=str), flush=True)
    print()
    head = ("| fault | far admitted / stored | strict admitted / stored | small 4/5/6/7/8 "
            "| hot worst 10 s; least in 12 s while down (admitted of sent) | 5xx | /readyz "
            "| hits in doubt: settled | exits | checks |")
    print(head)
    print("|" + "---|" * 10)
    for r in rows:
        worst, least, adm, sent = r["hot"]
        ready = ", ".join(f"{k} {v}" for k, v in sorted(r["ready"].items()))
        failed = [k for k, ok in r["ok"].items() if not ok]
        print(f"| {r['fault']} | {r['far'][0]:,} / {r['far'][1]:,} | {r['strict'][0]} / "
              f"{r['strict'][1]} | {' / '.join(map(str, r['small']))} | {worst:,}; "
              f"{'-' if least is None else f'{least:,}'} ({adm:,} of {sent:,}) | {r['5xx']} "
              f"| {ready} | {r['uncertain']} | {r['exits']} "
              f"| {'ok' if not failed else 'FAIL: ' + '; '.join(failed)} |")
    for r in rows:
        print(f"{r['fault']}: down/back {r['times']}; last words {r['words']}; logs {r['logs']}")
    return 0 if all(all(r["ok"].values()) for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
