"""The layering, checked on the sources: who may import whom."""

from __future__ import annotations

import ast
import re
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


def test_only_the_settings_modules_read_the_environment() -> None:
    readers = sorted(
        str(p.relative_to(ROOT)) for folder in ("domain", "adapters", "handlers") for p in modules(folder)
        if "os.environ" in p.read_text()
    )
    assert readers == ["adapters/command_settings.py", "adapters/settings.py"]


#: The adapters that may import handlers/: the wiring and the process entries.
#: The Redis and dramatiq code, logs, settings and metrics never do.
MAY_IMPORT_HANDLERS = ("adapters/bootstrap.py", "adapters/processes/")


@pytest.mark.parametrize("path", modules("adapters"), ids=lambda p: str(p.relative_to(ROOT)))
def test_only_the_wiring_and_the_process_entries_import_handlers(path: Path) -> None:
    relative = str(path.relative_to(ROOT))
    if relative.startswith(MAY_IMPORT_HANDLERS):
        return
    assert not {n for n in imports_of(path) if n.startswith("importer.handlers")}, relative


@pytest.mark.parametrize("path", modules("adapters/redis"), ids=lambda p: p.name)
def test_the_store_knows_nothing_of_the_queue_or_the_processes(path: Path) -> None:
    bad = {n for n in imports_of(path) if n.startswith(("importer.adapters.dramatiq", "importer.adapters.processes",
                                                          "importer.adapters.bootstrap", "dramatiq"))}
    assert not bad, f"{path.name} imports {sorted(bad)}"


@pytest.mark.parametrize("path", modules("adapters/dramatiq"), ids=lambda p: p.name)
def test_the_queue_does_not_climb_into_the_processes_or_the_wiring(path: Path) -> None:
    bad = {n for n in imports_of(path) if n.startswith(("importer.adapters.processes", "importer.adapters.bootstrap"))}
    assert not bad, f"{path.name} imports {sorted(bad)}"


def test_dramatiqs_private_api_is_used_in_one_module_only() -> None:
    users = sorted(
        str(p.relative_to(ROOT)) for p in modules("adapters")
        if any(name in p.read_text() for name in ("_RedisConsumer", "._dispatch(", "._should_do_maintenance(",
                                                   "._max_unpack_size(", "import _scripts", "_run_exposition_server"))
    )
    assert users == ["adapters/dramatiq/private.py"]


@pytest.mark.parametrize("path", [p for folder in ("domain", "adapters", "handlers") for p in modules(folder)],
                         ids=lambda p: str(p.relative_to(ROOT)))
def test_no_module_is_a_god_module(path: Path) -> None:
    lines = len(path.read_text().splitlines())
    assert lines <= 420, f"{path.relative_to(ROOT)} has {lines} lines: cut it along what it does"


def test_every_setting_is_on_the_settings_page() -> None:
    """docs/settings.md is the reference: each IMPORTER_ variable the settings read is there."""
    read = {name for module in ("settings.py", "command_settings.py")
            for name in re.findall(r"\"(IMPORTER_[A-Z_]+)\"", (ROOT / "adapters" / module).read_text())}
    page = (ROOT / "docs" / "settings.md").read_text()
    assert read and not {name for name in read if f"`{name}`" not in page}, sorted(n for n in read if f"`{n}`" not in page)
