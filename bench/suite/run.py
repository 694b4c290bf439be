#!/usr/bin/env python3
"""Importer benchmark: ``make bench`` = ``.venv/bin/python -m bench.suite`` (also ``bench/suite/run.py``).

One command, from a clean clone: starts its own Redis-compatible server (valkey,
``importer.adapters.redis.embedded.EmbeddedRedis``, in a temp dir, on a free port of
127.0.0.1; never the machine's 6379), installs the BullMQ peer with ``npm ci`` when Node.js
is there, runs each scenario several times (Importer, the peer and a baseline one after
the other), prints ONE table (median and min-max of each figure, the peer's and the
baseline's beside it, and the ratios) and writes it, with the machine's description and
the targets, to bench/RESULTS.md.

Scenarios (see bench/RESULTS.md, "Method", for the exact rules); one module each, in bench/suite/:

1. drain         drain.py          N pre-enqueued 3-row imports: Importer's worker, the peer's
                                   worker, a no-op dramatiq actor.
1b. bulk         drain.py          the same N, each system's bulk path pre-enqueuing (Importer's
                                   bulk intake: group messages; the peer's addBulk).
   accounting    accounting.py     Redis commands per import on Importer's worker side (MONITOR).
2. http          http_load.py      wrk POSTing unique batches: ``importer serve``, the peer's
                                   server, a bare WSGI app with and without the one EVALSHA.
2b. bulkhttp     http_load.py      wrk POSTing 100 shipments per request: Importer's bulk intake,
                                   the peer's route calling addBulk.
3. large         large_batch.py    one 100,000-row import through each system: upload,
                                   active->completed, Redis blocked (SLOWLOG), peak RSS.
4. size          message_size.py   queue message bytes for a 3-row and a 100,000-row import.

Helpers: servers.py (configuration, own valkey, starting servers), producer.py (Importer's
producer path), peers/bullmq_runner.py (the peer), report.py (table, RESULTS.md), procs.py,
common.py. The bench never installs system packages: when wrk or Node.js is missing it says
so in one line and runs the rest.

Usage: python -m bench.suite [--quick] [--repeat R] [--no-peer] [--processes P --threads T --prefetch F]
                          [--http-workers W --http-threads T] [--duration D] [--only drain,http,...]
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: bench/suite/run.py
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from importer.adapters.processes.granian import DEFAULT_THREADS, default_workers  # noqa: E402
from importer.domain.shipment import DEFAULT_MAX_ROWS  # noqa: E402

from bench.suite.accounting import accounting_markdown, scenario_accounting  # noqa: E402
from bench.suite.cluster import scenario_cluster  # noqa: E402
from bench.suite.common import QUICK_RESULTS, RESULTS, ROOT, code_fingerprint, loadavg, log  # noqa: E402
from bench.suite.drain import scenario_bulk_drain, scenario_drain  # noqa: E402
from bench.suite.http_load import scenario_bulk_http, scenario_http  # noqa: E402
from bench.suite.large_batch import scenario_large  # noqa: E402
from bench.suite.ledger import scenario_ledger  # noqa: E402
from bench.suite.message_size import scenario_size  # noqa: E402
from bench.suite.peers.bullmq_runner import BullmqPeer  # noqa: E402
from bench.suite.report import write_results  # noqa: E402
from bench.suite.servers import Bench, Config  # noqa: E402

SCENARIOS = ("size", "drain", "bulk", "accounting", "http", "bulkhttp", "large", "cluster", "ledger")


def parse_args(argv: list[str]) -> Config:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true",
                   help="a check that the bench runs (~1-2 min): 1 repetition, drain N=2,000, 3 s of wrk, 20,000 rows")
    p.add_argument("--repeat", type=int, default=None, help="repetitions of each scenario (default 3, --quick 1)")
    p.add_argument("--no-peer", action="store_true", help="leave the BullMQ peer out")
    # Defaults = the product's defaults (importer worker / importer serve), chosen from this bench.
    p.add_argument("--processes", type=int, default=os.cpu_count() or 1, help="worker processes (importer worker / dramatiq -p)")
    p.add_argument("--threads", type=int, default=2, help="worker threads (importer worker / dramatiq -t; importer worker's default)")
    p.add_argument("--prefetch", type=int, default=64, help="messages prefetched per worker process (0: dramatiq's 2 x threads)")
    p.add_argument("--peer-concurrency", type=int, default=16, help="the peer's Worker concurrency (the seed's 16)")
    p.add_argument("--http-server", choices=("granian", "gunicorn"), default=None,
                   help="server of importer serve and the bare app (default: IMPORTER_HTTP_SERVER, else granian, as importer serve)")
    p.add_argument("--http-workers", type=int, default=default_workers(), help="HTTP worker processes (importer serve and the bare app; default: importer serve's, cores + 1)")
    p.add_argument("--http-threads", type=int, default=DEFAULT_THREADS, help="threads per HTTP worker process (default: importer serve's)")
    p.add_argument("--duration", type=int, default=None, help="seconds of wrk per run (default 10, --quick 3)")
    p.add_argument("--drain-n", type=str, default=None, help="comma-separated N for the drain (default 20000; --quick 2000)")
    p.add_argument("--rows", type=int, default=None, help="rows of the large batch (default 100,000; --quick 20,000)")
    p.add_argument("--only", type=str, default=",".join(SCENARIOS), help="scenarios to run (comma-separated)")
    a = p.parse_args(argv)
    repeat = a.repeat if a.repeat is not None else (1 if a.quick else 3)
    if repeat < 1:
        p.error("--repeat must be >= 1")
    drain = [int(x) for x in a.drain_n.split(",")] if a.drain_n else ([2000] if a.quick else [20000])
    rows = a.rows if a.rows is not None else (20000 if a.quick else DEFAULT_MAX_ROWS)
    return Config(
        repeat=repeat, quick=a.quick, drain_ns=drain, processes=a.processes, threads=a.threads, prefetch=a.prefetch,
        http_workers=a.http_workers, http_threads=a.http_threads,
        duration=a.duration if a.duration is not None else (3 if a.quick else 10), rows=rows,
        accounting_n=300 if a.quick else 1000, only={s.strip() for s in a.only.split(",") if s.strip()},
        peer=not a.no_peer, peer_concurrency=a.peer_concurrency,
        http_server=a.http_server or os.environ.get("IMPORTER_HTTP_SERVER") or "granian",
    )


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    cfg = parse_args(argv)
    started = time.monotonic()

    def on_term(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, on_term)
    tmp = Path(tempfile.mkdtemp(prefix="importer-bench-"))
    b = Bench(cfg, tmp)
    b.load_start = loadavg()
    b.code_start = code_fingerprint()
    finished = False
    failed = False
    try:
        if cfg.peer and not cfg.only <= {"cluster", "ledger"}:  # those scenarios have no peer
            b.peer, b.peer_note = BullmqPeer.prepare(b)
            if b.peer is None:
                log(b.peer_note)
                b.results.notes.append(b.peer_note)
        else:
            b.peer_note = "left out (--no-peer)" if not cfg.peer else "not needed (--only cluster)"
        b.start_server()
        runs = {"size": scenario_size, "drain": scenario_drain, "bulk": scenario_bulk_drain, "accounting": scenario_accounting,
                "http": scenario_http, "bulkhttp": scenario_bulk_http, "large": scenario_large, "cluster": scenario_cluster, "ledger": scenario_ledger}
        for name in SCENARIOS:
            if name not in cfg.only:
                continue
            try:
                runs[name](b)
            except Exception as exc:  # one scenario failing never hides the others' results
                log(f"scenario {name} failed: {exc!r}")
                b.results.notes.append(f"scenario {name} failed: {exc!r}")
                traceback.print_exc()
                failed = True
        finished = True
    except KeyboardInterrupt:
        log("interrupted: stopping everything")
    finally:
        b.procs.stop_all()
        b.stop_server()
        wall = time.monotonic() - started
        if b.code_start != code_fingerprint():
            b.results.notes.append("the product's sources changed during this run: the figures mix two versions of the code")
        out = QUICK_RESULTS if cfg.quick else RESULTS
        write_results(b, wall, argv, finished, accounting_markdown(b), out)
        print()
        print(b.results.table(markdown=False))
        for note in b.results.notes:
            print(f"note: {note}")
        summary = b.results.summary()
        if summary:
            print("\nImporter against the BullMQ peer (medians):")
            for measure, imp, peer, ratio in summary:
                print(f"  {measure}: Importer {imp}, peer {peer}, Importer ÷ peer {ratio}")
        keep = not (finished and not failed)
        if not keep:
            shutil.rmtree(tmp, ignore_errors=True)
        print(f"\nwall time {wall:.0f} s ({wall / 60:.1f} min); written to {out.relative_to(ROOT)}"
              + (f"; logs kept in {tmp}" if keep else ""))
    return 0 if finished and not failed else 1


if __name__ == "__main__":
    sys.exit(main())
