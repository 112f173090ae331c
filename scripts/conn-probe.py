#!/usr/bin/env python3
"""Connections that never finish, against a running quotad (docs/operations.md, "What an
unauthenticated caller can cost"): a chunked body that never ends on a route that reads it and
on one that does not, and gRPC connections that send nothing, half a preface, or a preface and
no stream. Prints, for each, what came back and when the server closed the connection.

    python3 scripts/conn-probe.py HTTP_PORT GRPC_PORT [WAIT_SECONDS]
"""
import socket
import sys
import threading
import time

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
EMPTY_SETTINGS = b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"


def until_closed(port, send, wait):
    s = socket.create_connection(("127.0.0.1", port))
    s.sendall(send)
    s.settimeout(wait)
    started, data = time.time(), b""
    try:
        while True:
            d = s.recv(65536)
            if not d:
                return "closed after %.1f s" % (time.time() - started), data
            data += d
    except socket.timeout:
        return "still open after %d s" % wait, data
    finally:
        s.close()


def main():
    port, gport = int(sys.argv[1]), int(sys.argv[2])
    wait = int(sys.argv[3]) if len(sys.argv) > 3 else 20
    probes = []
    for line in ["POST /v1/check HTTP/1.1", "GET /healthz HTTP/1.1"]:
        head = (line + "\r\nHost: q\r\nContent-Type: application/json\r\n"
                "Transfer-Encoding: chunked\r\n\r\na\r\n{\"tenant\":\r\n")
        probes.append(("chunked " + line, port, head.encode()))
    for name, send in [("nothing", b""), ("half a preface", PREFACE[:10]),
                       ("preface, no stream", PREFACE + EMPTY_SETTINGS)]:
        probes.append(("grpc " + name, gport, send))
    results = {}

    def probe(name, p, send):
        results[name] = until_closed(p, send, wait)

    threads = [threading.Thread(target=probe, args=pr) for pr in probes]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for name, _, _ in probes:
        what, data = results[name]
        first = data.split(b"\r\n")[0].decode(errors="replace") if name.startswith("chunked") else ""
        print("%-36s %s %s" % (name, what, first))


if __name__ == "__main__":
    main()
