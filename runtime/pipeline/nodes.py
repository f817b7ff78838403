"""What a pipeline stage's replica of the model owns: the traced nodes it runs and the parameters they use."""

from __future__ import annotations

from collections.abc import Collection

from torch import nn
from torch.fx import Node

from runtime.shapes import module_attribute

__all__ = ["nodes_of_stage", "parameters_of"]


def nodes_of_stage(nodes: list[Node], names: Collection[str]) -> list[Node]:
    """The nodes of a stage: those named, and every attribute its nodes read.

    Attributes by their readers: torch.fx names the tensor constants a trace makes after those already on
    the model (``_tensor_constant{i}``, the first free ``i``), so a model traced again (the stage cut's trace,
    then this one) names them differently than the trace ``names`` came from.
    """
    return [node for node in nodes if node.name in names
            or (node.op == "get_attr" and any(user.name in names for user in node.users))]


def parameters_of(nodes: list[Node], model: nn.Module) -> list[nn.Parameter]:
    """The parameters the ``nodes`` use (their modules' and attributes'), each once."""
    found: dict[int, nn.Parameter] = {}
    for node in nodes:
        if node.op == "call_module":
            found.update((id(p), p) for p in model.get_submodule(str(node.target)).parameters())
        elif node.op == "get_attr" and isinstance(value := module_attribute(model, str(node.target)), nn.Parameter):
            found[id(value)] = value
    return list(found.values())
