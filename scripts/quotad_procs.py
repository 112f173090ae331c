"""Real quotad processes on one Cassandra/ScyllaDB keyspace, for the hand-run fleet checks
(scripts/small-limits-check.py, scripts/holds-fleet-check.py): the environment they share, start,
one request, and waiting until an instance is ready. Talks only to 127.0.0.1."""

import http.client
import json
import os
import signal
import subprocess
import sys
import time


class Procs:
    """Instances of `bin_path` with default settings but the store (scylla on `nodes`,
    `keyspace`) and the admin token; their logs go to `logs`."""

    def __init__(self, bin_path, nodes, keyspace, token, logs, cpus=""):
        self.bin, self.nodes, self.keyspace, self.token, self.logs = (
            bin_path, nodes, keyspace, token, logs)
        # A `taskset -c` list the instances are pinned to; empty: not pinned.
        self.cpus = cpus

    def env(self):
        e = dict(os.environ)
        e.update({
            "QUOTAD__STORE__KIND": "scylla",
            "QUOTAD__STORE__NODES": self.nodes,
            "QUOTAD__STORE__KEYSPACE": self.keyspace,
            "QUOTAD__AUTH__ADMIN_TOKEN": self.token,
        })
        return e

    def migrate(self, *args):
        """`quotad migrate` with `args` (e.g. `--datacenters`, `dc1:3`); exits on failure."""
        out = subprocess.run([self.bin, "migrate", *args], env=self.env(), capture_output=True,
                             text=True)
        if out.returncode != 0:
            sys.exit(f"quotad migrate failed:\n{out.stdout}\n{out.stderr}")

    def start(self, port):
        e = self.env()
        e["QUOTAD__SERVER__BIND"] = f"127.0.0.1:{port}"
        log = open(os.path.join(self.logs, f"quotad-{port}.log"), "w")
        pin = ["taskset", "-c", self.cpus] if self.cpus else []
        p = subprocess.Popen([*pin, self.bin, "serve"], env=e, stdout=log,
                             stderr=subprocess.STDOUT)
        p.port = port
        return p

    def request(self, port, method, path, body=None, timeout=10):
        """One request on a fresh connection: (status, lower-cased headers, JSON body, or the
        text of a body that is not JSON)."""
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
        headers = {"Authorization": f"Bearer {self.token}",
                   "Content-Type": "application/json"}
        try:
            c.request(method, path, body=json.dumps(body) if body is not None else None,
                      headers=headers)
            r = c.getresponse()
            data = r.read()
            headers = {k.lower(): v for k, v in r.getheaders()}
            try:
                return r.status, headers, (json.loads(data) if data else None)
            except ValueError:
                return r.status, headers, data.decode()
        finally:
            c.close()

    def wait_ready(self, p, deadline=60):
        """Waits until instance `p` answers /readyz with 200; its answer."""
        end = time.monotonic() + deadline
        while time.monotonic() < end:
            if p.poll() is not None:
                sys.exit(f"instance on {p.port} exited with {p.returncode}; see {self.logs}")
            try:
                status, _, body = self.request(p.port, "GET", "/readyz", timeout=1)
                if status == 200:
                    return body
            except OSError:
                pass
            time.sleep(0.05)
        sys.exit(f"instance on {p.port} not ready in {deadline}s; see {self.logs}")


def stop(fleet):
    """SIGTERM to every instance still running, then waits for each (SIGKILL after 60 s)."""
    for p in fleet:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    for p in fleet:
        try:
            p.wait(timeout=60)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def worst_span(times, span):
    """The most of the sorted `times` (seconds) in any span of `span` seconds."""
    worst, lo = 0, 0
    for hi in range(len(times)):
        while times[hi] - times[lo] >= span:
            lo += 1
        worst = max(worst, hi - lo + 1)
    return worst
