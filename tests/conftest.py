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


@pytest.fixture(scope="session")
def postgres_server_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A PostgreSQL server for the ledger's tests: IMPORTER_TEST_DATABASE_URL when
    set (CI runs the suite once against the machine's PostgreSQL 15 that way),
    else the embedded server of `importer dev` (adapters/postgres/embedded.py).
    Never skipped: an unreachable configured server fails the run."""
    configured = os.environ.get("IMPORTER_TEST_DATABASE_URL")
    if configured:
        import psycopg

        try:
            psycopg.connect(configured, connect_timeout=3).close()
        except psycopg.Error as exc:
            pytest.fail(f"IMPORTER_TEST_DATABASE_URL is set but PostgreSQL does not answer: {exc}", pytrace=False)
        yield configured
        return
    from importer.adapters.postgres.embedded import EmbeddedPostgres

    from tests.integration.support import server_folder

    # Not under pytest's folder (mode 0700): as root the server runs as 'nobody'.
    folder = server_folder("postgres")
    server = EmbeddedPostgres(folder / "data")
    url = server.start()
    try:
        yield url
    finally:
        server.stop()
        import shutil

        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def make_database(postgres_server_url: str) -> Iterator[object]:
    """make() -> the URL of a new, empty database on that server, dropped after the test."""
    import uuid

    import psycopg
    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    made: list[str] = []

    def make() -> str:
        name = "importer_t_" + uuid.uuid4().hex[:12]
        with psycopg.connect(postgres_server_url, autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        made.append(name)
        params = conninfo_to_dict(postgres_server_url)
        params["dbname"] = name
        return "postgresql://{user}@{host}:{port}/{dbname}".format(
            user=params.get("user", "postgres"), host=params.get("host", "127.0.0.1"), port=params.get("port", 5432),
            dbname=name,
        ) if "password" not in params else make_conninfo(**params)

    yield make
    for name in made:
        with psycopg.connect(postgres_server_url, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
