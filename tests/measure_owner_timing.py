"""Does the time of a 404 tell another owner's job from a missing one?

Not a test (timings on a shared machine are no verdict); run it by hand:

    IMPORTER_REDIS_URL=redis://127.0.0.1:6379/0 .venv/bin/python -m tests.measure_owner_timing [--samples 400]

It starts a real `importer serve` (gunicorn) and `importer worker` on its own
key prefix, lets owner A complete one import, then, as owner B over one
keep-alive connection, alternates GET /api/imports/{A's job} and
GET /api/imports/{a missing id of the same length} (and the same for
/api/shipments/{batchId} and /api/shipments/{batchId}/receipt); then the same
as owner A with a key for location paris only (A's record is at main). It prints the AUC of the two latency samples
(Mann-Whitney: the chance that a request for A's existing record is slower
than one for a missing record; 0.5 = indistinguishable). Target: <= 0.6.
"""

from __future__ import annotations

import argparse
import bisect
import http.client
import os
import sys
import tempfile
import time
from pathlib import Path
from urllib.parse import urlsplit

from importer.handlers.auth import hash_key, new_key
from tests.integration.support import FIXTURES, System


def auc(slower: list[int], faster: list[int]) -> float:
    """P(a value of `slower` > a value of `faster`) + half the ties (Mann-Whitney U / n1 n2)."""
    ordered = sorted(faster)
    wins = 0.0
    for value in slower:
        below = bisect.bisect_left(ordered, value)
        ties = bisect.bisect_right(ordered, value) - below
        wins += below + ties / 2
    return wins / (len(slower) * len(faster))


def measure(conn: http.client.HTTPConnection, key: str, existing: str, missing: str, samples: int) -> tuple[list[int], list[int]]:
    """Alternate the two paths (which one goes first swaps every pair), `samples` requests in all."""
    headers = {"Authorization": f"Bearer {key}"}
    times: dict[str, list[int]] = {existing: [], missing: []}
    for n in range(samples // 2):
        pair = (existing, missing) if n % 2 == 0 else (missing, existing)
        for path in pair:
            start = time.perf_counter_ns()
            conn.request("GET", path, headers=headers)
            response = conn.getresponse()
            body = response.read()
            elapsed = time.perf_counter_ns() - start
            assert response.status == 404, (path, response.status, body)
            times[path].append(elapsed)
    return times[existing], times[missing]


def median_us(values: list[int]) -> float:
    return sorted(values)[len(values) // 2] / 1000


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--samples", type=int, default=400, help="requests per measured pair of paths (default 400)")
    parser.add_argument("--rounds", type=int, default=3, help="measurements of each pair (default 3)")
    args = parser.parse_args()
    redis_url = os.environ.get("IMPORTER_REDIS_URL", "redis://127.0.0.1:6379/0")
    with tempfile.TemporaryDirectory() as workdir:
        system = System(redis_url, Path(workdir))
        paris_key = new_key()  # owner A's, for location paris only
        system.env_overrides["IMPORTER_API_KEYS"] = (
            f"owner-a:{hash_key(system.api_key)},owner-b:{hash_key(system.other_key)},"
            f"owner-a:{hash_key(paris_key)} locations=paris"
        )
        try:
            system.start_worker()
            system.start_http()
            batch = "timing-a-0001"
            assert system.post_csv(batch, (FIXTURES / "shipment-a-2026.csv").read_bytes())[0] == 202
            assert system.wait_state(f"shipment-{batch}")["state"] == "completed"
            url = urlsplit(system.base_url)
            conn = http.client.HTTPConnection(url.hostname, url.port, timeout=30)
            pairs = {
                "job": (f"/api/imports/shipment-{batch}", "/api/imports/shipment-timing-a-0002"),
                "shipment": (f"/api/shipments/{batch}", "/api/shipments/timing-a-0002"),
                "receipt": (f"/api/shipments/{batch}/receipt", "/api/shipments/timing-a-0002/receipt"),
            }
            for who, key in (("owner B", system.other_key), ("A's key for paris", paris_key)):
                for name, (existing, missing) in pairs.items():
                    measure(conn, key, existing, missing, 100)  # warm-up
                    for r in range(args.rounds):
                        slow, fast = measure(conn, key, existing, missing, args.samples)
                        print(
                            f"{name} round {r + 1}: AUC {auc(slow, fast):.3f} over {args.samples} requests as {who}; "
                            f"median A's existing {median_us(slow):.0f} us, missing {median_us(fast):.0f} us",
                            flush=True,
                        )
            conn.close()
        finally:
            system.stop_all()
    return 0


if __name__ == "__main__":
    sys.exit(main())
