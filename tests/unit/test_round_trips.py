"""SharedRoundTrips (adapters/redis/round_trips.py), the group commit of the
HTTP side, with the interleavings forced: the round trip's ``send`` is held
until the test has queued the calls it wants behind it.

The real server's side (MONITOR, a cut connection, a timeout) is in
tests/integration/test_shared_round_trips.py."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace
from typing import Any

import pytest
import redis

from importer.adapters.redis import round_trips
from importer.adapters.redis.round_trips import SharedRoundTrips


class CountingLock:
    """A lock that counts its releases: how often a waiting call was woken."""

    made: list[CountingLock] = []

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.releases = 0
        CountingLock.made.append(self)

    def acquire(self, *args: Any) -> bool:
        return self._lock.acquire(*args)

    def release(self) -> None:
        self.releases += 1
        self._lock.release()

    __enter__ = acquire

    def __exit__(self, *exc: object) -> None:
        self._lock.release()


class HeldSend:
    """``send`` for the round trips: records each round trip's calls and holds
    it until the test releases it; answers with ``reply(calls)``, one reply each."""

    def __init__(self, reply: Any = lambda calls: [f"re:{c}" for c in calls]) -> None:
        self.trips: list[list[str]] = []
        self.gates: list[threading.Event] = []
        self.reply = reply

    def __call__(self, calls: list[str]) -> list[Any]:
        gate = threading.Event()
        self.trips.append(list(calls))
        self.gates.append(gate)
        assert gate.wait(10), "the test never released the round trip"
        return self.reply(calls)  # type: ignore[no-any-return]


@pytest.fixture
def sharing(monkeypatch: pytest.MonkeyPatch) -> SharedRoundTrips:
    shared = SharedRoundTrips()  # its own lock is a plain one
    CountingLock.made = []
    monkeypatch.setattr(round_trips, "threading", SimpleNamespace(Lock=CountingLock))
    return shared


def until(check: Any, what: str) -> None:
    deadline = time.monotonic() + 10
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.002)


def start(sharing: SharedRoundTrips, send: Any, request: str, out: dict[str, Any]) -> threading.Thread:
    t = threading.Thread(target=lambda: out.__setitem__(request, sharing.call(request, send)))
    t.start()
    return t


def behind_a_held_round_trip(sharing: SharedRoundTrips, held: HeldSend, out: dict[str, Any],
                             followers: tuple[str, ...], send: Any = None) -> list[threading.Thread]:
    """Call "a", which leads a round trip at once (held), then ``followers``, which
    queue behind it; ``send`` (``held`` itself by default) sends the round trips."""
    send = send or held
    lead = start(sharing, send, "a", out)
    until(lambda: len(held.trips) == 1, "a leads at once")
    queued = [start(sharing, send, r, out) for r in followers]
    until(lambda: len(sharing._queued) == len(followers), "the followers queue behind a's round trip")
    return [lead, *queued]


def test_each_waiting_call_is_woken_once_with_its_reply_or_to_lead_the_next_round_trip(sharing: SharedRoundTrips) -> None:
    send = HeldSend()
    out: dict[str, Any] = {}
    threads = behind_a_held_round_trip(sharing, send, out, ("b", "c"))
    send.gates[0].set()
    until(lambda: len(send.trips) == 2, "b leads the next round trip, with c")
    late = start(sharing, send, "d", out)
    until(lambda: len(sharing._queued) == 1, "d queues behind b's round trip")
    send.gates[1].set()
    until(lambda: len(send.trips) == 3, "d leads the third round trip")
    send.gates[2].set()
    for t in (*threads, late):
        t.join(10)

    assert send.trips == [["a"], ["b", "c"], ["d"]]
    assert out == {"a": "re:a", "b": "re:b", "c": "re:c", "d": "re:d"}
    assert (sharing.round_trips, sharing.calls) == (3, 4)
    # b, c and d waited: each was woken exactly once (b and d to lead, c with its reply);
    # the lone leader a never waited.
    assert [lock.releases for lock in CountingLock.made] == [1, 1, 1]
    assert not sharing._sending and not sharing._queued


def test_calls_queued_behind_a_round_trip_the_store_did_not_answer_fail_at_once(sharing: SharedRoundTrips) -> None:
    send = HeldSend(reply=lambda calls: [redis.TimeoutError("Timeout reading from socket")] * len(calls))
    out: dict[str, Any] = {}
    threads = behind_a_held_round_trip(sharing, send, out, ("b", "c"))
    send.gates[0].set()
    for t in threads:
        t.join(10)

    assert send.trips == [["a"]]  # b and c were never sent
    assert isinstance(out["a"], redis.TimeoutError)
    for r in ("b", "c"):
        assert isinstance(out[r], redis.ConnectionError) and "round trip ahead" in str(out[r])
    assert [lock.releases for lock in CountingLock.made] == [1, 1]
    # The next call is sent at once, on its own.
    send.reply = lambda calls: [f"re:{c}" for c in calls]
    after: dict[str, Any] = {}
    t = start(sharing, send, "e", after)
    until(lambda: len(send.trips) == 2, "e leads at once")
    send.gates[1].set()
    t.join(10)
    assert after == {"e": "re:e"}


def test_a_round_trip_that_raised_fails_only_its_own_calls(sharing: SharedRoundTrips) -> None:
    failing = ValueError("a script the store refused")
    send = HeldSend()

    def raising_once(calls: list[str]) -> list[Any]:
        answer = send(calls)
        if calls == ["a"]:
            raise failing
        return answer

    out: dict[str, Any] = {}
    threads = behind_a_held_round_trip(sharing, send, out, ("b",), send=raising_once)
    send.gates[0].set()
    until(lambda: len(send.trips) == 2, "b leads the next round trip")
    send.gates[1].set()
    for t in threads:
        t.join(10)

    assert out == {"a": failing, "b": "re:b"}
    assert [lock.releases for lock in CountingLock.made] == [1]


def test_a_leader_interrupted_by_a_base_exception_raises_it_and_its_followers_get_a_connection_error(
    sharing: SharedRoundTrips,
) -> None:
    send = HeldSend()

    def interrupted(calls: list[str]) -> list[Any]:
        send(calls)
        raise KeyboardInterrupt

    out: dict[str, Any] = {}
    raised: list[BaseException] = []

    def leader() -> None:
        try:
            sharing.call("a", interrupted)
        except BaseException as exc:  # noqa: BLE001 - the test checks which
            raised.append(exc)

    lead = threading.Thread(target=leader)
    lead.start()
    until(lambda: len(send.trips) == 1, "a leads at once")
    queued = start(sharing, interrupted, "b", out)
    until(lambda: len(sharing._queued) == 1, "b queues")
    send.gates[0].set()
    for t in (lead, queued):
        t.join(10)

    assert len(raised) == 1 and isinstance(raised[0], KeyboardInterrupt)
    # b was queued behind a round trip that got no answer: it fails at once, never sent.
    assert isinstance(out["b"], redis.ConnectionError)
    assert send.trips == [["a"]]
    assert not sharing._sending and not sharing._queued
