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
