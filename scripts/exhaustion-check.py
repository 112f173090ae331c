#!/usr/bin/env python3
"""What connections that never finish cost a running quotad (docs/operations.md, "What an
unauthenticated caller can cost"), one attack after another, with no token:

- chunked: CHUNKED connections (1,100) each send `POST /v1/check` with a chunked body that
  never ends, a chunk every 0.5 s; each one quotad closes is opened again.
- grpc-idle: IDLE connections (1,100) to the gRPC port, a third sending nothing, a third half
  the HTTP/2 preface, a third the preface and SETTINGS and no stream; reopened when closed.
- grpc-streams: 4 connections each open STREAMS (50,000) gRPC streams, HEADERS and no body.
- pipelining: PIPES connections (50) each send 20,000 `GET /v1/openapi.json` and read no answer.
- tls-silent: with TLS on the HTTP port (a self-signed certificate made with `openssl`), SILENT
  connections (600) that never begin their handshake; reopened when closed. `/healthz` is then
  timed over TLS, handshake included. Runs alone: `python3 scripts/exhaustion-check.py tls-silent`.

Each attack runs SECONDS (20). Meanwhile `/healthz` is timed every 0.25 s on a fresh connection
and quotad's RSS is read. Prints, per attack, the RSS at rest before it, the most above that,
and the slowest and median `/healthz`; exit status 0 when every attack left `/healthz` under
HEALTHZ_MAX_MS (100) and RSS under RSS_MAX_MIB (200) above rest. quotad runs on the embedded
store in a temporary directory, its HTTP port PORT (18490) and gRPC port PORT + 1. Talks only
to 127.0.0.1.

    cargo build --release
    python3 scripts/exhaustion-check.py [chunked grpc-idle grpc-streams pipelining]

Environment: QUOTAD_BIN (target/release/quotad), PORT, SECONDS, CHUNKED, IDLE, STREAMS, PIPES, SILENT,
HEALTHZ_MAX_MS, RSS_MAX_MIB, QUOTAD_CPUS (a `taskset -c` list for quotad; unset: not pinned).
"""

import os
import resource
import selectors
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time

BIN = os.environ.get("QUOTAD_BIN", "target/release/quotad")
PORT = int(os.environ.get("PORT", "18490"))
SECONDS = float(os.environ.get("SECONDS", "20"))
CHUNKED = int(os.environ.get("CHUNKED", "1100"))
IDLE = int(os.environ.get("IDLE", "1100"))
STREAMS = int(os.environ.get("STREAMS", "50000"))
PIPES = int(os.environ.get("PIPES", "50"))
SILENT = int(os.environ.get("SILENT", "600"))
HEALTHZ_MAX_MS = float(os.environ.get("HEALTHZ_MAX_MS", "100"))
RSS_MAX_MIB = float(os.environ.get("RSS_MAX_MIB", "200"))
CPUS = os.environ.get("QUOTAD_CPUS", "")
TOKEN = "8c2f4e6a0b1d3f5a7c9e0d1c2b3a4f5e"

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
EMPTY_SETTINGS = b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"
# Set when quotad serves TLS (the tls-silent attack): `/healthz` is then asked over TLS.
TLS = None
GRPC_PATH = b"/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"


def rss_mib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS"):
                return int(line.split()[1]) / 1024
    return 0.0


def healthz_ms():
    """One `GET /healthz` on a fresh connection: milliseconds, or None past 5 s or refused."""
    started = time.monotonic()
    try:
        with socket.create_connection(("127.0.0.1", PORT), timeout=5) as raw:
            s = TLS.wrap_socket(raw) if TLS else raw
            s.sendall(b"GET /healthz HTTP/1.1\r\nHost: q\r\nConnection: close\r\n\r\n")
            if not s.recv(64).startswith(b"HTTP/1.1 200"):
                return None
    except OSError:
        return None
    return (time.monotonic() - started) * 1000


def connect(port, rcvbuf=None):
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    if rcvbuf:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    s.settimeout(5)
    s.connect(("127.0.0.1", port))
    s.setblocking(False)
    return s


class Held:
    """COUNT connections to `port`, each opened with `first(i)` sent and, every `every` seconds,
    `again` sent; those quotad closes are opened again until `stop` is set."""

    def __init__(self, port, count, first, again=b"", every=0.5):
        self.port, self.count, self.first, self.again, self.every = (
            port, count, first, again, every)
        self.sel = selectors.DefaultSelector()
        self.reopened = 0

    def open(self, i):
        try:
            s = connect(self.port)
            s.send(self.first(i))
        except OSError:
            return
        self.sel.register(s, selectors.EVENT_READ, i)

    def run(self, stop):
        for i in range(self.count):
            self.open(i)
        last = time.monotonic()
        while not stop.is_set():
            for key, _ in self.sel.select(timeout=0.1):
                try:
                    data = key.fileobj.recv(65536)
                except (BlockingIOError, InterruptedError):
                    continue
                except OSError:
                    data = b""
                if not data:
                    self.sel.unregister(key.fileobj)
                    key.fileobj.close()
                    self.reopened += 1
                    self.open(key.data)
            if self.again and time.monotonic() - last >= self.every:
                last = time.monotonic()
                for key in list(self.sel.get_map().values()):
                    try:
                        key.fileobj.send(self.again)
                    except OSError:
                        pass
        for key in list(self.sel.get_map().values()):
            key.fileobj.close()

    def summary(self):
        return f"{self.count} held, {self.reopened} closed by quotad and opened again"


def chunked_attack():
    head = (b"POST /v1/check HTTP/1.1\r\nHost: q\r\nContent-Type: application/json\r\n"
            b"Transfer-Encoding: chunked\r\n\r\na\r\n{\"tenant\":\r\n")
    return Held(PORT, CHUNKED, lambda i: head, again=b"1\r\n \r\n")


def grpc_idle_attack():
    kinds = [b"", PREFACE[:10], PREFACE + EMPTY_SETTINGS]
    return Held(PORT + 1, IDLE, lambda i: kinds[i % 3])


def headers_frame(stream_id):
    block = (b"\x83\x86" + b"\x04" + bytes([len(GRPC_PATH)]) + GRPC_PATH + b"\x01\x01q"
             + b"\x0f\x10\x10application/grpc" + b"\x00\x02te\x08trailers")
    return (len(block).to_bytes(3, "big") + b"\x01\x04"
            + stream_id.to_bytes(4, "big") + block)


class Streams:
    """4 connections each opening STREAMS streams; what quotad sends back is read and dropped,
    so that the attacker's side never blocks."""

    def __init__(self):
        self.sent = 0
        self.gone = 0

    def run(self, stop):
        def one():
            try:
                s = socket.create_connection(("127.0.0.1", PORT + 1), timeout=5)
            except OSError:
                return
            s.settimeout(0.2)

            def drain():
                while not stop.is_set():
                    try:
                        if not s.recv(65536):
                            return
                    except socket.timeout:
                        continue
                    except OSError:
                        return
            t = threading.Thread(target=drain, daemon=True)
            t.start()
            try:
                s.sendall(PREFACE + EMPTY_SETTINGS)
                batch = []
                for n in range(STREAMS):
                    batch.append(headers_frame(2 * n + 1))
                    if len(batch) == 500:
                        s.sendall(b"".join(batch))
                        self.sent += len(batch)
                        batch = []
                s.sendall(b"".join(batch))
                self.sent += len(batch)
            except OSError:
                self.gone += 1
            stop.wait()
            s.close()
        threads = [threading.Thread(target=one, daemon=True) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    def summary(self):
        return f"{self.sent} streams sent on 4 connections, {self.gone} connections cut"


class Pipes:
    """PIPES connections each sending 20,000 pipelined `GET /v1/openapi.json`, reading nothing."""

    def __init__(self):
        self.taken = 0

    def run(self, stop):
        one = b"GET /v1/openapi.json HTTP/1.1\r\nHost: q\r\n\r\n"
        socks = []
        for _ in range(PIPES):
            try:
                socks.append([connect(PORT, rcvbuf=4096), memoryview(one * 20000)])
            except OSError:
                pass
        while not stop.is_set():
            for e in socks:
                if len(e[1]):
                    try:
                        e[1] = e[1][e[0].send(e[1]):]
                    except (BlockingIOError, OSError):
                        pass
            stop.wait(0.01)
        self.taken = sum(20000 - len(e[1]) // len(one) for e in socks)
        for e in socks:
            e[0].close()

    def summary(self):
        return f"{self.taken} of {PIPES * 20000} requests taken by the socket"


def tls_silent_attack():
    return Held(PORT, SILENT, lambda i: b"")


ATTACKS = {"tls-silent": tls_silent_attack, "chunked": chunked_attack, "grpc-idle": grpc_idle_attack,
           "grpc-streams": Streams, "pipelining": Pipes}


def trial(pid, name):
    time.sleep(3)
    rest = rss_mib(pid)
    attack = ATTACKS[name]()
    stop = threading.Event()
    runner = threading.Thread(target=attack.run, args=(stop,), daemon=True)
    runner.start()
    times, most, failed = [], rest, 0
    end = time.monotonic() + SECONDS
    time.sleep(1)
    while time.monotonic() < end:
        ms = healthz_ms()
        if ms is None:
            failed += 1
        else:
            times.append(ms)
        most = max(most, rss_mib(pid))
        time.sleep(0.25)
    stop.set()
    runner.join(timeout=30)
    times.sort()
    worst = times[-1] if times else float("inf")
    median = times[len(times) // 2] if times else float("inf")
    ok = failed == 0 and worst < HEALTHZ_MAX_MS and most - rest < RSS_MAX_MIB
    print(f"{name:13} rest {rest:6.0f} MiB  most +{most - rest:5.0f} MiB  /healthz worst "
          f"{worst:6.1f} ms median {median:5.1f} ms over {len(times)} ({failed} failed)  "
          f"{attack.summary()}  {'ok' if ok else 'FAILED'}")
    return ok


def main():
    global TLS
    names = sys.argv[1:] or [n for n in ATTACKS if n != "tls-silent"]
    if "tls-silent" in names and len(names) > 1:
        sys.exit("tls-silent runs alone")
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    data = tempfile.mkdtemp(prefix="quotad-exhaustion-")
    env = dict(os.environ)
    env.update({"QUOTAD__STORE__PATH": os.path.join(data, "store"),
                "QUOTAD__SERVER__BIND": f"127.0.0.1:{PORT}",
                "QUOTAD__SERVER__GRPC_BIND": f"127.0.0.1:{PORT + 1}",
                "QUOTAD__AUTH__ADMIN_TOKEN": TOKEN})
    if names == ["tls-silent"]:
        cert, key = os.path.join(data, "tls.crt"), os.path.join(data, "tls.key")
        subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt",
                        "ec_paramgen_curve:P-256", "-nodes", "-days", "1", "-subj", "/CN=q",
                        "-keyout", key, "-out", cert], check=True, capture_output=True)
        env.update({"QUOTAD__SERVER__TLS__CERT_FILE": cert,
                    "QUOTAD__SERVER__TLS__KEY_FILE": key})
        TLS = ssl.create_default_context()
        TLS.check_hostname = False
        TLS.verify_mode = ssl.CERT_NONE
    pin = ["taskset", "-c", CPUS] if CPUS else []
    log = open(os.path.join(data, "quotad.log"), "w")
    proc = subprocess.Popen([*pin, BIN, "serve"], env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.time() + 30
        while healthz_ms() is None:
            if time.time() > deadline or proc.poll() is not None:
                sys.exit(f"quotad did not start; see {log.name}")
            time.sleep(0.1)
        ok = all([trial(proc.pid, n) for n in names])
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        print(f"quotad's log: {log.name}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
