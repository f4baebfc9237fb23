"""``hierarchical``: a b-ary tree of interval counts per ordered attribute (Hay et al. 2010).

Any ``n`` (nodes split into near-equal children); ``mechanism_options.branching`` sets b."""

from __future__ import annotations

from dataclasses import dataclass

from dprelease.mechanisms.primitives.protocol import MechanismOptions, PlanRequest, require_int
from dprelease.mechanisms.primitives.strategies import KronFamily


@dataclass(frozen=True, kw_only=True)
class TreeOptions(MechanismOptions):
    branching: int = 2
    """fan-out of the tree of interval counts (integer >= 2)"""

    def __post_init__(self) -> None:
        require_int(self.branching, option="branching", minimum=2)


class HierarchicalMechanism(KronFamily):
    name = "hierarchical"
    summary = "a b-ary tree of interval counts per ordered attribute (Hay et al.)"
    family = "hierarchical"

    options = TreeOptions

    def branching(self, request: PlanRequest) -> int:
        return TreeOptions.parse(request.options).branching


MECHANISM = HierarchicalMechanism()
