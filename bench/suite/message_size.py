"""4. message size: bytes of the queue message for a 3-row and a 100,000-row import (Importer's dramatiq
message in ``.msgs``; the peer's BullMQ job hash), with no worker running."""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING

from importer.adapters.redis.keys import Keys
from importer.domain.shipment import job_id_for

from bench.suite.common import QUEUE, BenchError, csv_3rows, csv_rows, log, new_prefix
from bench.suite.producer import ImporterProducer
from bench.suite.report import same_size

if TYPE_CHECKING:
    from bench.suite.servers import Bench


def importer_sizes(b: Bench, rows: int) -> tuple[dict[str, int], dict[str, str]]:
    prefix = new_prefix("size")
    producer = ImporterProducer(b.url, b.importer_env(prefix))
    client = producer.client
    msgs_key = f"{Keys(prefix).dramatiq}:{QUEUE}.msgs"
    sizes: dict[str, int] = {}
    samples: dict[str, str] = {}
    try:
        for label, csv in (("small", csv_3rows(1)), ("large", csv_rows(rows))):
            batch_id = f"S{label[0]}{uuid.uuid4().hex[:10]}"  # same length for both
            before = set(client.hkeys(msgs_key))
            upload_id = producer.submit(batch_id, csv)
            new = [k for k in client.hkeys(msgs_key) if k not in before]
            if len(new) != 1:
                raise BenchError(f"expected one new message, found {len(new)}")
            data = client.hget(msgs_key, new[0]) or b""
            sizes[label] = len(data)
            samples[label] = data.decode(errors="replace")
            sizes[label + "_upload"] = int(client.strlen(Keys(prefix).upload(upload_id)))
    finally:
        producer.close()
        b.flush()
    return sizes, samples


def peer_sizes(b: Bench, rows: int) -> tuple[dict[str, int], str]:
    """Bytes of the BullMQ job hash (every field name and value) right after queue.add, and its fields."""
    assert b.peer is not None and b.client is not None
    prefix = new_prefix("speer")[:-1]
    proc = None
    sizes: dict[str, int] = {}
    sample = ""
    try:
        proc, port = b.peer.start_server(prefix)
        for label, csv in (("small", csv_3rows(1)), ("large", csv_rows(rows))):
            batch_id = f"S{label[0]}{uuid.uuid4().hex[:10]}"
            status, data, _ = b.post(port, f"/api/imports?batchId={batch_id}", csv, None)
            if status != 202:
                raise BenchError(f"peer POST answered {status}: {data[:200]!r}")
            fields = b.client.hgetall(b.peer.key(prefix, job_id_for(batch_id)))
            sizes[label] = sum(len(k) + len(v) for k, v in fields.items())
            if label == "large":
                sample = ", ".join(f"{k.decode()}={v.decode(errors='replace')}" for k, v in fields.items())
    finally:
        if proc is not None:
            b.procs.stop(proc)
        b.flush()
    return sizes, sample


def scenario_size(b: Bench) -> None:
    res = b.results
    rows = b.cfg.rows
    small = res.row("4. message size", "queue message bytes: 3-row import", "B")
    large = res.row("4. message size", f"queue message bytes: {rows:,}-row import", "B", base_label="Importer's 3-row message", target=same_size)
    log("message size: 3 rows vs %d rows" % rows)
    try:
        sizes, samples = importer_sizes(b, rows)
    except BenchError as exc:
        large.note = small.note = f"failed: {exc}"
        return
    for _ in range(max(1, b.cfg.repeat)):  # deterministic: the same figure each time
        small.imp.append(sizes["small"])
        large.imp.append(sizes["large"])
        large.base.append(sizes["small"])
    log(f"  Importer: 3 rows: {sizes['small']} B, {rows:,} rows: {sizes['large']} B (uploads {sizes['small_upload']:,} B / {sizes['large_upload']:,} B)")
    res.details.append(
        f"message size: 3-row message {sizes['small']} B (upload key {sizes['small_upload']:,} B), "
        f"{rows:,}-row message {sizes['large']} B (upload key {sizes['large_upload']:,} B). "
        f"The {rows:,}-row message as stored in `.msgs`: `{samples['large']}`"
    )
    if b.peer is None:
        return
    try:
        psizes, sample = peer_sizes(b, rows)
    except BenchError as exc:
        res.notes.append(f"message size of the peer failed: {exc}")
        return
    for _ in range(max(1, b.cfg.repeat)):
        small.peer.append(psizes["small"])
        large.peer.append(psizes["large"])
    log(f"  peer: 3 rows: {psizes['small']} B, {rows:,} rows: {psizes['large']} B")
    res.details.append(f"message size, peer: BullMQ job hash of the {rows:,}-row import ({psizes['large']} B): `{sample}`")
