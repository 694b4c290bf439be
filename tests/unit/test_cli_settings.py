"""The CLI reads its configuration through the settings module only, and hands
its children an explicit environment instead of changing its own."""

from __future__ import annotations

import os
from typing import Any

import pytest

from importer.adapters.processes.cli import build_parser
from importer.adapters.command_settings import ClientSettings, DevSettings, child_env
from importer.adapters.settings import Settings, SettingsError


def test_the_http_bind_and_the_worker_metrics_port_are_settings() -> None:
    assert Settings.from_env({}).http_bind == "127.0.0.1:8080"
    settings = Settings.from_env({"IMPORTER_HTTP_BIND": "0.0.0.0:9000", "IMPORTER_WORKER_METRICS_PORT": "9191"})
    assert (settings.http_bind, settings.worker_metrics_port) == ("0.0.0.0:9000", 9191)
    with pytest.raises(SettingsError, match="IMPORTER_WORKER_METRICS_PORT"):
        Settings.from_env({"IMPORTER_WORKER_METRICS_PORT": "nine"})


def test_the_client_settings_need_a_key_and_default_to_the_local_server() -> None:
    client = ClientSettings.from_env({})
    assert client.url == "http://127.0.0.1:8080"
    with pytest.raises(SettingsError, match="IMPORTER_API_KEY is not set"):
        client.require_key()
    client = ClientSettings.from_env({"IMPORTER_URL": "https://imports.example", "IMPORTER_API_KEY": "imp_x"})
    assert (client.url, client.require_key()) == ("https://imports.example", "imp_x")


def test_the_dev_settings() -> None:
    assert DevSettings.from_env({}) == DevSettings(redis_url=None, data_dir=".importer-data", api_keys_given=False)
    dev = DevSettings.from_env({"IMPORTER_API_KEYS_FILE": "/etc/keys", "IMPORTER_REDIS_URL": "redis://r:6379/0"})
    assert dev.api_keys_given and dev.redis_url == "redis://r:6379/0"


def test_child_env_adds_defaults_and_overrides_without_touching_this_process() -> None:
    before = dict(os.environ)
    env = child_env({"A": "over"}, defaults={"B": "default", "C": "default"}, env={"A": "mine", "C": "mine"})
    assert env == {"A": "over", "B": "default", "C": "mine"}
    inherited = child_env({"IMPORTER_ALLOW_EVICTION": "1"})
    assert inherited["IMPORTER_ALLOW_EVICTION"] == "1"
    assert dict(os.environ) == before


def test_the_parser_leaves_environment_defaults_to_the_settings() -> None:
    parser = build_parser()
    assert parser.parse_args(["serve"]).bind is None
    assert parser.parse_args(["worker"]).metrics_port is None
    assert parser.parse_args(["submit", "f.csv", "--batch-id", "b"]).url is None
    assert parser.parse_args(["worker", "--metrics-port", "0"]).metrics_port == 0


def test_the_demo_csv_of_an_installed_package_is_the_fixture() -> None:
    from importer.adapters.processes.dev import DEMO_CSV, DEMO_FIXTURE

    assert DEMO_FIXTURE.read_bytes() == DEMO_CSV


def test_importer_worker_bounds_the_idle_poll_unless_the_operator_set_it() -> None:
    """An idle dramatiq consumer waits up to its worker timeout between polls:
    importer worker makes that 100 ms (dramatiq's own default is 1 s)."""
    from importer.adapters.processes.commands import worker_env

    args = build_parser().parse_args(["worker"])
    settings = Settings.from_env({"IMPORTER_REDIS_URL": "redis://127.0.0.1:1/0"})
    assert worker_env(args, settings, env={})["dramatiq_worker_timeout"] == "100"
    assert worker_env(args, settings, env={"dramatiq_worker_timeout": "250"})["dramatiq_worker_timeout"] == "250"
    assert worker_env(args, settings, env={})["dramatiq_queue_prefetch"] == "64"  # the measured default


def test_the_worker_metrics_exporter_reads_the_folder_the_worker_processes_count_in(tmp_path: Any) -> None:
    """prometheus_client picks multiprocess mode when imported: importer worker
    sets its folder beforehand, the same as dramatiq's exporter reads, and clears
    an earlier run's counts."""
    from importer.adapters.processes.commands import clear_metrics_db, metrics_db, worker_env

    args = build_parser().parse_args(["worker"])
    settings = Settings.from_env({"IMPORTER_REDIS_URL": "redis://127.0.0.1:1/0", "IMPORTER_WORKER_METRICS_PORT": "9191"})
    env = worker_env(args, settings, env={})
    assert env["PROMETHEUS_MULTIPROC_DIR"] == env["dramatiq_prom_db"] == metrics_db(9191)
    chosen = worker_env(args, settings, env={"dramatiq_prom_db": str(tmp_path)})
    assert chosen["PROMETHEUS_MULTIPROC_DIR"] == chosen["dramatiq_prom_db"] == str(tmp_path)
    assert "PROMETHEUS_MULTIPROC_DIR" not in worker_env(args, Settings.from_env({"IMPORTER_REDIS_URL": "redis://127.0.0.1:1/0"}), env={})
    (tmp_path / "counter_123.db").write_bytes(b"old")
    (tmp_path / "notes.txt").write_text("kept")
    clear_metrics_db(str(tmp_path))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]


def test_the_log_format_is_json_for_services_and_text_for_importer_dev_unless_set() -> None:
    assert Settings.from_env({}).log_format == "json"
    assert Settings.from_env({"IMPORTER_LOG_FORMAT": "text"}).log_format == "text"
    assert DevSettings.from_env({}).log_format == "text"
    assert DevSettings.from_env({"IMPORTER_LOG_FORMAT": "json"}).log_format == "json"
    assert DevSettings.from_env({"IMPORTER_LOG_FORMAT": ""}).log_format == "text"
    for reader in (Settings.from_env, DevSettings.from_env):
        with pytest.raises(SettingsError, match="IMPORTER_LOG_FORMAT must be json or text"):
            reader({"IMPORTER_LOG_FORMAT": "yaml"})


def test_the_old_names_of_the_reconciler_settings_are_not_read() -> None:
    """IMPORTER_UNSENT_GRACE and IMPORTER_SWEEP_INTERVAL (the unsent sweeper's
    names) were dropped for IMPORTER_WAITING_GRACE and IMPORTER_RECONCILE_INTERVAL."""
    defaults = Settings.from_env({})
    old = Settings.from_env({"IMPORTER_UNSENT_GRACE": "1", "IMPORTER_SWEEP_INTERVAL": "0.5"})
    assert (old.waiting_grace_s, old.reconcile_interval_s) == (defaults.waiting_grace_s, defaults.reconcile_interval_s)
    new = Settings.from_env({"IMPORTER_WAITING_GRACE": "1", "IMPORTER_RECONCILE_INTERVAL": "0.5"})
    assert (new.waiting_grace_s, new.reconcile_interval_s) == (1.0, 0.5)
    from pathlib import Path

    import importer.adapters.settings

    source = Path(importer.adapters.settings.__file__).read_text()
    assert "IMPORTER_UNSENT_GRACE" not in source and "IMPORTER_SWEEP_INTERVAL" not in source


def test_importer_dev_waits_for_the_longest_shutdown_of_its_processes() -> None:
    from importer.adapters.processes.dev import HTTP_GRACEFUL_TIMEOUT_S, STOP_MARGIN_S, _stop_timeout

    assert _stop_timeout({}) == max(30.0, 2.0 + HTTP_GRACEFUL_TIMEOUT_S) + STOP_MARGIN_S
    assert _stop_timeout({"IMPORTER_WORKER_SHUTDOWN_TIMEOUT": "120"}) == 120 + STOP_MARGIN_S
