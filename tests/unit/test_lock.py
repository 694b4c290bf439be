"""requirements.lock (`make lock`) holds every pin of pyproject.toml, at the same version, with hashes."""

from __future__ import annotations

import re
import tomllib

from tests.integration.support import ROOT

PIN = re.compile(r"^([A-Za-z0-9._-]+)(?:\[[^\]]*\])?==([^\s;]+)")


def _name(text: str) -> str:
    return re.sub(r"[-_.]+", "-", text).lower()


def test_the_lock_pins_every_dependency_of_pyproject_at_its_version_with_hashes() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted = [*project["dependencies"], *project["optional-dependencies"]["test"], *project["optional-dependencies"]["otel"]]
    pins = {_name(m[1]): m[2] for line in wanted if (m := PIN.match(line))}
    assert all(PIN.match(line) for line in wanted), "every dependency in pyproject.toml is pinned with =="
    text = (ROOT / "requirements.lock").read_text()
    locked = {_name(m[1]): m[2] for line in text.splitlines() if (m := PIN.match(line))}
    assert {name: locked.get(name) for name in pins} == pins, "run `make lock`"
    entries = re.split(r"\n(?=[A-Za-z0-9])", text.split("\n", 2)[2])
    assert all("--hash=sha256:" in entry for entry in entries if PIN.match(entry))
