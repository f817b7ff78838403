"""Tier 2: the `parplan inspect` command, its JSON contract and every bad input it must answer cleanly."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from parplan.cli import main

REQUIRED_LAYER_FIELDS = {"name", "kind", "output_shape", "params", "flops_fwd", "activation_bytes"}


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_inspect_json_contract(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_cli(capsys, "inspect", "--model", "torchvision:resnet18", "--input-shape", "2,3,64,64", "--json")
    assert code == 0, err
    document = json.loads(out)
    assert set(document["totals"]) >= {"params", "flops_fwd", "activation_bytes"}
    assert document["totals"]["params"] == 11_689_512
    assert document["fingerprint"].startswith("sha256:")
    assert all(REQUIRED_LAYER_FIELDS <= set(layer) for layer in document["layers"])
    assert document["layers"][1]["name"] == "conv1" and document["layers"][1]["output_shape"] == [2, 64, 32, 32]
    assert {"src": "conv1", "dst": "bn1"} == {k: v for k, v in document["edges"][1].items() if k in ("src", "dst")}


def test_inspect_table(capsys: pytest.CaptureFixture[str], repo: Path) -> None:
    code, out, _ = run_cli(capsys, "inspect", "--model", f"{repo}/examples/unet.py:unet", "--input-shape", "1,3,32,32")
    assert code == 0
    assert "conv_transpose" in out and "476,610 parameters" in out and "fingerprint sha256:" in out


def test_module_factory_form(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_cli(capsys, "inspect", "--model", "examples.unet:unet", "--input-shape", "1,3,32,32", "--json")
    assert code == 0, err
    assert json.loads(out)["totals"]["params"] == 476_610


BAD_MODEL_FILES = {
    "raises.py": ("def make():\n    raise RuntimeError('no GPU here')\n", "raised RuntimeError: no GPU here"),
    "notmodule.py": ("def make():\n    return 42\n", "returned an object of type int, not a torch.nn.Module"),
    "broken.py": ("def make(:\n", "importing .* raised SyntaxError"),
    "untraceable.py": (
        textwrap.dedent(
            """
            import torch
            class Gate(torch.nn.Module):
                def forward(self, x):
                    return x if x.shape[1] > 3 else -x
            class Net(torch.nn.Module):
                def __init__(self):
                    super().__init__()
                    self.body = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), Gate())
                def forward(self, x):
                    return self.body(x) if x.mean() > 0 else -self.body(x)  # on values: refused
            def make():
                return Net()
            """
        ),
        r"cannot trace the forward of Net.*cannot be kept opaque",
    ),
}


@pytest.mark.parametrize("filename", sorted(BAD_MODEL_FILES))
def test_bad_model_files(capsys: pytest.CaptureFixture[str], tmp_path: Path, filename: str) -> None:
    source, message = BAD_MODEL_FILES[filename]
    (tmp_path / filename).write_text(source)
    code, out, err = run_cli(capsys, "inspect", "--model", f"{tmp_path / filename}:make", "--input-shape", "1,3,16,16")
    assert_clean_input_error(code, out, err, message)


@pytest.mark.parametrize(
    ("model", "shape", "message"),
    [
        ("torchvision:resnet51", "1,3,32,32", "torchvision has no model 'resnet51'; did you mean resnet50"),
        ("resnet50", "1,3,32,32", "not of the form torchvision:NAME"),
        ("no_such_package.models:net", "1,3,32,32", "no module named 'no_such_package'"),
        ("examples.unet:unett", "1,3,32,32", "has no callable 'unett'; did you mean unet"),
        ("missing/file.py:net", "1,3,32,32", "file missing/file.py does not exist"),
        ("torchvision:resnet18", "1,3", "has 2 dimensions; parplan plans CNNs on N,C,H,W images"),
        ("torchvision:resnet18", "1,3,32", "rejects input shape 1,3,32 at layer .conv1."),
        ("torchvision:resnet18", "1,3,0,32", "non-positive extent"),
        ("torchvision:resnet18", "1,3,-5,32", "non-positive extent"),
        ("torchvision:resnet18", "one,3,32,32", "not a list of integers"),
        ("torchvision:resnet18", "1,4,32,32", r"rejects input shape 1,4,32,32 at layer 'conv1'"),
    ],
)
def test_bad_specs_and_shapes(capsys: pytest.CaptureFixture[str], model: str, shape: str, message: str) -> None:
    code, out, err = run_cli(capsys, "inspect", "--model", model, "--input-shape", shape)
    assert_clean_input_error(code, out, err, message)


def test_usage_errors_are_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["inspect", "--model", "torchvision:resnet18"])
    out, err = capsys.readouterr()
    assert info.value.code == 2 and out == ""
    assert err.count("\n") == 1 and "--input-shape" in err and "parplan inspect --help" in err


def test_debug_shows_the_traceback(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_cli(capsys, "inspect", "--model", "torchvision:resnet18", "--input-shape", "1,4,32,32", "--debug")
    assert code == 2 and "Traceback" in err


def assert_clean_input_error(code: int, out: str, err: str, message: str) -> None:
    import re

    assert code == 2, err
    assert out == ""
    assert err.count("\n") == 1, err
    assert "Traceback" not in err
    assert err.startswith("parplan inspect: error: ")
    assert re.search(message, err), err


_PEAK_WRAPPER = """
import atexit, runpy, sys
def peak():  # this process's own high-water mark (VmHWM): not the parent's pages counted at fork, as ru_maxrss is
    with open("/proc/self/status") as status:
        line = next(line for line in status if line.startswith("VmHWM:"))
    sys.stderr.write(f"\\npeak-kib {line.split()[1]}\\n")
atexit.register(peak)
script, *sys.argv[1:] = sys.argv[1:]
sys.argv[0] = script
runpy.run_path(script, run_name="__main__")
"""


def test_console_script_resnet50_at_2048(tmp_path: Path) -> None:
    """The issue's acceptance run, through the installed `parplan` script: exact total, under 2 GB peak."""
    script = Path(sys.executable).with_name("parplan")
    result = subprocess.run(
        [sys.executable, "-c", _PEAK_WRAPPER, str(script), "inspect", "--model", "torchvision:resnet50",
         "--input-shape", "64,3,2048,2048", "--json"],
        capture_output=True, text=True, check=False, env={**os.environ, "PYTHONHASHSEED": "random"},
    )
    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout)
    assert document["totals"]["params"] == 25_557_032
    assert document["layers"][1]["output_shape"] == [64, 64, 1024, 1024]
    peak_kib = int(result.stderr.rsplit("peak-kib ", 1)[1].split()[0])
    assert peak_kib * 1024 < 2 * 10**9


def test_console_script_exit_code_for_bad_input() -> None:
    script = Path(sys.executable).with_name("parplan")
    result = subprocess.run([str(script), "inspect", "--model", "torchvision:nope", "--input-shape", "1,3,8,8"],
                            capture_output=True, text=True, check=False)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.count("\n") == 1 and "torchvision has no model 'nope'" in result.stderr
