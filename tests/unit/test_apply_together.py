"""Group commit on the worker, the pure part and the handover: which deliveries
share one call (domain/run_import.py apply_together), which fetched messages
ride along in it, and how each rider is finished by its leader or given back
to its own actor (adapters/dramatiq/handover.py MessageHandover).
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

    def __init__(self, fail: BaseException | None = None, acknowledge: bool = False) -> None:
        self.calls: list[list[OneStepImport]] = []
        self.fail = fail
        self.acknowledge = acknowledge  # as start_apply.lua does: each import's message acknowledged in the call

    def start_and_apply_together(self, imports: Sequence[OneStepImport]) -> list[tuple[StartOutcome, ApplyResult | None]]:
        self.calls.append(list(imports))
        if self.fail is not None:
            raise self.fail
        for i in imports:
            if self.acknowledge and i.ack is not None:
                i.ack.acknowledged()
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
    handover = MessageHandover(16 * 1024, together=together, ahead=2)
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


class Consumer:
    """What the handover reads of a dramatiq consumer: its outstanding message ids."""

    def __init__(self) -> None:
        self.queued_message_ids: set[str] = set()

    def meets(self, handover: MessageHandover, message: dramatiq.Message[Any]) -> bool:
        """The consumer takes ``message`` from its cache (dramatiq counts it outstanding): yielded or not."""
        self.queued_message_ids.add(message.message_id)
        return handover.to_yield(message, self)


def test_a_delivery_takes_the_last_fetched_messages_of_its_location_that_no_consumer_yielded() -> None:
    handover = _handover(together=3)
    bodies = [_body("b-0", 0), _body("b-1", 1), _body("p-2", 2, "paris"), _body("b-3", 3), _body("b-4", 4), _body("b-5", 5)]
    fetched = Fetched(handover, bodies)
    consumer = Consumer()
    assert consumer.meets(handover, fetched.messages[0]) and consumer.meets(handover, fetched.messages[5])
    handed = handover.take(fetched.messages[0])
    assert isinstance(handed, Handed) and handed.upload == VALID and handed.settled is None
    assert handed.ack.redis_message_id == "r0" and handed.ack.worker_id == "w-1"
    riders = handover.claim_together(handed)
    # The last fetched first, of main only (not paris's), and not r5: yielded to dramatiq already.
    assert [r.redis_message_id for r in riders] == ["r4", "r3"]
    assert riders[0].body == bodies[4]
    handover.give_back("r4", "outcome of r4")
    handover.give_back("r3", None)  # left out of the call: its actor runs on its own
    assert consumer.meets(handover, fetched.messages[3]) and consumer.meets(handover, fetched.messages[4])
    four, three = handover.take(fetched.messages[4]), handover.take(fetched.messages[3])
    assert four is not None and four.settled == "outcome of r4"
    assert three is not None and three.settled is None and three.upload == VALID
    # Not taken: its own upload, for a call of its own (paris's message waits for a paris delivery).
    one = handover.take(fetched.messages[1])
    assert one is not None and one.settled is None
    assert [r.redis_message_id for r in handover.claim_together(one)] == []  # r2 is paris's: nothing left for main


def test_a_finished_rider_is_never_yielded_and_no_longer_outstanding() -> None:
    handover = _handover(together=3)
    fetched = Fetched(handover, [_body("b-0", 0), _body("b-1", 1), _body("b-2", 2)])
    consumer = Consumer()
    assert consumer.meets(handover, fetched.messages[0])
    handed = handover.take(fetched.messages[0])
    assert handed is not None
    two, one = handover.claim_together(handed)
    # r2 met by its consumer while its leader's call is on its way; r1 only after it finished.
    assert not consumer.meets(handover, fetched.messages[2])
    for rider in (two, one):
        rider.ack.acknowledged()
        assert handover.acknowledged(rider.redis_message_id)
        handover.finish(rider.redis_message_id)
    assert not consumer.meets(handover, fetched.messages[1])
    assert consumer.queued_message_ids == {fetched.messages[0].message_id}  # r0's actor acks it; r1, r2 are done
    assert handover.take(fetched.messages[1]) is None and handover.take(fetched.messages[2]) is None


def test_each_finished_rider_is_told_to_the_listeners_as_a_message_processed() -> None:
    handover = _handover(together=3)
    fetched = Fetched(handover, [_body("b-0", 0), _body("b-1", 1), _body("b-2", 2)])
    told: list[tuple[str, str, float]] = []

    def failing(*_: object) -> None:
        raise RuntimeError("a listener that fails")

    handover.finished_listeners += [failing, lambda queue, actor, ms: told.append((queue, actor, ms))]
    handed = handover.take(fetched.messages[0])
    assert handed is not None
    two, one = handover.claim_together(handed)
    two.ack.acknowledged()
    handover.finish(two.redis_message_id)  # the failing listener fails nothing
    handover.give_back(one.redis_message_id, None)  # not finished here: its own actor is counted by dramatiq
    assert [(queue, actor) for queue, actor, _ in told] == [(QUEUE, "import_shipment")]
    assert 0 <= told[0][2] < 10_000
    assert handover.take(fetched.messages[2]) is None  # finished all the same


def test_a_rider_given_back_after_its_consumer_skipped_it_is_yielded_again() -> None:
    handover = _handover(together=2)
    fetched = Fetched(handover, [_body("b-0", 0), _body("b-1", 1)])
    consumer = Consumer()
    assert consumer.meets(handover, fetched.messages[0])
    handed = handover.take(fetched.messages[0])
    assert handed is not None
    (rider,) = handover.claim_together(handed)
    assert not consumer.meets(handover, fetched.messages[1])
    assert handover.returned(QUEUE) is None
    handover.give_back(rider.redis_message_id, "its outcome")
    again = handover.returned(QUEUE)
    assert again is fetched.messages[1] and handover.returned(QUEUE) is None
    assert consumer.queued_message_ids == {m.message_id for m in fetched.messages}  # outstanding until its ack
    got = handover.take(again)
    assert got is not None and got.settled == "its outcome" and got.upload == VALID


def test_a_consumer_yields_small_imports_only_while_few_wait_for_a_worker_thread() -> None:
    handover = _handover(together=2)  # ahead=2
    fetched = Fetched(handover, [_body(f"b-{n}", n) for n in range(4)])
    consumer = Consumer()
    assert handover.room_to_yield(QUEUE)
    assert consumer.meets(handover, fetched.messages[0]) and consumer.meets(handover, fetched.messages[1])
    started = time.monotonic()
    assert not handover.room_to_yield(QUEUE, wait_s=0.05)  # two wait: the rest stay where leaders take riders
    assert time.monotonic() - started >= 0.04
    assert handover.room_to_yield("imports.DQ")  # not an import queue's small imports: never held
    freed = threading.Timer(0.05, lambda: handover.take(fetched.messages[0]))
    freed.start()
    assert handover.room_to_yield(QUEUE, wait_s=5)  # an actor took one: room again, at once
    freed.join()
    consumer.queued_message_ids.discard(fetched.messages[1].message_id)
    handover.acked_by_script(fetched.messages[1])  # an ack or a nack frees its room too (an actor that never took it)
    assert consumer.meets(handover, fetched.messages[2]) and consumer.meets(handover, fetched.messages[3])
    assert not handover.room_to_yield(QUEUE, wait_s=0)


def test_a_closing_consumer_requeues_its_cache_but_not_the_riders() -> None:
    handover = _handover(together=3)
    fetched = Fetched(handover, [_body(f"b-{n}", n) for n in range(4)])
    cache = [m.encode() for m in fetched.messages[1:]]
    handed = handover.take(fetched.messages[0])
    assert handed is not None
    three, two = handover.claim_together(handed)
    assert (three.redis_message_id, two.redis_message_id) == ("r3", "r2")
    three.ack.acknowledged()
    handover.finish("r3")
    # r3 is done and r2 in its leader's call: only r1 goes back to the queue.
    assert handover.cached(QUEUE, cache) == [fetched.messages[1].encode()]
    # Its leader gives r2 back afterwards: the queue's next consumer yields it.
    handover.give_back("r2", None)
    again = handover.returned(QUEUE)
    assert again is not None and again.message_id == fetched.messages[2].message_id
    got = handover.take(again)
    assert got is not None and got.settled is None and got.upload == VALID


def test_one_at_a_time_claims_nothing() -> None:
    handover = _handover(together=1)
    fetched = Fetched(handover, [_body("b-0", 0), _body("b-1", 1)])
    handed = handover.take(fetched.messages[0])
    assert handed is not None and handover.claim_together(handed) == []


def _leading(bodies: list[dict[str, object]], store: TogetherStore) -> tuple[MessageHandover, Fetched, ImportRunner, Handed]:
    """A handover that fetched ``bodies``, and the first one's delivery taken by a runner on ``store``."""
    handover = _handover(together=len(bodies))
    fetched = Fetched(handover, bodies)
    runner = ImportRunner(store, Settings(accepted_versions=frozenset({1})))  # type: ignore[arg-type]
    handed = handover.take(fetched.messages[0])
    assert handed is not None
    return handover, fetched, runner, handed


def test_the_runner_shares_its_call_with_the_riders_it_accepts_and_finishes_the_acknowledged_ones() -> None:
    """ImportRunner.run with riders: one call for its own import and every
    rider whose message it accepts; a rider of a contract version it does not
    accept stays out (given back: its own actor records the rejection)."""
    bodies = [_body("b-0", 0), {"version": 99, "jobId": "shipment-b-1"}, _body("b-2", 2)]
    store = TogetherStore(acknowledge=True)
    handover, fetched, runner, handed = _leading(bodies, store)
    assert runner.run(bodies[0], "m-0", handed, handover) == "applied"
    (call,) = store.calls
    assert [i.job_id for i in call] == ["shipment-b-0", "shipment-b-2"]
    assert handover.take(fetched.messages[2]) is None  # finished by its leader: no actor of its own
    one = handover.take(fetched.messages[1])
    assert one is not None and one.settled is None  # runs on its own


def test_a_rider_whose_message_the_call_did_not_acknowledge_is_given_back_with_its_outcome() -> None:
    bodies = [_body("b-0", 0), _body("b-1", 1)]
    handover, fetched, runner, handed = _leading(bodies, TogetherStore(acknowledge=False))
    assert runner.run(bodies[0], "m-0", handed, handover) == "applied"
    one = handover.take(fetched.messages[1])
    assert one is not None and isinstance(one.settled, Settled) and one.settled.outcome.kind == "started"


def test_a_failed_call_gives_every_rider_back_to_run_on_its_own() -> None:
    bodies = [_body("b-0", 0), _body("b-1", 1), _body("b-2", 2)]
    handover, fetched, runner, handed = _leading(bodies, TogetherStore(fail=ConnectionError("store away")))
    with pytest.raises(ConnectionError):
        runner.run(bodies[0], "m-0", handed, handover)
    for message in fetched.messages[1:]:
        got = handover.take(message)
        assert got is not None and got.settled is None and got.upload == VALID
