"""Every subprocess the bench starts (servers, workers, the peer): spawned in its own session, always stopped."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from bench.suite.common import ROOT, log


@dataclass
class Proc:
    name: str
    popen: subprocess.Popen[bytes]
    log_path: Path
    started: float


class Procs:
    """Every subprocess the bench starts; each is stopped in a finally block."""

    def __init__(self, logdir: Path) -> None:
        self.logdir = logdir
        self.live: list[Proc] = []
        self.count = 0

    def spawn(self, name: str, argv: list[str], env: dict[str, str]) -> Proc:
        self.count += 1
        log_path = self.logdir / f"{self.count:03d}-{name}.log"
        handle = open(log_path, "wb")
        started = time.monotonic()
        popen = subprocess.Popen(
            argv, env=env, cwd=ROOT, stdin=subprocess.DEVNULL, stdout=handle, stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        handle.close()
        proc = Proc(name, popen, log_path, started)
        self.live.append(proc)
        return proc

    def stop(self, proc: Proc, timeout: float = 45) -> int | None:
        """SIGTERM the process (it stops its own children), wait, then SIGKILL its group if needed."""
        try:
            if proc.popen.poll() is None:
                proc.popen.send_signal(signal.SIGTERM)
                try:
                    proc.popen.wait(timeout=timeout)
                except subprocess.TimeoutExpired:
                    log(f"{proc.name} (pid {proc.popen.pid}) did not stop within {timeout:g} s: SIGKILL")
            # Stragglers of its own session (process group = its pid).
            try:
                os.killpg(proc.popen.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            try:
                proc.popen.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        finally:
            if proc in self.live:
                self.live.remove(proc)
        return proc.popen.returncode

    def stop_all(self) -> None:
        for proc in reversed(list(self.live)):
            self.stop(proc, timeout=30)

