"""Runs the BullMQ peer (bench/suite/peers/bullmq/, the seed's design on Node.js) for the bench.

``prepare`` checks for Node.js and npm and runs ``npm ci`` once per bench run; when
either is missing or ``npm ci`` fails it returns one line saying so, and the bench
runs everything else without the peer's column.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import time
from typing import TYPE_CHECKING

from bench.suite.common import ROOT, BenchError, free_port, log, tail
from bench.suite.procs import Proc

if TYPE_CHECKING:
    from bench.suite.servers import Bench

PEER_DIR = ROOT / "bench" / "suite" / "peers" / "bullmq"
QUEUE = "imports"
MIN_NODE = 18


class BullmqPeer:
    def __init__(self, bench: Bench, node: str, versions: str) -> None:
        self.bench = bench
        self.node = node
        self.versions = versions
        self.apply_sha = hashlib.sha1((PEER_DIR / "apply.lua").read_bytes()).hexdigest()
        self._names: dict[str, str] | None = None

    # -- installation -------------------------------------------------------------

    @classmethod
    def prepare(cls, bench: Bench) -> tuple[BullmqPeer | None, str]:
        """(the peer, "") when it can run, else (None, one line: what is missing and how to get it)."""
        node = shutil.which("node")
        npm = shutil.which("npm")
        if not node or not npm:
            missing = " and ".join(x for x, found in (("node", node), ("npm", npm)) if not found)
            return None, (f"BullMQ peer skipped: {missing} not found (Node.js >= {MIN_NODE} with npm, "
                          "e.g. `apt-get install nodejs npm`)")
        try:
            version = subprocess.run([node, "--version"], capture_output=True, text=True, timeout=20).stdout.strip()
            major = int(version.lstrip("v").split(".")[0])
        except (OSError, subprocess.TimeoutExpired, ValueError):
            return None, "BullMQ peer skipped: `node --version` did not answer"
        if major < MIN_NODE:
            return None, f"BullMQ peer skipped: Node.js {version} is older than {MIN_NODE} (BullMQ needs a newer one)"
        log(f"BullMQ peer: npm ci in {PEER_DIR.relative_to(ROOT)} (node {version})")
        try:
            done = subprocess.run(
                [npm, "ci", "--no-audit", "--no-fund", "--loglevel=error"], cwd=PEER_DIR,
                capture_output=True, text=True, timeout=600,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            return None, f"BullMQ peer skipped: `npm ci` failed ({exc!r})"
        if done.returncode != 0:
            lines = [x.strip() for x in (done.stderr + done.stdout).splitlines() if x.strip()]
            useful = [x for x in lines if x.startswith("npm error") and "complete log" not in x] or lines or ["?"]
            return None, (f"BullMQ peer skipped: `npm ci` in bench/suite/peers/bullmq exited {done.returncode} "
                          f"({'; '.join(useful[:2])[:200]}); the npm registry must be reachable")
        lock = json.loads((PEER_DIR / "package-lock.json").read_text())
        packages = lock.get("packages", {})
        versions = ", ".join(
            f"{name} {packages.get('node_modules/' + name, {}).get('version', '?')}" for name in ("bullmq", "ioredis")
        )
        return cls(bench, node, f"node {version}, {versions}"), ""

    # -- processes ----------------------------------------------------------------

    def env(self, prefix: str, port: int | None = None) -> dict[str, str]:
        env = dict(self.bench.base_env)
        env.update(
            PEER_REDIS_URL=self.bench.url,
            PEER_PREFIX=prefix,
            PEER_QUEUE=QUEUE,
            PEER_CONCURRENCY=str(self.bench.cfg.peer_concurrency),
            # As for Importer: retention must not remove records before the count reaches N.
            PEER_KEEP_COMPLETED_COUNT="10000000",
            PEER_KEEP_COMPLETED_AGE="10000000",
        )
        if port is not None:
            env["PEER_PORT"] = str(port)
        return env

    def start_server(self, prefix: str) -> tuple[Proc, int]:
        port = free_port()
        proc = self.bench.procs.spawn("peer-server", [self.node, str(PEER_DIR / "server.js")], self.env(prefix, port))
        self.bench.wait_http(proc, port, "/health")
        return proc, port

    def worker_argv(self) -> list[str]:
        return [self.node, str(PEER_DIR / "worker.js")]

    def start_worker(self, prefix: str) -> Proc:
        return self.bench.procs.spawn("peer-worker", self.worker_argv(), self.env(prefix))

    def wait_worker_ready(self, proc: Proc, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if proc.popen.poll() is not None:
                raise BenchError(f"peer worker exited with {proc.popen.returncode}: {tail(proc.log_path, 5)}")
            if "worker ready" in tail(proc.log_path, 50):
                return
            time.sleep(0.05)
        raise BenchError("peer worker not ready")

    def enqueue(self, prefix: str, n: int, tag: str) -> None:
        """N 3-row imports through the peer's own submitImport (SET upload + queue.add), no worker running."""
        done = subprocess.run(
            [self.node, str(PEER_DIR / "enqueue.js"), str(n), tag, "64"], env=self.env(prefix), cwd=PEER_DIR,
            capture_output=True, text=True, timeout=120 + n / 100,
        )
        if done.returncode != 0:
            raise BenchError(f"peer enqueue exited {done.returncode}: {done.stderr.strip()[-300:]}")

    def enqueue_bulk(self, prefix: str, n: int, tag: str, per_request: int = 100) -> None:
        """N 3-row imports through the peer's submitImports (SET pipeline + queue.addBulk per chunk)."""
        done = subprocess.run(
            [self.node, str(PEER_DIR / "enqueue-bulk.js"), str(n), tag, str(per_request)], env=self.env(prefix),
            cwd=PEER_DIR, capture_output=True, text=True, timeout=120 + n / 100,
        )
        if done.returncode != 0:
            raise BenchError(f"peer bulk enqueue exited {done.returncode}: {done.stderr.strip()[-300:]}")

    def script_names(self) -> dict[str, str]:
        """sha1 -> readable name of BullMQ's Lua scripts and of the peer's apply.lua (node script-names.js)."""
        if self._names is None:
            done = subprocess.run([self.node, str(PEER_DIR / "script-names.js")], cwd=PEER_DIR,
                                  capture_output=True, text=True, timeout=60)
            try:
                self._names = json.loads(done.stdout) if done.returncode == 0 else {}
            except ValueError:
                self._names = {}
            self._names.setdefault(self.apply_sha, "applyShipment (apply.lua)")
        return self._names

    # -- keys -----------------------------------------------------------------------

    @staticmethod
    def key(prefix: str, name: str) -> str:
        """A key of the peer's queue: wait, active, completed, failed, or a job id."""
        return f"{prefix}:{QUEUE}:{name}"
