"""The model-coverage suite's own machinery, without ranks: the hard cap's supervisor and the generated table."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from benchmarks.zoo_supervisor import supervise
from benchmarks.zoo_table import cause_of, markdown

_WORKER = textwrap.dedent("""
    import json, os, signal, sys, time
    sys.path.insert(0, {repo!r})
    from pathlib import Path
    from benchmarks.zoo_supervisor import beat

    done = Path({done!r})
    finished = done.read_text().split() if done.exists() else []
    for model in ["a", "hangs", "dies", "b"]:
        if model in finished:
            continue
        beat(Path({heartbeat!r}), {{"key": model, "started": time.time(), "checks": []}})
        if model == "hangs":
            time.sleep(600)
        if model == "dies":
            os.kill(os.getpid(), signal.SIGKILL)
        done.write_text(" ".join([*finished, model]))
        finished.append(model)
""")


def test_a_stuck_or_dead_worker_is_recorded_and_the_next_worker_resumes(tmp_path: Path) -> None:
    done, heartbeat = tmp_path / "done", tmp_path / "heartbeat"
    script = tmp_path / "worker.py"
    script.write_text(_WORKER.format(repo=str(Path(__file__).resolve().parent.parent), done=str(done),
                                     heartbeat=str(heartbeat)))
    stuck: list[tuple[str, str]] = []

    def record(last: dict[str, Any], why: str) -> None:
        stuck.append((last["key"], why))
        done.write_text(" ".join([*done.read_text().split(), last["key"]]))  # as the suite records it

    code = supervise([sys.executable, str(script)], heartbeat=heartbeat, limit_s=3.0, on_stuck=record)
    assert code == 0
    assert [key for key, _ in stuck] == ["hangs", "dies"], stuck
    assert "hard cap after 3 s" in stuck[0][1] and "died (SIGKILL)" in stuck[1][1], stuck
    assert done.read_text().split() == ["a", "hangs", "dies", "b"]


def _check(name: str, result: str, reason: str = "", whole: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    return {"name": name, "check": name.split()[0], "result": result, "reason": reason, "seconds": 1.0,
            "detail": {"whole": whole or [], "conv_flops_share": 0.9} if name != "trace" else
            {"conv_flops_share": 0.9}}


def _model(name: str, checks: list[dict[str, Any]]) -> dict[str, Any]:
    return {"zoo": "torchvision", "name": name, "family": "", "params": 1_000_000, "side": 32, "seconds": 5.0,
            "report": {"checks": checks}, "finished": "2026-12-01T00:00:00+00:00"}


def test_the_table_counts_each_zoo_and_names_each_cause_once() -> None:
    passing = ["trace", "plan 2", "verify plan 2", "plan 4", "verify plan 4", "verify n2", "verify h2", "verify w2",
               "verify c2", "verify h2·w2"]
    results = {"models": {
        "torchvision:good": _model("good", [_check(name, "pass") for name in passing]),
        "torchvision:bad": _model("bad", [_check(name, "pass") for name in passing[:5]]
                                  + [_check("verify n2", "fail", "rank 1 died (SIGKILL)"),
                                     _check("verify h2", "refused", "'view_3' (Tensor.view (4, 8)) cannot split")]),
    }, "cap_s": 300.0}
    table = markdown(results)
    assert "| torchvision | 2 models | 2 (100%) | 2 (100%) | 2 (100%) | 1 (50%) | 1 (50%) |" in table, table
    assert "fail F1" in table and "refused R1" in table
    assert "* **F1** (1): rank N died (SIGKILL) — bad" in table
    assert "killed with its ranks" in table  # the hard cap is stated in the legend
    assert "| s |\n" in table and " at |" not in table  # one commit (or none recorded): no column for it
    results["models"]["torchvision:good"]["commit"] = "abc1234"
    assert "| s | at |" in markdown(results) and "| abc1234 |" in markdown(results)  # resumed across commits
    results["runs"] = [{"what": "the first run", "models": 2, "commit": "abc1234", "wall_s": 10.0}]
    assert "merged runs: the first run (2 entries, at abc1234, 10 s)" in markdown(results)


def test_a_cause_reads_the_same_in_every_model() -> None:
    assert cause_of("'view_3' (Tensor.view (4, 8, 2)) needs 12 s") == cause_of("'view' (Tensor.view (2, 3, 9)) needs 1 s")


def test_a_model_its_worker_was_killed_on_keeps_its_finished_checks_and_fails_the_next() -> None:
    from benchmarks.model_zoo import ZooModel, _stuck

    entry = ZooModel("torchvision", "slow", "torchvision:slow", 1_000_000)
    last = {"key": "torchvision:slow", "entry": entry.__dict__, "started": 0.0,
            "checks": [_check("trace", "pass"), _check("plan 2", "pass")]}
    row = _stuck(last, "killed by the suite's hard cap after 360 s on this model")
    assert [c["name"] for c in row["report"]["checks"]] == ["trace", "plan 2", "verify plan 2"]
    assert row["report"]["checks"][-1]["result"] == "fail"
    table = markdown({"models": {"torchvision:slow": row}, "cap_s": 300.0})
    assert "killed by the suite's hard cap after N s on this model — slow" in table, table


@pytest.mark.multirank
def test_the_suite_runs_a_model_under_its_supervisor_and_writes_the_table(tmp_path: Path) -> None:
    import json
    import subprocess

    repo = Path(__file__).resolve().parent.parent
    out, table = tmp_path / "results.json", tmp_path / "coverage.md"
    done = subprocess.run([sys.executable, "benchmarks/model_zoo.py", "--zoo", "monai", "--only", "UNet",
                           "--out", str(out), "--markdown", str(table), "--cap-s", "200"],
                          capture_output=True, text=True, timeout=400, cwd=repo)
    assert done.returncode == 0, done.stderr[-2000:]
    results = json.loads(out.read_text())
    checks = results["models"]["monai:UNet"]["report"]["checks"]
    assert len(checks) == 10 and all(c["result"] == "pass" for c in checks), checks
    assert results["wall_s"] > 0 and not out.with_name(out.name + ".heartbeat").exists()
    assert "| UNet |" in table.read_text()


def test_a_float32_failure_that_passes_in_float64_counts_as_verified_and_is_marked() -> None:
    from benchmarks.zoo_table import verified

    rounding = {**_check("verify n2", "fail", "verify error above tolerance 0.001"),
                "detail": {"whole": [], "float64": {"passed": True}}}
    wrong = {**_check("verify n2", "fail", "verify error above tolerance 0.001"),
             "detail": {"whole": [], "float64": {"passed": False}}}
    passed = {**_check("verify n2", "pass", "n2 on 5 of 5 layers; float32 2e-2 above tolerance, in float64 …"),
              "detail": {"whole": [], "float64": {"passed": True}}}  # parplan check's own verdict since 2026-12
    assert verified(rounding) and verified(passed) and not verified(wrong)
    table = markdown({"models": {"torchvision:a": _model("a", [_check("trace", "pass"), rounding]),
                                 "torchvision:b": _model("b", [_check("trace", "pass"), wrong])}, "cap_s": 300.0})
    assert "| pass (f64) |" in table and "fail F1" in table


def test_the_shipped_catalogue_serves_its_library_versions_and_other_versions_are_chosen_anew(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from benchmarks import model_zoo

    versions = {"torch": "1", "torchvision": "2", "timm": "3", "monai": "4"}
    entry = {"zoo": "monai", "name": "UNet", "spec": "/elsewhere/benchmarks/model_zoo.py:monai__UNet", "params": 9,
             "family": "", "config": "", "skip": ""}
    shipped = tmp_path / "catalogue.json"
    model_zoo.save_catalogue({"catalogue": {"monai": {"versions": versions, "entries": [entry]}}}, shipped)
    assert '"benchmarks/model_zoo.py:monai__UNet"' in shipped.read_text()  # no machine's path shipped
    monkeypatch.setattr(model_zoo, "shipped_catalogue", lambda: model_zoo.read_catalogue(shipped))
    monkeypatch.setattr(model_zoo, "library_versions", lambda zoo="": versions)
    counted: list[str] = []
    monkeypatch.setattr(model_zoo, "monai_catalogue", lambda: counted.append("monai") or [])
    results: dict[str, Any] = {"catalogue": {}, "models": {}}
    (unet,) = model_zoo.catalogue("monai", results, None)
    assert (unet.name, unet.spec, counted) == ("UNet", model_zoo.spec_of("monai__UNet"), [])
    assert results["catalogue"]["monai"]["versions"] == versions  # cached in the results file too
    monkeypatch.setattr(model_zoo, "library_versions", lambda zoo="": {**versions, "monai": "5"})
    assert model_zoo.catalogue("monai", {"catalogue": {}, "models": {}}, None) == [] and counted == ["monai"]
