"""The same minimal POST (read the body, one EVALSHA of BASELINE_SCRIPT, a five-command script
shaped like enqueue.lua's writes, answer 202) as a threaded WSGI app and as an
asynchronous RSGI app on one event loop: the two server models of
``bench/studies/server_model.py``; the WSGI one is also the HTTP scenario's floor (``Bench.start_floor``).
A third, ``wsgi_grouped_app``, is the threaded one with group commit: the calls of the
process's threads that meet share one round trip (one pipeline of EVALSHAs).

Each granian worker process makes its own client on its first request, from
BENCH_REDIS_URL. No auth, no validation: only the server model differs.
"""

from __future__ import annotations

import os
import threading
import uuid
from typing import Any

# Five commands shaped like enqueue.lua's writes (HSET, SET of the body, XADD, HSET, RPUSH);
# bench/studies/post_cost.py's bare app makes the same call.
BASELINE_SCRIPT = """
redis.call('HSET', KEYS[1], 'state', 'waiting', 'owner', ARGV[2], 'sha', ARGV[3])
redis.call('SET', KEYS[2], ARGV[4])
redis.call('XADD', KEYS[3], 'MAXLEN', '~', '1000', '*', 'e', ARGV[1])
redis.call('HSET', KEYS[4], ARGV[1], ARGV[5])
redis.call('RPUSH', KEYS[5], ARGV[1])
return 1
"""


def baseline_call(prefix: str, body: bytes) -> tuple[list[str], list[Any]]:
    """BASELINE_SCRIPT's KEYS and ARGV for one POST of ``body`` (a new job each time)."""
    ident = uuid.uuid4().hex
    keys = [f"{prefix}job:{ident}", f"{prefix}up:{ident}", f"{prefix}ev", f"{prefix}msgs", f"{prefix}q"]
    return keys, [ident, "owner", "0" * 64, body, "m" * 300]


_ACCEPTED = b'{"jobId":"shipment-x","batchId":"x","state":"waiting"}'
_HEADERS = [("content-type", "application/json"), ("content-length", str(len(_ACCEPTED)))]

# Each made on the process's first request (two threads racing make two: harmless).
_sync: Any = None
_async: Any = None


def wsgi_app(environ: dict[str, Any], start_response: Any) -> list[bytes]:
    global _sync
    if _sync is None:
        import redis

        _sync = redis.Redis.from_url(os.environ["BENCH_REDIS_URL"]).register_script(BASELINE_SCRIPT)
    body = environ["wsgi.input"].read(int(environ.get("CONTENT_LENGTH") or 0))
    keys, args = baseline_call("{m}:", body)
    _sync(keys=keys, args=args)
    start_response("202 Accepted", list(_HEADERS))
    return [_ACCEPTED]


class GroupCommit:
    """Concurrent calls of one process share one round trip: a caller that finds
    no round trip on the way (the leader) sends every call waiting at that moment
    in one pipeline on one connection and hands each its reply; calls that
    arrived meanwhile wait, and the first of them leads the next round trip. A
    lone call does not wait for company; at most one round trip is on the way."""

    def __init__(self, client: Any, script: str) -> None:
        self.client, self.sha = client, client.script_load(script)
        self.lock = threading.Lock()
        self.pending: list[tuple[list[Any], list[Any], dict[str, Any]]] = []
        self.sending = False

    def __call__(self, keys: list[Any], args: list[Any]) -> Any:
        slot: dict[str, Any] = {"done": threading.Event(), "lead": False}
        with self.lock:
            self.pending.append((keys, args, slot))
            if not self.sending:
                self.sending = slot["lead"] = True
        if not slot["lead"]:
            slot["done"].wait()
            if "reply" in slot:
                return slot["reply"]
        # Leading: this call and those waiting now, in one pipeline.
        with self.lock:
            batch, self.pending = self.pending, []
        pipe = self.client.pipeline(transaction=False)
        for k, a, _ in batch:
            pipe.evalsha(self.sha, len(k), *k, *a)
        replies = pipe.execute()
        with self.lock:
            if self.pending:
                self.pending[0][2]["lead"] = True  # the next round trip's leader
                self.pending[0][2]["done"].set()
            else:
                self.sending = False
        for (_, _, waiting), reply in zip(batch, replies):
            waiting["reply"] = reply
            if waiting is not slot:
                waiting["done"].set()
        return slot["reply"]


_grouped: Any = None
_grouped_lock = threading.Lock()


def wsgi_grouped_app(environ: dict[str, Any], start_response: Any) -> list[bytes]:
    global _grouped
    with _grouped_lock:
        if _grouped is None:
            import redis

            _grouped = GroupCommit(redis.Redis.from_url(os.environ["BENCH_REDIS_URL"]), BASELINE_SCRIPT)
    body = environ["wsgi.input"].read(int(environ.get("CONTENT_LENGTH") or 0))
    keys, args = baseline_call("{m}:", body)
    _grouped(keys, args)
    start_response("202 Accepted", list(_HEADERS))
    return [_ACCEPTED]


async def rsgi_app(scope: Any, proto: Any) -> None:
    global _async
    if _async is None:
        import redis.asyncio

        _async = redis.asyncio.Redis.from_url(os.environ["BENCH_REDIS_URL"]).register_script(BASELINE_SCRIPT)
    body = await proto()
    keys, args = baseline_call("{m}:", body)
    await _async(keys=keys, args=args)
    proto.response_bytes(202, list(_HEADERS), _ACCEPTED)
