"""The measured peak of live tensors (``runtime.memory_peak``) sees what is alive before a step and what the step
allocates and frees, on CPU, independently of the cost model."""

from __future__ import annotations

import torch

from runtime.memory_peak import live_storage_bytes, peak_tensor_bytes

MIB = 2**20


def test_the_peak_is_what_lives_before_plus_the_highest_total_of_the_step() -> None:
    cpu = torch.device("cpu")
    held = torch.zeros(4 * MIB // 4)  # 4 MiB alive before and through the step
    view = held[: MIB // 4]  # a view of it: its storage is counted once
    base = live_storage_bytes(cpu)

    def step() -> None:
        first = torch.ones(8 * MIB // 4)  # 8 MiB
        second = first * 2  # 16 MiB live
        del first
        third = second + 1  # 16 MiB live again, never 24
        del second, third
        torch.ones(MIB // 4)  # 1 MiB, freed at once

    peak = peak_tensor_bytes(step, cpu)
    assert base >= held.numel() * 4 and view.data_ptr() == held.data_ptr()
    assert 16 * MIB <= peak - base <= 16 * MIB + 64 * 1024  # a few small tensors of the profiler's own at most


def test_tensors_made_and_kept_by_the_step_count_once() -> None:
    kept: list[torch.Tensor] = []
    cpu = torch.device("cpu")
    base = live_storage_bytes(cpu)
    peak = peak_tensor_bytes(lambda: kept.append(torch.ones(2 * MIB // 4)), cpu)
    assert 2 * MIB <= peak - base <= 2 * MIB + 64 * 1024
    assert live_storage_bytes(cpu) - base >= 2 * MIB
