#!/usr/bin/env python3
"""HTTP/1.1 pipelining against a running quotad (docs/operations.md, "What an unauthenticated
caller can cost"): CONNS connections each send N `GET /v1/openapi.json` without reading an
answer, for SECONDS; prints how many requests the server took, its RSS before and after, and
how long `/healthz` takes then.

    python3 scripts/pipeline-probe.py HTTP_PORT QUOTAD_PID CONNS N SECONDS
"""
import socket, sys, time, os
port=int(sys.argv[1]); pid=int(sys.argv[2]); conns=int(sys.argv[3]); n=int(sys.argv[4])
def rss():
    for l in open(f"/proc/{pid}/status"):
        if l.startswith("VmRSS"): return int(l.split()[1])//1024
print("rss before", rss(), "MiB")
req=b"GET /v1/openapi.json HTTP/1.1\r\nHost: q\r\n\r\n"*n
socks=[]
for i in range(conns):
    s=socket.create_connection(("127.0.0.1",port)); s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096); s.setblocking(False)
    socks.append([s, memoryview(req)])
t=time.time(); 
while time.time()-t<float(sys.argv[5]):
    for e in socks:
        if len(e[1]):
            try: k=e[0].send(e[1]); e[1]=e[1][k:]
            except BlockingIOError: pass
    time.sleep(0.01)
sent=sum(len(req)-len(e[1]) for e in socks)//len(b"GET /v1/openapi.json HTTP/1.1\r\nHost: q\r\n\r\n")
print("requests the server took:", sent, "of", conns*n, "rss now", rss(), "MiB")
t0=time.time(); import urllib.request
urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz").read(); print("healthz %.0f ms"%((time.time()-t0)*1000))
