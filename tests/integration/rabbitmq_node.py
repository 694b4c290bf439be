"""A RabbitMQ node of a test's own: its own node name, ports, epmd, data and
log directories, started and stopped by the test (never the machine's
RabbitMQ on 5672, which other tests and people share).

It can be SIGKILLed (the whole process group, as a machine dying would),
restarted on its data directory, have its connections closed and its memory
alarm raised (``rabbitmqctl set_vm_memory_high_watermark 0``) and cleared.

Where ``rabbitmq-server`` is missing, :func:`require_rabbitmq_server` skips
the test locally and fails it in CI (env ``CI`` set), as the RabbitMQ
variant of the integration tests does (tests/integration/conftest.py).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pika
import pytest

from tests.integration.support import free_port, wait_for

#: Debian's /usr/sbin/rabbitmq-server re-runs itself as the user rabbitmq
#: (su); the real scripts are in /usr/lib/rabbitmq/bin and run as anyone.
_DEBIAN_BIN = Path("/usr/lib/rabbitmq/bin")


def _binary(name: str) -> str | None:
    configured = os.environ.get(f"IMPORTER_TEST_{name.upper().replace('-', '_')}")
    if configured:
        return configured
    if (_DEBIAN_BIN / name).exists():
        return str(_DEBIAN_BIN / name)
    return shutil.which(name)


def require_rabbitmq_server() -> tuple[str, str]:
    """(rabbitmq-server, rabbitmqctl), or skip (locally) / fail (CI) without them."""
    server, ctl = _binary("rabbitmq-server"), _binary("rabbitmqctl")
    if server and ctl:
        return server, ctl
    if os.environ.get("CI"):
        pytest.fail("rabbitmq-server/rabbitmqctl not found and CI must run the RabbitMQ fault and bound tests")
    pytest.skip("rabbitmq-server is not installed (CI runs these tests; locally they are optional)")


def port_below_ephemeral(low: int = 20000) -> int:
    """A free port under the kernel's ephemeral range (net.ipv4.ip_local_port_range)."""
    import random
    import socket

    try:
        first = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        first = 32768
    for _ in range(200):
        port = random.randrange(low, max(low + 1, first))
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    return free_port()


class RabbitNode:
    """One RabbitMQ node of ours on free ports (AMQP, distribution, epmd)."""

    def __init__(self, workdir: Path) -> None:
        self.server, self.ctl_binary = require_rabbitmq_server()
        self.dir = workdir / "rabbitmq"
        self.dir.mkdir(parents=True, exist_ok=True)
        # Below the kernel's ephemeral range: a port from free_port() (inside it) can be
        # taken as the local port of any outgoing connection while the node is dead
        # between a kill and its restart (seen: "dist_port_already_used ... not_erlang").
        self.port, self.dist_port, self.epmd_port = (port_below_ephemeral() for _ in range(3))
        self.node = f"importer-test-{os.getpid()}-{self.port}@localhost"
        self.url = f"amqp://guest:guest@127.0.0.1:{self.port}/%2F"
        self.proc: subprocess.Popen[bytes] | None = None
        (self.dir / "enabled_plugins").write_text("[].\n")
        (self.dir / "rabbitmq-env.conf").write_text("")
        (self.dir / "rabbitmq.conf").write_text(
            f"listeners.tcp.1 = 127.0.0.1:{self.port}\n"
            # What clear_memory_alarm sets back (RabbitMQ's default).
            "vm_memory_high_watermark.relative = 0.4\n"
        )

    @property
    def env(self) -> dict[str, str]:
        d = self.dir
        env = {k: v for k, v in os.environ.items() if not k.startswith(("RABBITMQ_", "ERL_"))}
        env.update(
            HOME=str(d),  # the Erlang cookie of this node and of its rabbitmqctl
            RABBITMQ_NODENAME=self.node,
            RABBITMQ_NODE_IP_ADDRESS="127.0.0.1",
            RABBITMQ_NODE_PORT=str(self.port),
            RABBITMQ_DIST_PORT=str(self.dist_port),
            ERL_EPMD_PORT=str(self.epmd_port),
            ERL_EPMD_ADDRESS="127.0.0.1",
            RABBITMQ_SERVER_START_ARGS="-kernel inet_dist_use_interface {127,0,0,1}",
            RABBITMQ_MNESIA_BASE=str(d / "mnesia"),
            RABBITMQ_LOG_BASE=str(d / "log"),
            RABBITMQ_ENABLED_PLUGINS_FILE=str(d / "enabled_plugins"),
            RABBITMQ_CONFIG_FILE=str(d / "rabbitmq.conf"),
            RABBITMQ_ADVANCED_CONFIG_FILE=str(d / "advanced.config"),
            RABBITMQ_CONF_ENV_FILE=str(d / "rabbitmq-env.conf"),
        )
        return env

    def log(self) -> str:
        path = self.dir / "server.log"
        return path.read_text(errors="replace")[-4000:] if path.exists() else ""

    def start(self, timeout: float = 90) -> None:
        """Start (or restart on the same data directory) and wait until AMQP answers."""
        with open(self.dir / "server.log", "ab") as out:
            self.proc = subprocess.Popen(
                [self.server], env=self.env, cwd=self.dir, stdin=subprocess.DEVNULL, stdout=out,
                stderr=subprocess.STDOUT, start_new_session=True,
            )
        proc = self.proc

        def up() -> bool:
            if proc.poll() is not None:
                raise AssertionError(f"rabbitmq-server exited {proc.returncode}:\n{self.log()}")
            return self.answers()

        try:
            wait_for(up, timeout, 0.2, message=f"RabbitMQ node {self.node} up")
        except AssertionError:
            self.stop()
            raise

    def answers(self) -> bool:
        try:
            params = pika.URLParameters(self.url + "?socket_timeout=1&stack_timeout=2&connection_attempts=1")
            pika.BlockingConnection(params).close()
            return True
        except pika.exceptions.AMQPError:
            return False

    def ctl(self, *args: str, timeout: float = 60) -> str:
        done = subprocess.run(
            [self.ctl_binary, "-n", self.node, *args], env=self.env, cwd=self.dir, capture_output=True,
            timeout=timeout, check=False,
        )
        assert done.returncode == 0, f"rabbitmqctl {' '.join(args)}: {done.stdout!r} {done.stderr!r}"
        return done.stdout.decode(errors="replace")

    def kill(self) -> None:
        """SIGKILL the node (its process group: the script, beam and its helpers)."""
        assert self.proc is not None
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait(timeout=10)

    def pause(self) -> None:
        """SIGSTOP the node: connections stay open, nothing answers (a silent broker)."""
        assert self.proc is not None
        os.killpg(self.proc.pid, signal.SIGSTOP)

    def resume(self) -> None:
        assert self.proc is not None
        os.killpg(self.proc.pid, signal.SIGCONT)

    def raise_memory_alarm(self) -> None:
        """Block every publishing connection (a memory alarm)."""
        self.ctl("set_vm_memory_high_watermark", "0")

    def clear_memory_alarm(self) -> None:
        self.ctl("set_vm_memory_high_watermark", "0.4")

    def close_all_connections(self) -> None:
        self.ctl("close_all_connections", "closed by the fault suite")

    def stop(self) -> None:
        """Stop the node (SIGTERM, then SIGKILL) and the epmd it started on its own port."""
        if self.proc is not None and self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGCONT)
                os.killpg(self.proc.pid, signal.SIGTERM)
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.kill()
            except ProcessLookupError:
                pass
        epmd = shutil.which("epmd")
        if epmd:  # this node's own epmd (ERL_EPMD_PORT), nobody else's
            subprocess.run([epmd, "-port", str(self.epmd_port), "-kill"], capture_output=True, timeout=10, check=False)


def wait_until_blocked_or_clear(node: RabbitNode, blocked: bool, timeout: float = 30) -> None:
    """Until the node's memory alarm is raised (or gone), as rabbitmqctl reports it."""

    def alarm_is(state: bool) -> bool:
        listed = node.ctl("eval", "rabbit_alarm:get_alarms().")
        return ("memory" in listed) is state

    wait_for(lambda: alarm_is(blocked), timeout, 0.2, message=f"memory alarm {'raised' if blocked else 'cleared'}")


@pytest.fixture(scope="module")
def module_node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RabbitNode]:
    """A node of the test module's own, started once for the module."""
    node = RabbitNode(tmp_path_factory.mktemp("rabbit"))
    node.start()
    yield node
    node.stop()


@pytest.fixture
def node(module_node: RabbitNode) -> Iterator[RabbitNode]:
    """The module's node, up and without alarm at the start and at the end of each test."""
    module_node.resume()
    if module_node.proc is None or module_node.proc.poll() is not None:
        module_node.start()
    yield module_node
    module_node.resume()
    if module_node.proc is not None and module_node.proc.poll() is None:
        module_node.clear_memory_alarm()
