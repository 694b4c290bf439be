"""``importer submit`` and ``importer status``: the service's HTTP API for people
(a producer's key from IMPORTER_API_KEY; no Redis, no service settings)."""

from __future__ import annotations

import argparse
import json
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

from importer.adapters.settings import ClientSettings
from importer.domain.jobs import FINISHED_STATES


def http_json(method: str, url: str, key: str | None, body: bytes | None = None, ctype: str = "") -> tuple[int, Any]:
    """One request; (status, decoded JSON body). HTTP errors are answers, not exceptions."""
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


def _target(args: argparse.Namespace) -> tuple[str, str]:
    """The API's base URL (--url, else IMPORTER_URL) and the producer's key."""
    client = ClientSettings.from_env()
    key = client.require_key()
    return (args.url or client.url).rstrip("/"), key


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


def _print_rejections(error: dict[str, Any], url: str) -> None:
    """Where every rejected row is (GET .../rejections.csv), for a failed CSV validation."""
    report = error.get("rejections")
    if not isinstance(report, dict) or not report.get("url"):
        return
    found, listed = report.get("found"), report.get("listed")
    size = f"{found} issue(s)" + (f", the first {listed} listed" if report.get("truncated") else "")
    where = url + str(report["url"])
    print(f"rejection report ({size}): {where}")
    print(f'  get it: curl -H "Authorization: Bearer $IMPORTER_API_KEY" -o rejections.csv {where}')


def _show_final(record: dict[str, Any], url: str = "") -> int:
    if record["state"] == "completed":
        print(f"completed {record['id']}: {json.dumps(record['result'])}")
        return 0
    error = record.get("error") or {}
    print(f"failed {record['id']}: {error.get('code')}: {error.get('message')}")
    _print_issues(error)
    _print_rejections(error, url)
    return 1


def follow(url: str, key: str, job_id: str, *, timeout: float, interval: float = 0.2) -> int:
    """Follow the job until it finishes: its live event stream, else polling;
    one line per change, or a live line on a TTY."""
    from importer.adapters.event_stream_client import apply_event, follow_stream

    live = sys.stdout.isatty()
    started = time.monotonic()
    last = None
    view: dict[str, Any] = {"state": "waiting", "attempt": 0, "progress": None}

    def report(job: dict[str, Any]) -> float:
        """Print the job's line (once per change, or in place on a TTY); returns the seconds elapsed."""
        nonlocal last
        progress = job.get("progress") or {}
        line = f"{job['state']:<9} phase={progress.get('phase', '-')} rows={progress.get('rows', '-')} attempt={job['attempt']}"
        elapsed = time.monotonic() - started
        if live:
            print(f"\r{line} elapsed={elapsed:.1f}s", end="", flush=True)
        elif line != last:
            print(f"{line} elapsed={elapsed:.1f}s", flush=True)
        last = line
        return elapsed

    def show(event: dict[str, Any]) -> None:
        nonlocal view
        view = apply_event(view, event)
        report(view)

    outcome = follow_stream(url, key, job_id, deadline=started + timeout, on_event=show)
    if outcome == "timeout":
        print(("\n" if live else "") + f"still {view['state']} after {timeout:g} s", file=sys.stderr)
        return 3
    # "finished": read the record for the result; "unavailable": poll it.
    while True:
        status, record = http_json("GET", f"{url}/api/imports/{job_id}", key)
        if status != 200:
            print(("\n" if live else "") + f"error: {_describe_problem(status, record)}", file=sys.stderr)
            return 1
        elapsed = report(record)
        if record["state"] in FINISHED_STATES:
            if live:
                print()
            return _show_final(record, url)
        if elapsed > timeout:
            print(("\n" if live else "") + f"still {record['state']} after {timeout:g} s", file=sys.stderr)
            return 3
        time.sleep(interval)


def cmd_submit(args: argparse.Namespace) -> int:
    url, key = _target(args)
    try:
        data = Path(args.file).read_bytes()
    except OSError as err:
        print(f"importer: cannot read {args.file}: {err.strerror}", file=sys.stderr)
        return 2
    query = urllib.parse.urlencode({"batchId": args.batch_id})
    try:
        status, body = http_json("POST", f"{url}/api/imports?{query}", key, data, "text/csv")
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
    url, key = _target(args)
    status, record = http_json("GET", f"{url}/api/imports/{urllib.parse.quote(args.job_id)}", key)
    if status != 200:
        print(f"error: {_describe_problem(status, record)}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(record, indent=2))
        return 0
    progress = record.get("progress") or {}
    print(f"{record['id']}: {record['state']} (attempt {record['attempt']}, phase {progress.get('phase', '-')}, rows {progress.get('rows', '-')})")
    if record["state"] in FINISHED_STATES:
        _show_final(record, url)
    return 0
