"""The ``importer`` command: serve, worker, dev, openapi, keys, inspect."""

from __future__ import annotations

import argparse
import json
import os
import secrets
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

from importer.adapters.settings import Settings, SettingsError

ROOT = Path(__file__).resolve().parent.parent
DEMO_FIXTURE = ROOT / "fixtures" / "shipment-a-2026.csv"


def _check_redis(args: argparse.Namespace, process: str) -> Settings:
    """Settings and the Redis guard, in the parent process, before anything forks."""
    from importer.adapters.bootstrap import redis_client
    from importer.adapters.logs import configure_logging
    from importer.adapters.redis_guard import guard

    if getattr(args, "allow_eviction", False):
        os.environ["IMPORTER_ALLOW_EVICTION"] = "1"
    configure_logging()
    settings = Settings.from_env()
    client = redis_client(settings)
    try:
        guard(client, allow_eviction=settings.allow_eviction, process=process)
    finally:
        client.close()
    return settings


def cmd_serve(args: argparse.Namespace) -> int:
    from importer.adapters.http_server import serve

    _check_redis(args, "http")
    serve(args.bind, args.workers, args.threads, args.timeout, args.graceful_timeout)
    return 0


def cmd_worker(args: argparse.Namespace) -> int:
    settings = _check_redis(args, "worker")
    argv = [
        sys.executable, "-m", "dramatiq", "importer.adapters.worker_entry:broker",
        "--processes", str(args.processes), "--threads", str(args.threads),
        "--worker-shutdown-timeout", str(int(settings.worker_shutdown_timeout_s * 1000)),
        "--skip-logging", "--path", str(ROOT),
    ]
    env = dict(os.environ)
    # dramatiq prefetches 2 x threads messages by default; see README (Performance).
    if args.prefetch:
        env["dramatiq_queue_prefetch"] = str(args.prefetch)
    if args.metrics_port:
        # dramatiq's Prometheus middleware: one exporter per host for all the
        # worker processes (multiprocess mode), on loopback unless told otherwise.
        env["IMPORTER_WORKER_METRICS_PORT"] = str(args.metrics_port)
        env["dramatiq_prom_port"] = str(args.metrics_port)
        env.setdefault("dramatiq_prom_host", "127.0.0.1")
        env.setdefault("dramatiq_prom_db", os.path.join(tempfile.gettempdir(), f"importer-prometheus-{args.metrics_port}"))
    os.execve(sys.executable, argv, env)
    return 0  # not reached


def cmd_events(args: argparse.Namespace) -> int:
    """The observer: one line per job event from every worker, until SIGINT/SIGTERM."""
    from importer.adapters.bootstrap import redis_client
    from importer.adapters.logs import configure_logging
    from importer.adapters.observer import EventsObserver
    from importer.adapters.redis_store import Keys
    from importer.adapters.signals import StopOnce

    configure_logging()
    settings = Settings.from_env()
    stop = StopOnce(name="events").install()
    observer = EventsObserver(
        redis_client(settings), Keys(settings.key_prefix).events, sys.stdout, as_json=args.json, start=args.start
    )
    return observer.run(stop.event)


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
    from importer.handlers.auth import OWNER_PATTERN, hash_key, new_key

    if not OWNER_PATTERN.match(args.owner):
        print("owner must be 1-64 characters: letters, digits, '.', '_' or '-'", file=sys.stderr)
        return 2
    key = new_key()
    print(f"API key for {args.owner} (shown once, give it to the producer):\n  {key}")
    print(f"Line for IMPORTER_API_KEYS_FILE (the server keeps only this hash):\n  {args.owner}:{hash_key(key)}")
    return 0


def cmd_doctor(args: argparse.Namespace) -> int:
    """A readable checklist of what this service needs from Redis and of the queue."""
    import redis as redis_lib

    from importer.adapters.bootstrap import clock_ms, redis_client
    from importer.adapters.redis_guard import inspect_redis
    from importer.adapters.redis_store import RedisStore

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
    ns = f"{settings.key_prefix}dramatiq"
    queued = client.llen(f"{ns}:{settings.queue_name}")
    delayed = client.llen(f"{ns}:{settings.queue_name}.DQ")
    line("ok", "queue", f"{queued} message(s) ready, {delayed} delayed (retries waiting for their backoff)")
    line("ok", "jobs", f"{stats.waiting} waiting, {stats.active} active, {client.zcard(store.keys.unsent)} not yet sent")
    age = stats.oldest_waiting_age_s
    line("ok" if age < 60 else "warn", "oldest waiting job", f"{age:.1f} s" if stats.waiting else "none")
    now_ms = clock_ms()
    alive = client.zcount(f"{ns}:__heartbeats__", now_ms - int(settings.heartbeat_timeout_s * 1000), "+inf")
    line("ok" if alive else "warn", "workers alive", f"{alive} worker process(es) sent a heartbeat in the last {settings.heartbeat_timeout_s:g} s")
    return 1 if failures else 0


def cmd_inspect(args: argparse.Namespace) -> int:
    """Operator view of a job: the whole record, with the diagnostic the API never shows."""
    from importer.adapters.bootstrap import clock_ms, redis_client
    from importer.adapters.redis_store import RedisStore

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


# -- the HTTP client for people: submit, status ----------------------------------------


def _client_settings(args: argparse.Namespace) -> tuple[str, str]:
    key = os.environ.get("IMPORTER_API_KEY", "")
    if not key:
        raise SettingsError("IMPORTER_API_KEY is not set (the producer's API key; see `importer keys create`)")
    return args.url.rstrip("/"), key


def _describe_problem(status: int, body: Any) -> str:
    if isinstance(body, dict) and "code" in body:
        return f"{status} {body['code']}: {body.get('detail', '')}"
    return f"HTTP {status}"


def _print_issues(error: dict[str, Any]) -> None:
    for issue in error.get("issues") or []:
        column = f", column {issue['column']}" if issue.get("column") else ""
        print(f"  line {issue['line']}{column}: {issue['code']}: {issue['message']}")
    if error.get("issuesTruncated"):
        print("  (more issues not listed)")


def _show_final(record: dict[str, Any]) -> int:
    if record["state"] == "completed":
        print(f"completed {record['id']}: {json.dumps(record['result'])}")
        return 0
    error = record.get("error") or {}
    print(f"failed {record['id']}: {error.get('code')}: {error.get('message')}")
    _print_issues(error)
    return 1


def follow(url: str, key: str, job_id: str, *, timeout: float, interval: float = 0.2) -> int:
    """Poll the job until it finishes; one line per change, or a live line on a TTY."""
    live = sys.stdout.isatty()
    started = time.monotonic()
    last = None
    while True:
        status, record = _http("GET", f"{url}/api/imports/{job_id}", key)
        if status != 200:
            print(("\n" if live else "") + f"error: {_describe_problem(status, record)}", file=sys.stderr)
            return 1
        progress = record.get("progress") or {}
        line = (
            f"{record['state']:<9} phase={progress.get('phase', '-')} rows={progress.get('rows', '-')} "
            f"attempt={record['attempt']}"
        )
        elapsed = time.monotonic() - started
        if live:
            print(f"\r{line} elapsed={elapsed:.1f}s", end="", flush=True)
        elif line != last:
            print(f"{line} elapsed={elapsed:.1f}s", flush=True)
        last = line
        if record["state"] in ("completed", "failed"):
            if live:
                print()
            return _show_final(record)
        if elapsed > timeout:
            print(("\n" if live else "") + f"still {record['state']} after {timeout:g} s", file=sys.stderr)
            return 3
        time.sleep(interval)


def cmd_submit(args: argparse.Namespace) -> int:
    url, key = _client_settings(args)
    try:
        data = Path(args.file).read_bytes()
    except OSError as err:
        print(f"importer: cannot read {args.file}: {err.strerror}", file=sys.stderr)
        return 2
    query = urllib.parse.urlencode({"batchId": args.batch_id})
    try:
        status, body = _http("POST", f"{url}/api/imports?{query}", key, data, "text/csv")
    except (OSError, ValueError) as err:
        print(f"importer: cannot reach {url}: {err}", file=sys.stderr)
        return 2
    if status != 202:
        print(f"refused: {_describe_problem(status, body)}", file=sys.stderr)
        return 1
    print(f"accepted {body['jobId']} (batch {body['batchId']}, {body['state']})", flush=True)
    if not args.wait:
        return 0
    return follow(url, key, body["jobId"], timeout=args.timeout)


def cmd_status(args: argparse.Namespace) -> int:
    url, key = _client_settings(args)
    status, record = _http("GET", f"{url}/api/imports/{urllib.parse.quote(args.job_id)}", key)
    if status != 200:
        print(f"error: {_describe_problem(status, record)}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(record, indent=2))
        return 0
    progress = record.get("progress") or {}
    print(f"{record['id']}: {record['state']} (attempt {record['attempt']}, phase {progress.get('phase', '-')}, rows {progress.get('rows', '-')})")
    if record["state"] in ("completed", "failed"):
        _show_final(record)
    return 0


# -- importer dev ------------------------------------------------------------------


def _http(method: str, url: str, key: str | None, body: bytes | None = None, ctype: str = "") -> tuple[int, Any]:
    request = urllib.request.Request(url, data=body, method=method)
    if key:
        request.add_header("Authorization", f"Bearer {key}")
    if ctype:
        request.add_header("Content-Type", ctype)
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read() or b"null")
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read() or b"null")


def _wait_healthy(url: str, procs: list[subprocess.Popen[bytes]], timeout: float = 60) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if any(p.poll() is not None for p in procs):
            return False
        try:
            status, _ = _http("GET", f"{url}/health", None)
            if status == 200:
                return True
        except (OSError, ValueError):
            pass
        time.sleep(0.2)
    return False


def run_demo(url: str, key: str, fixture: Path = DEMO_FIXTURE) -> int:
    batch_id = fixture.stem
    print(f"demo: POST {fixture.name} as batch {batch_id}", flush=True)
    status, body = _http("POST", f"{url}/api/imports?batchId={batch_id}", key, fixture.read_bytes(), "text/csv")
    print(f"demo: {status} {json.dumps(body)}", flush=True)
    if status != 202:
        return 1
    job_url = f"{url}/api/imports/{body['jobId']}"
    last = None
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        status, record = _http("GET", job_url, key)
        shown = {k: record.get(k) for k in ("id", "state", "progress", "result", "error")} if status == 200 else record
        if shown != last:
            print(f"demo: GET {job_url} -> {status} {json.dumps(shown)}", flush=True)
            last = shown
        if status == 200 and record["state"] in ("completed", "failed"):
            return 0 if record["state"] == "completed" else 1
        time.sleep(0.1)
    print("demo: the import did not finish within 60 s", flush=True)
    return 1


def cmd_dev(args: argparse.Namespace) -> int:
    from importer.adapters.embedded_redis import EmbeddedRedis
    from importer.handlers.auth import hash_key, new_key

    env = dict(os.environ)
    embedded = None
    if not env.get("IMPORTER_REDIS_URL"):
        embedded = EmbeddedRedis(Path(env.get("IMPORTER_DATA_DIR", ".importer-data")).resolve())
        env["IMPORTER_REDIS_URL"] = embedded.start()
        print(f"dev: embedded Redis-compatible server (valkey) at {embedded.url}, data in {embedded.data_dir}", flush=True)
    key = env.get("IMPORTER_API_KEY")
    if not env.get("IMPORTER_API_KEYS") and not env.get("IMPORTER_API_KEYS_FILE"):
        key = new_key()
        env["IMPORTER_API_KEYS"] = f"local:{hash_key(key)}"
    if not env.get("IMPORTER_METRICS_TOKEN"):
        env["IMPORTER_METRICS_TOKEN"] = secrets.token_urlsafe(16)
    url = f"http://127.0.0.1:{args.port}"
    me = [sys.executable, "-m", "importer.adapters.cli"]
    # Own sessions: Ctrl-C reaches only this process, which then stops each
    # child exactly once (a second signal would not start a second shutdown,
    # but one clean signal is clearer).
    procs = [
        subprocess.Popen(me + ["events"], env=env, start_new_session=True),
        subprocess.Popen(me + ["worker", "--processes", "1", "--threads", "8"], env=env, start_new_session=True),
        subprocess.Popen(me + ["serve", "--bind", f"127.0.0.1:{args.port}", "--workers", "1"], env=env, start_new_session=True),
    ]
    stopping = {"flag": False}

    def on_signal(signum: int, frame: Any) -> None:
        stopping["flag"] = True

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    rc = 0
    try:
        if not _wait_healthy(url, procs):
            print("dev: the HTTP server did not become healthy", file=sys.stderr)
            rc = 1
        else:
            print(f"dev: HTTP on {url} (GET {url}/health, {url}/openapi.yaml), worker running", flush=True)
            if key:
                print(f"dev: API key: {key}", flush=True)
                print(
                    f"dev: try: curl -s -H 'Authorization: Bearer {key}' -H 'Content-Type: text/csv' "
                    f"--data-binary @fixtures/shipment-a-2026.csv '{url}/api/imports?batchId=shipment-a-2026'",
                    flush=True,
                )
            print(f"dev: metrics: curl -s -H 'Authorization: Bearer {env['IMPORTER_METRICS_TOKEN']}' {url}/metrics", flush=True)
            if args.demo:
                rc = run_demo(url, key or "")
                time.sleep(1.5)  # let the observer print the last events
            else:
                print("dev: press Ctrl-C to stop", flush=True)
                while not stopping["flag"] and all(p.poll() is None for p in procs):
                    time.sleep(0.2)
    finally:
        print("dev: stopping (each process finishes what it is doing)", flush=True)
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(timeout=60)
            except subprocess.TimeoutExpired:
                p.kill()
                rc = rc or 1
        if embedded is not None:
            embedded.stop()
        print("dev: stopped", flush=True)
    return rc


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="importer", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("serve", help="run the HTTP API under gunicorn")
    p.add_argument("--bind", default=os.environ.get("IMPORTER_HTTP_BIND", "127.0.0.1:8080"))
    # Measured with bench/ (README, Performance): gthread 2 x 4. Sync workers
    # were within noise of it on 2 cores, but keep no connection alive and
    # notice a shutdown only every timeout/2 seconds.
    p.add_argument("--workers", type=int, default=2, help="gunicorn worker processes")
    p.add_argument("--threads", type=int, default=4, help="threads per gunicorn worker (>1: gthread worker class)")
    p.add_argument("--timeout", type=int, default=30, help="seconds before a stuck request's worker is restarted")
    p.add_argument("--graceful-timeout", type=int, default=30, help="seconds in-flight requests get on SIGTERM")
    p.add_argument("--allow-eviction", action="store_true", help="start even if Redis may evict keys (dangerous)")
    p.set_defaults(func=cmd_serve)

    p = sub.add_parser("worker", help="run dramatiq worker processes")
    # Defaults measured with bench/: one process per core, 8 threads, and a
    # prefetch of 64 (dramatiq's 2 x threads starves the threads between fetches).
    p.add_argument("--processes", type=int, default=os.cpu_count() or 1)
    p.add_argument("--threads", type=int, default=8)
    p.add_argument("--prefetch", type=int, default=64, help="messages prefetched per process (0: dramatiq's 2 x threads)")
    p.add_argument("--allow-eviction", action="store_true", help="start even if Redis may evict keys (dangerous)")
    p.add_argument(
        "--metrics-port", type=int, default=int(os.environ.get("IMPORTER_WORKER_METRICS_PORT") or 0),
        help="expose dramatiq's Prometheus metrics on 127.0.0.1:PORT (0: off)",
    )
    p.set_defaults(func=cmd_worker)

    p = sub.add_parser("dev", help="embedded Redis + worker + HTTP on 127.0.0.1, until Ctrl-C")
    p.add_argument("--port", type=int, default=8080)
    p.add_argument("--demo", action="store_true", help="import fixtures/shipment-a-2026.csv over HTTP, then stop")
    p.set_defaults(func=cmd_dev)

    p = sub.add_parser("events", help="print every job event (progress, completed, failed...) from all workers")
    p.add_argument("--json", action="store_true", help="one JSON object per line")
    p.add_argument(
        "--from", dest="start", default="$",
        help="resume after this stream id ('0' for all retained history; default: from now)",
    )
    p.set_defaults(func=cmd_events)

    p = sub.add_parser("openapi", help="print the OpenAPI document generated from the code")
    p.add_argument("--write", action="store_true", help="rewrite openapi.yaml")
    p.set_defaults(func=cmd_openapi)

    p = sub.add_parser("keys", help="API keys")
    keys = p.add_subparsers(dest="keys_command", required=True)
    k = keys.add_parser("create", help="make a new key for OWNER")
    k.add_argument("owner")
    k.set_defaults(func=cmd_keys_create)

    default_url = os.environ.get("IMPORTER_URL", "http://127.0.0.1:8080")
    p = sub.add_parser("submit", help="send a CSV file over the HTTP API (key from IMPORTER_API_KEY)")
    p.add_argument("file")
    p.add_argument("--batch-id", required=True)
    p.add_argument("--url", default=default_url, help="the API's base URL (IMPORTER_URL)")
    p.add_argument("--wait", action="store_true", help="follow the import until it completes or fails")
    p.add_argument("--timeout", type=float, default=600, help="seconds --wait waits at most")
    p.set_defaults(func=cmd_submit)

    p = sub.add_parser("status", help="show one import's status over the HTTP API")
    p.add_argument("job_id")
    p.add_argument("--url", default=default_url)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_status)

    p = sub.add_parser("doctor", help="check Redis settings and the queue, as a readable checklist")
    p.set_defaults(func=cmd_doctor)

    p = sub.add_parser("inspect", help="operator view of a job record, with its diagnostic")
    p.add_argument("job_id")
    p.set_defaults(func=cmd_inspect)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except SettingsError as err:
        print(f"importer: {err}", file=sys.stderr)
        return 2
    except Exception as err:
        from importer.adapters.redis_guard import EvictionPolicyError

        if isinstance(err, EvictionPolicyError):
            print(f"importer: {err}", file=sys.stderr)
            return 3
        raise


if __name__ == "__main__":
    sys.exit(main())
