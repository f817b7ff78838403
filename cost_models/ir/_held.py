"""The trace's ``held_together`` spans: layers reading one value the LayerGraph does not hold, which a pipeline
must keep on one stage (``planner.pipeline.stages``, the runtime's pre-flight)."""

from __future__ import annotations

from torch.fx import GraphModule, Node

from cost_models.ir.graph import LayerGraph

__all__ = ["held_together"]


_METADATA_READS = frozenset({"size", "dim", "ndimension", "numel", "shape", "dtype", "device", "ndim", "is_cuda"})


def held_together(gm: GraphModule, graph: LayerGraph) -> list[list[str]]:
    """Layers that read one value the LayerGraph does not hold, each list to stay on one pipeline stage.

    A call whose result is not a layer's tensor (an opaque module returning ``(x, (h, w))``: mvitv2's
    attention) cannot be sent to another stage: the runtime computes it on the stage of its first reader, so
    every layer reading it — directly or through other such calls — must be there too. So must the layers
    reading one parameter or buffer the forward fetches itself (``self.w1[0]``: physicsnemo's AFNO), which the
    runtime fetches on its first reader's stage and a parameter is trained on one. Values made from
    layers' metadata alone (``x.shape[2] // 2``) are computed on every stage and hold nothing back.
    """
    dynamic: set[str] = set()
    spans = []
    for node in gm.graph.nodes:
        if node.op == "get_attr" and len(readers := _layer_readers(node, graph)) > 1:
            spans.append(sorted(readers))  # a weight read by several layers (AFNO's w1[0], w1[1]): trained once
            continue
        if node.name in graph or node.op in ("placeholder", "get_attr", "output") or _reads_metadata(node):
            continue
        if not any(n.name in graph or n.name in dynamic for n in node.all_input_nodes):
            continue
        dynamic.add(node.name)
        readers = _layer_readers(node, graph)
        if len(readers) > 1:
            spans.append(sorted(readers))
    return spans


def _reads_metadata(node: Node) -> bool:
    if node.op == "call_method":
        return str(node.target) in _METADATA_READS
    return node.op == "call_function" and (node.target is len or (
        node.target is getattr and len(node.args) > 1 and node.args[1] in _METADATA_READS))


def _layer_readers(node: Node, graph: LayerGraph) -> set[str]:
    """The layers reading ``node``, directly or through calls that are not layers."""
    readers: set[str] = set()
    pending, seen = list(node.users), set()
    while pending:
        user = pending.pop()
        if user.name in seen or user.op == "output":
            continue
        seen.add(user.name)
        if user.name in graph:
            readers.add(user.name)
        else:
            pending.extend(user.users)
    return readers
