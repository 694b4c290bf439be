"""[door] A worker process's presence beat (adapters/dramatiq/presence.py), against a small recording store."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from importer.adapters.redis.errors import StoreUnavailable
from importer.adapters.settings import Settings
from importer.adapters.dramatiq.presence import WorkerPresence, new_worker_id


@dataclass
class PresenceStore:
    calls: list[tuple[str, ...]] = field(default_factory=list)
    down: bool = False

    infos: list[dict[str, object]] = field(default_factory=list)

    def announce_worker(self, worker_id: str, accepts: frozenset[int], window_ms: int, info: str = "{}") -> int:
        if self.down:
            raise StoreUnavailable("down")
        self.infos.append(json.loads(info))
        self.calls.append(("announce", worker_id, ",".join(map(str, sorted(accepts))), str(window_ms)))
        return 1

    def remove_worker(self, worker_id: str) -> None:
        if self.down:
            raise StoreUnavailable("down")
        self.calls.append(("remove", worker_id))

    def declare_locations(self, names: list[str]) -> list[str]:
        if self.down:
            raise StoreUnavailable("down")
        self.calls.append(("declare", *names))
        return names


def presence(store: PresenceStore) -> WorkerPresence:
    settings = Settings(accepted_versions=frozenset({1, 2}), heartbeat_timeout_s=15.0)
    return WorkerPresence(store, settings, worker_id="w1")  # type: ignore[arg-type]


def test_it_announces_its_versions_for_the_heartbeat_window_every_third_of_it() -> None:
    store = PresenceStore()
    beat = presence(store)
    assert beat.interval_s == 5.0
    assert beat.beat() is True
    assert store.calls == [("announce", "w1", "1,2", "15000")]


def test_it_leaves_when_it_stops_and_never_announces_again() -> None:
    store = PresenceStore()
    beat = presence(store)
    beat.before_worker_shutdown(None, None)
    assert store.calls == [("remove", "w1")]
    assert beat.beat() is False  # a beat after the goodbye would make it live again
    assert store.calls == [("remove", "w1")]


def test_a_sick_redis_neither_kills_the_beat_nor_the_shutdown() -> None:
    store = PresenceStore(down=True)
    beat = presence(store)
    assert beat.beat() is False
    beat.before_worker_shutdown(None, None)  # no exception: the entry expires on its own
    assert store.calls == []


def test_worker_ids_are_unique_and_readable() -> None:
    first, second = new_worker_id(), new_worker_id()
    assert first != second and first.count(":") == 2


def test_the_configured_locations_are_declared_with_the_first_beat_redis_takes() -> None:
    """IMPORTER_LOCATIONS, declared by a worker started while Redis was away once it is back."""
    store = PresenceStore(down=True)
    settings = Settings(locations=("paris", "lyon"), default_location="rome", heartbeat_timeout_s=15.0)
    beats = WorkerPresence(store, settings, worker_id="w1")  # type: ignore[arg-type]
    assert beats.beat() is False and store.calls == []
    store.down = False
    assert beats.beat() is True and beats.beat() is True
    assert [c for c in store.calls if c[0] == "declare"] == [("declare", "lyon", "paris", "rome")]  # once


def test_each_beat_tells_the_operators_its_release_and_the_messages_it_runs() -> None:
    store = PresenceStore()
    presence = WorkerPresence(store, Settings.from_env({}), worker_id="w1")  # type: ignore[arg-type]
    presence.before_process_message(None, None)
    presence.before_process_message(None, None)
    presence.after_process_message(None, None, result=None)
    assert presence.beat() is True
    info = store.infos[-1]
    assert info["inFlight"] == 1 and info["pid"] > 0 and info["release"] and info["startedAt"] > 0
    presence.after_skip_message(None, None)
    presence.after_skip_message(None, None)  # never below zero
    presence.beat()
    assert store.infos[-1]["inFlight"] == 0
