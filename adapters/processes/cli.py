"""The ``importer`` command: its arguments and the dispatch to the three
modules that run it (commands, dev, operator, client)."""

from __future__ import annotations

import argparse
import os
import sys

from importer.adapters.processes import client, commands, dev, operator
from importer.adapters.processes.granian import DEFAULT_THREADS, default_workers
from importer.adapters.settings import SettingsError

DESCRIPTION = "Applies CSV shipments to stock exactly once: serve, worker, dev, events, submit, status, retry, doctor, inspect, keys, openapi."


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="importer", description=DESCRIPTION)
    sub = parser.add_subparsers(dest="command", required=True)

    # -- processes (commands) -------------------------------------------------
    p = sub.add_parser("serve", help="run the HTTP API under granian (or gunicorn)")
    p.add_argument("--bind", default=None, help="HOST:PORT to listen on (default: IMPORTER_HTTP_BIND, else 127.0.0.1:8080)")
    # Measured with bench/run.py, bench/http_servers.py and bench/profile_http.py
    # (README, Performance): granian, cores + 1 processes x 4 threads.
    p.add_argument("--server", choices=("granian", "gunicorn"), default=None, help="default: IMPORTER_HTTP_SERVER, else granian")
    p.add_argument("--workers", type=int, default=default_workers(), help="worker processes (default: cores + 1)")
    p.add_argument("--threads", type=int, default=DEFAULT_THREADS, help="Python threads per worker process (gunicorn: >1 is gthread)")
    p.add_argument("--timeout", type=int, default=30, help="gunicorn only: seconds before a stuck request's worker is restarted")
    p.add_argument("--graceful-timeout", type=int, default=30, help="seconds in-flight requests get on SIGTERM")
    p.add_argument(
        "--header-timeout", type=float, default=None,
        help="granian only: seconds a client has to send its whole header block (default: IMPORTER_HTTP_HEADER_TIMEOUT, else 10)",
    )
    p.add_argument("--allow-eviction", action="store_true", help="start even if Redis may evict keys (dangerous)")
    p.set_defaults(func=commands.cmd_serve)

    p = sub.add_parser("worker", help="run dramatiq worker processes")
    # Defaults measured with bench/ (docs/performance.md): one process per core,
    # 2 threads, and a prefetch of 64 (dramatiq's 2 x threads starves the threads
    # between fetches). With the small imports fetched together sharing one
    # script call, 2 threads drained faster than 4 or 8, at less CPU per import.
    p.add_argument("--processes", type=int, default=os.cpu_count() or 1)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--prefetch", type=int, default=64, help="messages prefetched per process (0: dramatiq's 2 x threads)")
    p.add_argument("--allow-eviction", action="store_true", help="start even if Redis may evict keys (dangerous)")
    p.add_argument(
        "--metrics-port", type=int, default=None,
        help="expose dramatiq's Prometheus metrics on 127.0.0.1:PORT (0: off; default: IMPORTER_WORKER_METRICS_PORT, else off)",
    )
    p.set_defaults(func=commands.cmd_worker)

    p = sub.add_parser("dev", help="embedded Redis + worker + HTTP on 127.0.0.1, until Ctrl-C")
    p.add_argument("--port", type=int, default=8080)
    p.add_argument("--demo", action="store_true", help="import fixtures/shipment-a-2026.csv over HTTP, then stop")
    p.set_defaults(func=dev.cmd_dev)

    p = sub.add_parser("events", help="print every job event (progress, completed, failed...) from all workers")
    p.add_argument("--json", action="store_true", help="one JSON object per line")
    p.add_argument(
        "--from", dest="start", default="$",
        help="resume after this stream id, at every location ('0' for all retained history; default: from "
             "now), or per location: main=ID,paris=ID (a location not named: from its beginning)",
    )
    p.set_defaults(func=commands.cmd_events)

    p = sub.add_parser("ledger", help="the exporter: copy applied shipments into the ledger (PostgreSQL), then trim Redis")
    p.add_argument("action", nargs="?", choices=("run", "verify", "restore"), default="run",
                   help="run: the exporter (default); verify: check the ledger against Redis, exit 1 on drift; "
                        "restore: bring Redis forward from the ledger where it is behind")
    p.add_argument("--once", action="store_true", help="run: export until caught up, trim, then exit")
    p.add_argument("--location", default=None, help="verify, restore: only this location (default: every one)")
    p.add_argument("--dry-run", action="store_true", help="restore: say what it would write, write nothing")
    p.add_argument("--max-lag", type=float, default=60.0, metavar="SECONDS",
                   help="verify: drift when an applied shipment waits for the exporter longer than this (default 60)")
    p.set_defaults(func=lambda a: _ledger(a))

    # -- operator tools (operator) ---------------------------------------------
    p = sub.add_parser("openapi", help="print the OpenAPI document generated from the code")
    p.add_argument("--write", action="store_true", help="rewrite openapi.yaml")
    p.set_defaults(func=operator.cmd_openapi)

    p = sub.add_parser("keys", help="API keys")
    keys = p.add_subparsers(dest="keys_command", required=True)
    k = keys.add_parser("create", help="make a new key for OWNER")
    k.add_argument("owner")
    k.add_argument(
        "--locations", metavar="LOC,LOC",
        help="the stock locations this key may use, comma-separated (default: every location)",
    )
    k.add_argument(
        "--scopes", metavar="SCOPE,SCOPE",
        help="extra rights of this key, comma-separated: stock:read (stock levels and every owner's stock movements), "
             "ops (the operators' routes /api/ops/ and the page /ops)",
    )
    k.set_defaults(func=operator.cmd_keys_create)

    p = sub.add_parser("doctor", help="check Redis settings and the queue, as a readable checklist")
    p.set_defaults(func=operator.cmd_doctor)

    p = sub.add_parser("locations", help="the declared stock locations: list them, or add some")
    p.add_argument("action", nargs="?", choices=("list", "add"), default="list")
    p.add_argument("names", nargs="*", metavar="NAME", help="add: the locations to declare")
    p.set_defaults(func=operator.cmd_locations)

    p = sub.add_parser("inspect", help="operator view of a job record, with its diagnostic")
    p.add_argument("job_id")
    p.set_defaults(func=operator.cmd_inspect)

    # -- the HTTP client (client) ----------------------------------------------
    url_help = "the API's base URL (default: IMPORTER_URL, else http://127.0.0.1:8080)"
    p = sub.add_parser("submit", help="send CSV files over the HTTP API (key from IMPORTER_API_KEY); several in bulk")
    p.add_argument("files", nargs="+", metavar="FILE", help="a CSV file, several, or folders of .csv files (sent in bulk)")
    p.add_argument("--batch-id", default=None, help="the batchId of a single file (default: its name without .csv)")
    p.add_argument("--location", default=None, help="the stock location (default: the server's, main)")
    p.add_argument("--url", default=None, help=url_help)
    p.add_argument("--wait", action="store_true", help="follow the import until it completes or fails")
    p.add_argument("--timeout", type=float, default=600, help="seconds --wait waits at most")
    p.set_defaults(func=client.cmd_submit)

    p = sub.add_parser("status", help="show one import's status over the HTTP API")
    p.add_argument("job_id")
    p.add_argument("--url", default=None, help=url_help)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=client.cmd_status)

    p = sub.add_parser("retry", help="retry one of your failed imports over the HTTP API (a new attempt chain)")
    p.add_argument("job_id")
    p.add_argument("--url", default=None, help=url_help)
    p.add_argument("--wait", action="store_true", help="follow the retried import until it completes or fails")
    p.add_argument("--timeout", type=float, default=600, help="seconds --wait waits at most")
    p.set_defaults(func=client.cmd_retry)
    return parser


def _ledger(args: argparse.Namespace) -> int:
    from importer.adapters.processes.ledger import cmd_ledger, cmd_ledger_restore, cmd_ledger_verify

    if args.action == "restore":
        return cmd_ledger_restore(args.location, args.dry_run)
    return cmd_ledger_verify(args.location, args.max_lag) if args.action == "verify" else cmd_ledger(args.once)


#: Commands that read the store, or call the API, of the `importer dev` running with
#: IMPORTER_DATA_DIR (./.importer-data by default) when no URL of their own is set.
_STORE_BESIDE_DEV = {"events", "doctor", "inspect", "locations"}
_API_BESIDE_DEV = {"submit", "status", "retry"}


def _beside_dev(args: argparse.Namespace) -> None:
    from importer.adapters.dev_state import data_folder
    from importer.adapters.command_settings import adopt_running_dev

    store = args.command in _STORE_BESIDE_DEV or (args.command == "ledger" and args.action in ("verify", "restore"))
    if not store and args.command not in _API_BESIDE_DEV:
        return
    env = adopt_running_dev()
    if store and not env.get("IMPORTER_REDIS_URL"):
        raise SettingsError(
            f"IMPORTER_REDIS_URL is not set, and no importer dev runs with the data folder {data_folder(env)} "
            "(start `importer dev`, set IMPORTER_DATA_DIR to the folder of the one running, or set IMPORTER_REDIS_URL)"
        )


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        _beside_dev(args)
        return int(args.func(args) or 0)
    except SettingsError as err:
        print(f"importer: {err}", file=sys.stderr)
        return 2
    except Exception as err:
        from importer.adapters.postgres.embedded import EmbeddedPostgresError
        from importer.adapters.redis.guard import EvictionPolicyError

        if isinstance(err, EmbeddedPostgresError):
            print(f"importer: {err}", file=sys.stderr)
            return 2
        if isinstance(err, EvictionPolicyError):
            print(f"importer: {err}", file=sys.stderr)
            return 3
        raise


if __name__ == "__main__":
    sys.exit(main())
