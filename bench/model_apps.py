"""The same minimal POST (read the body, one EVALSHA of post_cost's five-command script
shaped like enqueue.lua's writes, answer 202) as a threaded WSGI app and as an
asynchronous RSGI app on one event loop: the two server models of
``bench/server_model.py``; the WSGI one is also the HTTP scenario's floor (``Bench.start_floor``).

Each granian worker process makes its own client on its first request, from
BENCH_REDIS_URL. No auth, no validation: only the server model differs.
"""

from __future__ import annotations

import os
from typing import Any

from bench.post_cost import BASELINE_SCRIPT, baseline_call

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


async def rsgi_app(scope: Any, proto: Any) -> None:
    global _async
    if _async is None:
        import redis.asyncio

        _async = redis.asyncio.Redis.from_url(os.environ["BENCH_REDIS_URL"]).register_script(BASELINE_SCRIPT)
    body = await proto()
    keys, args = baseline_call("{m}:", body)
    await _async(keys=keys, args=args)
    proto.response_bytes(202, list(_HEADERS), _ACCEPTED)
