"""``importer submit``, ``importer status`` and ``importer retry``: the service's
HTTP API for people (a producer's key from IMPORTER_API_KEY; no Redis, no
service settings)."""

from __future__ import annotations

import argparse
import http.client
import io
import json
import select
import socket
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

from importer.adapters.command_settings import ClientSettings
from importer.domain.jobs import FINISHED_STATES
from importer.handlers.digest import content_digest


#: Seconds to wait for the server's ``100 Continue`` (or its early final
#: answer) before sending the body anyway, as curl does.
EXPECT_WAIT_S = 1.0
#: Bytes sent per write while watching for an early answer.
_SEND_CHUNK = 64 * 1024


def http_json(method: str, url: str, key: str | None, body: bytes | None = None, ctype: str = "") -> tuple[int, Any]:
    """One request; (status, decoded JSON body). HTTP errors are answers, not exceptions."""
    if body is not None:
        status, data = send_body(method, url, key, body, ctype)
        return status, json.loads(data or b"null")
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


def send_body(method: str, url: str, key: str | None, body: bytes, ctype: str, timeout: float = 60) -> tuple[int, bytes]:
    """A request with a body that hears the server's answer even when the server
    answers before reading the body (401, 429, 503 busy, 413) and then closes.

    urllib sends the whole body before it reads anything, so such an answer
    becomes a connection reset. Here the request head carries ``Expect:
    100-continue``; the body is sent after the server's ``100 Continue`` (or
    after EXPECT_WAIT_S without any answer: a server or proxy that ignores
    Expect), in chunks, and sending stops as soon as a final answer arrives."""
    parts = urllib.parse.urlsplit(url)
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    conn_class = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    conn = conn_class(parts.hostname or "127.0.0.1", parts.port, timeout=timeout)
    try:
        conn.putrequest(method, path, skip_accept_encoding=True)
        if key:
            conn.putheader("Authorization", f"Bearer {key}")
        if ctype:
            conn.putheader("Content-Type", ctype)
        conn.putheader("Content-Length", str(len(body)))
        # Proves the body whole end to end, through any proxy (RFC 9530).
        conn.putheader("Content-Digest", content_digest(body))
        conn.putheader("Expect", "100-continue")
        conn.endheaders()
        sock = conn.sock
        answer_start = _await_continue(sock)
        if answer_start is None:
            _send_unless_answered(sock, body)
            answer_start = b""
        response = http.client.HTTPResponse(_Prefixed(answer_start, sock), method=method)  # type: ignore[arg-type]
        response.begin()  # skips a 100 Continue that came late
        return response.status, response.read()
    finally:
        conn.close()


def _await_continue(sock: socket.socket) -> bytes | None:
    """None: send the body (``100 Continue`` came, or nothing within
    EXPECT_WAIT_S). Else the server answered before the body: the first line
    of its answer, already read."""
    readable, _, _ = select.select([sock], [], [], EXPECT_WAIT_S)
    if not readable:
        return None
    line = _read_line(sock)
    if line.split(b" ", 2)[1:2] != [b"100"]:
        return line
    while _read_line(sock) not in (b"\r\n", b"\n", b""):
        pass  # the interim answer's headers
    return None


def _read_line(sock: socket.socket) -> bytes:
    """One line, byte by byte: nothing after it is taken from the socket."""
    line = b""
    while not line.endswith(b"\n") and len(line) < 65536:
        byte = sock.recv(1)
        if not byte:
            break
        line += byte
    return line


def _send_unless_answered(sock: socket.socket, body: bytes) -> None:
    """Send the body, stopping early when the server's answer arrives (or the
    server stops reading and closes: its answer is read next)."""
    view = memoryview(body)
    sent = 0
    try:
        while sent < len(view):
            readable, writable, _ = select.select([sock], [sock], [], sock.gettimeout())
            if readable:
                return
            if not writable:
                raise TimeoutError("the server stopped reading the body")
            sent += sock.send(view[sent:sent + _SEND_CHUNK])
    except (BrokenPipeError, ConnectionResetError):
        return  # the server closed while we were sending: its answer may be there
    finally:
        view.release()


class _Prefixed:
    """What http.client.HTTPResponse reads from: bytes already taken off the
    socket, then the socket."""

    def __init__(self, prefix: bytes, sock: socket.socket) -> None:
        self.prefix = prefix
        self.sock = sock

    def makefile(self, mode: str) -> io.BufferedReader:
        return io.BufferedReader(_PrefixedRaw(self.prefix, self.sock))


class _PrefixedRaw(io.RawIOBase):
    def __init__(self, prefix: bytes, sock: socket.socket) -> None:
        self.prefix = prefix
        self.sock = sock

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        if self.prefix:
            n = min(len(buffer), len(self.prefix))
            buffer[:n] = self.prefix[:n]
            self.prefix = self.prefix[n:]
            return n
        return self.sock.recv_into(buffer)


def _target(args: argparse.Namespace) -> tuple[str, str]:
    """The API's base URL (--url, else IMPORTER_URL) and the producer's key."""
    client = ClientSettings.from_env()
    key = client.require_key()
    return (args.url or client.url).rstrip("/"), key


def _describe_problem(status: int, body: Any) -> str:
    if isinstance(body, dict) and "code" in body:
        fields = body.get("fields")
        if not isinstance(fields, dict):
            fields = {}
        named = "".join(f"\n  {name}: {' '.join(map(str, why))}" for name, why in fields.items())
        return f"{status} {body['code']}: {body.get('detail', '')}{named}"
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
    if record.get("retryable"):
        print(f"  retry it: importer retry {record['id']} --wait")
    return 1


def follow(url: str, key: str, job_id: str, *, timeout: float, interval: float = 0.2, retry: int = 0) -> int:
    """Follow the job until it finishes: its live event stream, else polling;
    one line per change, or a live line on a TTY. ``retry``: follow its n-th
    retry, skipping the events of the chains before it (the stream replays
    the job's whole history)."""
    from importer.adapters.processes.event_stream_client import apply_event, follow_stream

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

    skipping = retry > 0

    def show(event: dict[str, Any]) -> None:
        nonlocal view, skipping
        if skipping:
            data = event.get("data")
            if event.get("event") != "waiting" or not isinstance(data, dict) or data.get("retry") != retry:
                return
            skipping = False
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


#: A bulk request's shipments and bytes at most, as the client sends them (the server's bounds: handlers/bulk.py).
BULK_LINES = 1000
BULK_BYTES = 8 * 1024 * 1024


def cmd_submit(args: argparse.Namespace) -> int:
    """One file under --batch-id (or its name); several files, or folders of .csv files, in bulk requests."""
    url, key = _target(args)
    paths = [p for given in args.files for p in (sorted(Path(given).glob("*.csv")) if Path(given).is_dir() else [Path(given)])]
    if len(args.files) > 1 or Path(args.files[0]).is_dir():
        if args.batch_id:
            print("importer: --batch-id names one file's shipment; several are named after their files", file=sys.stderr)
            return 2
        return _submit_bulk(args, url, key, paths)
    try:
        data = paths[0].read_bytes()
    except OSError as err:
        print(f"importer: cannot read {args.files[0]}: {err.strerror}", file=sys.stderr)
        return 2
    batch_id = args.batch_id or paths[0].stem
    query = urllib.parse.urlencode({"batchId": batch_id, **({"location": args.location} if args.location else {})})
    body = _accepted(url, f"{url}/api/imports?{query}", key, data, "text/csv")
    if isinstance(body, int):
        return body
    where = f" at {body['location']}" if body.get("location") else ""
    print(f"accepted {body['jobId']} (batch {body['batchId']}{where}, {body['state']})", flush=True)
    if not args.wait:
        return 0
    return follow(url, key, body["jobId"], timeout=args.timeout)


def _submit_bulk(args: argparse.Namespace, url: str, key: str, paths: list[Path]) -> int:
    """POST /api/imports/bulk, as many requests as the bounds need: each file's batchId is its name.
    One file never stops the others: a file that cannot be read is reported and
    counted refused; one that is not UTF-8 (an NDJSON line cannot carry it) is
    sent on its own, as its bytes, for the server's own answer."""
    lines: list[bytes] = []
    accepted: list[str] = []
    refused = 0
    location = {"location": args.location} if args.location else {}
    for path in paths:
        try:
            data = path.read_bytes()
        except OSError as err:
            print(f"refused {path.stem}: cannot read {path}: {err.strerror}", file=sys.stderr)
            refused += 1
            continue
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            query = urllib.parse.urlencode({"batchId": path.stem, **location})
            body = _accepted(url, f"{url}/api/imports?{query}", key, data, "text/csv")
            if body == 2:
                return 2  # the server cannot be reached: nothing more can be sent
            if isinstance(body, int):
                refused += 1
            else:
                print(f"accepted {body['jobId']} (batch {body['batchId']}, {body['state']})", flush=True)
                accepted.append(body["jobId"])
            continue
        lines.append(json.dumps({"batchId": path.stem, "csv": text, **location}).encode())
    while lines:
        size, take = 0, 0
        while take < len(lines) and take < BULK_LINES and (take == 0 or size + len(lines[take]) + 1 <= BULK_BYTES):
            size += len(lines[take]) + 1
            take += 1
        chunk, lines = lines[:take], lines[take:]
        body = _accepted(url, f"{url}/api/imports/bulk", key, b"\n".join(chunk) + b"\n", "application/x-ndjson", ok=200)
        if isinstance(body, int):
            return body
        for raw, result in zip(chunk, body["results"]):
            batch_id = json.loads(raw)["batchId"]
            if result["status"] == 202:
                job = result["body"]
                print(f"accepted {job['jobId']} (batch {job['batchId']}, {job['state']})", flush=True)
                accepted.append(job["jobId"])
            else:
                refused += 1
                print(f"refused {batch_id}: {_describe_problem(result['status'], result['body'])}", file=sys.stderr)
    worst = 1 if refused else 0
    if args.wait:
        for job_id in accepted:
            worst = max(worst, follow(url, key, job_id, timeout=args.timeout))
    return worst


def _accepted(url: str, target: str, key: str | None, data: bytes | None = None, ctype: str = "", ok: int = 202) -> Any:
    """POST ``target``: the ``ok`` answer's body, or the exit code after saying
    why not (2: the server cannot be reached, 1: it refused)."""
    try:
        status, body = http_json("POST", target, key, data, ctype)
    except (OSError, ValueError, http.client.HTTPException) as err:
        print(f"importer: cannot reach {url}: {err}", file=sys.stderr)
        return 2
    if status != ok:
        print(f"refused: {_describe_problem(status, body)}", file=sys.stderr)
        return 1
    return body


def cmd_retry(args: argparse.Namespace) -> int:
    """POST /api/imports/{jobId}/retry: a failed import's new attempt chain (exit 1 on 404/409)."""
    url, key = _target(args)
    body = _accepted(url, f"{url}/api/imports/{urllib.parse.quote(args.job_id)}/retry", key)
    if isinstance(body, int):
        return body
    print(f"retrying {body['jobId']} (batch {body['batchId']}, {body['state']})", flush=True)
    if not args.wait:
        return 0
    # The retry's number, so that the wait shows this chain only (0: every event).
    status, record = http_json("GET", f"{url}/api/imports/{urllib.parse.quote(body['jobId'])}", key)
    retry = int(record.get("retries") or 0) if status == 200 and isinstance(record, dict) else 0
    return follow(url, key, body["jobId"], timeout=args.timeout, retry=retry)


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
    retried = f", retry {record['retries']}" if record.get("retries") else ""
    print(f"{record['id']}: {record['state']} (attempt {record['attempt']}{retried}, phase {progress.get('phase', '-')}, rows {progress.get('rows', '-')})")
    if record["state"] in FINISHED_STATES:
        _show_final(record, url)
    return 0
