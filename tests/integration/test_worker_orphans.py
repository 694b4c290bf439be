"""no orphaned worker processes. When the `importer worker`
parent (dramatiq's main process) dies by SIGKILL, its children stop taking
work, finish what is in flight, give back what they prefetched, and exit."""

from __future__ import annotations

import os
import signal
import time
import urllib.request
from pathlib import Path

import pytest

from importer.domain.shipment import job_id_for
from tests.integration.support import FIXTURES, System, free_port, queued_messages, wait_for

pytestmark = pytest.mark.integration

SEED = (FIXTURES / "shipment-a-2026.csv").read_bytes()


def _stat(pid: int) -> tuple[int, str] | None:
    """(parent pid, state) of a live process, None once it is gone or a zombie."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    fields = text[text.rindex(")") + 2 :].split()  # the name may hold spaces
    state, ppid = fields[0], int(fields[1])
    return None if state in ("Z", "X") else (ppid, state)


def children_of(pid: int) -> list[int]:
    """Live child processes of pid (a scan of /proc: portable across kernels
    built without /proc/<pid>/task/<tid>/children)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            stat = _stat(int(entry))
            if stat is not None and stat[0] == pid:
                found.append(int(entry))
    return sorted(found)


def _serves(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return bool(response.status == 200)
    except OSError:
        return False


def alive(pids: list[int]) -> list[int]:
    return [pid for pid in pids if _stat(pid) is not None]


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs Linux /proc")
@pytest.mark.parametrize("metrics", [False, True], ids=["plain", "with-metrics-exporter"])
def test_a_sigkilled_worker_parent_leaves_no_child_and_loses_no_job(make_system: object, metrics: bool) -> None:
    system: System = make_system()  # type: ignore[operator]
    system.start_http()
    port = free_port()
    extra = {"IMPORTER_WORKER_METRICS_PORT": str(port)} if metrics else {}
    # One thread: the first import holds it (2 s before its apply), the second
    # waits in the process's prefetch, fetched but not started.
    worker = system.start_worker(threads=1, IMPORTER_FAULT="before_apply:2", **extra)
    parent = worker.popen.pid
    children = wait_for(lambda: children_of(parent) if len(children_of(parent)) >= (2 if metrics else 1) else None,
                        20, message="worker children")
    if metrics:  # the exporter process is one of the children, and it serves
        wait_for(lambda: _serves(f"http://127.0.0.1:{port}/"), 20, 0.2, message="worker metrics")
    try:
        assert system.post_csv("orphan-1", SEED)[0] == 202
        wait_for(lambda: "fault.injected" in worker.log(), 20, message="first import in flight")
        assert system.post_csv("orphan-2", b"sku,quantity\nORPHAN-2,5\n")[0] == 202
        wait_for(lambda: queued_messages(system) == 0, 20, message="second message prefetched")

        os.kill(parent, signal.SIGKILL)  # the parent only, not its process group
        worker.popen.wait(timeout=10)
        killed_at = time.monotonic()
        wait_for(lambda: not alive(children), 5, 0.05, message=f"children {children} of the killed parent to exit")
        assert time.monotonic() - killed_at <= 5
    finally:
        for pid in alive(children):  # never leave a stray worker behind a failed test
            os.kill(pid, signal.SIGKILL)

    log = worker.log()
    assert "worker.parent_died" in log, log
    # The import in flight was finished by the orphaned child before it exited...
    first = system.get_job(job_id_for("orphan-1"))[1]
    assert (first["state"], first["attempt"]) == ("completed", 1), first
    # ...and the prefetched one was given back, untouched, for the next worker.
    second = system.get_job(job_id_for("orphan-2"))[1]
    assert second["state"] == "waiting", second
    assert queued_messages(system) == 1

    system.start_worker(threads=1)
    second = system.wait_state(job_id_for("orphan-2"), timeout=60)
    assert (second["state"], second["attempt"]) == ("completed", 1), second
    store = system.store()
    assert store.stock_of(["WIDGET-RED-01", "ORPHAN-2"]) == {"WIDGET-RED-01": 10, "ORPHAN-2": 5}
    assert store.generation() == 2
