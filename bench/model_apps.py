"""The two server models of ``bench/server_model.py``: the same minimal POST (read the
body, one EVALSHA of post_cost's five-command script shaped like enqueue.lua's writes,
answer 202), as a threaded WSGI app and as an asynchronous RSGI app on one event loop.

Each granian worker process makes its own client on its first request, from
BENCH_REDIS_URL. No auth, no validation: only the server model differs.
"""

from __future__ import annotations

import os
import threading
import uuid
from typing import Any

from bench.post_cost import BASELINE_SCRIPT

_ACCEPTED = b'{"jobId":"shipment-x","batchId":"x","state":"waiting"}'
_HEADERS = [("content-type", "application/json"), ("content-length", str(len(_ACCEPTED)))]


def _call(ident: str, body: bytes) -> tuple[list[str], list[Any]]:
    keys = [f"{{m}}:job:{ident}", f"{{m}}:up:{ident}", "{m}:ev", "{m}:msgs", "{m}:q"]
    return keys, [ident, "owner", "0" * 64, body, "m" * 300]


_sync: Any = None
_sync_lock = threading.Lock()


def wsgi_app(environ: dict[str, Any], start_response: Any) -> list[bytes]:
    global _sync
    if _sync is None:
        with _sync_lock:
            if _sync is None:
                import redis

                _sync = redis.Redis.from_url(os.environ["BENCH_REDIS_URL"]).register_script(BASELINE_SCRIPT)
    body = environ["wsgi.input"].read(int(environ.get("CONTENT_LENGTH") or 0))
    keys, args = _call(uuid.uuid4().hex, body)
    _sync(keys=keys, args=args)
    start_response("202 Accepted", list(_HEADERS))
    return [_ACCEPTED]


_async: Any = None


async def rsgi_app(scope: Any, proto: Any) -> None:
    global _async
    if _async is None:
        import redis.asyncio

        _async = redis.asyncio.Redis.from_url(os.environ["BENCH_REDIS_URL"]).register_script(BASELINE_SCRIPT)
    body = await proto()
    keys, args = _call(uuid.uuid4().hex, body)
    await _async(keys=keys, args=args)
    proto.response_bytes(202, list(_HEADERS), _ACCEPTED)
