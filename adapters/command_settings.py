"""The settings of the commands around the service, read from the environment:
``ClientSettings`` for ``importer submit``/``status``, ``DevSettings`` for
``importer dev``, and ``child_env`` for the environment a command hands to the
processes it starts (which read settings.py's ``Settings`` themselves).

Every variable is documented in docs/settings.md.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from importer.adapters.settings import SettingsError, log_format


@dataclass(frozen=True)
class ClientSettings:
    """What the HTTP client commands (``importer submit``/``status``) need."""

    #: The API's base URL (IMPORTER_URL).
    url: str = "http://127.0.0.1:8080"
    #: The producer's API key (IMPORTER_API_KEY); empty = not set.
    api_key: str = ""

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> "ClientSettings":
        env = os.environ if env is None else env
        return cls(url=env.get("IMPORTER_URL") or cls.url, api_key=env.get("IMPORTER_API_KEY", ""))

    def require_key(self) -> str:
        if not self.api_key:
            raise SettingsError("IMPORTER_API_KEY is not set (the producer's API key; see `importer keys create`)")
        return self.api_key


@dataclass(frozen=True)
class DevSettings:
    """What ``importer dev`` decides before it starts its processes (which
    then read ``Settings`` themselves, from the environment it gives them)."""

    #: None: start the embedded server.
    redis_url: str | None = None
    #: [ledger] None: start the embedded PostgreSQL (adapters/postgres/embedded.py).
    database_url: str | None = None
    #: The embedded server's data directory (IMPORTER_DATA_DIR).
    data_dir: str = ".importer-data"
    #: IMPORTER_API_KEY: shown, and used by --demo, when the keys are given.
    api_key: str = ""
    #: IMPORTER_API_KEYS or IMPORTER_API_KEYS_FILE is set: no key is made up.
    api_keys_given: bool = False
    metrics_token: str = ""
    #: IMPORTER_LOG_FORMAT for the processes it starts: text unless set.
    log_format: str = "text"

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> "DevSettings":
        env = os.environ if env is None else env
        return cls(
            redis_url=env.get("IMPORTER_REDIS_URL") or None,
            database_url=env.get("IMPORTER_DATABASE_URL") or None,
            data_dir=env.get("IMPORTER_DATA_DIR") or cls.data_dir,
            api_key=env.get("IMPORTER_API_KEY", ""),
            api_keys_given=bool(env.get("IMPORTER_API_KEYS") or env.get("IMPORTER_API_KEYS_FILE")),
            metrics_token=env.get("IMPORTER_METRICS_TOKEN", ""),
            log_format=log_format(env, default=cls.log_format),
        )


def child_env(
    overrides: Mapping[str, str] | None = None,
    *,
    defaults: Mapping[str, str] | None = None,
    env: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """The environment for a process a command starts: this process's own
    (or ``env``), plus ``defaults`` where a variable is unset, then
    ``overrides``. This process's environment is never changed."""
    out = dict(os.environ if env is None else env)
    for name, value in (defaults or {}).items():
        out.setdefault(name, value)
    out.update(overrides or {})
    return out


def adopt_running_dev() -> dict[str, str]:
    """[dev] Complete this process's environment with the URLs of the ``importer dev``
    running with its data folder, where it names none (adapters/dev_state.py); returns it."""
    from importer.adapters.dev_state import with_running_dev

    os.environ.update(with_running_dev(os.environ))
    return dict(os.environ)
