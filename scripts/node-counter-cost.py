#!/usr/bin/env python3
"""What a Cassandra/ScyllaDB node spends on counter updates: its CPU seconds per partition and
per cell, read from the node's own /proc entry around each case. Run by hand beside a node on
this machine (never in CI), with the Python driver (bench-cassandra.sh keeps one in
target/bench-venv):

    target/bench-venv/bin/python scripts/node-counter-cost.py <node pid>
    PARTITIONS=50000 target/bench-venv/bin/python scripts/node-counter-cost.py <node pid>

A table shaped as quotad's `client_counters` (one partition per client, a row per bucket) in a
keyspace of its own, dropped at the end. Each case sends COUNTER batches of several
partitions, as a sync round does, eight at a time, over PARTITIONS partitions that already
exist (a client seen before): one new cell per partition (a bucket opened), the same cell
again, four and sixteen new cells per partition. Printed per case: partitions and cells per
second of the node's CPU. Talks only to the node at NODE (127.0.0.1:9042).
"""

import os
import sys
import time

from cassandra.cluster import Cluster
from cassandra.concurrent import execute_concurrent
from cassandra.query import BatchStatement, BatchType

PID = int(sys.argv[1]) if len(sys.argv) > 1 else sys.exit("usage: node-counter-cost.py <node pid>")
HOST, PORT = os.environ.get("NODE", "127.0.0.1:9042").rsplit(":", 1)
PARTITIONS = int(os.environ.get("PARTITIONS", "20000"))
KEYSPACE = f"quotad_cost_{os.getpid()}"
TICK = os.sysconf("SC_CLK_TCK")


def node_cpu():
    """The node's user and system CPU seconds so far."""
    fields = open(f"/proc/{PID}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def main():
    cluster = Cluster([HOST], port=int(PORT))
    s = cluster.connect()
    s.execute(f"CREATE KEYSPACE {KEYSPACE} WITH replication = "
              "{'class': 'SimpleStrategy', 'replication_factor': 1}")
    try:
        s.execute(f"CREATE TABLE {KEYSPACE}.c (tenant text, subject text, bucket_start bigint, "
                  "limit_id text, grain bigint, shard smallint, hits counter, "
                  "PRIMARY KEY ((tenant, subject), bucket_start, limit_id, grain, shard))")
        up = s.prepare(f"UPDATE {KEYSPACE}.c SET hits = hits + ? WHERE tenant = ? AND "
                       "subject = ? AND bucket_start = ? AND limit_id = ? AND grain = ? AND shard = ?")

        def case(label, per_batch, cells, start):
            batches = []
            for first in range(0, PARTITIONS, per_batch):
                b = BatchStatement(batch_type=BatchType.COUNTER)
                for p in range(first, min(PARTITIONS, first + per_batch)):
                    for k in range(cells):
                        b.add(up, (1, "cost", f"c{p}", start + k, "l", 5000, 0))
                batches.append((b, ()))
            cpu0, t0 = node_cpu(), time.time()
            execute_concurrent(s, batches, concurrency=8, raise_on_first_error=True)
            cpu, wall = node_cpu() - cpu0, time.time() - t0
            n = PARTITIONS * cells
            print(f"{label:<28} {PARTITIONS:>7} partitions {n:>8} cells  {wall:5.1f} s  "
                  f"node CPU {cpu:5.1f} s: {PARTITIONS / cpu:>6.0f} partitions/s, "
                  f"{n / cpu:>6.0f} cells/s, {cpu / PARTITIONS * 1e3:.3f} ms a partition",
                  flush=True)

        case("first write (made)", 64, 1, 0)
        case("a new cell", 64, 1, 1000)
        case("the same cell again", 64, 1, 1000)
        case("4 new cells", 64, 4, 2000)
        case("16 new cells", 16, 16, 3000)
    finally:
        s.execute(f"DROP KEYSPACE IF EXISTS {KEYSPACE}")
        cluster.shutdown()


if __name__ == "__main__":
    main()
