"""``importer serve``, ``worker`` and ``events``: the long-running processes,
Redis checked first (``importer dev``, which starts all of them locally, is in dev.py)."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

from importer.adapters.command_settings import child_env
from importer.adapters.settings import Settings, log_format

ROOT = Path(__file__).resolve().parents[2]


def _check_redis(args: argparse.Namespace, process: str) -> Settings:
    """Settings and the Redis guard, in the parent process, before anything forks."""
    from importer.adapters.bootstrap import redis_client
    from importer.adapters.logs import configure_logging
    from importer.adapters.redis.guard import guard

    configure_logging()
    settings = Settings.from_env()
    if getattr(args, "allow_eviction", False):
        settings = dataclasses.replace(settings, allow_eviction=True)
    client = redis_client(settings)
    try:
        if guard(client, allow_eviction=settings.allow_eviction, process=process) is not None:
            declare_configured_locations(settings, client)  # Redis away: the workers' first beat does it
    finally:
        client.close()
    return settings


def declare_configured_locations(settings: Settings, client: Any) -> None:
    """IMPORTER_LOCATIONS and the default location, declared (admit.lua refuses any other)."""
    from importer.adapters.bootstrap import clock_ms
    from importer.adapters.redis.store import RedisStore

    RedisStore(client, settings, clock_ms=clock_ms).declare_locations(settings.declared_locations)


def cmd_serve(args: argparse.Namespace) -> int:
    from importer.adapters.processes.granian import serve_command

    settings = _check_redis(args, "http")
    # Each open event stream or download holds a thread: add one per allowed
    # one, so they never take the threads of ordinary requests (gthread starts
    # threads only when needed; granian's idle threads end after 30 s).
    threads = args.threads + settings.max_event_streams + settings.max_downloads
    return serve_command(
        server=args.server or settings.http_server, bind=args.bind or settings.http_bind, workers=args.workers,
        threads=threads, timeout=args.timeout, graceful_timeout=args.graceful_timeout,
        header_timeout=args.header_timeout or settings.http_header_timeout_s,
    )


def metrics_db(metrics_port: int) -> str:
    """The folder where the worker processes keep dramatiq's Prometheus counts for the exporter."""
    return os.path.join(tempfile.gettempdir(), f"importer-prometheus-{metrics_port}")


def clear_metrics_db(folder: str) -> None:
    """The counts an earlier run left (prometheus_client's files, one per process), so
    that the exporter counts this run's messages only."""
    for name in os.listdir(folder) if os.path.isdir(folder) else ():
        if name.endswith(".db"):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(folder, name))


def cmd_worker(args: argparse.Namespace) -> int:
    settings = _check_redis(args, "worker")
    env = worker_env(args, settings)
    if "PROMETHEUS_MULTIPROC_DIR" in env:
        clear_metrics_db(env["PROMETHEUS_MULTIPROC_DIR"])
    argv = [
        sys.executable, "-m", "dramatiq", "importer.adapters.processes.worker:broker",
        "--processes", str(args.processes), "--threads", str(args.threads),
        "--worker-shutdown-timeout", str(int(settings.worker_shutdown_timeout_s * 1000)),
        "--skip-logging", "--path", str(ROOT),
    ]
    os.execve(sys.executable, argv, env)
    return 0  # not reached


def worker_env(args: argparse.Namespace, settings: Settings, env: dict[str, str] | None = None) -> dict[str, str]:
    """The environment ``importer worker`` gives dramatiq and its worker processes."""
    overrides: dict[str, str] = {}
    defaults: dict[str, str] = {}
    if settings.allow_eviction:
        overrides["IMPORTER_ALLOW_EVICTION"] = "1"
    # An idle consumer polls with a backoff up to dramatiq's worker timeout
    # (1 s by default): an import sent to an idle worker waited up to that long
    # before it started (bench/run.py "202 -> active seen": 125-310 ms). 100 ms
    # bounds that wait; idle, each process then polls its queues 10 times a
    # second (a fetch script of a few microseconds on an empty queue).
    defaults["dramatiq_worker_timeout"] = "100"
    # dramatiq prefetches 2 x threads messages by default; see README (Performance).
    if args.prefetch:
        overrides["dramatiq_queue_prefetch"] = str(args.prefetch)
    metrics_port = settings.worker_metrics_port if args.metrics_port is None else args.metrics_port
    # The worker processes read it (Settings) to add the Prometheus middleware.
    overrides["IMPORTER_WORKER_METRICS_PORT"] = str(metrics_port)
    if metrics_port:
        # dramatiq's Prometheus middleware: one exporter per host for all the
        # worker processes (multiprocess mode), on loopback unless told otherwise.
        overrides["dramatiq_prom_port"] = str(metrics_port)
        defaults["dramatiq_prom_host"] = "127.0.0.1"
        defaults["dramatiq_prom_db"] = metrics_db(metrics_port)
    # dramatiq's main process supervises the worker processes; each of them
    # stops by itself if that process dies (adapters/processes/worker.py).
    out = child_env(overrides, defaults=defaults, env=env)
    if metrics_port:
        # prometheus_client picks multiprocess mode when it is imported, which in a
        # worker process is before the middleware sets this (Importer's modules import
        # it): without it the processes kept their counts to themselves and the
        # exporter, reading the folder, served nothing.
        out["PROMETHEUS_MULTIPROC_DIR"] = out["dramatiq_prom_db"]
    return out


def cmd_events(args: argparse.Namespace) -> int:
    """The observer: one line per job event from every worker, until SIGINT/SIGTERM."""
    from importer.adapters.bootstrap import redis_client
    from importer.adapters.logs import configure_logging
    from importer.adapters.processes.observer import EventsObserver
    from importer.adapters.redis.keys import Keys
    from importer.adapters.processes.signals import StopOnce

    # Its own lines read like the events it prints: text, unless --json or IMPORTER_LOG_FORMAT.
    configure_logging(log_format=log_format(default="json" if args.json else "text"))
    settings = Settings.from_env()
    stop = StopOnce(name="events").install()
    observer = EventsObserver(
        redis_client(settings), Keys(settings.key_prefix), sys.stdout, as_json=args.json, start=args.start
    )
    return observer.run(stop.event)
