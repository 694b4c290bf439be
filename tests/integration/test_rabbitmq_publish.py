"""A publish RabbitMQ does not confirm makes POST answer 503, and the job it
recorded is not an orphan: the workers' sweeper sends it later."""

from __future__ import annotations

import pytest

from tests.integration.support import FIXTURES, System

pytestmark = pytest.mark.integration

SEED = (FIXTURES / "shipment-a-2026.csv").read_bytes()


@pytest.fixture(params=["rabbitmq"])
def transport(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def test_an_unconfirmed_publish_answers_503_and_the_job_recovers(make_system: object) -> None:
    system: System = make_system(IMPORTER_WAITING_GRACE="1")  # type: ignore[operator]
    # This HTTP process's broker cannot confirm anything: nothing listens there.
    system.start_http(IMPORTER_BROKER_URL="amqp://guest:guest@127.0.0.1:1/%2F?connection_attempts=1&socket_timeout=2",
                      sick="broker_unreachable")  # /health says so
    status, problem = system.post_csv("unconfirmed-1", SEED)
    assert (status, problem["code"]) == (503, "service.unavailable")
    record = system.store().get_job("shipment-unconfirmed-1")
    assert record is not None and record.state == "waiting"
    assert system.store().generation() == 0

    system.start_worker()  # a worker with the real RabbitMQ: its sweeper sends the message
    assert system.wait_state("shipment-unconfirmed-1", timeout=60)["state"] == "completed"
    assert system.store().generation() == 1
