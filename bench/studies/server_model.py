"""Does one event loop per process lower the POST's tail, for the same Redis work?

    .venv/bin/python -m bench.studies.server_model [--repeat 3] [--seconds 10] [--workers 3] [--threads 4]

A question for the HTTP p99 target (docs/performance.md): the same minimal POST
(``bench/suite/model_apps.py``: read the body, one EVALSHA of a five-command script shaped
like enqueue.lua's writes, answer 202) under granian, on the bench's own valkey,
with wrk -t2 -c32 POSTing as in the HTTP scenario, alternately:

* ``wsgi``: the threaded model of ``importer serve`` (``--workers`` processes of
  ``--threads`` blocking threads, redis-py's blocking client);
* ``wsgi-grouped``: the threaded model with group commit: the calls of a
  process's threads that meet share one round trip (``model_apps.GroupCommit``);
* ``rsgi``: one asyncio event loop per process (granian's RSGI interface,
  redis-py's asyncio client), the same processes.

Prints req/s, p50 and p99 of each run, then the medians and each ÷ wsgi;
``--models`` picks some (default: all three), ``--single`` adds a one-client
run (wrk -t1 -c1) of each, whose p50 is the latency a lone POST sees. Not part
of ``make bench`` (whose HTTP scenario runs the ``wsgi`` model beside Importer as
its floor).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.suite.common import log  # noqa: E402
from bench.suite.http_load import find_wrk, run_wrk  # noqa: E402
from bench.suite.servers import Bench, Config  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--seconds", type=int, default=10)
    ap.add_argument("--workers", type=int, default=3)
    ap.add_argument("--threads", type=int, default=4)
    ap.add_argument("--models", default="wsgi,wsgi-grouped,rsgi")
    ap.add_argument("--single", action="store_true", help="also one client at a time (wrk -t1 -c1)")
    a = ap.parse_args()
    models = [m.strip() for m in a.models.split(",") if m.strip()]
    cfg = Config(
        repeat=a.repeat, quick=False, drain_ns=[0], processes=1, threads=1, prefetch=0,
        http_workers=a.workers, http_threads=a.threads, duration=a.seconds, rows=3, accounting_n=0, only=set(),
    )
    b = Bench(cfg, Path(tempfile.mkdtemp(prefix="server-model-")))
    b.wrk = find_wrk(b)
    if not b.wrk:
        log(b.wrk_note)
        return 1
    b.start_server()
    figures: dict[str, list[dict[str, float]]] = {m: [] for m in models}
    single: dict[str, list[dict[str, float]]] = {m: [] for m in models}
    try:
        for rep in range(a.repeat):
            for model in (models if rep % 2 == 0 else list(reversed(models))):
                proc, port = b.start_floor(model)
                try:
                    run_wrk(b, port, 2, f"warm{rep}{model}")
                    fig = run_wrk(b, port, a.seconds, f"r{rep}{model}")
                    if a.single:
                        single[model].append(run_wrk(b, port, a.seconds, f"s{rep}{model}", threads=1, connections=1))
                finally:
                    b.procs.stop(proc)
                b.flush()
                figures[model].append(fig)
                log(f"{model} rep {rep + 1}: {fig['rps']:,.0f} req/s, p50 {fig['p50_ms']:.2f} ms, p99 {fig['p99_ms']:.2f} ms")
    finally:
        b.procs.stop_all()
        b.stop_server()
    others = [m for m in models if m != models[0]]
    print(f"\n| granian, {a.workers} processes ({a.threads} threads each for wsgi), wrk -t2 -c32 {a.seconds} s, "
          f"medians of {a.repeat} | " + " | ".join(models) + " | " + " | ".join(f"{m} ÷ {models[0]}" for m in others) + " |")
    print("| --- " * (1 + len(models) + len(others)) + "|")
    rows = [(figures, key, label) for key, label in (("rps", "req/s"), ("p50_ms", "p50 ms"), ("p99_ms", "p99 ms"))]
    if a.single:
        rows += [(single, "rps", "one client: req/s"), (single, "p50_ms", "one client: p50 ms")]
    for source, key, label in rows:
        med = {m: statistics.median(f[key] for f in source[m]) for m in models}
        print(f"| {label} | " + " | ".join(f"{med[m]:,.2f}" for m in models) + " | "
              + " | ".join(f"{med[m] / med[models[0]]:.2f}×" for m in others) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
