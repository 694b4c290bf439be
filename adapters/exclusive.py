"""What one process holds alone: a data folder (an advisory lock on a file in
it) and a listening address (checked before a server binds it).

The lock is ``flock``: the kernel drops it when its holder dies, however it
dies, so a folder is never left locked by a process that is gone. The address
check exists because granian binds every worker's socket with SO_REUSEPORT:
a second server on a port already served would bind it too, and the kernel
would split the connections between the two.
"""

from __future__ import annotations

import errno
import fcntl
import os
import socket
from pathlib import Path


class FolderHeld(Exception):
    """Another live process holds the folder's lock."""

    def __init__(self, folder: Path, pid: int | None) -> None:
        super().__init__(f"{folder} is held by pid {pid}")
        self.folder = folder
        self.pid = pid


class FolderLock:
    """An exclusive lock on ``folder/name``, held until :meth:`release` or the
    process's end; the file says which pid holds it."""

    def __init__(self, folder: Path, name: str) -> None:
        self.folder = Path(folder)
        self.path = self.folder / name
        self._fd: int | None = None

    def acquire(self) -> "FolderLock":
        self.folder.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            holder = _pid_in(fd)
            os.close(fd)
            if exc.errno in (errno.EAGAIN, errno.EACCES):
                raise FolderHeld(self.folder, holder) from None
            raise
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._fd = fd
        return self

    def release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)  # closing the descriptor drops the lock


def _pid_in(fd: int) -> int | None:
    try:
        return int(os.pread(fd, 32, 0).split(b"\n", 1)[0])
    except (OSError, ValueError):
        return None


def address_in_use(host: str, port: int) -> bool:
    """True when something listens on host:port (a plain bind, without
    SO_REUSEPORT, fails; SO_REUSEADDR lets it pass over closed connections
    still in TIME_WAIT)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                return True
            raise
    return False
