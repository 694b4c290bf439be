"""dramatiq's middleware hooks called only on the middleware that has them
(adapters/dramatiq/hooks.py), beside dramatiq's own Broker on the same middleware."""

from __future__ import annotations

from typing import Any

import pytest
from dramatiq import Middleware
from dramatiq.brokers.stub import StubBroker
from dramatiq.middleware import SkipMessage

from importer.adapters.dramatiq.hooks import OwnHooksOnly, own_hooks


class Recording(Middleware):
    def __init__(self, name: str, calls: list[str]) -> None:
        self.name, self.calls = name, calls

    def before_process_message(self, broker: Any, message: Any) -> None:
        self.calls.append(f"{self.name}.before_process_message({message})")

    def after_process_message(self, broker: Any, message: Any, *, result: Any = None, exception: Any = None) -> None:
        self.calls.append(f"{self.name}.after_process_message({message}, {result}, {exception})")

    def after_ack(self, broker: Any, message: Any) -> None:
        self.calls.append(f"{self.name}.after_ack({message})")


class Failing(Recording):
    def before_process_message(self, broker: Any, message: Any) -> None:
        super().before_process_message(broker, message)
        raise RuntimeError("a middleware's bug")


class Skipping(Recording):
    def before_process_message(self, broker: Any, message: Any) -> None:
        super().before_process_message(broker, message)
        raise SkipMessage()


class Plain(Middleware):
    """Overrides no hook: dramatiq calls its no-ops, the mixin skips them."""


class OwnHooksBroker(OwnHooksOnly, StubBroker):
    pass


def _emit_all(broker: Any) -> None:
    broker.emit_before("process_message", "m1")
    broker.emit_after("process_message", "m1", result=42)
    broker.emit_before("ack", "m1")
    broker.emit_after("ack", "m1")
    broker.emit_after("skip_message", "m1")


def _brokers(kinds: list[type[Middleware]]) -> tuple[list[str], list[str], Any, Any]:
    dramatiqs: list[str] = []
    ours: list[str] = []

    def made(calls: list[str]) -> list[Middleware]:
        return [k(f"{k.__name__}{i}", calls) if issubclass(k, Recording) else k() for i, k in enumerate(kinds)]

    return dramatiqs, ours, StubBroker(middleware=made(dramatiqs)), OwnHooksBroker(middleware=made(ours))


def test_the_same_calls_in_the_same_order_as_dramatiqs_own_broker_and_a_failing_hook_only_logged() -> None:
    dramatiqs, ours, theirs, mine = _brokers([Recording, Plain, Failing, Recording, Plain])
    _emit_all(theirs)
    _emit_all(mine)
    assert ours == dramatiqs
    assert ours[:3] == ["Recording0.before_process_message(m1)", "Failing2.before_process_message(m1)",
                        "Recording3.before_process_message(m1)"]
    assert ours[3] == "Recording3.after_process_message(m1, 42, None)"  # after_*: in reverse


def test_a_skip_is_raised_to_dramatiqs_worker_as_its_own_broker_raises_it() -> None:
    dramatiqs, ours, theirs, mine = _brokers([Recording, Skipping, Recording])
    for broker in (theirs, mine):
        with pytest.raises(SkipMessage):
            broker.emit_before("process_message", "m1")
    assert ours == dramatiqs == ["Recording0.before_process_message(m1)", "Skipping1.before_process_message(m1)"]


def test_middleware_added_after_a_first_emit_has_its_hooks_called() -> None:
    calls: list[str] = []
    broker = OwnHooksBroker(middleware=[Recording("a", calls)])
    broker.emit_after("ack", "m1")
    broker.add_middleware(Recording("b", calls))
    broker.emit_after("ack", "m2")
    assert calls == ["a.after_ack(m1)", "b.after_ack(m2)", "a.after_ack(m2)"]


def test_only_the_middleware_that_override_a_hook_are_called() -> None:
    calls: list[str] = []
    middleware = [Plain(), Recording("r", calls), Plain()]
    assert [m for _, m in own_hooks(middleware, "before_process_message")] == [middleware[1]]
    assert own_hooks(middleware, "before_nack") == []


class Watched(Middleware):
    """Overrides no hook, and counts how often a hook of it is looked up."""

    looked_up = 0

    def __getattribute__(self, name: str) -> Any:
        if name.startswith(("before_", "after_")):
            type(self).looked_up += 1
        return super().__getattribute__(name)


def test_a_message_no_longer_goes_through_the_no_ops_of_middleware_that_have_none() -> None:
    theirs, mine = StubBroker(middleware=[Watched()]), OwnHooksBroker(middleware=[Watched()])
    for broker in (theirs, mine):
        _emit_all(broker)  # the first: the lists are made
        Watched.looked_up = 0
        for _ in range(3):
            _emit_all(broker)
        if broker is theirs:
            assert Watched.looked_up == 15  # dramatiq: 5 signals x 3
        else:
            assert Watched.looked_up == 0
