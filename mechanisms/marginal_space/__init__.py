"""``marginal_space``: unions of marginals measured and answered without ever forming the cell vector.

For a workload whose every item is a marginal (each factor ``Identity`` or ``Total``), the plan is
one weight per attribute subset (bit i of a subset = attribute i; the algebra is in
:mod:`mechanisms.primitives.marginal_strategies`):

* Laplace noise (ε-DP, L1): HDMM's marginals template, weights ``w_S`` of plain marginals ``M_S``
  (``Δ₁ = Σ w_S``), :func:`mechanisms.primitives.marginal_strategies.marginal_weights_l1`;
* Gaussian noise (ρ-zCDP, (ε, δ), L2): Eigen-Design in subset space (centred marginals, closed
  form, equal to the SVD bound), :func:`mechanisms.primitives.marginal_strategies.marginal_weights_l2`.

Measuring needs only the measured marginals (:class:`~catalog.confidential.choke_point.ProtectedMarginals`,
one noise mechanism, charge before noise).  Least squares decouples over the subset lattice: with
``AᵀA = Σ_T μ_T Q_T``, the centred T-component of the estimate is

    v̂_T = C_T M_T x̂ = μ_T⁻¹ Σ_{S ⊇ T measured} w_S c_S · centre_T(Σ_{S∖T} y_S)

(``c_S = Π_{i∉S} n_i``; for centred terms only ``S = T`` contributes), and each workload marginal
is ``M_R x̂ = Σ_{T ⊆ R} v̂_T`` spread evenly over the axes ``R∖T``.  Its per-cell variance is the
constant ``σ² Σ_{T⊆R} μ_T⁻¹ Π_{i∈T}(1 − 1/n_i) Π_{i∈R∖T} n_i⁻¹ Π_{i∉R} n_i``.  Everything costs a
function of the marginal sizes and of 2^d, never of N = Π n_i; each shortcut is checked against
the dense matrices in ``tests/unit/mechanisms/test_marginal_space.py``.

Privacy: planning reads only the public workload (the optimiser's restarts use the public seed of
the workload fingerprint); the data are read only by the choke point.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from dprelease.mechanisms.pgm import ConsistentMarginals, consistent_marginals
from dprelease.mechanisms.primitives.compute_limits import MIN_TIME_LIMIT
from dprelease.mechanisms.primitives.marginal_objectives import plan_subset_weights
from dprelease.mechanisms.primitives.marginal_strategies import (
    DEFAULT_L1_RESTARTS,
    SubsetStrategy,
    marginal_workload_reason,
)
from dprelease.mechanisms.primitives.protocol import (
    InputKind,
    MatrixMechanism,
    PlanRequest,
    StrategyCache,
    require_available,
)
from dprelease.mechanisms.primitives.subset_family import (
    MAX_MARGINAL_ATTRIBUTES,
    closure_size_bound,
    down_closure,
    maximal_masks,
    set_bits,
    submasks,
)
from dprelease.mechanisms.primitives.workload import (
    Workload,
    item_subset,
    mask_of,
)


def marginal_of(x: np.ndarray, domain_shape: tuple[int, ...], axes: tuple[int, ...]) -> np.ndarray:
    """The ``axes``-marginal of a full cell vector (tests and small domains). O(N)."""
    summed = tuple(i for i in range(len(domain_shape)) if i not in axes)
    return np.asarray(x, dtype=np.float64).reshape(domain_shape).sum(axis=summed)


def _item_masks(workload: Workload) -> dict[str, int]:
    """Each item's kept-attribute bitmask; ``ValueError`` for an item that is not a marginal."""
    masks = {item.name: item_subset(item) for item in workload.items}
    for name, mask in masks.items():
        if mask is None:
            raise ValueError(f"item {name!r} is not a marginal (Identity/Total factors)")
    return masks  # type: ignore[return-value]


def _summed_out(shape: tuple[int, ...], axes: tuple[int, ...]) -> float:
    """``c_S = Π_{i∉S} n_i`` (float: the product may pass 2⁶³). O(|S|)."""
    return float(math.prod(shape)) / math.prod(float(shape[a]) for a in axes)


def _centre(table: np.ndarray) -> np.ndarray:
    """``⊗ (I − J/n)`` along every axis of a table. O(size × axes)."""
    out = np.array(table, dtype=np.float64)
    for axis in range(out.ndim):
        out -= out.mean(axis=axis, keepdims=True)
    return out


@dataclass(frozen=True, kw_only=True, eq=False)
class MarginalSpaceStrategy(SubsetStrategy):
    """Weighted (plain or centred) marginals, measured and answered in marginal space.

    Planning algebra (sensitivity, per-item error and per-query variances, support) is
    :class:`~mechanisms.primitives.marginal_strategies.SubsetStrategy`'s; ``apply`` and ``answers`` work on
    the measured marginals only.  Answers are ordered by ascending subset bitmask, each term
    row-major over its ascending axes (the same order as ``to_union()``).
    """

    @property
    def marginal_subsets(self) -> tuple[tuple[int, ...], ...]:
        """The measured marginals (ascending axes), in answer order."""
        return tuple(tuple(set_bits(int(mask))) for mask in self.weights.subsets)

    def term_answers(self, axes: tuple[int, ...], table: np.ndarray) -> np.ndarray:
        """One term's answers from its own marginal: ``w_S · table`` (centred for the centred
        basis). Confidential in, confidential out; O(table size)."""
        weight = self.weights.weight_of(mask_of(axes))
        values = np.asarray(table, dtype=np.float64)
        if self.weights.basis == "centred":
            values = _centre(values)
        return weight * values.ravel()

    def apply(self, x: np.ndarray) -> np.ndarray:
        """``A·x`` from a full cell vector, marginal by marginal (small domains and tests)."""
        return np.concatenate(
            [
                self.term_answers(axes, marginal_of(x, self.domain_shape, axes))
                for axes in self.marginal_subsets
            ]
        )

    def _split(self, y: np.ndarray) -> Iterable[tuple[int, np.ndarray]]:
        shape = self.domain_shape
        y = np.asarray(y, dtype=np.float64)
        if y.size != self.num_queries:
            raise ValueError(f"y has {y.size} answers; the strategy measures {self.num_queries}")
        start = 0
        for axes in self.marginal_subsets:
            sizes = tuple(shape[a] for a in axes)
            stop = start + math.prod(sizes)
            yield mask_of(axes), y[start:stop].reshape(sizes)
            start = stop

    def components(self, y: np.ndarray, needed: Iterable[int]) -> dict[int, np.ndarray]:
        """``v̂_T = C_T M_T x̂`` (a table over T's axes) for every needed subset T of positive rank.

        O(Σ_S |y_S| · #{needed T ⊆ S}): sums of each measured table over the axes ``S∖T``.
        Raises ``ValueError`` when a needed component has no measurement (``μ_T = 0``).
        """
        shape = self.domain_shape
        family = self.weights.family
        mu = self.weights.strategy_eigenvalues()
        targets = [int(t) for t in needed if all(shape[a] > 1 for a in set_bits(int(t)))]
        unsupported = [tuple(set_bits(t)) for t in targets if not family.value_at(mu, t) > 0]
        if unsupported:
            raise ValueError(f"the strategy measures no marginal covering {unsupported[:3]}")
        totals = {t: np.zeros(tuple(shape[a] for a in set_bits(t))) for t in targets}
        centred = self.weights.basis == "centred"
        for mask, table in self._split(y):
            axes = tuple(set_bits(mask))
            factor = self.weights.weight_of(mask) * _summed_out(shape, axes)
            for t in [mask] if centred else submasks(mask):  # O(2^|S|) per measured table
                if t not in totals:
                    continue
                summed = tuple(k for k, a in enumerate(axes) if not t >> a & 1)
                totals[t] += factor * (table.sum(axis=summed) if summed else table)
        return {t: _centre(total) / family.value_at(mu, t) for t, total in totals.items()}

    def answers(self, y: np.ndarray, workload: Workload) -> dict[str, np.ndarray]:
        """Least-squares answers of every (marginal) item: ``M_R x̂ = Σ_{T⊆R} spread(v̂_T)``.

        O(Σ_R 2^|R| |M_R|) after :meth:`components`; never forms the N-vector.
        """
        shape = self.domain_shape
        kept = _item_masks(workload)
        parts = self.components(y, down_closure(kept.values()))
        out = {}
        for name, mask in kept.items():
            axes = tuple(set_bits(mask))
            estimate = np.zeros(tuple(shape[a] for a in axes))
            for t in submasks(mask):  # O(2^|R|): never the whole closure per table
                part = parts.get(t)
                if part is None:
                    continue
                spread = [shape[a] if t >> a & 1 else 1 for a in axes]
                divisor = math.prod(shape[a] for a in axes if not t >> a & 1)
                estimate += part.reshape(spread) / divisor
            out[name] = estimate.ravel()
        return out

    def consistent(self, y: np.ndarray, workload: Workload) -> ConsistentMarginals:
        """``reconstruct: pgm``: the consistent, non-negative tables over the workload's
        marginals closest to the measurements (:func:`mechanisms.pgm.consistent_marginals`,
        precisions ``λ_T = μ_T / Π_{i∉T} n_i``).  Post-processing of ``y`` only."""
        cliques = maximal_masks(list(_item_masks(workload).values()))
        needed = down_closure(cliques)
        mu = self.weights.strategy_eigenvalues()
        shape = self.domain_shape
        return consistent_marginals(
            domain_shape=shape,
            cliques=cliques,
            estimates=self.components(y, needed),
            precisions={
                t: self.weights.family.value_at(mu, t) / _summed_out(shape, tuple(set_bits(t)))
                for t in needed
            },
        )

    def consistent_answers(self, y: np.ndarray, workload: Workload) -> dict[str, np.ndarray]:
        """Every marginal item's table from :meth:`consistent`, flattened (answer order)."""
        model = self.consistent(y, workload)
        return {
            item.name: model.marginal(int(item_subset(item) or 0)).ravel()
            for item in workload.items
        }


class MarginalSpaceMechanism(MatrixMechanism):
    name = "marginal_space"
    summary = (
        "weighted marginals measured and reconstructed in marginal space (never the full cell "
        "vector): HDMM's marginals template for Laplace, subset-space Eigen-Design for Gaussian"
    )
    input_kind: ClassVar[InputKind] = "marginals"

    def unavailable_reason(self, request: PlanRequest) -> str | None:
        return marginal_workload_reason(request.workload)

    def predicted_seconds(self, request: PlanRequest) -> float:
        # subset projections O(items · 2^d); the L1 template adds ~300 evaluations of O(d 2^d)
        # per start (~1 ms per 2^14 subsets on one core).
        workload = request.workload
        d = len(workload.domain_shape)
        if d > MAX_MARGINAL_ATTRIBUTES:  # the downward closure: O(Σ 2^|R|) per evaluation
            subsets = closure_size_bound(item_subset(item) or 0 for item in workload.items)
            evaluations = 1 + (300 if request.noise == "laplace" else 0)
            return 1e-3 + len(workload.items) * 2e-5 + evaluations * subsets * 2e-7
        seconds = 1e-3 + len(workload.items) * 2**d * 1e-7
        if request.noise == "laplace":
            seconds += (1 + DEFAULT_L1_RESTARTS) * 300 * d * 2**d * 5e-9
        return seconds

    def plan(self, request: PlanRequest, *, cache: StrategyCache) -> MarginalSpaceStrategy:
        require_available(self, request)
        limit = request.time_limit
        limit = None if limit is None else max(limit, MIN_TIME_LIMIT)
        weights = plan_subset_weights(request, cache=cache, time_limit=limit)
        template = "subset-eigen" if weights.basis == "centred" else "marginals"
        parameters = {
            "template": template,
            "measured_marginals": int(weights.subsets.size),
            "measured_answers": weights.num_answers,
            **weights.to_parameters(),
        }
        return MarginalSpaceStrategy(name=self.name, weights=weights, parameters=parameters)


MECHANISM = MarginalSpaceMechanism()
