"""Shared fixtures. Integration tests need a real Redis-compatible server:
IMPORTER_REDIS_URL when set (CI sets it), else an embedded valkey started here.
They never skip: an unreachable configured Redis fails the run."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    configured = os.environ.get("IMPORTER_REDIS_URL")
    if configured:
        import redis

        try:
            redis.Redis.from_url(configured, socket_connect_timeout=3).ping()
        except redis.RedisError as exc:
            pytest.fail(f"IMPORTER_REDIS_URL is set but Redis does not answer: {exc}", pytrace=False)
        yield configured
        return
    from importer.adapters.redis.embedded import EmbeddedRedis

    server = EmbeddedRedis(Path(tmp_path_factory.mktemp("valkey")))
    url = server.start()
    try:
        yield url
    finally:
        server.stop()
