"""The Redis store: stock, done markers, journal, job records, uploads, events.

Every state change is one Lua script (lua/), so a record, its index entries
and the event that reports it change together or not at all. The scripts
are registered once per client (EVALSHA with a fallback to EVAL when the
server lost its script cache). One class per side of the store, combined
here into the one object the composition root builds:

* :class:`~importer.adapters.redis.recorder.JobRecorder`: the producer's side;
* :class:`~importer.adapters.redis.attempts.AttemptSteps`: the worker's side;
* :class:`~importer.adapters.redis.reads.JobReads`: owner-scoped reads;
* :class:`~importer.adapters.redis.upkeep.StoreUpkeep`: reconciler, presence, metrics, health;
* :class:`~importer.adapters.redis.outbox.LedgerOutbox`: the ledger's outbox (journal, receipts), trimmed once exported;
* :class:`~importer.adapters.redis.ops.OpsReads`: the operators' view and actions;
* :class:`~importer.adapters.redis.sync.LedgerSyncSide`: where Redis stands against the ledger, and its restore.
"""

from __future__ import annotations

from importer.adapters.redis.attempts import AttemptSteps
from importer.adapters.redis.ops import OpsReads
from importer.adapters.redis.outbox import LedgerOutbox
from importer.adapters.redis.reads import JobReads
from importer.adapters.redis.sync import LedgerSyncSide
from importer.adapters.redis.recorder import JobRecorder
from importer.adapters.redis.upkeep import StoreUpkeep


class RedisStore(JobRecorder, AttemptSteps, JobReads, StoreUpkeep, LedgerOutbox, OpsReads, LedgerSyncSide):
    """All of Importer's Redis state behind one object.

    With ``messages`` (the producer on the Redis transport, when the broker
    uses this very Redis), :meth:`enqueue` writes the job's dramatiq message in
    the same script as its record: one round trip, no unsent window.
    """
