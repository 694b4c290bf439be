"""An upgraded install: a store written by the previous release (no ledger,
its own worker and HTTP server, commit PREVIOUS_RELEASE installed apart from
this tree), then this release with the ledger on. The exporter copies the
whole history from the journal's first entry, `importer ledger verify` is
clean, and a batch the previous release applied is never applied again."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import psycopg
import pytest

from importer.domain.shipment import job_id_for
from tests.integration.support import ROOT, System

pytestmark = pytest.mark.integration

#: The last commit before the ledger (the release an operator upgrades from).
PREVIOUS_RELEASE = "04f7c9bb35f9f236f236e65e82aa1b38acd1ac09"


@pytest.fixture(scope="module")
def previous_release(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The previous release's package, installed (no dependencies: the same ones) into its own folder."""
    work = tmp_path_factory.mktemp("previous")
    tree, site = work / "tree", work / "site"
    tree.mkdir()
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", PREVIOUS_RELEASE], capture_output=True, timeout=60)
    assert archive.returncode == 0, f"the clone must hold {PREVIOUS_RELEASE} (a full clone): {archive.stderr!r}"
    subprocess.run(["tar", "-x", "-C", str(tree)], input=archive.stdout, check=True, timeout=60)
    pip = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(site), str(tree)],
                         capture_output=True, text=True, timeout=300)
    assert pip.returncode == 0, pip.stdout + pip.stderr
    return site


def shipment(rows: dict[str, int]) -> bytes:
    return ("sku,quantity\n" + "".join(f"{sku},{q}\n" for sku, q in rows.items())).encode()


def test_the_history_of_a_store_the_previous_release_wrote_is_exported_whole(
    make_system: Any, make_database: Any, previous_release: Path,
) -> None:
    db = make_database()
    old = make_system()
    old.env_overrides["PYTHONPATH"] = str(previous_release)  # its own package first on the path
    old.start_worker()
    old.start_http()
    probe = subprocess.run([sys.executable, "-c", "import importer.adapters.redis.attempts as a; print(a.__file__)"],
                           env=old.env, capture_output=True, text=True, timeout=60)
    assert probe.stdout.startswith(str(previous_release)), probe.stdout + probe.stderr  # the old code runs
    batches = {
        ("main", "old-1"): {"UPG-A": 3, "UPG-B": 1},
        ("main", "old-2"): {"UPG-A": 4},
        ("paris", "old-1"): {"UPG-A": 9},
    }
    for (location, batch_id), rows in batches.items():
        status, _, body = old.request("POST", f"/api/imports?batchId={batch_id}&location={location}",
                                      body=shipment(rows), ctype="text/csv")
        assert status == 202, body
        assert old.wait_state(job_id_for(batch_id, location))["state"] == "completed"
    old.stop_all()

    # the same store, this release, the ledger on
    new = make_system(IMPORTER_DATABASE_URL=db)
    new.prefix, new.queue_name = old.prefix, old.queue_name
    new.start_ledger(once=True).popen.wait(60)
    with psycopg.connect(db) as conn:
        rows = conn.execute(
            "SELECT location, batch_id, count(*), sum(quantity) FROM ledger_movements GROUP BY location, batch_id"
        ).fetchall()
        cursors = conn.execute("SELECT location, shipments FROM ledger_export_cursors ORDER BY location").fetchall()
    assert {(r[0], r[1]): (r[2], r[3]) for r in rows} == {key: (len(v), sum(v.values())) for key, v in batches.items()}
    assert cursors == [("main", 2), ("paris", 1)]
    verified = subprocess.run([sys.executable, "-m", "importer.adapters.processes.cli", "ledger", "verify"],
                              env=new.env, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert verified.returncode == 0, verified.stdout + verified.stderr

    new.start_worker()
    new.start_http()
    new.store().delete_job_record(job_id_for("old-2"))  # as retention does
    status, _ = new.post_csv("old-2", shipment({"UPG-A": 4}))
    assert status == 202
    again = new.wait_state(job_id_for("old-2"))
    assert again["state"] == "completed" and again["result"]["replay"] is True
    assert new.store().stock_of(["UPG-A"])["UPG-A"] == 7
