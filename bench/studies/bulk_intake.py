"""What a bulk request saves a producer: N 3-row shipments sent to `importer
serve` (its defaults, no worker: intake only) by one client as N single POSTs
(one keep-alive connection), as N/100 bulk requests of 100, and as one of N;
shipments recorded per second and the server's Redis commands per shipment.
Rounds alternate, each on its own valkey; medians.

    python -m bench.studies.bulk_intake --shipments 1000 --rounds 3
"""

from __future__ import annotations

import argparse
import http.client
import json
import shutil
import statistics
import tempfile
import time
import uuid
from pathlib import Path

import redis

from bench.suite.common import free_port
from bench.suite.ledger import _env, _spawn, _stop, wait_healthy
from importer.adapters.redis.embedded import EmbeddedRedis
from importer.handlers.auth import hash_key, new_key

CSV = "sku,quantity\nWIDGET-RED-01,10\nGADGET-BLU-02,25\nSPROCKET-07,5\n"


def one_round(n: int, how: str, work: Path) -> dict[str, float]:
    work.mkdir(parents=True, exist_ok=True)
    valkey = EmbeddedRedis(work / "valkey")
    url = valkey.start()
    key = new_key()
    env = _env(url, None, "{bulk}:")
    env.update(IMPORTER_API_KEYS=f"bench:{hash_key(key)}", IMPORTER_KEEP_COMPLETED_AGE="3600")
    port = free_port()
    proc = _spawn(["serve", "--bind", f"127.0.0.1:{port}"], env, work / "http.log")
    client = redis.Redis.from_url(url)
    try:
        wait_healthy(port)
        run = uuid.uuid4().hex[:8]
        items = [{"batchId": f"{run}-{i}", "csv": CSV} for i in range(n)]
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        headers = {"Authorization": f"Bearer {key}"}
        calls_before = sum(int(v.get("calls", 0)) for k, v in client.info("commandstats").items())
        started = time.perf_counter()
        if how == "single":
            for item in items:
                conn.request("POST", "/api/imports", json.dumps(item), {**headers, "Content-Type": "application/json"})
                conn.getresponse().read()
        else:
            size = n if how == "bulk-all" else 100
            for at in range(0, n, size):
                body = "\n".join(json.dumps(item) for item in items[at:at + size]) + "\n"
                conn.request("POST", "/api/imports/bulk", body, {**headers, "Content-Type": "application/x-ndjson"})
                answer = json.loads(conn.getresponse().read())
                assert all(r["status"] == 202 for r in answer["results"]), answer
        elapsed = time.perf_counter() - started
        stats = client.info("commandstats")
        calls = sum(int(v.get("calls", 0)) for v in stats.values()) - calls_before
        assert client.zcard("{bulk}:jobs:waiting") == n
        return {"per_s": n / elapsed, "commands": calls / n}
    finally:
        _stop(proc)
        client.close()
        valkey.stop()
        shutil.rmtree(work, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--shipments", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="importer-bench-bulk-"))
    ways = ("single", "bulk-100", "bulk-all")
    got: dict[str, list[dict[str, float]]] = {w: [] for w in ways}
    for r in range(args.rounds):
        for how in ways:
            res = one_round(args.shipments, how, base / f"{r}-{how}")
            got[how].append(res)
            print(f"round {r} {how}: {res['per_s']:.0f} shipments/s, {res['commands']:.1f} commands per shipment", flush=True)
    print(f"\nbulk intake: {args.shipments} 3-row shipments, one client, {args.rounds} rounds, medians")
    single = statistics.median(x["per_s"] for x in got["single"])
    for how in ways:
        per_s = statistics.median(x["per_s"] for x in got[how])
        commands = statistics.median(x["commands"] for x in got[how])
        print(f"{how}: {per_s:.0f} shipments/s ({per_s / single:.2f}× single POSTs), {commands:.1f} Redis commands per shipment")


if __name__ == "__main__":
    main()
