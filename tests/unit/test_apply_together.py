"""Group commit on the worker, the pure part and the handover: which deliveries
share one call (domain/run_import.py apply_together), and how the other
messages' actors get their outcome (adapters/dramatiq/handover.py MessageHandover).
The end-to-end test on a real worker is tests/integration/test_apply_together.py."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from typing import Any

import dramatiq
import pytest

from importer.adapters.dramatiq.handover import Handed, MessageHandover
from importer.adapters.dramatiq.runner import ImportRunner
from importer.adapters.settings import Settings
from importer.adapters.redis.keys import LocationQueues
from importer.domain.contract import decode_message, encode_message
from importer.domain.ports import ApplyResult, OneStepImport, StartOutcome, StartedAttempt
from importer.domain.run_import import Delivery, Settled, apply_together
from importer.domain.shipment import job_id_for

VALID = b"sku,quantity\nA-1,2\nB-1,3\n"


def _body(batch_id: str, n: int, location: str = "main") -> dict[str, object]:
    return encode_message(job_id_for(batch_id, location), batch_id, f"{n:032x}")


class TogetherStore:
    """Records each start_and_apply_together call; every import applies."""

    def __init__(self, fail: BaseException | None = None) -> None:
        self.calls: list[list[OneStepImport]] = []
        self.fail = fail

    def start_and_apply_together(self, imports: Sequence[OneStepImport]) -> list[tuple[StartOutcome, ApplyResult | None]]:
        self.calls.append(list(imports))
        if self.fail is not None:
            raise self.fail
        return [
            (StartOutcome("started", 1, StartedAttempt(1, i.batch_id, "owner-a", "", b"")),
             ApplyResult("applied", {"imported": i.shipment.row_count, "batchId": i.batch_id}))
            for i in imports
        ]


def _delivery(batch_id: str, n: int, upload: bytes | None, ack: object = None, **kw: Any) -> Delivery:
    return Delivery(decode_message(_body(batch_id, n), frozenset({1})), upload, ack, **kw)


def test_one_call_for_the_valid_deliveries_each_with_its_own_outcome() -> None:
    store = TogetherStore()
    earlier = Settled(StartOutcome("finished", 0, None, "completed"), None, 0)
    deliveries = [
        _delivery("b-1", 1, VALID, "ack-1"),
        _delivery("b-2", 2, b"sku,quantity\nA-1,many\n", "ack-2"),  # invalid CSV: the separate steps record it
        _delivery("b-3", 3, None, "ack-3"),  # no upload came with it (a large one)
        _delivery("b-4", 4, VALID, "ack-4"),
        _delivery("b-1", 1, VALID, "ack-5"),  # the same job again: a duplicate delivery
        _delivery("b-6", 6, VALID, "ack-6", settled=earlier),  # another delivery's call ran it
    ]
    settled = apply_together(store, deliveries, max_rows=100)  # type: ignore[arg-type]
    (call,) = store.calls
    assert [(i.job_id, i.ack) for i in call] == [("shipment-b-1", "ack-1"), ("shipment-b-4", "ack-4")]
    assert [s is not None for s in settled] == [True, False, False, True, False, True]
    assert settled[5] is earlier
    first = settled[0]
    assert isinstance(first, Settled) and first.rows == 2 and first.applied is not None
    assert first.applied.result == {"imported": 2, "batchId": "b-1"}


def test_nothing_valid_makes_no_call_and_a_failed_call_raises() -> None:
    store = TogetherStore()
    assert apply_together(store, [_delivery("b-1", 1, b"")], max_rows=100) == [None]  # type: ignore[arg-type]
    assert store.calls == []
    failing = TogetherStore(fail=ConnectionError("store away"))
    with pytest.raises(ConnectionError):
        apply_together(failing, [_delivery("b-1", 1, VALID)], max_rows=100)  # type: ignore[arg-type]


QUEUE = "imports"


def _handover(together: int) -> MessageHandover:
    handover = MessageHandover(16 * 1024, together=together, wait_s=5.0)
    handover.location_queues = LocationQueues("{importer}:", QUEUE, per_location=False)
    handover.worker_id = "w-1"
    return handover


class Fetched:
    """Messages as the fetch brings them: dramatiq's encoded messages and fetch.lua's side lists."""

    def __init__(self, handover: MessageHandover, bodies: list[dict[str, object]]) -> None:
        self.messages = [dramatiq.Message(QUEUE, "import_shipment", (b,), {}, {"redis_message_id": f"r{n}"}) for n, b in enumerate(bodies)]
        raw = [m.encode() for m in self.messages]
        fetched: list[list[Any]] = [
            [f"r{n}".encode() for n in range(len(bodies))], [VALID] * len(bodies),
            [str(b["jobId"]).encode() for b in bodies], list(range(1, len(bodies) + 1)),
        ]
        handover.keep(QUEUE, raw, fetched)


def test_a_delivery_takes_the_last_fetched_messages_of_its_location_and_they_get_its_outcomes() -> None:
    handover = _handover(together=3)
    bodies = [_body("b-0", 0), _body("b-1", 1), _body("p-2", 2, "paris"), _body("b-3", 3), _body("b-4", 4)]
    fetched = Fetched(handover, bodies)
    handed = handover.take(fetched.messages[0])
    assert isinstance(handed, Handed) and handed.upload == VALID and handed.settled is None
    assert handed.ack.redis_message_id == "r0" and handed.ack.worker_id == "w-1"
    companions = handover.claim_together(handed)
    # The last fetched first (the furthest from a worker thread), of main only: not paris's.
    assert [c.redis_message_id for c in companions] == ["r4", "r3"]
    assert companions[0].body == bodies[4]
    handover.settle("r4", "outcome of r4")
    handover.settle("r3", None)  # left out of the call: its actor runs on its own
    four, three = handover.take(fetched.messages[4]), handover.take(fetched.messages[3])
    assert four is not None and four.settled == "outcome of r4"
    assert three is not None and three.settled is None and three.upload == VALID
    # Not claimed: its own upload, for a call of its own (paris's message waits for a paris delivery).
    one = handover.take(fetched.messages[1])
    assert one is not None and one.settled is None
    assert [c.redis_message_id for c in handover.claim_together(one)] == []  # r2 is paris's: nothing left for main


def test_an_actor_whose_message_is_in_a_call_on_its_way_waits_for_its_outcome() -> None:
    handover = _handover(together=2)
    fetched = Fetched(handover, [_body("b-0", 0), _body("b-1", 1)])
    handed = handover.take(fetched.messages[0])
    assert handed is not None
    (companion,) = handover.claim_together(handed)
    got: list[Any] = []
    waiter = threading.Thread(target=lambda: got.append(handover.take(fetched.messages[1])))
    waiter.start()
    time.sleep(0.2)
    assert got == [] and waiter.is_alive()  # waits for the call on its way
    handover.settle(companion.redis_message_id, "its outcome")
    waiter.join(5)
    assert got and got[0].settled == "its outcome"


def test_one_at_a_time_claims_nothing() -> None:
    handover = _handover(together=1)
    fetched = Fetched(handover, [_body("b-0", 0), _body("b-1", 1)])
    handed = handover.take(fetched.messages[0])
    assert handed is not None and handover.claim_together(handed) == []


def test_the_runner_shares_its_call_with_the_companions_it_accepts_and_hands_each_its_outcome() -> None:
    """ImportRunner.run with companions: one call for its own import and every
    companion whose message it accepts; a companion of a contract version it
    does not accept stays out (None: its own actor records the rejection)."""
    handover = _handover(together=3)
    bodies = [_body("b-0", 0), {"version": 99, "jobId": "shipment-b-1"}, _body("b-2", 2)]
    fetched = Fetched(handover, bodies)
    store = TogetherStore()
    runner = ImportRunner(store, Settings(accepted_versions=frozenset({1})))  # type: ignore[arg-type]
    handed = handover.take(fetched.messages[0])
    assert handed is not None
    assert runner.run(bodies[0], "m-0", handed, handover) == "applied"
    (call,) = store.calls
    assert [i.job_id for i in call] == ["shipment-b-0", "shipment-b-2"]
    two, one = handover.take(fetched.messages[2]), handover.take(fetched.messages[1])
    assert two is not None and isinstance(two.settled, Settled) and two.settled.outcome.kind == "started"
    assert one is not None and one.settled is None  # runs on its own
