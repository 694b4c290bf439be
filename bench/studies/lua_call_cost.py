"""What one ``redis.call`` inside a Lua script costs the server, beside what the
command itself costs: the bound under the apply script's per-import time.

    .venv/bin/python -m bench.studies.lua_call_cost [--calls 2000] [--rounds 5]

On its own embedded valkey (the bench's server, never a shared Redis). Each
case is one script making the same ``redis.call`` ``--calls`` times; per call,
the EVALSHA's server time (INFO commandstats, execution only) beside the
inner command's own time, medians of ``--rounds`` runs. An empty Lua loop of
the same length is the baseline. The difference between the two columns is
what the script engine pays per call (arguments made into server strings,
the command's lookup and checks, its reply made back into Lua values): the
commands of an import each pay it, whatever they do.
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

import redis  # noqa: E402

from importer.adapters.redis.embedded import EmbeddedRedis  # noqa: E402

#: name -> the loop's body (KEYS[1] is one key; i the loop counter).
CASES = {
    "empty Lua loop (baseline)": "local x = i",
    "PING": "redis.call('PING')",
    "INCR of one key": "redis.call('INCR', KEYS[1])",
    "HSET, 1 field": "redis.call('HSET', KEYS[1], 'f', i)",
    "HSET, 10 fields (a job record's completion)": (
        "redis.call('HSET', KEYS[1], 'a', 1, 'b', 2, 'c', 3, 'd', 4, 'e', 5, 'f', 6, 'g', 7, 'h', 8, 'i', 9, 'j', i)"
    ),
    "XADD, 5 fields, MAXLEN ~ (P:events)": (
        "redis.call('XADD', KEYS[1], 'MAXLEN', '~', 10000, '*', 'event', 'active', 'jobId', 'shipment-abc',"
        " 'batchId', 'abc', 'attempt', 1, 'data', '{}')"
    ),
    "XADD, 5 fields, a new stream each (P:events:<jobId>)": (
        "redis.call('XADD', KEYS[1] .. i, 'MAXLEN', 64, '*', 'event', 'active', 'jobId', 'shipment-abc',"
        " 'batchId', 'abc', 'attempt', 1, 'data', '{}')"
    ),
}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=5)
    a = ap.parse_args()
    server = EmbeddedRedis(Path(tempfile.mkdtemp(prefix="lua-call-cost-")))
    client = redis.Redis.from_url(server.start())
    try:
        version = client.info("server").get("valkey_version") or client.info("server")["redis_version"]
        print(f"server: valkey/redis {version}, {a.calls:,} calls per script, medians of {a.rounds} rounds\n")
        print("| one call of | EVALSHA server time per call | the command's own time | the engine's cost per call |")
        print("| --- | --- | --- | --- |")
        for name, body in CASES.items():
            sha = client.script_load(f"for i = 1, {a.calls} do {body} end return 1")
            per_call, own = [], []
            for _ in range(a.rounds):
                client.flushall()
                client.config_resetstat()
                client.evalsha(sha, 1, "{lua-call-cost}:k")
                stats = client.info("commandstats")
                per_call.append(stats["cmdstat_evalsha"]["usec"] / a.calls)
                own.append(sum(v["usec"] for k, v in stats.items() if k not in ("cmdstat_evalsha", "cmdstat_config|resetstat",
                                                                                   "cmdstat_flushall")) / a.calls)
            total, inner = statistics.median(per_call), statistics.median(own)
            print(f"| {name} | {total:.2f} µs | {inner:.2f} µs | {total - inner:.2f} µs |")
    finally:
        client.close()
        server.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
