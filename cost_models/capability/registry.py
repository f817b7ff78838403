"""Rules registered per layer kind, found by the kind — as PyTorch's DTensor registers a propagation rule per op
(``@register_prop_rule(aten.convolution.default)``) rather than one central chain of ``if kind == …``.

A :class:`KindRules` table holds, for one way of splitting a layer, the rule of each kind that has its own: the
family modules beside this one register theirs with ``@SPATIAL_RULES.register("upsample")``, and the predicate
(``cost_models.capability.predicate``) asks the table for a layer's rule. A kind with no rule in a table has
nothing of its own to refuse there.
"""

from __future__ import annotations

from collections.abc import Callable

from cost_models.ir.kinds import LayerKind
from cost_models.ir.layer import Layer
from cost_models.layout import Layout

__all__ = ["CHANNEL_RULES", "SPATIAL_RULES", "KindRules", "Rule"]

Rule = Callable[[Layer, Layout], "str | None"]
"""Why a layer cannot run under a layout, or ``None`` when its kind allows it."""


class KindRules:
    """The rules of one way of splitting, one per kind that has its own."""

    def __init__(self, split: str) -> None:
        self.split = split
        """What the rules are asked about (``"height/width split"``), for their reader."""
        self._by_kind: dict[str, Rule] = {}

    def register(self, *kinds: LayerKind) -> Callable[[Rule], Rule]:
        """A decorator registering its function as the rule of ``kinds``; a kind registered twice is a bug."""
        def add(rule: Rule) -> Rule:
            taken = [kind for kind in kinds if kind in self._by_kind]
            if taken:
                raise ValueError(f"{self.split} rules: kinds {taken} already have a rule; one rule per kind")
            self._by_kind.update(dict.fromkeys(kinds, rule))
            return rule
        return add

    def kinds(self) -> frozenset[str]:
        """The kinds with a rule of their own."""
        return frozenset(self._by_kind)

    def refusal(self, layer: Layer, layout: Layout) -> str | None:
        """The rule of ``layer``'s kind applied (``None`` for a kind without one)."""
        rule = self._by_kind.get(layer.kind)
        return rule(layer, layout) if rule is not None else None


SPATIAL_RULES = KindRules("height/width split")
"""Each kind's own rule under a layout that splits rows, columns or slices (after the checks every layer meets)."""

CHANNEL_RULES = KindRules("channel split")
"""Each kind's own rule under a layout that splits channels (``c > 1``), space not split."""
