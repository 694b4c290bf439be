from __future__ import annotations

from collections.abc import Iterator
from typing import Any
from pathlib import Path

import pytest

from tests.integration.support import System


@pytest.fixture
def make_system(redis_url: str, tmp_path: Path) -> Iterator[Any]:
    systems: list[System] = []

    def make(**env: str) -> System:
        system = System(redis_url, tmp_path, env_overrides=env)
        systems.append(system)
        return system

    yield make
    for system in systems:
        system.stop_all()


@pytest.fixture
def system(make_system: Any) -> System:
    """A fresh installation with one HTTP server and one worker running."""
    s = make_system()
    s.start_worker()
    s.start_http()
    return s
