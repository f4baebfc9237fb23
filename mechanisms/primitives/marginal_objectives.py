"""What a marginal workload's subset-space weights minimise, and the one place they are planned.

:func:`plan_subset_weights` serves ``marginal_space`` and ``optimized`` by the request's objective:
``total_variance`` is the closed form of
:func:`~mechanisms.primitives.marginal_strategies.marginal_weights_l2` (L2) or HDMM's marginals
template (L1), both of the items' weighted total (``Σ_t w_t`` × table t's total variance) when
items carry weights; ``max_variance`` is the design below (L2) or, for L1, the better of the template
and measuring each table on its own.

The design of least largest cell variance (L2).

In the centred basis of :mod:`~mechanisms.primitives.marginal_strategies` at L2 sensitivity 1
(``Σ_T μ_T r_T / N = 1``), every row of marginal item ``t`` has the same variance per unit noise
variance, ``V_t(μ) = Σ_T a_{t,T} / μ_T`` with ``a_{t,T} = g_T(item t) / m_t`` (``m_t`` rows; only
subsets T of the item's own attributes are non-zero).  ``min_μ max_t V_t(μ)`` is convex and is
solved through its dual (ResidualPlanner: Xiao et al., NeurIPS 2023, §5, the max-variance loss):

* for item weights ``θ`` on the simplex, ``min_μ Σ_t θ_t V_t(μ)`` is the closed form of
  :func:`~mechanisms.primitives.marginal_strategies.marginal_weights_l2` with ``v = Aᵀθ``; its
  value ``(Σ_T √(v_T r_T))² / N`` is a lower bound on the optimum (weak duality);
* its minimiser ``μ(θ)`` has sensitivity 1, so its largest ``V_t`` is an upper bound;
* exponentiated-gradient steps on ``θ`` (the gradient is ``V(μ(θ))``) until the bounds agree
  within ``gap`` (relative): the design returned is certified to be that close to the optimum.

*Privacy*: reads only the public workload and spends nothing.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
from scipy import sparse

from dprelease.mechanisms.primitives.compute_limits import Progress
from dprelease.mechanisms.primitives.marginal_strategies import (
    MarginalWeights,
    SubsetStrategy,
    SubsetWorkload,
    item_support,
    marginal_weights_l1,
    marginal_weights_l2,
    subset_unit_error,
    subset_workload,
)
from dprelease.mechanisms.primitives.noise import SENSITIVITY_NORM
from dprelease.mechanisms.primitives.protocol import (
    PlanRequest,
    StoredStrategy,
    StrategyCache,
    cache_key,
)
from dprelease.mechanisms.primitives.subset_family import SubsetFamily, set_bits
from dprelease.mechanisms.primitives.workload import Workload, item_subset

DEFAULT_GAP = 1e-6
"""Relative distance between the certified lower bound and the design's largest variance."""
MAX_STEPS = 10_000
STEP = 2.0
"""Exponentiated-gradient step on the item weights, in units of ``V_t / max V − 1``."""


@dataclass(frozen=True, kw_only=True, eq=False)
class MaxVarianceDesign:
    """Centred-basis weights and what they achieve, per unit noise variance at sensitivity 1."""

    weights: MarginalWeights
    largest_variance: float
    """``max_t s_t V_t`` of ``weights``: the largest (scaled) variance of any released cell."""
    lower_bound: float
    """No design of this family at the same cost has a largest (scaled) variance below this."""
    item_variances: tuple[float, ...]
    """``s_t V_t`` per workload item, in the workload's item order."""


def item_row_variances(
    workload: Workload,
    *,
    family: SubsetFamily | None = None,
    item_scales: Mapping[str, float] | None = None,
) -> sparse.csr_array:
    """``A``: items × subsets of ``family`` (default: the workload's), ``a_{t,T} = s_t · g_T(item t) / m_t`` (``s_t`` from
    ``item_scales``, else 1). O(items · 2^d) to build on the lattice, O(Σ 2^k · k) on a closed
    family; sparse.

    Raises ``ValueError`` naming the first item that is not a marginal (its rows would not share
    one variance)."""
    if family is None:
        family = subset_workload(workload).family
    masks = []
    for item in workload.items:
        mask = item_subset(item)
        if mask is None:
            raise ValueError(
                f"objective max_variance needs a workload of marginals; item {item.name!r} has "
                "other queries"
            )
        masks.append(mask)
    scales = np.array(
        [1.0 if item_scales is None else float(item_scales[item.name]) for item in workload.items]
    )
    if not family.is_lattice:  # a_{t,T} = s_t r_T c_R / |R| for T ⊆ R: rows of one sparse matrix
        sizes = family.sizes
        kept = np.array([math.prod(float(sizes[i]) for i in set_bits(m)) for m in masks])
        rows = family.subset_rows([family.position(m) for m in masks], family.multiplicities())
        return sparse.csr_array(sparse.diags_array(scales * family.num_cells / kept**2) @ rows)
    rows, columns, values = [], [], []
    for row, (item, scale) in enumerate(zip(workload.items, scales, strict=True)):
        support, projections = item_support(item, family)
        rows.extend([row] * support.size)
        columns.extend(support.tolist())
        values.extend((scale * projections / item.num_queries).tolist())
    shape = (len(workload.items), len(family))
    return sparse.csr_array((values, (rows, columns)), shape=shape)


def marginal_weights_max_variance(
    workload: Workload,
    *,
    item_scales: Mapping[str, float] | None = None,
    gap: float = DEFAULT_GAP,
    max_steps: int = MAX_STEPS,
    time_limit: float | None = None,
    progress: Progress | None = None,
) -> MaxVarianceDesign:
    """The centred-basis design of least largest cell variance (module docstring); with
    ``item_scales``, of least largest ``s_t · V_t`` (accuracy targets: ``s_t = 1/target_t²``).

    O(steps · nnz(A)).  When ``max_steps`` or ``time_limit`` stops the search first, the best
    design found is returned with ``weights.stopped_early`` set and its lower bound.
    """
    if not 0.0 < gap < 1.0:
        raise ValueError(f"gap ({gap}) must be in (0, 1)")
    if max_steps < 1:
        raise ValueError(f"max_steps ({max_steps}) must be >= 1")
    if time_limit is not None and not time_limit > 0:
        raise ValueError(f"time_limit ({time_limit}) must be > 0 seconds or None")
    if workload.weighted:
        raise ValueError(
            "objective max_variance takes no item weights: it bounds every cell, and a weight "
            "scales a table's total variance (use item_scales for per-table targets)"
        )
    started = time.perf_counter()
    subset = subset_workload(workload)
    if item_scales is not None:
        bad = {k: v for k, v in item_scales.items() if not (math.isfinite(v) and v > 0)}
        if bad:
            raise ValueError(f"item_scales {bad} must be finite and > 0")
    family = subset.family
    coefficients = item_row_variances(workload, family=family, item_scales=item_scales)
    if coefficients.nnz == 0:
        raise ValueError("the workload has no non-zero query")
    privacy = subset.multiplicities() / subset.num_cells  # r_T / N: Δ₂² = Σ_T μ_T r_T / N
    item_weights = np.full(coefficients.shape[0], 1.0 / coefficients.shape[0])
    lower, upper = 0.0, math.inf
    best = np.empty(0)
    steps = 0
    stopped_early = True
    while steps < max_steps:
        steps += 1
        roots = np.sqrt(privacy * (coefficients.T @ item_weights))  # O(nnz)
        mu = np.divide(roots, privacy, out=np.zeros_like(roots), where=roots > 0) / roots.sum()
        inverse = np.divide(1.0, mu, out=np.zeros_like(mu), where=mu > 0)
        variances = coefficients @ inverse
        lower = max(lower, float(roots.sum()) ** 2)
        if variances.max() < upper:
            upper, best = float(variances.max()), mu
        if upper <= lower * (1.0 + gap):
            stopped_early = False
            break
        if time_limit is not None and time.perf_counter() - started > time_limit:
            break
        item_weights = item_weights * np.exp(STEP * (variances / variances.max() - 1.0))
        item_weights /= item_weights.sum()
    inverse = np.divide(1.0, best, out=np.zeros_like(best), where=best > 0)
    weights = MarginalWeights(
        domain_shape=subset.domain_shape,
        basis="centred",
        weights=np.sqrt(best / family.summed_out_sizes()),
        family=family,
        noise="gaussian",
        unit_total_error=float(subset.projections @ inverse),
        stopped_early=stopped_early,
        iterations=steps,
        seconds=time.perf_counter() - started,
    )
    if progress is not None:
        progress(1.0, f"max-variance design: {weights.subsets.size} centred marginals")
    return MaxVarianceDesign(
        weights=weights,
        largest_variance=upper,
        lower_bound=lower,
        item_variances=tuple(float(v) for v in coefficients @ inverse),
    )


def plan_subset_weights(
    request: PlanRequest, *, cache: StrategyCache, time_limit: float | None
) -> MarginalWeights:
    """The subset-space weights of a marginal workload, searched once per (workload, noise,
    objective); see the module docstring for what each objective gets.

    ``optimized`` and ``marginal_space`` share one ``cache`` entry, under the key
    ``marginal_space`` has always written; ``objective`` enters the key only when it is not the
    default, so entries stored before objectives existed still load (``item_scales`` come from
    the spec's accuracy targets and item weights from the spec's items, both of which the
    workload fingerprint includes).
    """
    settings: dict[str, object] = {"norm": SENSITIVITY_NORM[request.noise]}
    if request.objective != "total_variance":
        settings["objective"] = request.objective
    key = cache_key("marginal_space", request.workload_fingerprint, settings)
    stored = cache.load(key)
    if stored is not None:
        return MarginalWeights.from_parameters(request.workload.domain_shape, stored.parameters)
    if request.noise == "gaussian" and request.objective == "max_variance":
        weights = marginal_weights_max_variance(
            request.workload,
            item_scales=request.item_scales,
            time_limit=time_limit,
            progress=request.progress,
        ).weights
    else:
        weights = _closed_form_or_template(request, time_limit=time_limit)
    cache.save(key, StoredStrategy(parameters=weights.to_parameters()))
    return weights


def _closed_form_or_template(request: PlanRequest, *, time_limit: float | None) -> MarginalWeights:
    """Gaussian total variance: the closed form; Laplace: HDMM's template (under max_variance,
    the better of it and each table on its own, for the largest scaled variance).  Both minimise
    the items' weighted total variance (``Σ_t w_t Σ_T g_T(t)/μ_T``: weighted projections)."""
    subset = subset_workload(request.workload, weighted=True)
    progress = request.progress
    if request.noise == "gaussian":
        return marginal_weights_l2(subset, time_limit=time_limit, progress=progress)
    rng = np.random.default_rng(request.seed)  # public: derived from the workload
    weights = marginal_weights_l1(subset, rng=rng, time_limit=time_limit, progress=progress)
    if request.objective != "max_variance":
        return weights
    return min(
        (weights, _each_table_on_its_own(subset)),
        key=lambda w: _largest_unit_variance(w, request.workload, request.item_scales),
    )


def _each_table_on_its_own(subset: SubsetWorkload) -> MarginalWeights:
    """Every table of the workload measured once, with equal weights (L1 sensitivity 1)."""
    family = subset.family
    own = sorted(set(subset.own_subsets))
    weights = np.zeros(len(family))
    weights[[family.position(mask) for mask in own]] = 1.0 / len(own)
    separate = MarginalWeights(
        domain_shape=subset.domain_shape,
        family=family,
        basis="marginal",
        weights=weights,
        noise="laplace",
        unit_total_error=math.nan,  # set below, from these weights
    )
    error = subset_unit_error(separate, subset.projections)
    return dataclasses.replace(separate, unit_total_error=error)


def _largest_unit_variance(
    weights: MarginalWeights, workload: Workload, item_scales: Mapping[str, float] | None
) -> float:
    """``Δ² · max_t s_t V_t``: the largest (scaled) cell variance per unit noise variance."""
    strategy = SubsetStrategy(name="candidate", weights=weights)
    squared = weights.sensitivity(noise=weights.noise) ** 2
    return squared * max(
        (1.0 if item_scales is None else item_scales[item.name])
        * (strategy.uniform_unit_variance(item) or 0.0)
        for item in workload.items
    )
