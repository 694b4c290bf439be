"""What a running ``importer dev`` leaves in its data folder for the commands
run beside it, and what it keeps there across restarts.

* ``dev.lock``: held (flock) by the dev for as long as it runs: one dev per folder.
* ``dev.json``: written once everything is up, removed when it stops: its pid,
  the store's and the ledger's URLs and its HTTP URL. A command run with no
  IMPORTER_REDIS_URL (``importer doctor``, ``events``, ``inspect``, ``ledger
  verify``) or no IMPORTER_URL (``submit``, ``status``, ``retry``) reads it, so
  that it works next to a running dev with nothing set.
* ``dev-key``: the API key the dev made on its first start (mode 0600), used
  again on every later start, so that a console tab or a script keeps working.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

DEFAULT_DATA_DIR = ".importer-data"
LOCK_FILE = "dev.lock"
STATE_FILE = "dev.json"
KEY_FILE = "dev-key"


def data_folder(env: Mapping[str, str]) -> Path:
    return Path(env.get("IMPORTER_DATA_DIR") or DEFAULT_DATA_DIR).resolve()


def dev_key(folder: Path, make: Any) -> str:
    """The folder's dev key: read, or made by ``make()`` and kept."""
    path = folder / KEY_FILE
    try:
        key = path.read_text().strip()
        if key:
            return key
    except FileNotFoundError:
        pass
    key = str(make())
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(key + "\n")
    return key


def write_state(folder: Path, **state: str | None) -> None:
    path = folder / STATE_FILE
    temporary = path.with_suffix(".tmp")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        json.dump({"pid": os.getpid(), **state}, out)
    temporary.replace(path)


def remove_state(folder: Path) -> None:
    try:
        (folder / STATE_FILE).unlink()
    except FileNotFoundError:
        pass


def running_dev(folder: Path) -> dict[str, Any] | None:
    """The state of the dev running with this folder, None when none runs."""
    try:
        state = json.loads((folder / STATE_FILE).read_text())
        os.kill(int(state["pid"]), 0)
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return state if isinstance(state, dict) else None


def with_running_dev(env: Mapping[str, str]) -> dict[str, str]:
    """``env`` plus, for what it leaves unset, the URLs (and key) of the dev
    running with its data folder; ``env`` itself when none runs."""
    out = dict(env)
    state = running_dev(data_folder(env))
    if state is None:
        return out
    given = {
        "IMPORTER_REDIS_URL": state.get("redisUrl"), "IMPORTER_DATABASE_URL": state.get("databaseUrl"),
        "IMPORTER_URL": state.get("httpUrl"), "IMPORTER_KEY_PREFIX": state.get("keyPrefix"),
    }
    if not env.get("IMPORTER_URL") and state.get("apiKey"):
        given["IMPORTER_API_KEY"] = state["apiKey"]
    if env.get("IMPORTER_REDIS_URL"):  # another store named: none of the dev's settings apply to it
        given = {k: v for k, v in given.items() if k in ("IMPORTER_URL", "IMPORTER_API_KEY")}
    for name, value in given.items():
        if value and not out.get(name):
            out[name] = str(value)
    return out
