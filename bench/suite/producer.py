"""Importer's producer path, in-process, for the scenarios that pre-enqueue jobs with no worker running.

The product's own use case, ``importer.domain.submit_import.submit_import``, over the store and sender that
the HTTP composition root (``importer.adapters.bootstrap.build_http``) builds: the bench does not
re-implement the enqueue sequence.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from importer.adapters.bootstrap import build_http
from importer.adapters.settings import Settings
from importer.domain.submit_import import Upload, send_recorded, submit_import, submit_imports

from bench.suite.common import OWNER, BenchError


class ImporterProducer:
    def __init__(self, url: str, env: dict[str, str]) -> None:
        self.settings = Settings.from_env(dict(env, IMPORTER_REDIS_URL=url))
        self.side = build_http(self.settings)
        self.client = self.side.client

    def submit(self, batch_id: str, csv: bytes) -> str:
        """Record and send one new import; returns its upload id."""
        upload_id = uuid.uuid4().hex
        accepted = submit_import(
            self.side.api.store, self.side.api.sender, owner=OWNER, batch_id=batch_id, csv=csv,
            upload_id=upload_id, max_rows=self.settings.max_rows,
        )
        if accepted.state != "waiting":
            raise BenchError(f"enqueue of {batch_id}: the job already existed ({accepted})")
        return upload_id

    def submit_bulk(self, shipments: list[tuple[str, bytes]]) -> None:
        """Record new imports as one bulk request does (handlers/bulk.py): all
        in one enqueue_many.lua pipeline, whose calls write one group message
        per location and per GROUP_MAX (every worker reads groups: the bench's
        workers are this release's); what was left to send later (none on
        the Redis transport) is sent together."""
        later: list[tuple[str, str, str]] = []
        uploads = [Upload(batch_id, csv, uuid.uuid4().hex, send_later=True) for batch_id, csv in shipments]
        results = submit_imports(self.side.api.store, self.side.api.sender, uploads, owner=OWNER,
                                 max_rows=self.settings.max_rows, send_later=later)
        for (batch_id, _), accepted in zip(shipments, results):
            if isinstance(accepted, Exception) or accepted.state != "waiting":
                raise BenchError(f"enqueue of {batch_id}: {accepted!r}")
        for job_id, exc in send_recorded(self.side.api.store, self.side.api.sender, later, grouped=True):
            if exc is not None:
                raise BenchError(f"send of {job_id}: {exc!r}")

    def close(self) -> None:
        self.side.close()


def parallel(work: Callable[[range], None], n: int, threads: int = 4) -> None:
    """Split range(n) over a few threads and wait for all of them."""
    step = -(-n // threads)
    chunks = [range(s, min(n, s + step)) for s in range(0, n, step)]
    with ThreadPoolExecutor(threads) as pool:
        for fut in [pool.submit(work, c) for c in chunks]:
            fut.result()


def preenqueue_importer(url: str, env: dict[str, str], n: int, tag: str, csv: Callable[[int], bytes]) -> None:
    """N imports named <tag>-<i> through Importer's producer path, 4 threads, no worker running."""
    producer = ImporterProducer(url, env)

    def work(indices: range) -> None:
        for i in indices:
            producer.submit(f"{tag}-{i}", csv(i))

    try:
        parallel(work, n)
    finally:
        producer.close()


def preenqueue_importer_bulk(
    url: str, env: dict[str, str], n: int, tag: str, csv: Callable[[int], bytes], per_request: int = 100,
) -> None:
    """N imports named <tag>-<i> as bulk requests of ``per_request`` shipments (the bulk intake's path,
    in process), 4 threads, no worker running."""
    producer = ImporterProducer(url, env)

    def work(indices: range) -> None:
        for start in range(indices.start, indices.stop, per_request):
            producer.submit_bulk([(f"{tag}-{i}", csv(i)) for i in range(start, min(indices.stop, start + per_request))])

    try:
        parallel(work, n)
    finally:
        producer.close()
