"""Does a worker setting make the drain faster? Drains of N pre-enqueued 3-row
imports through a real ``importer worker`` (the bench's defaults: 2 processes,
2 threads, prefetch 64), one variant after the other in alternating rounds on
one valkey, each variant with its own ``IMPORTER_*`` settings; imports/s
(first fetch -> all completed, as the bench's drain times it) and the worker
processes' CPU per import, medians of the rounds.

    .venv/bin/python -m bench.studies.drain_settings [--n 20000] [--rounds 3] \\
        default IMPORTER_LOG_LEVEL=debug "together-32:IMPORTER_APPLY_TOGETHER_MAX=32 IMPORTER_LOG_LEVEL=info"

Each variant is ``[name:]NAME=VALUE ...`` (``default``: none). ``make bench``
strips ``IMPORTER_*`` from its environment; this is where settings are
compared. Only alternating rounds are worth comparing: this kind of machine's
speed drifts by a third within an hour.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.suite.common import QUEUE, children, cpu_seconds, csv_3rows, new_prefix  # noqa: E402
from bench.suite.producer import preenqueue_importer  # noqa: E402
from bench.suite.servers import Bench, Config  # noqa: E402
from importer.adapters.redis.keys import Keys  # noqa: E402


def variant(text: str) -> tuple[str, dict[str, str]]:
    """``[name:]NAME=VALUE ...`` -> (name, settings)."""
    name, _, spec = text.partition(":") if ":" in text.split("=", 1)[0] else ("", "", text)
    settings = dict(item.split("=", 1) for item in spec.split() if item != "default")
    if any(not key.startswith("IMPORTER_") for key in settings):
        raise SystemExit(f"{text!r}: each setting is IMPORTER_NAME=VALUE")
    return name or spec, settings


def one_drain(b: Bench, n: int, settings: dict[str, str], log: Path) -> tuple[float, float]:
    """(imports/s, worker CPU ms per import) of one drain of n imports."""
    assert b.client is not None
    b.flush()
    prefix = new_prefix("ds")
    env = {**b.importer_env(prefix), **settings}
    preenqueue_importer(b.url, env, n, "d" + uuid.uuid4().hex[:6], csv_3rows)
    keys = Keys(prefix)
    queue = f"{keys.dramatiq}:{QUEUE}"
    with open(log, "w") as out:
        proc = subprocess.Popen(b.importer_argv("worker", *b.worker_args()), env=env, stdout=out, stderr=out)
    try:
        while b.client.llen(queue) >= n:
            if proc.poll() is not None:
                raise SystemExit(f"the worker exited with {proc.returncode}: see {log}")
            time.sleep(0.002)
        start, kids = time.monotonic(), children(proc.pid)
        cpu = sum(cpu_seconds(k) for k in kids)
        while b.client.zcard(keys.completed) < n:
            time.sleep(0.005)
        elapsed = time.monotonic() - start
        cpu = sum(cpu_seconds(k) for k in kids) - cpu
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    return n / elapsed, cpu / n * 1000


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("variants", nargs="+", help="[name:]IMPORTER_NAME=VALUE ... ('default': none)")
    ap.add_argument("--n", type=int, default=20_000)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    variants = [variant(v) for v in a.variants]
    cfg = Config(repeat=1, quick=True, drain_ns=[a.n], processes=2, threads=2, prefetch=64,
                 http_workers=1, http_threads=1, duration=1, rows=3, accounting_n=0, only=set())
    tmp = Path(tempfile.mkdtemp(prefix="drain-settings-"))
    b = Bench(cfg, tmp)
    b.start_server()
    rounds: dict[str, list[tuple[float, float]]] = {name: [] for name, _ in variants}
    try:
        for r in range(a.rounds):
            for name, settings in (variants if r % 2 == 0 else variants[::-1]):
                rate, cpu = one_drain(b, a.n, settings, tmp / f"worker-{len(rounds[name])}-{name.replace('/', '_')}.log")
                rounds[name].append((rate, cpu))
                print(f"round {r + 1} {name}: {rate:,.0f} imports/s, worker {cpu:.3f} ms CPU per import", flush=True)
    finally:
        b.stop_server()
    print()
    print(f"| variant (medians of {a.rounds}) | imports/s | worker CPU per import |")
    print("| --- | --- | --- |")
    for name, runs in rounds.items():
        print(f"| {name} | {statistics.median(r for r, _ in runs):,.0f} | "
              f"{statistics.median(c for _, c in runs):.3f} ms |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
