#!/usr/bin/env python3
# usage: wrong-token-load.py PORT TOKENS_FILE CONNECTIONS RATE_PER_CONNECTION SECONDS
# (docs/operations.md, "What an unauthenticated caller can cost": the wrong-token rows).
"""Wrong-token load: N keep-alive connections to quotad re-sending a few given bearer tokens
to POST /v1/check, each at most RATE requests a second (0: as fast as answers come), for
SECONDS. Loopback only. Prints requests sent and statuses seen."""
import asyncio, sys, time, collections

HOST, PORT = "127.0.0.1", int(sys.argv[1])
TOKENS = open(sys.argv[2]).read().split()
CONNS, RATE, SECONDS = int(sys.argv[3]), float(sys.argv[4]), float(sys.argv[5])
assert HOST.startswith("127.")
BODY = b'{"tenant":"acme","client":"attacker"}'
seen = collections.Counter()

def request(tok):
    return (b"POST /v1/check HTTP/1.1\r\nHost: q\r\nContent-Type: application/json\r\n"
            b"Authorization: Bearer " + tok.encode() + b"\r\nContent-Length: "
            + str(len(BODY)).encode() + b"\r\n\r\n" + BODY)

async def conn(i, end):
    r, w = await asyncio.open_connection(HOST, PORT)
    n = 0
    while time.monotonic() < end and n < 10_000_000:
        t0 = time.monotonic()
        try:
            w.write(request(TOKENS[(i + n) % len(TOKENS)]))
            await w.drain()
            head = await r.readuntil(b"\r\n\r\n")
        except (asyncio.IncompleteReadError, ConnectionError):
            # The server closed the connection: open another, as an attacker would.
            seen["reconnect"] += 1
            r, w = await asyncio.open_connection(HOST, PORT)
            continue
        status = int(head.split(b" ", 2)[1])
        length = 0
        for line in head.split(b"\r\n"):
            if line.lower().startswith(b"content-length:"):
                length = int(line.split(b":")[1])
        await r.readexactly(length)
        seen[status] += 1
        n += 1
        if RATE > 0:
            await asyncio.sleep(max(0.0, 1.0 / RATE - (time.monotonic() - t0)))
    w.close()

async def main():
    end = time.monotonic() + SECONDS
    await asyncio.gather(*(conn(i, end) for i in range(CONNS)))
    print(f"attacker: {sum(seen.values())} requests in {SECONDS:.0f} s: {dict(seen)}")

asyncio.run(main())
