"""Tier 1: plan and profile files without ``jsonschema``: still checked (format, fields, types), one warning line.

The missing package is simulated by ``sys.modules["jsonschema"] = None`` (an
import then raises ImportError), in this process and in a child process.
"""

from __future__ import annotations

import copy
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from test_plan import make_plan

import cost_models.formats.schema as schema
from calibrate.presets import preset_profile
from cost_models.errors import InputError, PlanError
from cost_models.formats.plan import Plan, load_plan, save_plan
from cost_models.profile import Profile, ProfileError

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def no_jsonschema(monkeypatch: pytest.MonkeyPatch) -> None:
    """Hide jsonschema from imports, and forget an earlier warning."""
    for name in ("jsonschema", "jsonschema.exceptions"):
        monkeypatch.setitem(sys.modules, name, None)
    monkeypatch.setattr(schema, "_warned", False)
    monkeypatch.setenv("PARPLAN_SCHEMA_WARNED", "")  # restored (removed) afterwards, whatever the test sets


def plan_document() -> dict[str, Any]:
    return make_plan().to_dict()


def profile_document() -> dict[str, Any]:
    return preset_profile("h100").to_dict()


def _drop(*path: Any) -> Callable[[dict[str, Any]], None]:
    def change(document: dict[str, Any]) -> None:
        parent = document
        for key in path[:-1]:
            parent = parent[key]
        del parent[path[-1]]
    return change


def _set(value: Any, *path: Any) -> Callable[[dict[str, Any]], None]:
    def change(document: dict[str, Any]) -> None:
        parent = document
        for key in path[:-1]:
            parent = parent[key]
        parent[path[-1]] = value
    return change


PLAN_BREAKS = {  # what is broken: (the change, the path the message names, what it says)
    "no cluster": (_drop("cluster"), "$", "'cluster' is a required property"),
    "stage not an integer": (_set("0", "layers", 0, "stage"), "$.layers[0].stage", "not of type 'integer'"),
    "layout not an object": (_set([4, 1, 2, 1], "layers", 1, "layout"), "$.layers[1].layout", "not of type 'object'"),
    "no layout extent": (_drop("layers", 0, "layout", "n"), "$.layers[0].layout", "'n' is a required property"),
    "pipeline schedule unknown": (_set("eager", "pipeline", "schedule"), "$.pipeline.schedule", "not one of"),
    "solver name a number": (_set(3, "solver", "name"), "$.solver.name", "not of type 'string'"),
}
PROFILE_BREAKS = {
    "no device": (_drop("device"), "$", "'device' is a required property"),
    "memory a string": (_set("80GB", "device", "memory_bytes"), "$.device.memory_bytes", "not of type 'integer'"),
    "fit phase unknown": (_set("sideways", "compute", "fits", 0, "phase"), "$.compute.fits[0].phase", "not one of"),
    "source unknown": (_set("guessed", "meta", "source"), "$.meta.source", "not one of"),
}


def test_valid_files_load_and_one_line_says_what_was_skipped(no_jsonschema: None, tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    save_plan(make_plan(), tmp_path / "plan.json")
    assert load_plan(tmp_path / "plan.json") == Plan.from_dict(plan_document())
    assert Profile.from_dict(profile_document()).device.name == preset_profile("h100").device.name
    lines = capsys.readouterr().err.splitlines()
    assert lines == [schema.SKIPPED_WARNING]
    assert "jsonschema is not installed" in lines[0] and "skipped" in lines[0]


@pytest.mark.parametrize("name", sorted(PLAN_BREAKS))
def test_a_broken_plan_is_refused_at_its_path(no_jsonschema: None, name: str) -> None:
    change, path, message = PLAN_BREAKS[name]
    document = plan_document()
    change(document)
    with pytest.raises(PlanError, match=rf"is not a valid parplan.plan/3 document: at {_escape(path)}: .*{message}"):
        Plan.from_dict(document, source="p.json")


@pytest.mark.parametrize("name", sorted(PROFILE_BREAKS))
def test_a_broken_profile_is_refused_at_its_path(no_jsonschema: None, name: str) -> None:
    change, path, message = PROFILE_BREAKS[name]
    document = profile_document()
    change(document)
    with pytest.raises(ProfileError, match=rf"at {_escape(path)}: .*{message}"):
        Profile.from_dict(document, source="p.json")


def test_format_and_version_are_checked_as_with_jsonschema(no_jsonschema: None) -> None:
    for found, expected in (("parplan.plan/9", "has format 'parplan.plan/9' but this parplan reads"),
                            ("parplan.profile/1", "is not a parplan.plan document")):
        with pytest.raises(PlanError, match=expected):
            Plan.from_dict({**plan_document(), "format": found}, source="p.json")
    with pytest.raises(PlanError, match="holds a JSON list"):
        Plan.from_dict([], source="p.json")  # type: ignore[arg-type]


@pytest.mark.parametrize("name", sorted(PLAN_BREAKS) + sorted(PROFILE_BREAKS))
def test_what_the_fallback_refuses_jsonschema_refuses_at_the_same_path(name: str) -> None:
    pytest.importorskip("jsonschema")
    change, path, _ = {**PLAN_BREAKS, **PROFILE_BREAKS}[name]
    document = plan_document() if name in PLAN_BREAKS else profile_document()
    change(document)
    kind = "plan" if name in PLAN_BREAKS else "profile"
    with pytest.raises(InputError, match=rf"at {_escape(path)}: "):
        version = 3 if kind == "plan" else 1
        schema.check_document(copy.deepcopy(document), f"parplan.{kind}/{version}", f"{kind}-{version}", "p.json",
                              InputError)


def test_the_warning_is_printed_once_per_process_and_not_again_by_the_ranks_it_starts(tmp_path: Path) -> None:
    save_plan(make_plan(), tmp_path / "plan.json")
    load = ("import sys; sys.modules['jsonschema'] = None\n"
            "from cost_models.formats.plan import load_plan\n"
            f"for _ in range(3): load_plan({str(tmp_path / 'plan.json')!r})\n")
    code = load + f"import subprocess; subprocess.run([sys.executable, '-c', {load!r}], check=True)\n"
    env = {name: value for name, value in os.environ.items() if name != "PARPLAN_SCHEMA_WARNED"}
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0, done.stderr
    assert done.stderr.splitlines() == [schema.SKIPPED_WARNING]


def _escape(path: str) -> str:
    return path.replace("$", r"\$").replace(".", r"\.").replace("[", r"\[").replace("]", r"\]")
