"""The bulk intake on the RabbitMQ transport, through the real processes: no
script writes the messages there, so the small shipments of a bulk are
recorded first and then published as group messages (one per location and
per 64), each confirmed by RabbitMQ before the 200; a large one gets its own
message. Every shipment ends on its own, and the same body again applies
nothing twice."""

from __future__ import annotations

from typing import Any

import pytest

from tests.integration.support import System, queued_messages, wait_for
from tests.integration.test_bulk import bulk, line

pytestmark = pytest.mark.integration


@pytest.fixture(params=["rabbitmq"])
def transport(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def test_a_bulk_on_rabbitmq_travels_in_group_messages_and_applies_each_shipment_once(make_system: Any) -> None:
    system: System = make_system(IMPORTER_RATE_LIMIT="0")
    system.start_http()
    items: list[Any] = [line(f"rq-{i}", {"RQ-A": 1, f"RQ-{i % 3}": 2}) for i in range(100)]
    items += [line(f"rq-p-{i}", {"RQ-P": 5}, "paris") for i in range(10)]
    items.append({"batchId": "rq-bad", "csv": "sku,quantity\nRQ-A,-1\n"})  # recorded, fails at its validation
    items.append(line("rq-large", {f"RQ-L-{n:05d}": 1 for n in range(2000)}))  # over the one-step bound
    status, answer = bulk(system, items)
    assert status == 200
    assert [r["status"] for r in answer["results"]] == [202] * len(items)

    # No worker yet: what waits in RabbitMQ is 2 groups at main (64 + 37), 1 at paris, and the large one's own.
    assert queued_messages(system) == 4

    system.start_worker()
    for item in items:
        job = "shipment-" + item["batchId"] + ("@paris" if item.get("location") else "")
        expected = ("failed",) if item["batchId"] == "rq-bad" else ("completed",)
        assert system.wait_state(job, expected, timeout=60)["state"] == expected[0], job
    store = system.store()
    assert store.stock_of(["RQ-A", "RQ-0", "RQ-1", "RQ-2"]) == {"RQ-A": 100, "RQ-0": 68, "RQ-1": 66, "RQ-2": 66}
    assert store.stock_of(["RQ-P"], location="paris") == {"RQ-P": 50}
    assert store.generation() == 101  # at main: 100 small ones and the large one, each once

    # The answer was lost: the same body again. The same jobs, nothing applied twice.
    again = bulk(system, items)[1]["results"]
    assert [r["body"].get("jobId") for r in again] == [r["body"]["jobId"] for r in answer["results"]]
    wait_for(lambda: queued_messages(system) == 0, 10, 0.1, message="the queue drained")
    assert store.generation() == 101
    assert store.stock_of(["RQ-A"]) == {"RQ-A": 100}
