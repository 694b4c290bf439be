"""deploy/: what a deployment runs and watches, checked against the real thing.
Every metric the Prometheus rules and the Grafana dashboard name is one a running
`importer serve` serves on /metrics (with a worker and the ledger); every command
the systemd units and the Procfile run is one the CLI takes."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path
from typing import Any

import pytest
import yaml

from importer.adapters.processes.cli import build_parser
from tests.integration.support import FIXTURES, ROOT

pytestmark = pytest.mark.integration

DEPLOY = ROOT / "deploy"
METRIC = re.compile(r"\b(importer_[a-z_]+)\b")


def rule_expressions() -> list[str]:
    rules = yaml.safe_load((DEPLOY / "prometheus" / "importer-alerts.yml").read_text())
    return [rule["expr"] for group in rules["groups"] for rule in group["rules"]]


def dashboard_expressions() -> list[str]:
    dashboard = json.loads((DEPLOY / "grafana" / "importer.json").read_text())
    return [target["expr"] for panel in dashboard["panels"] for target in panel["targets"]]


def test_every_metric_the_alerts_and_the_dashboard_name_is_served(make_system: Any, make_database: Any) -> None:
    system = make_system(IMPORTER_DATABASE_URL=make_database(), IMPORTER_METRICS_TOKEN="metrics-token")
    system.start_worker()
    system.start_http()
    system.start_ledger()
    assert system.post_csv("deploy-1", (FIXTURES / "shipment-a-2026.csv").read_bytes())[0] == 202
    assert system.wait_state("shipment-deploy-1")["state"] == "completed"
    assert system.post_csv("deploy-bad", (FIXTURES / "invalid-bad-quantity.csv").read_bytes())[0] == 202
    assert system.wait_state("shipment-deploy-bad")["state"] == "failed"  # importer_jobs_failed_total{code=...}
    status, _, body = system.request("GET", "/metrics", key="metrics-token")
    assert status == 200
    served = {line.split("{")[0].split()[0] for line in body.decode().splitlines() if line and not line.startswith("#")}
    expressions = rule_expressions() + dashboard_expressions()
    named = {name for expr in expressions for name in METRIC.findall(expr)}
    assert len(rule_expressions()) >= 7 and len(named) >= 10, named
    assert named <= served, sorted(named - served)


def test_every_command_the_units_and_the_procfile_run_is_one_the_cli_takes() -> None:
    commands: list[list[str]] = []
    for unit in sorted((DEPLOY / "systemd").glob("*.service")):
        (line,) = [line for line in unit.read_text().splitlines() if line.startswith("ExecStart=")]
        commands.append(shlex.split(line.removeprefix("ExecStart=")))
    for line in (DEPLOY / "Procfile").read_text().splitlines():
        commands.append(shlex.split(line.split(":", 1)[1].replace("${PORT:-8080}", "8080")))
    assert {Path(c[0]).name for c in commands} == {"importer"} and len(commands) == 6, commands
    parser = build_parser()
    for command in commands:
        parser.parse_args(command[1:])  # exits (SystemExit) on a command it does not take
    assert {c[1] for c in commands} == {"serve", "worker", "ledger"}
