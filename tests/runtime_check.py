"""Shared by the runtime's multi-rank tests: run a model under a plan on every rank and compare with the unsplit model.

:func:`compare_plans` builds the unsplit reference once per dtype on every
rank, then for each named rule makes a plan (``cost_models.uniform``), applies it
to an identically initialised copy (batch-norm synchronised over the whole
batch, as the unsplit model computes it), runs one forward and backward on this
rank's box of the same batch, and checks with ``torch.testing.assert_close``:
the output box, the global loss, every parameter gradient (this rank's slice
of it for channel-split weights) and batch-norm's running statistics.

float64 runs are compared at ``assert_close``'s default (tight) tolerance:
that is where an error in the method would show. In float32, training-mode
batch-norm over small maps makes gradients ill-conditioned: the unsplit
float32 model itself differs from the float64 one by up to a few percent in
places. Rounding anywhere reaches every gradient after it, and which one it
shows in most depends on where the rounding happened, so a split — which
only changes the order of sums — cannot be held to the unsplit float32
model's error gradient by gradient. It is compared with the float64 unsplit
values within four times the unsplit float32 model's worst error relative to
magnitude, over the whole network, times that gradient's magnitude (plus
four times its own unsplit error, for gradients that are nearly zero).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from typing import Any

from cost_models.layout import Layout

__all__ = ["RULES", "compare_plans"]

Rule = Callable[[str, int], Sequence[Layout]]


def _rules(size: int, layers: int) -> dict[str, Rule]:
    """The plan families of the runtime issue on ``size`` ranks; each ends in ``n1`` (whole, on every rank)."""
    whole, half = Layout(), max(1, size // 2)
    mixed_thirds = (
        [Layout(h=2, w=size // 2), Layout(h=size), Layout(h=2), whole],
        [Layout(n=size), Layout(n=half), whole],
        [Layout(c=size), Layout(n=half, c=2) if size == 4 else Layout(c=2), Layout(c=2), whole],
    )
    rules: dict[str, Rule] = {
        "sample": lambda _n, _p: [Layout(n=size), Layout(n=half), whole],
        "height": lambda _n, _p: [Layout(h=size), Layout(h=half), whole],
        "width": lambda _n, _p: [Layout(w=size), Layout(w=half), whole],
        "channel": lambda _n, _p: [Layout(c=size), Layout(c=half), whole],
        "mixed": lambda _n, position: mixed_thirds[min(2, 3 * position // layers)],
    }
    if size == 4:
        rules["height×width"] = lambda _n, _p: [Layout(h=2, w=2), Layout(h=2), Layout(w=2), whole]
        rules["sample×spatial"] = lambda _n, _p: [Layout(n=2, h=2), Layout(n=2, w=2), Layout(n=2), whole]
    else:  # two ranks: rows and columns alternate from layer to layer (every edge redistributes)
        rules["height×width"] = lambda _n, position: [Layout(h=2) if position % 2 else Layout(w=2), whole]
    return rules


RULES = ("sample", "height", "width", "height×width", "sample×spatial", "channel", "mixed")


def compare_plans(rank: int, world_size: int, model_name: str, shape: tuple[int, ...], rules: Sequence[str],
                  dtypes: Sequence[str], skip: Sequence[str] = ()) -> dict[str, str]:
    """Check each rule's plan against the unsplit model; returns ``{rule/dtype: plan summary}``.

    ``skip``: ``rule/dtype`` pairs not checked (known open defects, named where they are skipped).
    """
    import torch
    from conftest import build_model

    from cost_models.cluster import Cluster, Link
    from cost_models.ir.tracing import trace
    from cost_models.uniform import uniform_plan
    from runtime.apply import apply_plan

    checked: dict[str, str] = {}
    exact: dict[str, Any] = {}  # float64 unsplit gradients: the yardstick of float32 accuracy
    link = Link(1e-6, 1e9)
    cluster = Cluster(devices=world_size, devices_per_node=world_size, memory_bytes=2**34, intra=link, inter=link)
    for dtype_name in dtypes:
        dtype = getattr(torch, dtype_name)
        base = _prepared(build_model(model_name).to(dtype))
        graph = trace(base, shape, dtype)
        x, target = _batch(shape, graph, dtype)
        reference = copy.deepcopy(base)
        expected = reference(x)
        expected_loss = torch.nn.functional.cross_entropy(expected, target)
        expected_loss.backward()
        values = {name: param.grad for name, param in reference.named_parameters()}
        values["(output)"] = expected.detach()
        if dtype == torch.float64:
            exact = {name: value.clone() for name, value in values.items()}
        yardsticks = _yardsticks(values, exact)
        rules_here = _rules(world_size, len(graph.compute_layers()))
        for rule in rules:
            if rule not in rules_here or f"{rule}/{dtype_name}" in skip:
                continue
            plan = uniform_plan(graph, cluster, rules_here[rule])
            model = apply_plan(copy.deepcopy(base), plan, graph=graph, sync_batchnorm=True)
            context = f"{model_name} {rule} ({plan.summary()}) {dtype_name} on rank {rank}"
            _check_one(model, x, target, expected_loss, yardsticks, context, dict(reference.named_buffers()))
            checked[f"{rule}/{dtype_name}"] = plan.summary()
    return checked


def _yardsticks(values: dict[str, Any], exact: dict[str, Any]) -> dict[str, tuple[Any, dict[str, float]]]:
    """Per output/gradient: the value to compare with and ``assert_close``'s tolerances (module docstring)."""
    import torch

    if next(iter(values.values())).dtype == torch.float64:
        return {name: (value, {}) for name, value in values.items()}
    if not exact:
        raise ValueError("compare float64 before float32: its values are the float32 yardstick")
    errors = {name: float((value.double() - exact[name]).abs().max()) for name, value in values.items()}
    scales = {name: float(exact[name].abs().max()) for name in values}
    worst = max(errors[name] / scales[name] for name in values if scales[name] > 0)  # network-wide, relative
    return {name: (exact[name], {"rtol": 1e-5, "atol": 4 * (worst * scales[name] + errors[name])})
            for name in values}


def _check_one(model: Any, x: Any, target: Any, expected_loss: Any, yardsticks: dict[str, tuple[Any, dict[str, float]]],
               context: str, buffers: dict[str, Any]) -> None:
    """Compare with the unsplit values (float64: its own; float32: the float64 model's, within ``_tolerance``)."""
    import torch

    out = model(model.shard(x))
    expected, tolerance = yardsticks["(output)"]
    box = tuple(slice(a, b) for a, b in model.output_placement.box(_shape4(expected.shape), model.member))
    torch.testing.assert_close(out.to(expected.dtype), expected[box[:expected.dim()]], **tolerance,
                               msg=lambda m: f"{context} output: {m}")
    torch.testing.assert_close(model.gather(out.detach()).to(expected.dtype), expected, **tolerance,
                               msg=lambda m: f"{context} gathered output: {m}")
    loss = model.loss(out, target[model.target_box(tuple(target.shape))])
    loss.backward()
    torch.testing.assert_close(model.global_value(loss), expected_loss.item(), rtol=1e-5, atol=1e-6,
                               msg=lambda m: f"{context} loss: {m}")
    sliced = {piece.name: piece for piece in model.slices}
    for name, param in model.model.named_parameters():
        full, tolerance = yardsticks[name]
        if name in sliced:
            piece = sliced[name]
            full = full.narrow(piece.dim, piece.start, piece.stop - piece.start)
        torch.testing.assert_close(param.grad.to(full.dtype), full, **tolerance,
                                   msg=lambda m: f"{context} grad of {name}: {m}")
    for name, buffer in model.model.named_buffers():
        full = buffers[name]
        weight = sliced.get(name.rsplit(".", 1)[0] + ".weight")
        if weight is not None and buffer.dim() == 1:
            full = full[weight.start:weight.stop]
        statistics = {"rtol": 1e-4, "atol": 1e-5} if buffer.dtype == torch.float32 else {}  # sums in another order
        torch.testing.assert_close(buffer, full, **statistics, msg=lambda m: f"{context} buffer {name}: {m}")


def _prepared(model: Any) -> Any:
    """Training mode with dropout off: dropout masks are drawn per rank, so no split could match them."""
    import torch

    model.train()
    for module in model.modules():
        if isinstance(module, torch.nn.modules.dropout._DropoutNd):
            module.eval()
    return model


def _batch(shape: tuple[int, ...], graph: Any, dtype: Any) -> tuple[Any, Any]:
    import torch

    generator = torch.Generator().manual_seed(7)
    x = torch.randn(shape, dtype=torch.float64, generator=generator).to(dtype)  # the same batch in every dtype
    out = graph.nodes[graph.graph["outputs"][0]]["output_shape"]
    labels = [out[0], *out[2:]]
    return x, torch.randint(0, out[1], labels, generator=generator)


def _shape4(shape: Sequence[int]) -> tuple[int, ...]:
    return tuple(shape) if len(shape) == 4 else (shape[0], shape[1], 1, 1)


def assert_split_matches(split: Any, reference: Any, out: Any, expected: Any, context: str) -> None:
    """``split`` (a DistributedModel after its backward, ``out`` its output box) equals the unsplit
    ``reference`` (after its backward, ``expected`` its output): output, and every gradient (its slice)."""
    import torch

    torch.testing.assert_close(split.gather(out.detach()), expected.detach(), msg=lambda m: f"{context} output: {m}")
    sliced = {piece.name: piece for piece in split.slices}
    grads = dict(reference.named_parameters())
    for parameter, param in split.model.named_parameters():
        full = grads[parameter].grad
        if full is None and param.grad is not None:  # no loss reaches it (another head): zero, or no gradient
            full = torch.zeros_like(grads[parameter])
        if parameter in sliced:
            full = full.narrow(sliced[parameter].dim, sliced[parameter].start,
                               sliced[parameter].stop - sliced[parameter].start)
        torch.testing.assert_close(param.grad, full, msg=lambda m: f"{context} grad of {parameter}: {m}")


def split_step_matches(build: Callable[[], Any], plan: Any, graph: Any, shape: Sequence[int], context: str, *,
                       output: str | None = None, seed: int | None = None) -> None:
    """One step of the model ``build()`` makes, under ``plan`` (batch-norm synchronised) and unsplit, on one float64
    batch of ``shape`` (5 classes; a map's output: a label per position): the outputs and every gradient equal (the loss of every floating output, or of
    the part ``output`` names). With ``seed``, random layers draw keyed masks (``runtime.random_ops``), the unsplit
    model the same ones."""
    import torch

    from runtime.apply import apply_plan
    from runtime.outputs import output_loss, select_value
    from runtime.random_ops import DrawKey, KeyedInterpreter

    split = apply_plan(build(), plan, graph=graph, sync_batchnorm=True, output=output, random_seed=seed or 0)
    reference = build()
    generator = torch.Generator().manual_seed(3)
    shapes = [tuple(s) for s in shape] if isinstance(shape[0], (list, tuple)) else [tuple(shape)]  # several inputs
    xs = [torch.randn(s, dtype=torch.float64, generator=generator) for s in shapes]
    made = graph.nodes[graph.graph["outputs"][0]]["output_shape"]
    maps = output is None and len(made) >= 3 and isinstance(made[0], int)  # a map's labels: (N, H, W) of C classes
    target = torch.randint(0, made[1] if maps else 5, (made[0], *made[2:]) if maps else (shapes[0][0],),
                           generator=generator)
    if seed is not None:
        split.draw_key = DrawKey(seed, 1)
    out = split(*split.shard_inputs(xs))
    split.loss(out, target[split.target_box(tuple(target.shape))]).backward()
    if seed is None:
        expected = reference(*xs)
    else:
        from cost_models.ir.tracing import symbolic_trace

        traced = symbolic_trace(reference, (), shapes=[tuple(x.shape) for x in xs])
        expected = KeyedInterpreter(traced, DrawKey(seed, 1), root=reference).run(*xs)
    output_loss(expected, target, key=output).backward()
    assert_split_matches(split, reference, _first(select_value(out, output)), _first(select_value(expected, output)),
                         context)


def _first(value: Any) -> Any:
    """The first tensor of an output (the logits of ``(logits, aux)``, ``out`` of ``{"out": …, "aux": …}``)."""
    import torch

    while not isinstance(value, torch.Tensor):
        value = next(iter(value.values())) if isinstance(value, dict) else value[0]
    return value


def uniform_test_plan(graph: Any, world: int, layouts: Sequence[str]) -> Any:
    """Each layer of ``graph`` in the first of ``layouts`` it takes (else unsplit), on ``world`` ranks of a cluster
    whose links and memory do not matter (a plan to check, not to price)."""
    from cost_models.cluster import Cluster, Link
    from cost_models.layout import Layout
    from cost_models.uniform import uniform_plan

    link = Link(1e-6, 1e9)
    cluster = Cluster(devices=world, devices_per_node=world, memory_bytes=2**34, intra=link, inter=link)
    return uniform_plan(graph, cluster, [*(Layout.parse(text) for text in layouts), Layout()])


def step_cases(cases: Sequence[tuple[str, str]], world: int, model: Callable[[str], Any],
               shape: Callable[[str], Any], *, seed: int | None = None) -> dict[str, dict[str, str]]:
    """For each ``(name, layout)``: one float64 step of ``model(name)`` under the uniform plan of ``layout`` equals
    the unsplit model's (:func:`split_step_matches`); returns each case's layout of every layer."""
    import torch

    from cost_models.ir.tracing import trace

    results = {}
    for name, layout in cases:
        graph = trace(model(name), shape(name), torch.float64)
        plan = uniform_test_plan(graph, world, [layout])
        split_step_matches(lambda: model(name), plan, graph, shape(name), f"{name} under {layout}", seed=seed)
        results[f"{name} {layout}"] = {layer: str(a.layout) for layer, a in plan.layers.items()}
    return results
