"""3. large batch: one 100,000-row import through Importer's HTTP server + worker and through the BullMQ
peer's: upload, active → completed, Redis blocked by the apply script (SLOWLOG), peak RSS; beside bare
costs of the same rows (a HINCRBY pipeline, one EVAL of a HINCRBY loop, a POST to the bare app)."""

from __future__ import annotations

import hashlib
import time
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import redis
from importer.adapters.redis.keys import Keys
from importer.adapters.redis.scripts import lua_source
from importer.adapters.settings import Settings
from importer.domain.shipment import job_id_for

from bench.suite.common import (
    MIB,
    BenchError,
    children,
    csv_rows,
    end_slowlog,
    log,
    new_prefix,
    script_names,
    slowlog_words,
    tail,
    vm_kib,
)
from bench.suite.procs import Proc
from bench.suite.report import at_most, base_at_most, peer_at_most

if TYPE_CHECKING:
    from bench.suite.servers import Bench

PEER_APPLY_HEADER = b"-- applyShipment: apply one validated shipment"


@dataclass
class Subject:
    """One system under test for this scenario: its two processes and how to read its job record."""

    serve: Proc
    worker: Proc
    port: int
    http_pids: list[int]
    worker_pids: list[int]
    job_key: str
    apply_sha: str
    api_key: str | None
    peer: bool

    def poll(self, client: redis.Redis) -> tuple[bool, bool, str]:
        """(active seen, finished, final state) from one read of the job record."""
        if not self.peer:
            state = (client.hget(self.job_key, "state") or b"").decode()
            return state == "active", state in ("completed", "failed"), state
        processed, finished, reason = client.hmget(self.job_key, "processedOn", "finishedOn", "failedReason")
        if finished:
            return True, True, "failed" if reason else "completed"
        return bool(processed), False, "active" if processed else "waiting"

    def span_ms(self, client: redis.Redis) -> float:
        """active → completed from the job record (worker/server clock)."""
        fields = ("processedOn", "finishedOn") if self.peer else ("startedAt", "finishedAt")
        started, finished = (int(x) for x in client.hmget(self.job_key, *fields))
        return float(finished - started)

    def error(self, client: redis.Redis) -> Any:
        return client.hget(self.job_key, "failedReason" if self.peer else "error")


def start_importer(b: Bench, batch_id: str, started: list[Proc]) -> Subject:
    prefix = new_prefix("large")
    env = b.importer_env(prefix)
    serve, port = b.start_serve(env)
    started.append(serve)
    worker = b.procs.spawn("importer-worker", b.importer_argv("worker", *b.worker_args()), env)
    started.append(worker)
    b.wait_worker_ready(worker, Keys(prefix).dramatiq)
    time.sleep(0.5)  # let boot settle (sweeper thread, first fetch loop)
    http_kids, worker_kids = children(serve.popen.pid), children(worker.popen.pid)
    if not http_kids or not worker_kids:
        raise BenchError(f"no child processes found (http {http_kids}, worker {worker_kids})")
    return Subject(
        serve, worker, port, http_kids, worker_kids, Keys(prefix).job(job_id_for(batch_id)),
        hashlib.sha1(lua_source("apply").encode()).hexdigest(), b.api_key, peer=False,
    )


def start_peer(b: Bench, batch_id: str, started: list[Proc]) -> Subject:
    assert b.peer is not None
    prefix = new_prefix("lpeer")[:-1]
    serve, port = b.peer.start_server(prefix)
    started.append(serve)
    worker = b.peer.start_worker(prefix)
    started.append(worker)
    b.peer.wait_worker_ready(worker)
    time.sleep(0.5)
    return Subject(
        serve, worker, port, [serve.popen.pid], [worker.popen.pid], b.peer.key(prefix, job_id_for(batch_id)),
        b.peer.apply_sha, None, peer=True,
    )


def large_once(b: Bench, which: str, body: bytes) -> dict[str, float]:
    assert b.client is not None
    started: list[Proc] = []
    batch_id = f"L{uuid.uuid4().hex[:10]}"
    try:
        s = start_importer(b, batch_id, started) if which == "importer" else start_peer(b, batch_id, started)
        idle_http = max(vm_kib(p) or 0 for p in s.http_pids)
        idle_worker = max(vm_kib(p) or 0 for p in s.worker_pids)
        b.client.config_set("slowlog-max-len", 100000)
        b.client.config_set("slowlog-log-slower-than", 0)
        b.client.slowlog_reset()
        t0 = time.monotonic()
        status, data, upload_s = b.post(s.port, f"/api/imports?batchId={batch_id}", body, s.api_key)
        if status != 202:
            raise BenchError(f"POST answered {status}: {data[:200]!r}")
        poller = redis.Redis.from_url(b.url, single_connection_client=True)
        deadline = time.monotonic() + 120
        seen_active: float | None = None
        try:
            while True:
                active, finished, state = s.poll(poller)
                if active and seen_active is None:
                    seen_active = time.monotonic()
                if finished:
                    break
                if time.monotonic() > deadline:
                    raise BenchError(f"large import not finished after 120 s (state {state!r})")
                if s.worker.popen.poll() is not None:
                    raise BenchError(f"worker exited: {tail(s.worker.log_path, 5)}")
                time.sleep(0.005)
        finally:
            poller.close()
        t_done = time.monotonic()
        peak_http = max(vm_kib(p) or 0 for p in (children(s.serve.popen.pid) if not s.peer else s.http_pids) or s.http_pids)
        peak_worker = max(vm_kib(p) or 0 for p in (children(s.worker.popen.pid) if not s.peer else s.worker_pids) or s.worker_pids)
        entries = b.client.slowlog_get(-1)
        end_slowlog(b.client)
        if state != "completed":
            raise BenchError(f"large import {state}: {s.error(b.client)!r}")
        sha_names = b.peer.script_names() if s.peer and b.peer is not None else script_names()
        apply_us = 0
        longest: list[tuple[int, str]] = []
        for entry in entries:
            name, sha = slowlog_words(entry)
            raw = entry.get("command", b"")
            raw = b" ".join(raw) if isinstance(raw, (list, tuple)) else raw
            # ioredis sends a script's first call on a connection as EVAL <source>: known by its header line.
            is_apply = (name == "EVALSHA" and sha == s.apply_sha) or (
                name == "EVAL" and s.peer and isinstance(raw, bytes) and PEER_APPLY_HEADER in raw)
            if is_apply:
                label = f"{name} apply script"
                apply_us = max(apply_us, int(entry["duration"]))
            elif name == "EVALSHA":
                label = f"EVALSHA {sha_names.get(sha, sha[:8])}"
            else:
                label = name
            longest.append((int(entry["duration"]), label))
        longest.sort(reverse=True)
        if not apply_us:
            raise BenchError(f"no call of the apply script in SLOWLOG (longest: {longest[:4]})")
        return {
            "upload_ms": upload_s * 1000,
            "active_ms": s.span_ms(b.client),
            "active_seen_ms": (t_done - seen_active) * 1000 if seen_active is not None else float("nan"),
            "pickup_ms": (seen_active - t0 - upload_s) * 1000 if seen_active is not None else float("nan"),
            "total_ms": (t_done - t0) * 1000,
            "apply_ms": apply_us / 1000,
            "peak_http_mib": peak_http / 1024,
            "peak_worker_mib": peak_worker / 1024,
            "idle_http_mib": idle_http / 1024,
            "idle_worker_mib": idle_worker / 1024,
            "longest": ", ".join(f"{label} {us / 1000:.1f} ms" for us, label in longest[:5]),  # type: ignore[dict-item]
        }
    finally:
        for p in reversed(started):
            b.procs.stop(p)
        b.flush()


def large_baselines(b: Bench, rows: int, bare_port: int | None, body: bytes) -> dict[str, float]:
    """Bare costs of the same rows: one HINCRBY pipeline; one EVAL looping HINCRBY; a POST to the bare app."""
    assert b.client is not None
    skus = [(f"SKU{i:07d}", (i % 1000) + 1) for i in range(rows)]
    key = "{bench}:hincrby"
    client = redis.Redis.from_url(b.url, socket_timeout=60)
    t = time.monotonic()
    pipe = client.pipeline(transaction=False)
    for sku, qty in skus:
        pipe.hincrby(key, sku, qty)
    pipe.execute()
    pipeline_ms = (time.monotonic() - t) * 1000
    args: list[Any] = []
    for sku, qty in skus:
        args += [sku, qty]
    script = "for i = 1, #ARGV, 2 do redis.call('HINCRBY', KEYS[1], ARGV[i], ARGV[i + 1]) end return #ARGV / 2"
    client.config_set("slowlog-log-slower-than", 0)
    client.slowlog_reset()
    client.eval(script, 1, key + "2", *args)
    eval_us = max((int(e["duration"]) for e in client.slowlog_get(-1) if slowlog_words(e)[0] == "EVAL"), default=0)
    end_slowlog(client)
    client.delete(key, key + "2")
    client.close()
    out = {"hincrby_pipeline_ms": pipeline_ms, "eval_hincrby_ms": eval_us / 1000}
    if bare_port is not None:
        status, _, upload_s = b.post(bare_port, "/api/imports?batchId=x", body, None)
        if status == 202:
            out["bare_upload_ms"] = upload_s * 1000
    return out


def fig_text(fig: dict[str, float]) -> str:
    return (
        f"upload {fig['upload_ms']:.0f} ms, active→completed {fig['active_ms']:.0f} ms (record) / "
        f"{fig['active_seen_ms']:.0f} ms (seen), pickup {fig['pickup_ms']:.0f} ms, total {fig['total_ms']:.0f} ms, "
        f"apply script {fig['apply_ms']:.1f} ms, worker RSS {fig['idle_worker_mib']:.0f}→{fig['peak_worker_mib']:.0f} MiB, "
        f"HTTP RSS {fig['idle_http_mib']:.0f}→{fig['peak_http_mib']:.0f} MiB; longest commands: {fig['longest']}"
    )


def scenario_large(b: Bench) -> None:
    c = b.cfg
    res = b.results
    settings = Settings.from_env(b.importer_env(new_prefix("x")))
    sizes = [c.rows]
    if c.quick:
        pass
    elif settings.max_rows != c.rows:
        sizes.append(settings.max_rows)
    else:
        res.notes.append(
            f"3. large batch: the maximum rows allowed (IMPORTER_MAX_ROWS) is {settings.max_rows:,}, "
            f"the same as the {c.rows:,}-row case, so it is run once."
        )
    subjects = ("importer", "peer") if b.peer is not None else ("importer",)
    for rows in sizes:
        sc = f"3. large batch ({rows:,} rows)"
        body = csv_rows(rows)
        upload = res.row(sc, f"upload: POST → 202 ({len(body) / MIB:.1f} MiB)", "ms", base_label="same POST to bare app", target=peer_at_most(3))
        active = res.row(sc, "active → completed (job record)", "ms", base_label="HINCRBY pipeline", target=peer_at_most(1.5))
        active_seen = res.row(sc, "active → completed (seen by polling the record every 5 ms)", "ms", base_label="HINCRBY pipeline")
        pickup = res.row(sc, "202 → active seen (worker pickup)", "ms")
        total = res.row(sc, "total: POST start → completed seen", "ms", base_label="HINCRBY pipeline")
        blocked = res.row(sc, "Redis blocked by the apply script (SLOWLOG)", "ms", base_label="EVAL of bare HINCRBY loop", target=base_at_most(1.3))
        rss_w = res.row(sc, "worker process peak RSS (VmHWM)", "MiB", base_label="Importer's, idle before", target=at_most(120, "MiB"))
        rss_h = res.row(sc, "HTTP process peak RSS (VmHWM)", "MiB", base_label="Importer's, idle before", target=at_most(80, "MiB"))
        for rep in range(c.repeat):
            for which in subjects:
                log(f"large batch {rows:,} rows rep {rep + 1}/{c.repeat}: {which}")
                try:
                    fig = large_once(b, which, body)
                except BenchError as exc:
                    log(f"large batch {which} failed: {exc}")
                    res.notes.append(f"large batch {rows} {which} rep {rep + 1} failed: {exc}")
                    continue
                field = "imp" if which == "importer" else "peer"
                for row, key in ((upload, "upload_ms"), (active, "active_ms"), (active_seen, "active_seen_ms"), (pickup, "pickup_ms"),
                                 (total, "total_ms"), (blocked, "apply_ms"), (rss_w, "peak_worker_mib"), (rss_h, "peak_http_mib")):
                    getattr(row, field).append(fig[key])
                if which == "importer":
                    rss_w.base.append(fig["idle_worker_mib"])
                    rss_h.base.append(fig["idle_http_mib"])
                log(f"  {which}: {fig_text(fig)}")
                res.details.append(f"large {rows} rep {rep + 1} {which}: {fig_text(fig)}")
            bare = None
            try:
                bare, bare_port = b.start_bare()
                base = large_baselines(b, rows, bare_port, body)
            except BenchError as exc:
                res.notes.append(f"large batch baseline rep {rep + 1} failed: {exc}")
                base = large_baselines(b, rows, None, body)
            finally:
                if bare is not None:
                    b.procs.stop(bare)
                b.flush()
            if "bare_upload_ms" in base:
                upload.base.append(base["bare_upload_ms"])
            for row in (active, active_seen, total):
                row.base.append(base["hincrby_pipeline_ms"])
            blocked.base.append(base["eval_hincrby_ms"])
            msg = (f"HINCRBY pipeline {base['hincrby_pipeline_ms']:.0f} ms, EVAL HINCRBY loop {base['eval_hincrby_ms']:.1f} ms, "
                   f"bare POST {base.get('bare_upload_ms', float('nan')):.0f} ms")
            log(f"  baselines: {msg}")
            res.details.append(f"large {rows} rep {rep + 1} baselines: {msg}")
