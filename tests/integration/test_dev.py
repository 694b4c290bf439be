"""`importer dev` (what `make run` starts), as a newcomer sees it: readable
log lines, no warning on a default start, and Ctrl-C stops everything cleanly.

Real processes: the embedded valkey (IMPORTER_REDIS_URL unset, as on a fresh
machine), the events observer, `importer worker` and `importer serve`."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from importer.adapters.processes.client import http_json
from tests.integration.support import FIXTURES, ROOT, free_port, server_folder, wait_for

pytestmark = pytest.mark.integration

#: `importer dev`'s text lines: "21:40:01 info  worker.presence workerId=..."
TEXT_LINE = re.compile(r"^\d\d:\d\d:\d\d (debug|info |warning|error|critical) \S")


def dev_data_dir(tmp_path: Path) -> Path:
    """A data folder in the project (removed after the test), not under pytest's
    0700 tmp folder: as root, `importer dev`'s embedded PostgreSQL runs as
    'nobody', which must be able to enter every parent folder of its data."""
    folder = server_folder("dev")
    _CLEANUP.append(folder)
    return folder


_CLEANUP: list[Path] = []


@pytest.fixture(autouse=True)
def _remove_dev_data() -> object:
    import shutil

    yield
    while _CLEANUP:
        shutil.rmtree(_CLEANUP.pop(), ignore_errors=True)


def _stat(pid: int) -> tuple[int, str, str] | None:
    """(parent pid, state, start time) of a live process, else None."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = raw[raw.rindex(")") + 2:].split()  # after "pid (comm) "
    return int(fields[1]), fields[0], fields[19]


def _family(root: int) -> dict[int, str]:
    """Every descendant of ``root``, with its start time (against pid reuse)."""
    parents: dict[int, list[int]] = {}
    starts: dict[int, str] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (stat := _stat(int(entry.name))) is not None:
            parents.setdefault(stat[0], []).append(int(entry.name))
            starts[int(entry.name)] = stat[2]
    found: dict[int, str] = {}
    todo = [root]
    while todo:
        for child in parents.get(todo.pop(), []):
            found[child] = starts[child]
            todo.append(child)
    return found


def _still_running(family: dict[int, str]) -> list[int]:
    return [pid for pid, start in family.items() if (stat := _stat(pid)) is not None and stat[2] == start and stat[1] != "Z"]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_ctrl_c_stops_importer_dev_cleanly_with_readable_lines(tmp_path: Path) -> None:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("IMPORTER_")}
    env.update(IMPORTER_DATA_DIR=str(dev_data_dir(tmp_path)), PYTHONUNBUFFERED="1")
    out = tmp_path / "dev.log"
    with open(out, "wb") as handle:
        # Its own process group, as a shell gives a foreground job.
        dev = subprocess.Popen(
            [sys.executable, "-m", "importer.adapters.processes.cli", "dev", "--port", str(port)],
            stdout=handle, stderr=subprocess.STDOUT, env=env, cwd=ROOT, start_new_session=True,
        )
    family: dict[int, str] = {}
    try:
        wait_for(lambda: "dev: press Ctrl-C to stop" in out.read_text(), 90, 0.1, "importer dev to be ready")
        wait_for(lambda: "Worker process is ready for action" in out.read_text(), 60, 0.1, "the worker")
        key = re.search(r"^dev: API key: (\S+)$", out.read_text(), re.MULTILINE)
        assert key is not None
        status, body = http_json(
            "POST", f"http://127.0.0.1:{port}/api/imports?batchId=dev-ctrl-c", key.group(1),
            (FIXTURES / "shipment-a-2026.csv").read_bytes(), "text/csv",
        )
        assert status == 202, body
        wait_for(lambda: re.search(r"^completed \S+", out.read_text(), re.MULTILINE), 30, 0.1, "the import to complete")
        family = _family(dev.pid)
        # valkey, the observer, dramatiq's main and worker processes, granian's main and worker.
        assert len(family) >= 6, family
        # Ctrl-C: a terminal sends SIGINT to every process of its foreground group.
        os.killpg(dev.pid, signal.SIGINT)
        rc = dev.wait(timeout=120)
    finally:
        if dev.poll() is None:
            os.killpg(dev.pid, signal.SIGKILL)
            dev.wait()
        for pid in _still_running(family):
            os.kill(pid, signal.SIGKILL)
    lines = out.read_text().splitlines()
    shown = "\n".join(lines)

    assert rc == 0, shown
    assert lines[-1] == "dev: stopped", shown
    assert not _still_running(family), shown
    # Text, not JSON: each log line reads "HH:MM:SS level event key=value".
    json_lines = []
    for line in lines:
        try:
            json_lines.append(json.loads(line))
        except ValueError:
            pass
    assert not [line for line in json_lines if isinstance(line, dict)], shown
    # The import's own events, from `importer events` (its applied line is a debug line: IMPORTER_LOG_LEVEL).
    assert "completed shipment-dev-ctrl-c" in lines, shown
    assert [line for line in lines if TEXT_LINE.match(line)], shown
    # No warning on a default start (granian's "up to 8 Python threads" was one).
    assert not [line for line in lines if "Python threads" in line], shown
    assert not [line for line in lines if re.search(r"\bwarning\b", line) and "granian" in line], shown
    # Every process stopped by itself: nothing killed, and Redis outlived them
    # (the embedded valkey got the Ctrl-C too and stopped first).
    assert not [line for line in lines if "killing" in line.lower()], shown
    assert "connection error" not in shown.lower(), shown
    assert not [line for line in lines if re.match(r"^\S+ (warning|error|critical)", line)], shown
    for event in ("events.closed", "worker.redis_closed", "http.closed"):
        assert [line for line in lines if f" {event}" in line], (event, shown)


def _dev_env(data_dir: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("IMPORTER_")}
    env.update(IMPORTER_DATA_DIR=str(data_dir), PYTHONUNBUFFERED="1")
    return env


def _start_dev(
    tmp_path: Path, data_dir: Path | None = None, port: int | None = None, log: str = "dev.log",
) -> tuple[subprocess.Popen[bytes], Path, int]:
    port = port or free_port()
    out = tmp_path / log
    with open(out, "wb") as handle:
        dev = subprocess.Popen(
            [sys.executable, "-m", "importer.adapters.processes.cli", "dev", "--port", str(port)],
            stdout=handle, stderr=subprocess.STDOUT, env=_dev_env(data_dir or dev_data_dir(tmp_path)), cwd=ROOT,
            start_new_session=True,
        )
    return dev, out, port


def _ready_key(out: Path) -> str:
    wait_for(lambda: "dev: press Ctrl-C to stop" in out.read_text(), 90, 0.1, "importer dev to be ready")
    key = re.search(r"^dev: API key: (\S+)$", out.read_text(), re.MULTILINE)
    assert key is not None, out.read_text()
    return key.group(1)


def _ctrl_c(dev: subprocess.Popen[bytes]) -> int:
    os.killpg(dev.pid, signal.SIGINT)
    return dev.wait(timeout=120)


def _kill(dev: subprocess.Popen[bytes]) -> None:
    if dev.poll() is None:
        os.killpg(dev.pid, signal.SIGKILL)
        dev.wait()


def test_a_second_dev_refuses_a_busy_port_and_a_held_data_folder_and_the_first_is_untouched(tmp_path: Path) -> None:
    """Two `make run` in one clone used to share a port (the kernel split the
    connections, half of each one's requests got 401) and one append-only file."""
    folder = dev_data_dir(tmp_path)
    first, out, port = _start_dev(tmp_path, folder)
    try:
        key = _ready_key(out)
        # the same folder, as a second `make run` in the same clone
        same_folder = subprocess.run(
            [sys.executable, "-m", "importer.adapters.processes.cli", "dev", "--port", str(free_port())],
            env=_dev_env(folder), cwd=ROOT, capture_output=True, text=True, timeout=60,
        )
        said = same_folder.stdout + same_folder.stderr
        assert same_folder.returncode == 2, said
        assert f"another importer dev (pid {first.pid}) runs with the data folder {folder.resolve()}" in said, said
        assert "embedded" not in said, said  # refused before starting anything
        # another folder, the same port
        same_port = subprocess.run(
            [sys.executable, "-m", "importer.adapters.processes.cli", "dev", "--port", str(port)],
            env=_dev_env(dev_data_dir(tmp_path)), cwd=ROOT, capture_output=True, text=True, timeout=60,
        )
        said = same_port.stdout + same_port.stderr
        assert same_port.returncode == 2, said
        assert f"127.0.0.1:{port} is already in use" in said and "embedded" not in said, said
        assert len(said.strip().splitlines()) == 1, said
        # the first is untouched: every request reaches it, with its key
        for _ in range(30):
            status, body = http_json("GET", f"http://127.0.0.1:{port}/api/imports", key)
            assert status == 200, body
        assert first.poll() is None
    finally:
        _kill(first)


def test_the_dev_key_survives_a_restart_and_the_cli_beside_it_finds_its_store(tmp_path: Path) -> None:
    """The console tab of a restarted dev keeps working; `importer doctor`,
    `submit` and `status` next to a running dev need nothing set; a key the
    server does not know is told apart from no key at all."""
    folder = dev_data_dir(tmp_path)
    dev, out, port = _start_dev(tmp_path, folder)
    try:
        key = _ready_key(out)
        url = f"http://127.0.0.1:{port}"
        status, problem = http_json("GET", f"{url}/api/imports", "not-a-key-this-server-knows")
        assert status == 401 and problem["code"] == "auth.invalid", problem
        status, problem = http_json("GET", f"{url}/api/imports", None)
        assert status == 401 and problem["code"] == "auth.required", problem

        # the CLI beside it, with nothing set but the data folder (as `make run`'s own .importer-data)
        def cli(*args: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run([sys.executable, "-m", "importer.adapters.processes.cli", *args],
                                  env=_dev_env(folder), cwd=tmp_path, capture_output=True, text=True, timeout=120)
        doctor = cli("doctor")
        assert doctor.returncode == 0, doctor.stdout + doctor.stderr
        assert "IMPORTER_REDIS_URL is not set" not in doctor.stderr, doctor.stderr
        submitted = cli("submit", str(FIXTURES / "shipment-a-2026.csv"), "--batch-id", "dev-cli-finds")
        assert submitted.returncode == 0, submitted.stdout + submitted.stderr
        status_line = cli("status", "shipment-dev-cli-finds")
        assert status_line.returncode == 0 and "shipment-dev-cli-finds" in status_line.stdout, status_line.stdout

        assert _ctrl_c(dev) == 0, out.read_text()
        dev, out, port = _start_dev(tmp_path, folder, log="dev-again.log")
        assert _ready_key(out) == key
        status, _ = http_json("GET", f"http://127.0.0.1:{port}/api/imports", key)
        assert status == 200
        # the local key is the operator's too: the page it prints, and its API
        assert f"http://127.0.0.1:{port}/ops" in out.read_text()
        status, overview = http_json("GET", f"http://127.0.0.1:{port}/api/ops/overview", key)
        assert status == 200 and [row["location"] for row in overview["locations"]] == ["main"], overview
        assert _ctrl_c(dev) == 0, out.read_text()
        # no dev running: the CLI says what to set, in one line
        doctor = cli("doctor")
        assert doctor.returncode == 2 and "no importer dev runs with the data folder" in doctor.stderr, doctor.stderr
    finally:
        _kill(dev)


def test_the_printed_curl_works_from_any_folder(tmp_path: Path) -> None:
    """`dev: try: curl ...` sent an empty body from anywhere but the repo root."""
    dev, out, port = _start_dev(tmp_path)
    try:
        _ready_key(out)
        line = next(line for line in out.read_text().splitlines() if line.startswith("dev: try: "))
        done = subprocess.run(line.removeprefix("dev: try: "), shell=True, cwd=tmp_path, capture_output=True,
                              text=True, timeout=30)
        answer = json.loads(done.stdout)
        assert answer["state"] in ("waiting", "active", "completed"), answer
    finally:
        _kill(dev)


def _names(pids: list[int]) -> list[str]:
    out = []
    for pid in pids:
        try:
            command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            out.append(f"{pid}:{command[:90]}")
        except OSError:
            out.append(f"{pid}:?")
    return out


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_sigkill_of_importer_dev_stops_every_process_it_started(tmp_path: Path) -> None:
    """`importer dev` supervises its children: killed by any signal, SIGKILL
    included (no handler of its own runs), the server, the worker, the
    observer and the embedded valkey it started, and their own processes,
    stop within a few seconds."""
    dev, out, port = _start_dev(tmp_path)
    family: dict[int, str] = {}
    try:
        wait_for(lambda: "dev: press Ctrl-C to stop" in out.read_text(), 90, 0.1, "importer dev to be ready")
        wait_for(lambda: "Worker process is ready for action" in out.read_text(), 60, 0.1, "the worker")
        family = _family(dev.pid)
        # valkey, the observer, dramatiq's main and worker processes, granian's main and worker.
        assert len(family) >= 6, _names(list(family))
        os.kill(dev.pid, signal.SIGKILL)  # dev alone, not its process group
        dev.wait(timeout=10)
        killed_at = time.monotonic()
        try:
            wait_for(lambda: not _still_running(family), 10, 0.05, "every process importer dev started to stop")
        except AssertionError:
            raise AssertionError(f"still running: {_names(_still_running(family))}\n{out.read_text()}") from None
        took = time.monotonic() - killed_at
    finally:
        if dev.poll() is None:
            os.killpg(dev.pid, signal.SIGKILL)
            dev.wait()
        for pid in _still_running(family):
            os.kill(pid, signal.SIGKILL)
    shown = out.read_text()
    print(f"[dev] SIGKILL: {len(family)} processes gone in {took:.1f}s")
    assert took <= 5, f"{took:.1f}s\n{shown}"
    # Each stopped as on SIGTERM, none was killed, and the embedded server
    # stopped last: nobody lost its connection to it.
    assert "dev: importer dev is gone; stopping the processes it started" in shown, shown
    for event in ("events.closed", "worker.redis_closed", "http.closed"):
        assert f" {event}" in shown, (event, shown)
    assert "killing" not in shown.lower() and "connection error" not in shown.lower(), shown


def test_a_time_limit_failure_reads_as_one_line_per_attempt_and_a_retry_after_a_restart_completes(tmp_path: Path) -> None:
    """The README's way to see a retryable failure: an import that outlives a time limit
    set too short, then a retry once dev runs with its usual limits (the same key).
    The terminal shows one line per failed attempt, no traceback (they were two per attempt)."""
    folder = dev_data_dir(tmp_path)
    big = tmp_path / "big.csv"
    big.write_text("sku,quantity\n" + "".join(f"BULK-{i:06d},1\n" for i in range(100_000)))
    port = free_port()
    out = tmp_path / "dev-short.log"
    # 0.01 s: the worker checks the limits every 100 ms (TimeLimit interval, adapters/dramatiq/broker.py),
    # so it fires by about 110 ms, while the attempt's Python work on 100,000 rows (fetch, validation)
    # takes about 200 ms. With 0.1 s it could fire while the worker waited for the apply script: raised
    # once the script had committed, the job is completed (test_end_to_end, the late time limit).
    env = {**_dev_env(folder), "IMPORTER_TIME_LIMIT": "0.01"}
    with open(out, "wb") as handle:
        dev = subprocess.Popen(
            [sys.executable, "-m", "importer.adapters.processes.cli", "dev", "--port", str(port)],
            stdout=handle, stderr=subprocess.STDOUT, env=env, cwd=ROOT, start_new_session=True,
        )
    try:
        key = _ready_key(out)
        url = f"http://127.0.0.1:{port}/api/imports"
        status, body = http_json("POST", f"{url}?batchId=dev-big-1", key, big.read_bytes(), "text/csv")
        assert status == 202, body
        failed = wait_for(lambda: (r := http_json("GET", f"{url}/shipment-dev-big-1", key)[1])["state"] == "failed" and r,
                          60, 0.2, "the import to fail its time limit")
        assert failed["error"]["code"] == "import.time_limit" and failed["attempt"] == 3, failed
        wait_for(lambda: out.read_text().count("import.failure_recorded") >= 3, 10, 0.1, "the last attempt's line")
        assert _ctrl_c(dev) == 0
        shown = out.read_text()
        assert "Traceback" not in shown and "Failed to process message" not in shown, shown
        attempts = [line for line in shown.splitlines() if " import.attempt_failed " in line]
        assert len(attempts) == 3 and all("code=import.time_limit" in line for line in attempts), shown
        assert all('exc="TimeLimitExceeded' in line for line in attempts), attempts

        dev, out, port = _start_dev(tmp_path, folder, log="dev-usual.log")
        assert _ready_key(out) == key
        url = f"http://127.0.0.1:{port}/api/imports"
        status, body = http_json("POST", f"{url}/shipment-dev-big-1/retry", key)
        assert status == 202, body
        done = wait_for(lambda: (r := http_json("GET", f"{url}/shipment-dev-big-1", key)[1])["state"] == "completed" and r,
                        60, 0.2, "the retried import to complete")
        assert done["result"]["imported"] == 100_000 and done["retries"] == 1, done
    finally:
        _kill(dev)
