"""Every Redis key name of Importer, made in one place."""

from __future__ import annotations

from importer.domain.locations import MAIN


def location_prefix(prefix: str, location: str) -> str:
    """The key prefix of a location's partition: its own hash tag, so one
    script's keys are always in one Redis Cluster slot. The partition of
    ``main`` is the prefix itself (a single-location install's keys, as they
    always were); ``{importer}:`` + paris -> ``{importer@paris}:``."""
    if location == MAIN:
        return prefix
    close = prefix.index("}")
    return f"{prefix[:close]}@{location}{prefix[close:]}"


def location_upload_prefix(prefix: str) -> tuple[str, str]:
    """('{importer@', '}:upload:'): another location's upload prefix is the first, its name, the second (fetch.lua)."""
    head, tail = location_prefix(prefix, "\0").split("\0")
    return head, f"{tail}upload:"


class LocationQueues:
    """Where each location's dramatiq messages live (dramatiq's Redis broker).

    On a Redis Cluster each location's queue is in its own partition
    (``{importer@paris}:dramatiq:imports@paris``), so the fetch that brings an
    upload and the script that applies it and acknowledges the message touch
    one slot: one script call per import at any location. On one node every
    location shares main's queue (one consumer serves them all; a script may
    reach any key there). The queue's name says its location, so every
    dispatch call (fetch, ack, requeue, the delay queue's) finds its namespace
    from the name alone.
    """

    def __init__(self, prefix: str, queue_name: str, *, per_location: bool) -> None:
        self.prefix = prefix
        self.queue_name = queue_name
        self.per_location = per_location
        self._namespaces: dict[str, str] = {}

    def queue_of(self, location: str) -> str:
        """The dramatiq queue of a location's messages: ``imports``, or ``imports@paris`` on a cluster."""
        if location == MAIN or not self.per_location:
            return self.queue_name
        return f"{self.queue_name}@{location}"

    def location_of(self, queue_name: str) -> str:
        """The location whose partition holds a queue (its delay queue ``.DQ`` and dead letters ``.XQ`` alike)."""
        base = queue_name[:-3] if queue_name.endswith((".DQ", ".XQ")) else queue_name
        head, at, location = base.rpartition("@")
        return location if at and head == self.queue_name else MAIN

    def namespace_of(self, queue_name: str) -> str:
        """dramatiq's namespace (the KEYS[1] of its dispatch script) for a queue."""
        namespace = self._namespaces.get(queue_name)
        if namespace is None:
            namespace = self._namespaces[queue_name] = Keys(self.prefix, self.location_of(queue_name)).dramatiq
        return namespace

    def dispatch_keys(self, queue_name: str) -> list[str]:
        """The KEYS of a dispatch call (fetch, ack, requeue...) on a queue:
        dramatiq's script reads only KEYS[1], its namespace, a key that never
        exists. The queue's list is declared beside it so that the call is a
        multi-key one: while its slot is migrating between two cluster nodes
        Redis answers TRYAGAIN (the consumer waits) instead of running it on
        the target node, where it would create a second copy of the queue's
        keys and stop the move with BUSYKEY."""
        namespace = self.namespace_of(queue_name)
        return [namespace, f"{namespace}:{queue_name}"]

    def upload_prefix_of(self, queue_name: str) -> str:
        """The upload key prefix of the jobs whose messages a queue holds
        (main's on one node: another location's message there brings no upload)."""
        return Keys(self.prefix, self.location_of(queue_name)).upload("")

    def is_import_queue(self, queue_name: str) -> bool:
        """A queue of import messages (not a delay queue): main's or a location's."""
        if queue_name.endswith((".DQ", ".XQ")):
            return False
        return queue_name == self.queue_name or self.location_of(queue_name) != MAIN


class Keys:
    """Every key name, under one hash-tagged prefix: the one place they are made.

    The Lua scripts get every one of them as KEYS (Redis Cluster's rule; see
    the layout in adapters/redis/lua/common.lua).
    """

    def __init__(self, prefix: str, location: str = MAIN) -> None:
        #: The location this partition holds; the control keys (workers, rate,
        #: the locations registry, dramatiq's namespace) are main's (a partition's own are unused).
        self.location = location
        self.prefix = prefix = location_prefix(prefix, location)
        self.stock = f"{prefix}stock"
        self.generation = f"{prefix}generation"
        self.journal = f"{prefix}journal"
        self.events = f"{prefix}events"
        self.stats = f"{prefix}stats"
        # The job indexes (zsets of jobId), P:jobs:<name>.
        self.unsent, self.waiting, self.active, self.completed, self.failed = (
            f"{prefix}jobs:{name}" for name in ("unsent", "waiting", "active", "completed", "failed")
        )
        #: zset jobId -> finishedAt: final, not yet in its owner's retention index
        #: (the job steps cannot name that index; the retention pass moves it, upkeep.py).
        self.finished_new = f"{prefix}jobs:finished:new"
        #: dramatiq's Redis broker namespace (its queues).
        self.dramatiq = f"{prefix}dramatiq"
        #: /health's write probe (a tiny expiring string).
        self.health = f"{prefix}health"
        #: A tiny expiring string written just before WAIT (ThreadConnections.wait_replicated):
        #: its write moves the partition's master's replication offset past every earlier write.
        self.replicated = f"{prefix}replicated"
        #: Reconciler: P:jobs:deadline (jobId -> deadline ms of every sent, non-final job),
        #: P:fence (the attempts' fencing tokens), its lock.
        self.deadline = f"{prefix}jobs:deadline"
        self.fence = f"{prefix}fence"
        self.reconciler_lock = f"{prefix}reconciler:lock"
        #: The server time of the last reconciler pass (reconcile.lua, "Blame").
        self.reconciler_pass = f"{prefix}reconciler:pass"
        #: [door] live workers: P:workers (id -> expiry ms), P:workers:accepts (id -> "1,2").
        self.workers = f"{prefix}workers"
        self.workers_accepts = f"{prefix}workers:accepts"
        #: [control] set: every location but main that ever had a job (the reconciler,
        #: the observer and /metrics go over them).
        self.locations = f"{prefix}locations"
        #: [ops] hash, control partition: location ('*': every one) -> JSON {by, at} of the operator
        #: who paused its intake (enqueue.lua, admit.lua refuse new uploads there).
        self.intake_paused = f"{prefix}intake:paused"
        #: [ops] hash, control partition: worker id -> JSON {release, pid, host, inFlight, startedAt} (presence.lua).
        self.workers_info = f"{prefix}workers:info"
        #: [ops] stream, control partition: what operators did, by whom and when (capped).
        self.ops_actions = f"{prefix}ops:actions"
        #: [ledger] string: how many times done markers were pruned here (ledger_prune.lua);
        #: absent until the first pruning (apply.lua's door).
        self.ledger_pruned = f"{prefix}ledger:pruned"
        #: [ledger] string: a Bloom filter of the batchIds whose marker was pruned here (common.lua).
        self.ledger_pruned_filter = f"{prefix}ledger:pruned:filter"
        #: [ledger] zset batchId -> appliedAt ms: done markers whose journal entry and receipt the
        #: ledger holds and Redis dropped (ledger_trim.lua), to prune past the idempotency horizon.
        self.ledger_markers = f"{prefix}ledger:markers"
        #: [ledger] hash: this location's Redis was found behind the ledger (since, shipments, seconds,
        #: reason); intake, applies and the export wait until the restore deletes it (adapters/redis/sync.py).
        self.ledger_behind = f"{prefix}ledger:behind"
        #: [ledger] string: the restore's lock (a token with a TTL).
        self.ledger_restoring = f"{prefix}ledger:restoring"

    def job(self, job_id: str) -> str:
        return f"{self.prefix}job:{job_id}"

    def rejections(self, job_id: str) -> str:
        """string: a failed validation's rejection report (JSON), removed with the record."""
        return f"{self.job(job_id)}:rejections"

    def upload(self, upload_id: str) -> str:
        return f"{self.prefix}upload:{upload_id}"

    def done(self, batch_id: str) -> str:
        return f"{self.prefix}done:{batch_id}"

    def receipt(self, batch_id: str) -> str:
        """string: what the batch's application changed ('sku,before,quantity\\n' per row, domain/receipt.py),
        written with the done marker and kept forever like it."""
        return f"{self.prefix}receipt:{batch_id}"

    def owner_jobs(self, owner: str) -> str:
        """zset jobId -> createdAt: one owner's job records (GET /api/imports)."""
        return f"{self.prefix}jobs:owner:{owner}"

    def owner_locations(self, owner: str) -> str:
        """[control] set: the locations but main where ``owner`` has job records (GET /api/imports)."""
        return f"{self.prefix}locations:owner:{owner}"

    def job_events(self, job_id: str) -> str:
        """stream: one job's events, under the same ids as in P:events."""
        return f"{self.events}:{job_id}"

    def workers_accepting(self, version: int | str) -> str:
        """[door] zset worker id -> expiry ms of the workers that accept ``version`` ('' = the name prefix)."""
        return f"{self.workers}:v{version}"

    def rate(self, owner: str, window: int) -> str:
        return f"{self.prefix}rate:{owner}:{window}"

    def completed_of(self, owner: str) -> str:
        """One owner's completed records (retention counts per owner)."""
        return f"{self.completed}:{owner}"

    def failed_of(self, owner: str) -> str:
        """One owner's failed records (retention counts per owner)."""
        return f"{self.failed}:{owner}"
