"""The part of the Redis store every port shares: the client, keys and scripts."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import redis

from importer.adapters.redis.client import ImporterRedis, ImporterRedisCluster, RedisClient
from importer.adapters.redis.errors import store_errors
from importer.adapters.redis.keys import Keys
from importer.adapters.redis.records import GroupWriter, MessageWriter, parse_versions, text_of
from importer.adapters.redis.scripts import SCRIPT_NAMES, lua_source
from importer.adapters.settings import Settings
from importer.domain.ledger import ArchiveLookup, ShipmentHistory
from importer.domain.locations import MAIN, location_of_job


class RedisStoreBase:
    """What every part of the store shares: the client, the key names, the
    settings, the clock and the registered scripts. Built by the composition
    root as :class:`importer.adapters.redis.store.RedisStore`.

    With ``messages`` (the producer on the Redis transport, when the broker
    uses this very Redis), :meth:`enqueue` writes the job's dramatiq message in
    the same script as its record: one round trip, no unsent window.
    """

    def __init__(
        self, client: RedisClient, settings: Settings, *, clock_ms: Callable[[], int], messages: MessageWriter | None = None,
        groups: GroupWriter | None = None,
    ) -> None:
        self.client = client
        self.settings = settings
        #: The control partition's keys: location main's, and what spans locations.
        self.keys = Keys(settings.key_prefix)
        self._partitions: dict[str, Keys] = {MAIN: self.keys}
        self._now = clock_ms
        self.messages = messages
        #: With ``messages``: the group message that enqueue_many.lua fills with the small jobs it records.
        self.groups = groups
        #: [ledger] Where the worker asks about a batch whose done marker may have left
        #: Redis (the door, apply.lua); None: no ledger configured.
        self.archive: ArchiveLookup | None = None
        #: [ledger] Where owner reads find a shipment Redis no longer holds; None: no ledger.
        self.history: ShipmentHistory | None = None
        #: [ledger] Whether a location's Redis is behind the ledger (adapters/processes/ledger_sync.py
        #: SyncWatch): nothing is enqueued or applied there until it is brought forward.
        self.behind: Callable[[str], bool] = lambda location: False
        self._scripts = {name: client.register_script(lua_source(name)) for name in SCRIPT_NAMES}

    def partition(self, location: str) -> Keys:
        """The keys of a location's partition (domain/locations.py): one hash tag, one slot."""
        keys = self._partitions.get(location)
        if keys is None:
            keys = self._partitions[location] = Keys(self.settings.key_prefix, location)
        return keys

    def partition_of(self, job_id: str) -> Keys:
        """The keys of the partition that holds this job (its id names the location)."""
        return self.partition(location_of_job(job_id))

    def live_workers(self) -> dict[str, frozenset[int]]:
        """Worker id -> accepted versions of every live worker (expiry not past
        on the server's clock), as enqueue.lua's door check sees them (live_workers.lua)."""
        with store_errors():
            flat = self._script("live_workers", keys=[self.keys.workers, self.keys.workers_accepts], args=[])
        return {text_of(flat[i]): parse_versions(text_of(flat[i + 1])) for i in range(0, len(flat), 2)}

    def server_time_ms(self) -> int:
        """The Redis server's clock (every liveness and lag is measured by it)."""
        with store_errors():
            seconds, micros = self.client.time()
        return int(seconds) * 1000 + int(micros) // 1000

    def declare_locations(self, names: Iterable[str]) -> list[str]:
        """Declare stock locations (the control partition's registry, which admit.lua
        checks); returns those that were not declared yet."""
        new = sorted({n for n in names if n != MAIN})
        if not new:
            return []
        with store_errors():
            pipe = self.client.pipeline(transaction=False)
            for name in new:
                pipe.sadd(self.keys.locations, name)
            added = pipe.execute()
        return [name for name, was_added in zip(new, added) if int(was_added)]

    def locations(self) -> list[str]:
        """main and every declared location (the control partition's registry), sorted."""
        with store_errors():
            others = self.client.smembers(self.keys.locations)
        return [MAIN, *sorted(text_of(v) for v in others if text_of(v) != MAIN)]

    def _script(self, name: str, *, keys: list[Any], args: list[Any]) -> Any:
        """One script call: on the calling thread's own connection when the
        client is Importer's (ImporterRedis.run_script), else as redis-py's Script."""
        script = self._scripts[name]
        if isinstance(self.client, (ImporterRedis, ImporterRedisCluster)):
            return self.client.run_script(script, keys, args)
        return script(keys=keys, args=args)

    def _script_shared(self, name: str, *, keys: list[Any], args: list[Any]) -> Any:
        """As :meth:`_script`, for the calls of a request path (a POST's enqueue):
        such calls from threads of this process that meet share one round trip
        (ThreadConnections.run_script_shared); a lone call goes at once.
        IMPORTER_SHARE_ROUND_TRIPS=0: as _script."""
        if self.settings.share_round_trips and isinstance(self.client, (ImporterRedis, ImporterRedisCluster)):
            return self.client.run_script_shared(self._scripts[name], keys, args)
        return self._script(name, keys=keys, args=args)

    def _pipelined(self, calls: list[tuple[str, list[Any], list[Any]]]) -> list[Any]:
        """Run several scripts in one round trip, by EVALSHA.

        redis-py's Script objects in a pipeline first ask SCRIPT EXISTS, which
        costs a round trip per pipeline. Here a script the server has
        forgotten (restart, SCRIPT FLUSH) fails with NOSCRIPT and only the
        calls that failed are loaded and run again, in order.
        """
        if isinstance(self.client, redis.RedisCluster):
            # A cluster pipeline carries no EVALSHA (redis-py): one call each, routed by its keys' slot.
            return [self._script(name, keys=keys, args=args) for name, keys, args in calls]
        pending = list(range(len(calls)))
        results: list[Any] = [None] * len(calls)
        for _ in range(2):
            pipe = self.client.pipeline(transaction=False)
            for i in pending:
                name, keys, args = calls[i]
                pipe.evalsha(self._scripts[name].sha, len(keys), *keys, *args)
            replies = pipe.execute(raise_on_error=False)
            missing = []
            for i, reply in zip(pending, replies):
                if isinstance(reply, redis.exceptions.NoScriptError):
                    missing.append(i)
                elif isinstance(reply, Exception):
                    raise reply
                else:
                    results[i] = reply
            if not missing:
                return results
            for i in missing:
                self.client.script_load(self._scripts[calls[i][0]].script)
            pending = missing
        raise redis.exceptions.NoScriptError("scripts could not be loaded")
