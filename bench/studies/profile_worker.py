"""Python cost of one import on the worker side, without dramatiq's threads: the worker
process's own broker, middleware and actor (``build_worker``) driven in ONE thread over N
pre-enqueued 3-row imports, as dramatiq's worker thread drives them (fetch, before/after
middleware hooks, the actor, the ack), optionally under cProfile.

    .venv/bin/python -m bench.studies.profile_worker [--n 4000] [--profile] [--top 30]
        [--one-step-max-bytes B]   (IMPORTER_ONE_STEP_MAX_BYTES for the worker; 0 = separate steps)
        [--commandstats]           (the server's time per command per import, script-internal included)

It starts its own valkey (the bench's) and pre-enqueues through Importer's producer path.
Prints imports/s of the single thread, its CPU per import (process time: the Python work
plus the socket system calls), the server's CPU per import (its main process; AOF
rewrites run in children) and its AOF bytes per import, and with --profile the top functions by own and cumulative
time. Without GIL contention between threads, so the figures are a floor of what a
worker thread costs.
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench.suite.common import QUEUE, cpu_seconds, cpu_seconds_incl_waited, csv_3rows, new_prefix  # noqa: E402
from bench.suite.producer import preenqueue_importer  # noqa: E402
from bench.suite.servers import Bench, Config  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=4000)
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--top", type=int, default=30)
    ap.add_argument("--one-step-max-bytes", type=int, default=None)
    ap.add_argument("--commandstats", action="store_true",
                    help="print the server's time per command per import (INFO commandstats, script-internal commands included)")
    a = ap.parse_args()
    cfg = Config(
        repeat=1, quick=True, drain_ns=[a.n], processes=1, threads=1, prefetch=64,
        http_workers=2, http_threads=4, duration=3, rows=3, accounting_n=0, only=set(),
    )
    b = Bench(cfg, Path(tempfile.mkdtemp(prefix="profile-worker-")))
    b.start_server()
    try:
        env = b.importer_env(new_prefix("profw"))
        if a.one_step_max_bytes is not None:
            env["IMPORTER_ONE_STEP_MAX_BYTES"] = str(a.one_step_max_bytes)
        preenqueue_importer(b.url, env, a.n, "p" + uuid.uuid4().hex[:6], csv_3rows)
        os.environ.update(env)
        from importer.adapters.bootstrap import build_worker
        from importer.adapters.settings import Settings

        broker = build_worker(Settings.from_env())
        broker.emit_after("process_boot")
        consumer = broker.consume(QUEUE, prefetch=64, timeout=100)
        actor = broker.get_actor("import_shipment")
        done = 0
        profiler = cProfile.Profile() if a.profile else None
        b.client.config_resetstat()
        t0, c0 = time.perf_counter(), time.process_time()
        s0, sw0 = cpu_seconds(b.server_pid), cpu_seconds_incl_waited(b.server_pid)
        aof0 = b.client.info("persistence")
        if profiler:
            profiler.enable()
        for message in consumer:
            if message is None:
                continue
            broker.emit_before("process_message", message)
            try:
                result = actor(*message.args, **message.kwargs)
                broker.emit_after("process_message", message, result=result)
            except Exception as exc:  # as dramatiq's worker thread: the middleware records it
                broker.emit_after("process_message", message, exception=exc)
            if message.failed:
                consumer.nack(message)
            else:
                consumer.ack(message)
            done += 1
            if done >= a.n:
                break
        if profiler:
            profiler.disable()
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        server = cpu_seconds(b.server_pid) - s0
        server_children = cpu_seconds_incl_waited(b.server_pid) - sw0 - server
        aof1 = b.client.info("persistence")
        if aof1.get("aof_rewrites") == aof0.get("aof_rewrites") and "aof_current_size" in aof1:
            print(f"AOF: {(aof1['aof_current_size'] - aof0['aof_current_size']) / a.n:,.0f} bytes/import")
        print(f"{a.n / wall:,.0f} imports/s in one thread, CPU {cpu * 1000 / a.n:.3f} ms/import "
              f"(wall {wall * 1000 / a.n:.3f} ms/import){' under cProfile' if profiler else ''}; "
              f"Redis server CPU {server * 1e6 / a.n:.0f} µs/import "
              f"(+{server_children * 1e6 / a.n:.0f} µs in its finished children: AOF rewrites)")
        if a.commandstats:
            stats = sorted(b.client.info("commandstats").items(), key=lambda kv: -kv[1]["usec"])
            print(f"{'command':<28} {'calls/import':>12} {'µs/call':>8} {'µs/import':>10}")
            for name, st in stats:
                print(f"{name.removeprefix('cmdstat_'):<28} {st['calls'] / a.n:>12.2f} {st['usec_per_call']:>8.2f} {st['usec'] / a.n:>10.1f}")
            print(f"{'all':<28} {sum(st['calls'] for _, st in stats) / a.n:>12.2f} {'':>8} {sum(st['usec'] for _, st in stats) / a.n:>10.1f}")
        if profiler:
            stats = pstats.Stats(profiler)
            stats.sort_stats("tottime").print_stats(a.top)
            stats.sort_stats("cumulative").print_stats(a.top)
        consumer.close()
    finally:
        b.stop_server()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
