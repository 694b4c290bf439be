"""`importer submit --wait` and `importer status`, as a person uses them."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.integration.support import FIXTURES, ROOT, System

pytestmark = pytest.mark.integration


def importer(system: System, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**system.env, "IMPORTER_API_KEY": system.api_key, "IMPORTER_URL": system.base_url}
    return subprocess.run(
        [sys.executable, "-m", "importer.adapters.cli", *args], env=env, cwd=ROOT, capture_output=True, text=True, timeout=120
    )


def test_submit_wait_follows_a_good_import_to_completion(system: System) -> None:
    out = importer(system, "submit", str(FIXTURES / "shipment-a-2026.csv"), "--batch-id", "cli-1", "--wait")
    assert out.returncode == 0, out.stdout + out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == "accepted shipment-cli-1 (batch cli-1, waiting)"
    assert lines[-1] == 'completed shipment-cli-1: {"imported": 3, "batchId": "cli-1"}'
    assert any(line.startswith("completed phase=committed rows=3 attempt=1") for line in lines)

    status = importer(system, "status", "shipment-cli-1", "--json")
    assert status.returncode == 0 and json.loads(status.stdout)["state"] == "completed"
    readable = importer(system, "status", "shipment-cli-1")
    assert readable.stdout.startswith("shipment-cli-1: completed (attempt 1, phase committed, rows 3)")


def test_submit_wait_prints_each_located_issue_of_a_bad_file(system: System) -> None:
    out = importer(system, "submit", str(FIXTURES / "invalid-bad-quantity.csv"), "--batch-id", "cli-bad", "--wait")
    assert out.returncode == 1
    assert "failed shipment-cli-bad: csv.bad_quantity:" in out.stdout
    assert "  line 2, column 2: csv.bad_quantity: quantity 'abc'" in out.stdout
    assert "  line 3, column 2: csv.bad_quantity: quantity '-3'" in out.stdout


def test_refusals_and_missing_jobs_exit_non_zero(system: System) -> None:
    importer(system, "submit", str(FIXTURES / "shipment-a-2026.csv"), "--batch-id", "cli-2", "--wait")
    conflict = importer(system, "submit", str(FIXTURES / "invalid-duplicate-sku.csv"), "--batch-id", "cli-2")
    assert conflict.returncode == 1 and "409 batch.conflict" in conflict.stderr
    missing = importer(system, "status", "shipment-nope")
    assert missing.returncode == 1 and "404 job.not_found" in missing.stderr
