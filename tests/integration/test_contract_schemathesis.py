"""schemathesis against the live app: no 5xx, every response conforms to
openapi.yaml, and its ignored_auth check passes."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from tests.integration.support import ROOT

pytestmark = pytest.mark.integration


def test_schemathesis_finds_no_failure(make_system: object, make_database: object) -> None:
    system = make_system(  # type: ignore[operator]
        IMPORTER_RATE_LIMIT="0", IMPORTER_METRICS_TOKEN="not-the-producer-key",
        IMPORTER_DATABASE_URL=make_database(),  # type: ignore[operator]
    )
    system.start_ledger()
    system.start_worker()
    system.start_http(workers=2)
    out = subprocess.run(
        [
            sys.executable, "-m", "schemathesis.cli",
            "--config-file", str(ROOT / "tests" / "integration" / "schemathesis.toml"),
            "run", str(ROOT / "openapi.yaml"),
            "--url", system.base_url,
            "--header", f"Authorization: Bearer {system.api_key}",
            "--checks", "all",
            "--max-examples", "50",
            "--seed", "1",
            "--generation-database", "none",
            "--no-color",
        ],
        cwd=ROOT, capture_output=True, text=True, timeout=900,
        env={**os.environ, "SCHEMATHESIS_HOOKS": "tests.integration.schemathesis_hooks"},
    )
    report = out.stdout[-8000:] + out.stderr[-2000:]
    assert out.returncode == 0, report
    counts = re.search(r"(\d+) generated, (\d+) passed", out.stdout)
    assert counts and counts.group(1) == counts.group(2) and int(counts.group(1)) > 300, report
