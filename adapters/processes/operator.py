"""``importer doctor``, ``inspect``, ``keys create`` and ``openapi``: one-shot
operator tools that read Redis or the code directly and then exit."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable

from importer.adapters.redis.keys import Keys, LocationQueues
from importer.adapters.redis.store import RedisStore
from importer.adapters.settings import Settings


def cmd_openapi(args: argparse.Namespace) -> int:
    from importer.handlers.openapi import SPEC_PATH, spec_yaml

    text = spec_yaml()
    if args.write:
        SPEC_PATH.write_text(text, encoding="utf-8")
        print(f"wrote {SPEC_PATH.name}")
    else:
        sys.stdout.write(text)
    return 0


def cmd_keys_create(args: argparse.Namespace) -> int:
    from importer.domain.locations import LOCATION_RULE, is_valid_location
    from importer.domain.access import SCOPES
    from importer.handlers.auth import OWNER_PATTERN, hash_key, key_line, new_key

    if not OWNER_PATTERN.match(args.owner):
        print("owner must be 1-64 characters: letters, digits, '.', '_' or '-'", file=sys.stderr)
        return 2
    given = args.locations  # None: a key for every location
    locations = tuple(dict.fromkeys(name.strip() for name in given.split(","))) if given is not None else ()
    if not all(is_valid_location(name) for name in locations):
        print(f"--locations takes stock locations separated by commas. {LOCATION_RULE}", file=sys.stderr)
        return 2
    scopes = tuple(dict.fromkeys(name.strip() for name in args.scopes.split(","))) if args.scopes else ()
    if not all(name in SCOPES for name in scopes):
        print(f"--scopes takes scopes separated by commas: {', '.join(sorted(SCOPES))}", file=sys.stderr)
        return 2
    key = new_key()
    where = f" at {', '.join(locations)} only" if locations else ""
    reads = f" (with the scopes {', '.join(scopes)}: see docs/security.md)" if scopes else ""
    print(f"API key for {args.owner}{where}{reads} (shown once, give it to the producer):\n  {key}")
    line = key_line(args.owner, hash_key(key), locations, scopes)
    print(f"Line for IMPORTER_API_KEYS_FILE (the server keeps only this hash):\n  {line}")
    return 0


def cmd_doctor(args: argparse.Namespace) -> int:
    """A readable checklist of what this service needs from Redis and of the queue."""
    import redis as redis_lib

    from importer.adapters.bootstrap import clock_ms, redis_client
    from importer.adapters.redis.guard import inspect_redis
    from importer.adapters.redis.store import RedisStore

    settings = Settings.from_env()
    client = redis_client(settings)
    failures = 0

    def line(status: str, what: str, detail: str) -> None:
        nonlocal failures
        failures += status == "FAIL"
        print(f"[{status:>4}] {what}: {detail}")

    try:
        report = inspect_redis(client)
    except (redis_lib.ConnectionError, redis_lib.TimeoutError) as exc:
        line("FAIL", "Redis reachable", f"no ({type(exc).__name__})")
        return 1
    line("ok", "Redis reachable", f"yes, version {report.version}")
    line("ok" if report.policy == "noeviction" else "FAIL", "maxmemory-policy", report.policy + ("" if report.policy == "noeviction" else " (must be noeviction)"))
    line("ok" if report.aof else "warn", "persistence", f"{report.persistence} (AOF {'on' if report.aof else 'off'}, RDB save '{report.rdb_save}')")
    store = RedisStore(client, settings, clock_ms=clock_ms)
    stats = store.queue_stats()
    ns = Keys(settings.key_prefix).dramatiq
    # Every location's queue (its own partition's on a cluster, LocationQueues; main's on one node).
    queues = LocationQueues(settings.key_prefix, settings.queue_name, per_location=settings.redis_cluster)
    names = {queues.queue_of(location) for location in store.locations()}
    queued = sum(client.llen(f"{queues.namespace_of(q)}:{q}") for q in names)
    delayed = sum(client.llen(f"{queues.namespace_of(q)}:{q}.DQ") for q in names)
    line("ok", "queue", f"{queued} message(s) ready, {delayed} delayed (retries waiting for their backoff)")
    line("ok", "jobs", f"{stats.waiting} waiting, {stats.active} active, {client.zcard(store.keys.unsent)} not yet sent")
    age = stats.oldest_waiting_age_s
    line("ok" if age < 60 else "warn", "oldest waiting job", f"{age:.1f} s" if stats.waiting else "none")
    now_ms = clock_ms()
    alive = client.zcount(f"{ns}:__heartbeats__", now_ms - int(settings.heartbeat_timeout_s * 1000), "+inf")
    line("ok" if alive else "warn", "workers alive", f"{alive} worker process(es) sent a heartbeat in the last {settings.heartbeat_timeout_s:g} s")
    _doctor_door(store, settings, line)
    _doctor_ledger(store, settings, line)
    return 1 if failures else 0


def _doctor_ledger(store: RedisStore, settings: Settings, line: Callable[[str, str, str], None]) -> None:
    """[ledger] The ledger's schema and how far it is behind each location's journal."""
    from importer.adapters.postgres.errors import LedgerUnavailable
    from importer.adapters.postgres.ledger import PostgresLedger
    from importer.adapters.processes.ledger import export_lags

    if not settings.database_url:
        line("warn", "ledger", "off (IMPORTER_DATABASE_URL unset): done markers, the journal and receipts stay in "
             "Redis forever, so its memory grows with every shipment")
        return
    ledger = PostgresLedger(settings.database_url, max_size=1).open(wait=False)
    try:
        have, want = ledger.schema_status()
        line("ok" if have == want else "FAIL", "ledger schema",
             f"version {have}" + ("" if have == want else f", this release needs {want} (start `importer ledger` to migrate)"))
        from importer.adapters.processes.ledger_sync import LedgerSync

        behind = LedgerSync(store, ledger).check()
        marked = store.behind_marks(store.locations())
        for location in sorted(set(behind) | set(marked)):
            b = behind.get(location)
            said = (f"behind the ledger by {b.shipments} shipment(s) over {b.seconds:.1f} s ({b.reason})" if b is not None
                    else f"marked behind the ledger ({marked[location].get('reason', '')}): being brought forward")
            line("FAIL", f"redis at {location}", said + "; `importer ledger restore` brings it forward")
        if not behind and not marked:
            line("ok", "redis against the ledger", "no location lacks a shipment the ledger holds")
        for lag in export_lags(store, ledger):
            late = lag.seconds > 60
            line("warn" if late else "ok", f"ledger lag at {lag.location}",
                 f"{lag.entries} shipment(s) not yet in the ledger, the oldest {lag.seconds:.1f} s old")
    except LedgerUnavailable as exc:
        line("FAIL", "ledger reachable", f"no ({str(exc).split(':')[0]})")
    finally:
        ledger.close()


def _doctor_door(store: RedisStore, settings: Settings, line: Callable[[str, str, str], None]) -> None:
    """[door] The live workers' contract versions, and whether this environment's producer version passes."""
    from importer.adapters.redis.records import format_versions
    from importer.domain.contract import live_workers_can_run

    workers = store.live_workers()
    version = settings.producer_version
    if not workers:
        line("warn", "worker contract versions", "no worker alive: imports are accepted and wait for a worker")
        return
    listed = "; ".join(f"{worker_id} accepts {format_versions(accepts)}" for worker_id, accepts in sorted(workers.items()))
    line("ok", "worker contract versions", f"{len(workers)} live: {listed}")
    able = sum(version in accepts for accepts in workers.values())
    if live_workers_can_run(version, list(workers.values())):
        line("ok", "door check", f"producer version {version} (IMPORTER_PRODUCER_VERSION) is accepted by {able} live worker(s)")
    else:
        line("FAIL", "door check", f"no live worker accepts producer version {version} (IMPORTER_PRODUCER_VERSION): "
             "POST /api/imports answers 503 contract.no_worker until one runs")


def cmd_inspect(args: argparse.Namespace) -> int:
    """Operator view of a job: the whole record, with the diagnostic the API never shows."""
    from importer.adapters.bootstrap import clock_ms, redis_client
    from importer.adapters.redis.store import RedisStore

    settings = Settings.from_env()
    store = RedisStore(redis_client(settings), settings, clock_ms=clock_ms)
    record = store.get_job(args.job_id)
    if record is None:
        print(f"no job record {args.job_id} (it may have been removed by retention)", file=sys.stderr)
        return 1
    out = dict(vars(record))
    out["diagnostic"] = store.get_diagnostic(args.job_id)
    print(json.dumps(out, indent=2, default=str))
    return 0


def cmd_locations(args: argparse.Namespace) -> int:
    """`importer locations [list]`, `importer locations add NAME...`: the declared stock locations."""
    from importer.adapters.bootstrap import clock_ms, redis_client
    from importer.adapters.redis.store import RedisStore
    from importer.domain.locations import LOCATION_PATTERN, is_valid_location

    settings = Settings.from_env()
    store = RedisStore(redis_client(settings), settings, clock_ms=clock_ms)
    if args.action == "add":
        bad = [name for name in args.names if not is_valid_location(name)]
        if bad or not args.names:
            print(f"importer: a location name must match {LOCATION_PATTERN}" + (f", got {bad[0]!r}" if bad else ""),
                  file=sys.stderr)
            return 2
        added = set(store.declare_locations(args.names))
        for name in args.names:
            print(f"{name}: {'declared' if name in added else 'already declared'}")
        return 0
    for name in store.locations():
        print(name)
    return 0
