"""Loads the Lua scripts that sit beside this module, each with common.lua prepended."""

from __future__ import annotations

from functools import cache
from importlib import resources


@cache
def lua_source(name: str) -> str:
    folder = resources.files("importer.adapters") / "lua"
    common = (folder / "common.lua").read_text(encoding="utf-8")
    body = (folder / f"{name}.lua").read_text(encoding="utf-8")
    return f"{common}\n{body}"


SCRIPT_NAMES = ("enqueue", "start", "progress", "apply", "fail")
