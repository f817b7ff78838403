"""The measured peak of live tensors (``runtime.memory_peak``) sees what is alive before a step and what the step
allocates and frees, on CPU, independently of the cost model."""

from __future__ import annotations

import torch

from runtime.memory_peak import held_tensors, live_storage_bytes, peak_tensor_bytes, storage_bytes

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

    peak = peak_tensor_bytes(step, cpu, [held, view])
    assert base >= held.numel() * 4 and view.data_ptr() == held.data_ptr()
    assert 20 * MIB <= peak <= 20 * MIB + 64 * 1024  # the 4 MiB held (its view counted once) + 16; a few small
    # tensors of the profiler's own at most


def test_tensors_made_and_kept_by_the_step_count_once() -> None:
    kept: list[torch.Tensor] = []
    cpu = torch.device("cpu")
    base = live_storage_bytes(cpu)
    peak = peak_tensor_bytes(lambda: kept.append(torch.ones(2 * MIB // 4)), cpu)
    assert 2 * MIB <= peak <= 2 * MIB + 64 * 1024
    assert live_storage_bytes(cpu) - base >= 2 * MIB


def test_what_a_run_holds_is_its_weights_gradients_buffers_and_optimizer_state() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.BatchNorm1d(256))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.randn(4, 256)).sum().backward()
    optimizer.step()
    weights = sum(p.numel() for p in model.parameters()) * 4
    buffers = sum(b.numel() * b.element_size() for b in model.buffers())
    held = storage_bytes(held_tensors(model, optimizer), torch.device("cpu"))
    assert held == 3 * weights + buffers  # weights, their gradients, one momentum each
