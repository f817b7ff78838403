"""``parplan calibrate --timeout-s``: a rank that hangs while collectives are timed fails the calibration in one line.

The hang is injected with ``PARPLAN_FAULT=hang:1:1`` (``runtime.fault_injection``; for calibrate, STEP is the collective
measurement), on 2 spawned gloo ranks timing collectives for a tiny resnet18.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from distributed import survivors

from parplan.cli import main

pytestmark = pytest.mark.multirank

TINY = ["--model", "torchvision:resnet18", "--input-shape", "2,3,32,32", "--no-forms"]


def _calibrate(*args: str, cwd: Path, fault: str, tag: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PARPLAN_TEST_TAG": tag, "PARPLAN_FAULT": fault}
    command = [str(Path(sys.executable).parent / "parplan"), "calibrate", *args]
    return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=300, check=False)


def test_a_hung_rank_fails_the_calibration_within_the_timeout_naming_the_collective(tmp_path: Path) -> None:
    tag, out = uuid.uuid4().hex, tmp_path / "profile.json"
    started = time.time()
    # a budget the ranks' start-up cannot eat on a loaded machine: the hang ends the run long before it
    run = _calibrate(*TINY, "--ranks", "2", "--timeout-s", "4", "--budget-s", "60", "--out", str(out), cwd=tmp_path,
                     fault="hang:1:1", tag=tag)
    ended = time.time()
    assert run.returncode == 1, run.stderr[-3000:]
    last = run.stderr.strip().splitlines()[-1]
    assert re.fullmatch(r"parplan calibrate: error: rank 0 failed \(exit code 1\): RankFailure: rank 0: timed out "
                        r"after 4 s \(a peer hung or is far behind\) in the (go-ahead for the )?timed allreduce of "
                        r"\d+ bytes with rank 1 \(measurement 1 of \d+\)", last), last
    struck = float(re.search(r"parplan: fault: rank 1 hangs at step 1 \(t=([0-9.]+)\)", run.stderr).group(1))
    assert struck > started and 4 <= ended - struck < 4 + 20  # the timeout, then the report and the ranks stopped
    assert "Traceback" not in run.stderr and not out.exists()
    deadline = time.monotonic() + 5
    while survivors(tag) and time.monotonic() < deadline:  # the killed ranks leave /proc a moment later
        time.sleep(0.1)
    assert survivors(tag) == []


@pytest.mark.parametrize("value", ["0", "-5", "nan", "x"])
def test_a_timeout_that_is_not_a_positive_number_is_refused(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                                            value: str) -> None:
    with pytest.raises(SystemExit) as info:
        main(["calibrate", *TINY, "--ranks", "2", "--timeout-s", value, "--out", str(tmp_path / "p.json")])
    assert info.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "--timeout-s" in lines[0], lines


def test_a_malformed_fault_is_refused_before_any_rank_starts(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PARPLAN_FAULT", "hang:one:1")
    assert main(["calibrate", *TINY, "--ranks", "2", "--timeout-s", "4", "--out", str(tmp_path / "p.json")]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("parplan calibrate: error: PARPLAN_FAULT='hang:one:1'"), lines
    assert list(tmp_path.iterdir()) == []
