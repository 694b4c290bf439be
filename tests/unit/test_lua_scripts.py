"""The Lua scripts and the Python side agree on what both name: job states,
the duration buckets, and key names (which only adapters/redis/keys.py makes)."""

from __future__ import annotations

import re
from importlib import resources

import pytest

from importer.adapters.metrics import DURATION_BUCKETS_MS as METRICS_BUCKETS
from importer.adapters.redis.keys import Keys
from importer.adapters.dramatiq import private
from importer.adapters.redis.scripts import DURATION_BUCKETS_MS, SCRIPT_NAMES, fetch_source, lua_source
from importer.domain.jobs import FINISHED_STATES, JobState

LUA = resources.files("importer.adapters.redis") / "lua"


def code_of(name: str) -> str:
    """A script's text without its comments."""
    text = (LUA / f"{name}.lua").read_text(encoding="utf-8")
    return "\n".join(line.split("--", 1)[0] for line in text.splitlines())


ALL = [*SCRIPT_NAMES, "common"]


def test_every_script_file_is_loaded() -> None:
    files = {entry.name.removesuffix(".lua") for entry in LUA.iterdir() if entry.name.endswith(".lua")}
    assert files == {*ALL, "fetch"}


def test_fetch_runs_dramatiqs_own_dispatch_script_unchanged() -> None:
    from dramatiq.brokers.redis import _scripts

    dispatch = _scripts["dispatch"]
    dispatch = dispatch.decode() if isinstance(dispatch, bytes) else dispatch
    source = fetch_source(private.dispatch_script())
    assert source.startswith("#!lua\nlocal function dramatiq_dispatch()\n" + dispatch + "\nend\n")
    assert source.endswith((LUA / "fetch.lua").read_text(encoding="utf-8"))


def test_start_apply_runs_start_and_apply_unchanged_as_steps() -> None:
    source = lua_source("start_apply")
    for step in ("start", "apply"):
        body = (LUA / f"{step}.lua").read_text(encoding="utf-8")
        assert f"local function {step}_step(KEYS, ARGV, COMBINED)\n{body}\nend\n" in source
        assert "local step = job_step(KEYS, ARGV" in body  # the step's own KEYS and ARGV, not the globals
    # Run on its own, a step's COMBINED is common.lua's nil.
    assert "\nlocal COMBINED = nil\n" in (LUA / "common.lua").read_text(encoding="utf-8")


def test_the_scripts_write_exactly_the_job_states() -> None:
    written = set()
    for name in ALL:
        writes = [line for line in code_of(name).splitlines() if "HMGET" not in line]  # reads name fields
        written |= set(re.findall(r"'state',\s*'([a-z]+)'", "\n".join(writes)))
    assert written == {state.value for state in JobState}


def test_finished_means_the_same_in_lua() -> None:
    match = re.search(r"local function is_finished\(state\)\s*return (.*?)\s*end", code_of("common"), re.S)
    assert match is not None
    assert set(re.findall(r"state == '([a-z]+)'", match.group(1))) == {state.value for state in FINISHED_STATES}


def test_duration_buckets_are_written_into_every_script_from_one_constant() -> None:
    assert METRICS_BUCKETS is DURATION_BUCKETS_MS
    assert "DURATION_BUCKETS_MS = {" not in code_of("common")
    for name in SCRIPT_NAMES:
        shebang, _generated, prelude = lua_source(name).split("\n", 3)[:3]
        assert shebang == "#!lua"  # Redis checks OOM before the script runs, never half-way
        assert prelude == "local DURATION_BUCKETS_MS = {" + ", ".join(map(str, DURATION_BUCKETS_MS)) + "}"


@pytest.mark.parametrize("name", ALL)
def test_no_script_makes_a_key_name_of_its_own(name: str) -> None:
    """Key names come in KEYS or as name prefixes in ARGV, all made by Keys."""
    code = code_of(name)
    literals = set(re.findall(r"'([^']*)'", code))
    key_like = {
        lit for lit in literals
        if re.fullmatch(r"(job|upload|done|receipt|jobs|rate|stats|stock|generation|journal|events)(:.*)?", lit)
    }
    assert key_like == set(), key_like
    assert re.search(r"\bprefix \.\.", code) is None  # the old single-prefix ARGV


@pytest.mark.parametrize("name", [*SCRIPT_NAMES])
def test_every_declared_argument_is_used(name: str) -> None:
    """The header documents KEYS[i]/ARGV[i]; each documented one is read by the script
    (directly or through job_step in common.lua)."""
    text = (LUA / f"{name}.lua").read_text(encoding="utf-8")
    # ("ARGV[n] onwards: ..." declares a variadic tail, read in a loop.)
    header = "\n".join(line for line in text.splitlines() if line.startswith("--") and "onwards" not in line)
    code = code_of(name)
    shared = "KEYS[1..7], ARGV[1..8]" in header
    for kind in ("KEYS", "ARGV"):
        declared = {int(i) for i in re.findall(kind + r"\[(\d+)\]", header)}
        used = {int(i) for i in re.findall(kind + r"\[(\d+)\]", code)}
        if shared:
            assert not declared & set(range(1, 8 if kind == "KEYS" else 9)), "the job-step header is documented in common.lua"
            used |= set(range(1, 8 if kind == "KEYS" else 9))
        assert declared <= used, (kind, sorted(declared - used))


def test_the_job_step_header_is_as_long_in_lua_and_in_python() -> None:
    """The job steps' shared header, and start_apply.lua's layout of its
    shared and per-import KEYS and ARGV, are as long in Lua as AttemptSteps makes them."""
    from importer.adapters.redis.attempts import JOB_STEP_KEYS, TOGETHER_LAYOUT

    match = re.search(r"KEYS\[(\d+)\] P:jobs:finished:new\n--   ARGV\[1\] jobId", (LUA / "common.lua").read_text(encoding="utf-8"))
    assert match is not None and int(match.group(1)) == JOB_STEP_KEYS
    shared_keys, per_import_keys, shared_argv = TOGETHER_LAYOUT
    assert f"local SHARED_KEYS, PER_IMPORT_KEYS, SHARED_ARGV = {shared_keys}, {per_import_keys}, {shared_argv}\n" in code_of("start_apply")
    header = (LUA / "start_apply.lua").read_text(encoding="utf-8")
    assert f"KEYS[{shared_keys}] P:ledger:pruned:filter" in header
    assert f"ARGV[{shared_argv}] how many imports" in header


@pytest.mark.parametrize("name", ALL)
def test_no_script_builds_a_key_name(name: str) -> None:
    """Every key is declared in KEYS (Redis Cluster's rule): no key name is
    concatenated inside a script (the runtime check is tests/integration/test_declared_keys.py)."""
    code = code_of(name)
    assert re.search(r"redis\.p?call\('[A-Za-z]+',\s*[^,)]*\.\.", code) is None
    assert "_prefix" not in code, "a key name prefix in a script"
