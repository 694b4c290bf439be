from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.integration.support import System, delete_rabbitmq_queues, rabbitmq_available


@pytest.fixture(params=["redis"])
def transport(request: pytest.FixtureRequest) -> str:
    """The message transport; modules that must run on both override this fixture."""
    return str(request.param)


def require_transport(name: str) -> None:
    if name == "rabbitmq" and not rabbitmq_available():
        if os.environ.get("CI"):
            pytest.fail("RabbitMQ is not reachable on 127.0.0.1:5672 and CI must run the RabbitMQ variant")
        pytest.skip("RabbitMQ is not running on 127.0.0.1:5672 (CI runs this variant; locally it is optional)")


@pytest.fixture
def make_system(redis_url: str, tmp_path: Path, transport: str) -> Iterator[Any]:
    require_transport(transport)
    systems: list[System] = []

    def make(**env: str) -> System:
        system = System(redis_url, tmp_path, env_overrides=env, transport=transport)
        systems.append(system)
        return system

    yield make
    for system in systems:
        system.stop_all()
        delete_rabbitmq_queues(system)


@pytest.fixture
def system(make_system: Any) -> System:
    """A fresh installation with one HTTP server and one worker running."""
    s = make_system()
    s.start_worker()
    s.start_http()
    return s
