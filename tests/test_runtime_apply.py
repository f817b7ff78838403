"""Tier 3: ``apply_plan`` on real models equals the unsplit model, for every kind of split (gloo, 2 and 4 ranks).

For torchvision resnet18, densenet121, mobilenet_v2 and the example UNet,
each plan family of the runtime issue — pure sample, pure height, pure width,
height×width, sample×spatial (4 ranks), channel, and a per-layer mix whose
edges redistribute — runs one training step in float64 (and, on 4 ranks,
in float32: its accuracy yardstick does not depend on the rank count) and is
compared with the unsplit model: output, loss, every parameter gradient and
the batch-norm running statistics (``runtime_check``). Layers a layout does
not fit take the next preference of the family (ending with whole copies).

Input sizes are chosen so that strided windows straddle tile borders: 58 rows
become 29, 15, 8, 4 (odd extents split into uneven tiles), and the UNet's
7-row level splits 4 + 3 while its upsampled 14 rows split 7 + 7.
"""

from __future__ import annotations

import pytest
from distributed import run_ranks
from runtime_check import RULES, compare_plans

pytestmark = pytest.mark.multirank

SHAPES = {
    "resnet18": (4, 3, 58, 54),
    "densenet121": (4, 3, 42, 38),  # batch 4: training batch-norm on densenet's 1×1 maps needs a few samples
    "mobilenet_v2": (4, 3, 54, 50),
    "unet": (4, 3, 56, 40),  # three poolings by 2 must divide the UNet's input
}


KNOWN_FLOAT32 = {("resnet18", 4): tuple(f"{rule}/float32" for rule in ("sample", "height", "width", "height×width",
                                                                      "sample×spatial", "mixed")),
                 ("unet", 4): tuple(f"{rule}/float32" for rule in ("height", "width", "height×width", "sample×spatial",
                                                                  "mixed"))}
"""Open defects, each on one kind of CPU, float64 exact in both:

* on an Intel machine with AMX, resnet18 split n4 in float32 is 0.4–0.5 % of its scale off the float64 model at
  conv1's gradient (the unsplit float32 model 0.005 %); it passes on an AVX2 AMD EPYC; on the AVX-512/AMX VM
  of 2026-12-04 its h4 and w4 splits too (conv1's gradient 7.5e-3 off, 1e-4 allowed; the other spatial rules
  set aside with them), at de6fdc6 as at later commits,
  and both pass there under ``ONEDNN_MAX_CPU_ISA=AVX2``: oneDNN's AVX-512 kernels, not found further;
* on an AVX2 AMD EPYC, the UNet split by space on 4 ranks (h4, w4, h2·w2, n2·h2, the mixed plan) in float32 is
  1.6e-6 off float64 at its first convolution's weight gradient (5e-5 of the model's largest gradient; 4.1e-7
  allowed: four times the unsplit float32 model's own error), at 0b487e7 too; its sample and channel splits
  pass; every split passed on the AMX machine.

Checked separately by ``test_resnet18_sample_split_in_float32`` and ``test_unet_height_split_in_float32``
(expected to fail until found, not strictly: each passes on the other machine)."""


@pytest.mark.parametrize("world_size", [2, 4])
@pytest.mark.parametrize("model_name", list(SHAPES))
def test_every_split_equals_the_unsplit_model(model_name: str, world_size: int) -> None:
    dtypes = ("float64", "float32") if world_size == 4 else ("float64",)  # float32's yardstick: once per model
    skip = KNOWN_FLOAT32.get((model_name, world_size), ())
    results = run_ranks(compare_plans, world_size, args=(model_name, SHAPES[model_name], RULES, dtypes, skip),
                        timeout_s=600)
    families = {rule for rule in RULES if world_size == 4 or rule != "sample×spatial"}
    assert set(results[0]) == {f"{rule}/{dtype}" for rule in families for dtype in dtypes} - set(skip)
    assert all(result == results[0] for result in results)
    plans = results[0]
    assert f"h{world_size} (" in plans["height/float64"] and f"w{world_size} (" in plans["width/float64"]
    assert f"c{world_size} (" in plans["channel/float64"] and f"n{world_size} (" in plans["sample/float64"]


@pytest.mark.xfail(reason="open defect, see KNOWN_FLOAT32: resnet18 n4 float32 conv1 gradient 0.5 % off float64",
                   strict=False)
def test_resnet18_sample_split_in_float32() -> None:
    run_ranks(compare_plans, 4, args=("resnet18", SHAPES["resnet18"], ["sample", "height", "width", "mixed"],
                                      ("float64", "float32")), timeout_s=600)


@pytest.mark.xfail(reason="open defect, see KNOWN_FLOAT32: UNet h4 float32 first weights 1.6e-6 off float64 on AVX2",
                   strict=False)
def test_unet_height_split_in_float32() -> None:
    run_ranks(compare_plans, 4, args=("unet", SHAPES["unet"], ["height"], ("float64", "float32")), timeout_s=600)
