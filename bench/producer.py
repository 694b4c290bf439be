"""Importer's producer path, in-process, for the scenarios that pre-enqueue jobs with no worker running.

One function per upload, ``ImporterProducer.submit``: the product's own enqueue sequence (content identity,
record, send, mark sent), so the bench never re-implements it elsewhere.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import redis
from importer.adapters.bootstrap import clock_ms
from importer.adapters.queue import ImportQueue, build_broker
from importer.adapters.redis_store import RedisStore
from importer.adapters.settings import Settings
from importer.domain.shipment import job_id_for, parse_shipment

from bench.common import OWNER, BenchError


class ImporterProducer:
    def __init__(self, url: str, env: dict[str, str]) -> None:
        self.settings = Settings.from_env(env)
        self.client = redis.Redis.from_url(url, socket_timeout=30)
        self.store = RedisStore(self.client, self.settings, clock_ms=clock_ms)
        self.broker = build_broker(self.settings, self.client)
        self.queue = ImportQueue(self.broker, self.settings)

    def submit(self, batch_id: str, csv: bytes) -> str:
        """Record and send one import; returns its upload id."""
        job_id = job_id_for(batch_id)
        parsed = parse_shipment(csv, max_rows=self.settings.max_rows)
        if not hasattr(parsed, "content_sha256"):
            raise BenchError(f"the bench's own CSV for {batch_id} is invalid: {parsed}")
        upload_id = uuid.uuid4().hex
        outcome = self.store.enqueue(
            job_id=job_id, batch_id=batch_id, owner=OWNER, content_sha256=parsed.content_sha256,
            upload_id=upload_id, csv=csv,
        )
        if outcome.kind != "created":
            raise BenchError(f"enqueue of {job_id}: {outcome}")
        self.queue.send(job_id=job_id, batch_id=batch_id, upload_id=upload_id)
        self.store.mark_sent(job_id)
        return upload_id

    def close(self) -> None:
        self.broker.close()
        self.client.close()


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
