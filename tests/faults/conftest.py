from __future__ import annotations

from collections.abc import Iterator
import signal
from pathlib import Path
from typing import Any

import pytest

from tests.faults.harness import FAULT_ENV, RedisServer
from tests.integration.support import System


@pytest.fixture
def make_redis(tmp_path: Path) -> Iterator[Any]:
    servers: list[RedisServer] = []

    def make(fsync: str = "always") -> RedisServer:
        server = RedisServer(tmp_path / f"r{len(servers)}", fsync=fsync)
        server.start()
        servers.append(server)
        return server

    yield make
    for server in servers:
        server.stop()


@pytest.fixture
def make_faulty(tmp_path: Path) -> Iterator[Any]:
    """An Importer installation on a given RedisServer, with the fault suite's settings."""
    systems: list[System] = []

    def make(server: RedisServer, **env: str) -> System:
        system = System(server.url, tmp_path, env_overrides={**FAULT_ENV, **env})
        systems.append(system)
        return system

    yield make
    for system in systems:
        for proc in system.procs:  # a stopped process cannot stop: wake it first
            try:
                proc.signal(signal.SIGCONT)
            except ProcessLookupError:
                pass
        system.stop_all()
