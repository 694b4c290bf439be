"""The ledger's costs, measured with the ledger on and off in the same run:

1. drain: N pre-enqueued 3-row imports through one `importer worker`
   (2 threads), with and without `importer ledger` exporting meanwhile:
   imports/s, and the export lag (entries not yet committed, age of the
   oldest) sampled every 100 ms during the drain with the ledger on;
2. Redis memory: `used_memory` after the drain, once retention removed the
   job records and (ledger on) the exporter trimmed the journal, receipts
   and markers (hot window and horizon 0 here), against the memory before;
3. one 100,000-row shipment: the time one exporter pass takes to commit it.

Each round uses its own valkey (embedded) and, with the ledger on, its own
embedded PostgreSQL; rounds alternate on/off, medians are reported.

    python -m bench.studies.ledger --imports 20000 --rounds 3
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path
from typing import Any

from bench.suite.ledger import one_round

ROOT = Path(__file__).resolve().parents[2]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--imports", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="importer-bench-ledger-"))
    base.chmod(0o755)  # as root the embedded PostgreSQL runs as 'nobody'

    results: dict[bool, list[dict[str, Any]]] = {True: [], False: []}
    for r in range(args.rounds):
        for on in (False, True):
            res = one_round(args.imports, on, base / f"{r}-{'on' if on else 'off'}")
            print(res, flush=True)
            results[on].append(res)

    def med(on: bool, key: str) -> float:
        return statistics.median(x[key] for x in results[on])

    print(f"\nledger study: {args.imports} small imports, {args.rounds} rounds, medians")
    print(f"drain imports/s: on {med(True, 'imports_per_s'):.0f}, off {med(False, 'imports_per_s'):.0f}, "
          f"ratio {med(True, 'imports_per_s') / med(False, 'imports_per_s'):.2f}")
    print(f"export lag p99 during the drain: {med(True, 'lag_p99_s'):.2f} s (max entries behind: {med(True, 'lag_max_entries'):.0f})")
    for on in (False, True):
        grown = med(on, "memory_after") - med(on, "memory_before")
        print(f"Redis used_memory growth after the drain, ledger {'on' if on else 'off'}: {grown / 1024:.0f} KiB "
              f"({grown / args.imports:.0f} B per import; done markers left: {med(on, 'markers_left'):.0f})")
    print(f"one 100,000-row shipment exported in {med(True, 'export_100k_s'):.2f} s")


if __name__ == "__main__":
    main()
