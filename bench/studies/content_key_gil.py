#!/usr/bin/env python3
"""How long content_key holds the GIL: what another request thread
of the same HTTP process waits while an upload's content identity is computed.

    .venv/bin/python -m bench.studies.content_key_gil [--repeat 3]
    PYTHONPATH=/path/to/other/checkout-as-importer .venv/bin/python -m bench.studies.content_key_gil   # "before"

For each shape (a valid 100,000-row file of 6.8 MiB, 10 MiB of commas, of
blank lines, one long line): content_key's time, and the longest a thread
that sleeps 0.5 ms in a loop beside it waited beyond its sleep (it needs the
GIL to wake up; a C call that holds the GIL for X ms makes it wait ~X ms).
A script, not a timed test.
"""

from __future__ import annotations

import argparse
import random
import statistics
import threading
import time

from importer.domain.shipment import content_key

MIB = 1024 * 1024
HEADER = b"sku,quantity\n"


def shapes() -> dict[str, bytes]:
    order = list(range(100_000))
    random.Random(11).shuffle(order)
    valid = HEADER + b"".join(b"%s,%d\n" % (b"S%063d" % n, 1 + n % 999_999) for n in order)
    return {
        "valid (6.8 MiB)": valid,
        "commas": HEADER + b"," * (10 * MIB - len(HEADER)),
        "newlines": HEADER + b"\n" * (10 * MIB - len(HEADER)),
        "one long line": HEADER + b"A" * (10 * MIB - len(HEADER)),
    }


def measure(data: bytes) -> tuple[float, float]:
    waits: list[float] = []
    stop = threading.Event()

    def ticker() -> None:
        while not stop.is_set():
            started = time.perf_counter()
            time.sleep(0.0005)
            waits.append(time.perf_counter() - started - 0.0005)

    thread = threading.Thread(target=ticker)
    thread.start()
    time.sleep(0.05)
    started = time.perf_counter()
    content_key(data, 100_000)
    took = time.perf_counter() - started
    stop.set()
    thread.join()
    return 1000 * took, 1000 * max(waits)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    for name, data in shapes().items():
        runs = [measure(data) for _ in range(args.repeat)]
        print(
            f"{name:16s} content_key median {statistics.median(t for t, _ in runs):7.1f} ms; "
            f"other thread's worst GIL wait median {statistics.median(w for _, w in runs):6.1f} ms "
            f"(runs: {', '.join(f'{w:.0f}' for _, w in runs)})", flush=True,
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
