"""Every command answers bad input the same way: exit code 2, one line on stderr, no traceback, no file written.

Hypothesis draws mutations of a valid plan and profile file — truncated
JSON, other versions, dropped keys, values of the wrong type, negative
numbers, layouts that do not divide the devices, another model's
fingerprint — and of valid command lines — a required option left out, a
value its option refuses, an unknown option, a model or input shape that does
not exist, a file that is missing or a folder, an output folder that does not
exist — and feeds each to the commands that read it, in this process.

A mutated document the schema still accepts (an optional key dropped) may
succeed (exit 0); everything else must exit 2. Reaching the ranks or the
calibration at all means a bad input went unnoticed, so both are replaced by
a function that fails the test. ``PARPLAN_FUZZ_EXAMPLES`` sets how many inputs
each property tries (default 40, the same ones every run; when set, new random ones — the closing note of
issue 10 reports a long run).
"""

from __future__ import annotations

import contextlib
import copy
import io
import json
import os
import tempfile
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from hypothesis.control import currently_in_test_context

from cost_models.formats.schema import load_schema
from parplan.cli import main

EXAMPLES = int(os.environ.get("PARPLAN_FUZZ_EXAMPLES", "40"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow],
                derandomize="PARPLAN_FUZZ_EXAMPLES" not in os.environ)  # CI: the same inputs every run
MODEL_FILE = Path(__file__).resolve().parents[1] / "examples" / "digits_cnn.py"
MODEL = ["--model", f"{MODEL_FILE}:digits_cnn", "--input-shape", "8,1,8,8"]


@pytest.fixture(scope="module")
def valid(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A valid plan (2 devices) and profile document for the small CNN."""
    from calibrate.presets import preset_profile

    folder = tmp_path_factory.mktemp("valid")
    plan = folder / "plan.json"
    with _quiet():
        assert main(["plan", *MODEL, "--profile", "h100", "--devices", "2", "--max-stages", "1", "--out", str(plan),
                     "--json"]) == 0
    return {"plan": json.loads(plan.read_text()), "profile": preset_profile("h100").to_dict()}


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        yield


def _unreachable(*_: Any, **__: Any) -> Any:
    raise AssertionError("bad input reached the ranks or the calibration")


def _outcome(argv: list[str], folder: Path) -> tuple[int, list[str], str, list[str]]:
    """Run ``parplan argv`` here: exit code, stderr lines, stdout, and the files that appeared in ``folder``."""
    before = set(folder.rglob("*"))
    out, err = io.StringIO(), io.StringIO()
    with warnings.catch_warnings(), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), \
            mock.patch("runtime.launch.launch", _unreachable), mock.patch("runtime.launch.launch_many", _unreachable), \
            mock.patch("calibrate.session.run_calibration", _unreachable):
        warnings.simplefilter("ignore")
        try:
            code = main(argv)
        except SystemExit as exit_:  # argparse
            code = int(exit_.code or 0)
    created = sorted(str(p.relative_to(folder)) for p in set(folder.rglob("*")) - before)
    return code, err.getvalue().strip().splitlines(), out.getvalue(), created


def _assert_refused(argv: list[str], folder: Path, must_fail: bool = True) -> None:
    if currently_in_test_context():  # a hypothesis example: count it (--hypothesis-show-statistics)
        event(f"fed to parplan {argv[0]}")
    code, lines, stdout, created = _outcome(argv, folder)
    if not must_fail and code == 0:
        return
    assert code == 2, f"parplan {' '.join(argv)} exited {code}: {lines}"
    assert len(lines) == 1 and "Traceback" not in lines[0] and lines[0].startswith("parplan"), lines
    assert created == [] and stdout == "", (created, stdout)


# --- mutated documents -----------------------------------------------------------------------------------------

def _leaves(document: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Paths to every value of a JSON document (dict keys and list indices)."""
    found = [path] if path else []
    if isinstance(document, dict):
        for key, value in document.items():
            found += _leaves(value, (*path, key))
    elif isinstance(document, list):
        for index, value in enumerate(document):
            found += _leaves(value, (*path, index))
    return found


def _set(document: Any, path: tuple[Any, ...], value: Any) -> Any:
    changed = copy.deepcopy(document)
    target = changed
    for part in path[:-1]:
        target = target[part]
    if value is _DROP:
        del target[path[-1]]
    else:
        target[path[-1]] = value
    return changed


_DROP = object()
_OTHER_TYPES = (None, "x", 1.5, -3, [], {}, True)


@st.composite
def mutated(draw: Any, document: dict[str, Any], schema: str) -> tuple[str, bool, str]:
    """(file text, whether every command must refuse it, what was done)."""
    from jsonschema import Draft202012Validator

    kind = draw(st.sampled_from(("truncate", "version", "not_object", "drop", "retype", "negative")))
    text = json.dumps(document, indent=1)
    if kind == "truncate":
        cut = draw(st.integers(min_value=0, max_value=text.rindex("}") - 1))
        return text[:cut], True, f"truncated at {cut}"
    if kind == "version":
        kind_name, current = document["format"].split("/")
        version = draw(st.sampled_from(("0", str(int(current) + 1), "99", "1.0", "")))  # none this code reads
        return json.dumps({**document, "format": f"{kind_name}/{version}"}), True, f"version {version!r}"
    if kind == "not_object":
        return json.dumps(draw(st.sampled_from(([], [document], "plan", 3, None)))), True, "not an object"
    paths = [p for p in _leaves(document) if (kind != "drop" or isinstance(p[-1], str)) and (kind != "negative" or (
        isinstance(_get(document, p), (int, float)) and not isinstance(_get(document, p), bool)))]
    path = draw(st.sampled_from(paths))
    value: Any = _DROP
    if kind == "retype":
        value = draw(st.sampled_from([v for v in _OTHER_TYPES if type(v) is not type(_get(document, path))]))
    elif kind == "negative":
        value = -abs(_get(document, path)) - draw(st.sampled_from((1, 0.5, 10**9)))
    changed = _set(document, path, value)
    invalid = any(True for _ in Draft202012Validator(load_schema(schema)).iter_errors(changed))
    return json.dumps(changed), invalid, f"{kind} at {'/'.join(map(str, path))}"


def _get(document: Any, path: tuple[Any, ...]) -> Any:
    for part in path:
        document = document[part]
    return document


@FUZZ
@given(data=st.data())
def test_mutated_plan_files_are_refused_by_estimate_and_run(valid: dict[str, Any], data: st.DataObject) -> None:
    text, must_fail, what = data.draw(mutated(valid["plan"], "plan-3"), label="plan")
    command = data.draw(st.sampled_from(("estimate", "run")))
    with tempfile.TemporaryDirectory() as name:
        folder = Path(name)
        (folder / "plan.json").write_text(text)
        if command == "run" and not must_fail:
            event("not fed: run of a plan the schema accepts would start ranks")
            return
        extra = ["--profile", "h100"] if command == "estimate" else ["--nproc", "2", "--out", str(folder / "m.json")]
        _assert_refused([command, *MODEL, "--plan", str(folder / "plan.json"), *extra], folder, must_fail)


@FUZZ
@given(data=st.data())
def test_mutated_profile_files_are_refused_by_every_command_that_reads_one(valid: dict[str, Any],
                                                                          data: st.DataObject) -> None:
    text, must_fail, what = data.draw(mutated(valid["profile"], "profile-1"), label="profile")
    command = data.draw(st.sampled_from(("profile", "estimate", "plan", "whatif", "validate")))
    with tempfile.TemporaryDirectory() as name:
        folder = Path(name)
        profile = folder / "profile.json"
        profile.write_text(text)
        (folder / "plan.json").write_text(json.dumps(valid["plan"]))
        argv = {"profile": ["profile", "show", str(profile)],
                "estimate": ["estimate", *MODEL, "--plan", str(folder / "plan.json"), "--profile", str(profile)],
                "plan": ["plan", *MODEL, "--profile", str(profile), "--devices", "2", "--out", str(folder / "p.json")],
                "whatif": ["whatif", *MODEL, "--profile", str(profile), "--devices", "1,2"],
                "validate": ["validate", *MODEL, "--profile", str(profile), "--nproc", "2"]}[command]
        if command == "validate" and not must_fail:
            event("not fed: validate with a profile the schema accepts would start ranks")
            return
        _assert_refused(argv, folder, must_fail)


@FUZZ
@given(data=st.data())
def test_the_mutated_plan_kinds_the_issue_names_are_refused(valid: dict[str, Any], data: st.DataObject) -> None:
    plan = copy.deepcopy(valid["plan"])
    command = data.draw(st.sampled_from(("estimate", "run")))
    kind = data.draw(st.sampled_from(("layout", "fingerprint", "devices", "layer")))
    if kind == "layout":  # h3 or c3 does not divide 2 devices
        index = data.draw(st.integers(0, len(plan["layers"]) - 1))
        plan["layers"][index]["layout"] = {"n": 1, "c": 1, "h": 3, "w": 1} if data.draw(st.booleans()) else \
            {"n": 1, "c": 3, "h": 1, "w": 1}
    elif kind == "fingerprint":
        plan["model"]["fingerprint"] = "sha256:" + data.draw(st.text("0123456789abcdef", min_size=16, max_size=16))
    elif kind == "devices":  # fewer devices than the stage uses; or 4 (n2 divides them), but run starts 2 ranks
        plan["cluster"]["devices"] = 1 if command == "estimate" else data.draw(st.sampled_from((1, 4)))
        plan["pipeline"]["devices_per_stage"] = [max(2, plan["cluster"]["devices"])]
    else:
        plan["layers"][0]["name"] = data.draw(st.sampled_from(("no_such_layer", "", "conv1 ")))
    with tempfile.TemporaryDirectory() as name:
        folder = Path(name)
        (folder / "plan.json").write_text(json.dumps(plan))
        extra = ["--profile", "h100"] if command == "estimate" else ["--nproc", "2"]
        _assert_refused([command, *MODEL, "--plan", str(folder / "plan.json"), *extra], folder)


# --- mutated command lines -------------------------------------------------------------------------------------

def _command_lines(folder: Path, plan: Path, profile: Path) -> dict[str, list[str]]:
    """A valid command line of every command (the checkpoint commands' folder is empty: never valid)."""
    out = str(folder / "out.json")
    return {
        "inspect": ["inspect", *MODEL],
        "calibrate": ["calibrate", *MODEL, "--out", out, "--budget-s", "5", "--timeout-s", "30"],
        "profile": ["profile", "show", str(profile)],
        "estimate": ["estimate", *MODEL, "--plan", str(plan), "--profile", str(profile)],
        "plan": ["plan", *MODEL, "--profile", "h100", "--devices", "2", "--out", out],
        "run": ["run", *MODEL, "--plan", str(plan), "--nproc", "2", "--out", out],
        "whatif": ["whatif", *MODEL, "--profile", "h100", "--devices", "1,2", "--csv", str(folder / "w.csv")],
        "validate": ["validate", *MODEL, "--profile", str(profile), "--nproc", "2", "--out", out],
    }


_BAD_VALUES = {
    "--input-shape": ("1,2,3", "0,1,8,8", "a,b,c,d", "-1,1,8,8", "8,1,8,8,8", "", "8;1;8;8"),
    "--model": ("no_such_file.py:f", "torchvision:no_such_model", "os:getcwd", "nocolon", "examples/unet.py:nothing",
                ":", "torchvision:"),
    "--dtype": ("float8", "int64", ""),
    "--devices": ("0", "-2", "x", "", "1..0", "2,x"),
    "--nproc": ("0", "-1", "two", "1.5"),
    "--profile": ("no_such_preset", "missing.json", "/"),
    "--plan": ("missing.json", "/", "/dev/null"),
    "--out": ("no/such/folder/out.json",),
    "--csv": ("no/such/folder/w.csv",),
    "--budget-s": ("0", "-1", "nan", "inf", "x"),
    "--steps": ("-1", "x", "1.5"),
    "--timeout-s": ("0", "-5", "nan", "x"),
    "--max-restarts": ("-1", "x"),
}
_UNKNOWN = ("--bogus", "--steps-per-day", "-z", "--nproc=")


@FUZZ
@given(data=st.data())
def test_mutated_command_lines_are_refused_by_every_command(valid: dict[str, Any], data: st.DataObject) -> None:
    with tempfile.TemporaryDirectory() as name:
        folder = Path(name)
        plan, profile = folder / "plan.json", folder / "profile.json"
        plan.write_text(json.dumps(valid["plan"]))
        profile.write_text(json.dumps(valid["profile"]))
        command = data.draw(st.sampled_from(sorted(_command_lines(folder, plan, profile))), label="command")
        argv = _command_lines(folder, plan, profile)[command]
        options = [i for i, word in enumerate(argv) if word.startswith("--")]
        candidates = [i for i in options if argv[i] in _BAD_VALUES]
        kinds = ("drop", "value", "unknown") if candidates else ("unknown",)
        kind = data.draw(st.sampled_from(kinds), label="mutation")
        if kind == "drop":
            index = data.draw(st.sampled_from(options))
            must_fail = _required(command, argv[index])
            argv = argv[:index] + argv[index + 2:]
        elif kind == "value":
            index = data.draw(st.sampled_from(candidates))
            argv = [*argv[:index + 1], data.draw(st.sampled_from(_BAD_VALUES[argv[index]])), *argv[index + 2:]]
            must_fail = True
        else:
            position = data.draw(st.integers(1, len(argv)))
            argv = [*argv[:position], data.draw(st.sampled_from(_UNKNOWN)), *argv[position:]]
            must_fail = True
        if not must_fail:
            event("not fed: an optional option left out gives a valid command line")
            return
        with mock.patch.dict(os.environ, {"PARPLAN_FAULT": ""}):
            _assert_refused(argv, folder)


def _required(command: str, option: str) -> bool:
    """Whether leaving ``option`` out of ``command``'s valid line must be refused."""
    optional = {"calibrate": {"--budget-s", "--timeout-s"}, "whatif": {"--csv"}, "run": {"--out", "--nproc"},
                "validate": {"--out"}}
    return option not in optional.get(command, set())


@pytest.mark.parametrize("state", ["missing", "a file", "empty", "damaged"])
def test_checkpoint_commands_refuse_a_folder_without_a_usable_checkpoint(tmp_path: Path, state: str) -> None:
    folder = tmp_path / "ck"
    if state == "a file":
        folder.write_text("x")
    elif state in ("empty", "damaged"):
        folder.mkdir()
    if state == "damaged":
        (folder / "step-00000002").mkdir()
        (folder / "step-00000002" / "manifest.json").write_text('{"format": "parplan.checkpoint/1", "step": ')
    for action in ("show", "gather"):
        _assert_refused(["checkpoint", action, "--checkpoint-dir", str(folder)], tmp_path)
    _assert_refused(["run", *MODEL, "--layout", "n2", "--nproc", "2", "--checkpoint-dir", str(folder), "--resume"],
                    tmp_path)
