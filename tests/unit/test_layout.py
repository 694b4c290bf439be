"""The layering, checked on the sources: who may import whom."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def imports_of(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


def modules(folder: str) -> list[Path]:
    return sorted((ROOT / folder).rglob("*.py"))


@pytest.mark.parametrize("path", modules("domain"), ids=lambda p: p.name)
def test_domain_imports_no_io_library_and_no_adapter(path: Path) -> None:
    forbidden = ("redis", "dramatiq", "pika", "socket", "urllib", "http", "gunicorn", "importer.adapters", "importer.handlers")
    bad = {name for name in imports_of(path) if name.split(".")[0] in forbidden or name.startswith(forbidden)}
    assert not bad, f"{path.name} imports {sorted(bad)}"


@pytest.mark.parametrize("path", modules("handlers"), ids=lambda p: p.name)
def test_handlers_import_nothing_from_adapters(path: Path) -> None:
    assert not {n for n in imports_of(path) if n.startswith("importer.adapters")}


def test_only_the_composition_root_imports_fault_injection() -> None:
    importers = sorted(
        str(p.relative_to(ROOT)) for folder in ("domain", "adapters", "handlers") for p in modules(folder)
        if "importer.adapters.faults" in imports_of(p)
    )
    assert importers == ["adapters/bootstrap.py"]


def test_only_the_settings_module_reads_the_environment() -> None:
    readers = sorted(
        str(p.relative_to(ROOT)) for folder in ("domain", "adapters", "handlers") for p in modules(folder)
        if "os.environ" in p.read_text()
    )
    assert readers == ["adapters/settings.py"]
