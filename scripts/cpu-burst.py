#!/usr/bin/env python3
"""Burns CPU in a given shape, to see what a background burst does to a server's tail.

    python3 scripts/cpu-burst.py BURST_MS PERIOD_MS [SLICE_MS PAUSE_MS]

Every PERIOD_MS it burns BURST_MS of CPU, in slices of SLICE_MS with a sleep of PAUSE_MS after
each (no pauses when left out). Run it beside the bare server (examples/bench_baseline) under
the half-rate load of scripts/bench-http.sh: 26 ms every 250 ms is about what one sync round
of quotad cost at 10^4 clients before its passes were paced (docs/performance.md, "the shape of
a round"). Stop it with Ctrl-C or kill.
"""
import sys
import time

burst_ms, period_ms = float(sys.argv[1]), float(sys.argv[2])
slice_ms = float(sys.argv[3]) if len(sys.argv) > 3 else burst_ms
pause_ms = float(sys.argv[4]) if len(sys.argv) > 4 else 0.0
clock = time.perf_counter
due = clock()
while True:
    done = 0.0
    while done < burst_ms:
        start = clock()
        end = start + min(slice_ms, burst_ms - done) / 1000
        while clock() < end:
            pass
        done += (clock() - start) * 1000
        if pause_ms and done < burst_ms:
            time.sleep(pause_ms / 1000)
    due += period_ms / 1000
    wait = due - clock()
    if wait > 0:
        time.sleep(wait)
