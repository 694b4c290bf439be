"""What the door check (issue 14, item 3) costs a POST, inside Redis.

    .venv/bin/python -m bench.door_cost

Starts its own server (the embedded valkey/redis-server, never the shared one)
and reads INFO commandstats (microseconds per EVALSHA, measured by Redis
itself, so client and network noise stay out):

* the check alone (``no_worker_accepts`` of common.lua) against a script that
  returns at once, with 0, 1 and 10 live workers registered, and a refusal
  (10 live workers, none accepting: the slow path, which reads them all);
* enqueue.lua as a whole (Redis transport, with the message), 0 and 10 workers.

Stand-alone, not part of ``make bench``; prints a table, asserts nothing.
"""

from __future__ import annotations

import statistics
import tempfile
import uuid
from pathlib import Path

import redis

from importer.adapters.embedded_redis import EmbeddedRedis
from importer.adapters.redis_store import Keys, RedisStore
from importer.adapters.scripts import lua_source
from importer.adapters.settings import Settings

CALLS = 20_000
ROUNDS = 5


def _per_call_us(client: redis.Redis, calls: list[tuple[str, list[str], list[object]]]) -> float:
    client.config_resetstat()
    pipe = client.pipeline(transaction=False)
    for n, (sha, keys, args) in enumerate(calls, 1):
        pipe.evalsha(sha, len(keys), *keys, *args)
        if n % 1000 == 0:
            pipe.execute()
    pipe.execute()
    return float(client.info("commandstats")["cmdstat_evalsha"]["usec_per_call"])


def _workers(client: redis.Redis, count: int, accepting_last: frozenset[int]) -> Keys:
    prefix = "{door" + uuid.uuid4().hex[:8] + "}:"
    store = RedisStore(client, Settings(key_prefix=prefix), clock_ms=lambda: 0)
    for n in range(count):
        store.announce_worker(f"w{n}", accepting_last if n == count - 1 else frozenset({9}), 3_600_000)
    return Keys(prefix)


def _enqueue_calls(sha: str, keys: Keys, version: int) -> list[tuple[str, list[str], list[object]]]:
    csv, message = b"sku,quantity\nA-1,1\nB-2,2\nC-3,3\n", b"m" * 350
    calls = []
    for i in range(CALLS):
        job_id, upload_id = f"shipment-b{i}", uuid.uuid4().hex
        calls.append((sha, [
            keys.job(job_id), keys.upload(upload_id), keys.done(f"b{i}"), keys.unsent, keys.waiting, keys.events,
            keys.owner_jobs("o"), keys.workers, keys.workers_accepts, keys.workers_accepting(version),
            f"{keys.dramatiq}:q", f"{keys.dramatiq}:q.msgs", keys.deadline,
        ], [job_id, f"b{i}", "o", "sha", upload_id, 1_000_000 + i, csv, 10_000, version, upload_id, message, 15_000]))
    return calls


def main() -> None:
    server = EmbeddedRedis(Path(tempfile.mkdtemp(prefix="door-cost-")))
    client = redis.Redis.from_url(server.start())
    try:
        enqueue = lua_source("enqueue")
        prelude = enqueue[: enqueue.index("-- enqueue.lua")]
        empty = client.script_load(prelude + "return 0\n")
        check = client.script_load(prelude + "return no_worker_accepts(KEYS[1], KEYS[2], KEYS[3], ARGV[1]) or 0\n")
        whole = client.script_load(enqueue)
        none, one, ten = _workers(client, 0, frozenset()), _workers(client, 1, frozenset({1})), _workers(client, 10, frozenset({1, 2}))

        def check_calls(sha: str, keys: Keys, version: int = 1) -> list[tuple[str, list[str], list[object]]]:
            return [(sha, [keys.workers, keys.workers_accepts, keys.workers_accepting(version)], [version])] * CALLS

        cases = {
            "script returning at once (baseline)": lambda: check_calls(empty, none),
            "check, no worker registered": lambda: check_calls(check, none),
            "check, 1 live worker, accepts": lambda: check_calls(check, one),
            "check, 10 live workers, one accepts": lambda: check_calls(check, ten),
            "check, 10 live workers, none accepts (refusal)": lambda: check_calls(check, ten, version=3),
            "enqueue.lua, no worker registered": lambda: _enqueue_calls(whole, _workers(client, 0, frozenset()), 1),
            "enqueue.lua, 10 live workers, one accepts": lambda: _enqueue_calls(whole, _workers(client, 10, frozenset({1})), 1),
        }
        results: dict[str, list[float]] = {name: [] for name in cases}
        for _ in range(ROUNDS):
            for name, make in cases.items():
                results[name].append(_per_call_us(client, make()))
        print(f"in-Redis microseconds per call (EVALSHA, INFO commandstats), median of {ROUNDS} x {CALLS:,} calls")
        for name, values in results.items():
            print(f"  {name:48s} {statistics.median(values):6.2f} us  (min {min(values):.2f})")
    finally:
        client.close()
        server.stop()


if __name__ == "__main__":
    main()
