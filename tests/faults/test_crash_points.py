"""Real signals at the crash points of one import (`pytest -m faults`).

A worker's dramatiq worker process (the child of `importer worker`'s main
process) is stopped with SIGSTOP at one step of an import and then SIGKILLed
there. The test finds the step by watching from outside, never through a hook
in the product. MONITOR on the test's own redis-server shows each script the
moment it has run (scripts are named by their SHA, harness.py script_sha), and
the watching thread stops the process right then. A PING the server is too
busy to answer shows a long script still running. Whether the process really
stopped there is checked, not assumed: MONITOR shows every command it ran
after the step, and the records show where the import stood (state, done
marker, its message in the worker's acks set). Then a fresh worker starts, and
the invariant checker checks that the import was applied once or not at all
and finally completed (stock = the applied batches, generation = their
number), that nothing is stuck and nothing is left in the queue, and that it
happened within the documented bound.

The points, on both paths:

* one step (an upload of at most IMPORTER_ONE_STEP_MAX_BYTES: the worker
  parses and validates it, then start + apply + ack are one script,
  start_apply.lua): after the fetch; inside the parse (100,000 rows, with the
  one-step bound raised); right after start_apply returned (started, applied
  and acknowledged at once). "After the start" and "before the ack" do not
  exist apart on this path: they are inside the one script.
* separate steps (an upload over IMPORTER_ONE_STEP_MAX_BYTES: start.lua
  hands it over, the worker parses it, apply.lua, then dramatiq's ack from
  the same worker thread): after the fetch; after the start; inside the parse
  (100,000 rows, between start and apply); right after apply returned
  (stopped while the server ran the apply, so the reply reaches a stopped
  process); before the ack (stopped the same way, then CLIENT PAUSE WRITE and
  SIGCONT: the worker reads the reply, logs import.applied and sends its ack
  (dramatiq's worker thread acks right after the actor, on the apply's
  connection). The server holds the ack, and it dies with the process).
"""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass, field
from typing import Any

import pytest

from tests.faults.harness import (
    FAULT_ENV, Monitor, MonitorLine, Post, Trigger, check_invariants, client_ports, cpu_seconds, csv_for, driver_for,
    job_path, preload_scripts, script_sha, tcp_ports_of, wait_busy, worker_process_of,
)
from tests.integration.support import wait_for

pytestmark = [pytest.mark.faults, pytest.mark.integration]

LEASE = float(FAULT_ENV["IMPORTER_ATTEMPT_LEASE"])
INTERVAL = float(FAULT_ENV["IMPORTER_RECONCILE_INTERVAL"])
GRACE = float(FAULT_ENV["IMPORTER_WAITING_GRACE"])
#: README "Guarantees", with the fault suite's settings: an import whose worker
#: died is picked up again within the lease + one reconciler pass (5 s); one
#: that never started, within the waiting grace + one pass (4 s); an applied
#: one is already completed.
DOCUMENTED = {"waiting": GRACE + INTERVAL, "active": LEASE + INTERVAL, "completed": 0.0}
#: On top of it: a new worker's boot and the new attempt's own time (100,000
#: rows) on a loaded machine (CI met 8.1 s with 3 s here, the bound being 5 s).
SLACK = 5.0
#: No drain delay: no load balancer here, and each test stops its server.
# The worker writes import.applied (a debug line) once it has read the apply's reply: the marker of some points.
ENV = {"IMPORTER_HTTP_DRAIN_DELAY": "0", "IMPORTER_LOG_LEVEL": "debug"}
ONE_STEP_MAX = 16 * 1024  # the default IMPORTER_ONE_STEP_MAX_BYTES

#: How the process is stopped at its step.
AT_ONCE = "at_once"  # SIGSTOP the moment MONITOR shows the step has run
AFTER_DELAY = "after_delay"  # SIGSTOP `delay_s` after the step (it parses meanwhile)
WHILE_RUNNING = "while_running"  # SIGSTOP while the server runs the step's script (after `start`)
HOLD_NEXT = "hold_next"  # as WHILE_RUNNING, then CLIENT PAUSE WRITE and SIGCONT; SIGSTOP once its next write is held


@dataclass(frozen=True)
class Point:
    path: str
    name: str
    rows: int
    #: "fetch" (the fetch that took the message: a script's SADD to the
    #: worker's acks set), else the script whose EVALSHA is the step
    step: str
    how: str
    #: what must not have run after the step: scripts, or "ack" (an SREM of
    #: the message from the worker's acks set)
    not_after: tuple[str, ...]
    #: the job's state when the worker dies
    at_crash: str
    delay_s: float = 0.0
    env: dict[str, str] = field(default_factory=dict)

    @property
    def id(self) -> str:
        return f"{self.path}-{self.name}"


POINTS = [
    Point("one_step", "after_fetch", 800, "fetch", AT_ONCE, ("start_apply",), "waiting"),
    Point("one_step", "inside_parse", 100_000, "fetch", AFTER_DELAY, ("start_apply",), "waiting", delay_s=0.15,
          env={"IMPORTER_ONE_STEP_MAX_BYTES": str(4 << 20)}),
    Point("one_step", "after_start_apply", 800, "start_apply", AT_ONCE, ("ack",), "completed"),
    Point("separate", "after_fetch", 5000, "fetch", AT_ONCE, ("start",), "waiting"),
    Point("separate", "after_start", 5000, "start", AT_ONCE, ("apply",), "active"),
    Point("separate", "inside_parse", 100_000, "start", AFTER_DELAY, ("apply",), "active", delay_s=0.15),
    Point("separate", "after_apply", 20_000, "apply", WHILE_RUNNING, ("ack",), "completed"),
    Point("separate", "before_ack", 20_000, "apply", HOLD_NEXT, ("ack",), "completed"),
]


def _rows(n: int) -> dict[str, int]:
    return {f"CP-{i:06d}": i % 9 + 1 for i in range(n)}


def _is_ack(line: MonitorLine, acks_key: bytes, message_id: bytes) -> bool:
    return line.args[:3] == [b"srem", acks_key, message_id]


def _fetched(acks_prefix: bytes) -> Any:
    def match(line: MonitorLine) -> bool:
        return line.client == "lua" and len(line.args) > 2 and line.args[0] == b"sadd" and line.args[1].startswith(acks_prefix)

    return match


def _stop_while_the_server_runs_it(server: Any, admin: Any, child: int, step: Trigger) -> None:
    """SIGSTOP the process while the server runs its long script (a PING the
    server does not answer), so that the script's reply reaches a stopped
    process. A server that was only slow (a loaded machine) while the process
    still parsed is told apart afterwards: no step ran. The process then goes
    on, and the next long command is waited for."""
    for _ in range(20):
        wait_busy(server, longer_than_s=0.01)
        os.kill(child, signal.SIGSTOP)
        admin.ping()  # answered once the server is done with what it ran
        if step.fired.wait(1.0):
            return
        os.kill(child, signal.SIGCONT)
    raise AssertionError("never caught the server running the step")


#: Tries of a point whose stop came late (the worker had already sent the
#: next step when the signal landed): the harness missed the moment, which
#: says nothing of the product; each try is a fresh server, system and batch.
TRIES = 3


@pytest.mark.parametrize("point", POINTS, ids=lambda p: p.id)
def test_worker_killed_at_a_crash_point(make_redis: Any, make_faulty: Any, point: Point) -> None:
    late = []
    for attempt in range(1, TRIES + 1):
        missed = _kill_at_the_point(make_redis, make_faulty, point, attempt)
        if not missed:
            return
        late.append(missed)
    pytest.fail(f"the stop came late in all {TRIES} tries: {late}")


def _kill_at_the_point(make_redis: Any, make_faulty: Any, point: Point, attempt: int) -> str:
    """One try: '' when the worker died at the point and every promise held
    (any broken one raises), else why the stop came late."""
    began = time.monotonic()
    # everysec: no fsync in the server's thread, which the busy-server probe
    # could take for a running script (nothing here restarts the server).
    server = make_redis("everysec")
    admin = server.client()
    preload_scripts(admin)
    system = make_faulty(server, **ENV, **point.env)
    system.start_http()
    doomed = system.start_worker()
    child = worker_process_of(doomed)
    rows = _rows(point.rows)
    body = csv_for(rows)
    one_step_max = int(point.env.get("IMPORTER_ONE_STEP_MAX_BYTES", ONE_STEP_MAX))
    assert (len(body) <= one_step_max) == (point.path == "one_step"), len(body)  # the path the upload takes
    batch_id, job_id = f"cp-{point.id}-{attempt}", f"shipment-cp-{point.id}-{attempt}"
    fetched = _fetched(f"{system.prefix}dramatiq:__acks__.".encode())
    step_sha = script_sha(point.step) if point.step != "fetch" else ""

    def at_step(line: MonitorLine) -> bool:
        return fetched(line) if point.step == "fetch" else line.is_script(step_sha)

    monitor = Monitor(server).start()
    pauser = server.client()
    pauser.ping()  # connected now: a CLIENT PAUSE later is one command, not a handshake first
    paused = False
    detail = ""
    try:
        stop_at_step = monitor.when(at_step, lambda line: os.kill(child, signal.SIGSTOP) if point.how == AT_ONCE else None)
        took = monitor.when(fetched, lambda line: None)
        started = monitor.when(lambda line: line.is_script(script_sha("start")), lambda line: None)
        status, answer = system.post_csv(batch_id, body)
        assert status == 202, answer
        post = Post(batch_id, rows, statuses=[status], accepted_at=time.monotonic())
        if point.how in (WHILE_RUNNING, HOLD_NEXT):
            started.wait(30)  # then it parses, the server idle, and sends the apply
            _stop_while_the_server_runs_it(server, admin, child, stop_at_step)
        line = stop_at_step.wait(30)
        took_message = took.wait(5)
        acks_key, message_id = took_message.args[1], took_message.args[2]
        if point.how == AFTER_DELAY:  # it parses meanwhile: the CPU it burns says so
            cpu = cpu_seconds(child)
            time.sleep(max(0.0, line.at + point.delay_s - time.monotonic()))
            os.kill(child, signal.SIGSTOP)
            detail = f" cpu_in_delay={cpu_seconds(child) - cpu:.2f}s"
        if point.how == HOLD_NEXT:
            # Stopped, it cannot send anything before the pause; woken, it takes
            # the apply's reply and sends its ack, which the server holds.
            pauser.execute_command("CLIENT", "PAUSE", 5000, "WRITE")
            paused = True
            os.kill(child, signal.SIGCONT)
            wait_for(lambda: "import.applied" in doomed.log(), 3, 0.002, message="the worker to take the apply's reply")
            wait_for(lambda: line.port in client_ports(admin, blocked=True), 2, 0.002,
                     message="its next write (the ack) held by the server")
            os.kill(child, signal.SIGSTOP)
            detail = " next_write_held=True"
        time.sleep(0.3)  # whatever it sent before it stopped has run, and shows, by now
        ports = tcp_ports_of(child)
        assert line.port in ports, (line, ports)
        ran = [ln for ln in monitor.lines(after=line, ports=ports) if ln.script is not line]
        ran_scripts = {name for name in ("fetch", "dispatch", "start", "apply", "start_apply")
                       if any(ln.is_script(script_sha(name)) for ln in ran)}
        for forbidden in point.not_after:
            came_late = (bool([ln for ln in ran if _is_ack(ln, acks_key, message_id)]) if forbidden == "ack"
                         else forbidden in ran_scripts)
            if came_late:
                os.kill(child, signal.SIGKILL)
                doomed.popen.wait(timeout=15)
                system.stop_all()
                return f"it ran {forbidden} before it stopped (try {attempt})"
        if point.how == WHILE_RUNNING:
            assert "import.applied" not in doomed.log(), "it had read the apply's reply"
        state, attempt = (v.decode() if v else "" for v in admin.hmget(f"{system.prefix}job:{job_id}", "state", "attempt"))
        applied = bool(admin.exists(f"{system.prefix}done:{batch_id}"))
        unacked = bool(admin.sismember(acks_key, message_id))
        at_crash = f"state={state} attempt={attempt or 0} applied={applied} unacked={unacked}"

        os.kill(child, signal.SIGKILL)
        killed_at = time.monotonic()
        seconds, micros = admin.time()
        killed_at_ms = int(seconds) * 1000 + int(micros) // 1000  # the events' clock (Redis's)
        doomed.popen.wait(timeout=15)  # dramatiq's main process follows its killed worker process
        # The server lets its connections go, and with them whatever it held back.
        wait_for(lambda: not client_ports(admin) & ports, 10, 0.01, message="the killed worker's connections closed")
    finally:
        if paused:
            pauser.execute_command("CLIENT", "UNPAUSE")
        pauser.close()
        monitor.close()

    assert state == point.at_crash, at_crash
    assert applied == (point.at_crash == "completed"), at_crash
    # Unacknowledged unless the one script acknowledged it with the apply.
    assert unacked == (point.step != "start_apply"), at_crash

    system.start_worker()
    report = check_invariants(system, server.url, driver_for(system, [post]), fault_over=killed_at,
                              bound=DOCUMENTED["active"] + SLACK)
    drained = time.monotonic() - killed_at
    path = job_path(admin, system.prefix, job_id)
    record = {k.decode(): v.decode() for k, v in admin.hgetall(f"{system.prefix}job:{job_id}").items()}
    assert record["state"] == "completed", record
    assert int(admin.get(f"{system.prefix}generation") or 0) == 1
    assert admin.xlen(f"{system.prefix}journal") == 1
    again = [ms for event, att, ms in path if event == "active" and ms >= killed_at_ms]
    picked_up = (again[0] - killed_at_ms) / 1000 if again else 0.0
    completed_ms = [ms for event, att, ms in path if event == "completed"]
    assert len(completed_ms) == 1, path
    final_s = max(0.0, (completed_ms[0] - killed_at_ms) / 1000)  # 0: completed before it was killed
    # Where the worker died decides what comes next: a job never started keeps
    # attempt 1; one started gets attempt 2 after its lease; one applied is done.
    expected_attempt = {"waiting": 1, "active": 2, "completed": 1}[point.at_crash]
    assert int(record["attempt"]) == expected_attempt, (record, path)
    assert bool(again) == (point.at_crash != "completed"), path
    assert final_s <= DOCUMENTED[point.at_crash] + SLACK, (final_s, path)
    assert report.stuck == [] and report.completed == 1
    shown = " ".join(f"{event}/{att}" for event, att, _ in path)
    print(f"[crash] {point.id}: ran_after_step={sorted(ran_scripts) or '-'}{detail} at_crash: {at_crash}; "
          f"path: {shown}; final={record['state']} attempt={record['attempt']} applied_once=True; "
          f"picked_up={picked_up:.1f}s final={final_s:.1f}s drained<={drained:.1f}s "
          f"(documented {DOCUMENTED[point.at_crash]:.0f}s); test={time.monotonic() - began:.1f}s try={attempt}")
    return ""
