"""The spec's ``reconstruct`` choice: which estimator turns a measurement into the released tables.

* ``least_squares`` (default): the mechanism's own estimator, unbiased, with the closed-form
  ``std_error`` of its error model.
* ``pgm``: consistent, non-negative tables (:meth:`MarginalSpaceStrategy.consistent`, the
  local-consistency relaxation of private-pgm's estimator) for marginal-space plans.  Its estimate
  is biased towards the polytope, so its error has no closed form: ``std_error`` is the
  least-squares noise standard deviation, the rows are labelled ``noise-only`` and claim no
  interval, and its accuracy is the empirical one measured by simulation on public data of the
  same domain (``benchmarks/marginals_bench.py``), never on the confidential data.
* ``auto``: ``pgm`` where the plan supports it and the solve fits one machine
  (:data:`MAX_PGM_NONZEROS`; all 2-way marginals of Adult: 0.6M, all 3-way: 167M), least
  squares otherwise.

Everything here is post-processing of the noisy measurement and public metadata."""

from __future__ import annotations

from typing import Any

import numpy as np

from dprelease.catalog.errors import SpecError
from dprelease.catalog.planning.planner import Plan, build_workload
from dprelease.catalog.spec.model import ReleaseSpec
from dprelease.mechanisms.pgm import solver_size
from dprelease.mechanisms.primitives.protocol import ItemAnswers, Measurement
from dprelease.mechanisms.primitives.workload import Workload, item_subset

LEAST_SQUARES = "least_squares"
PGM = "pgm"
PGM_NOTE = (
    "pgm: consistent, non-negative tables, the point of the local-consistency polytope closest to "
    "the noisy marginals in the measurement loss (private-pgm's relaxed estimator, solved by ADMM "
    "in marginal space). Its error is empirical (a simulation on public data of the same domain, "
    "benchmarks/marginals_bench.py: on all 2-way marginals of the public Adult data at epsilon 1, "
    "about 0.4 times the total squared error of least squares clipped at 0), never computed from "
    "the confidential data; std_error is the least-squares noise standard deviation and no "
    "interval is claimed (noise-only)."
)

MAX_PGM_NONZEROS = 40_000_000
"""Largest pgm solve (non-zeros of its spread operator, ~24 bytes each: ~1 GB)."""


def pgm_size(spec: ReleaseSpec, plan: Plan) -> int:
    """Non-zeros of the pgm solve for the plan's workload (public sizes only)."""
    workload = plan.workload or build_workload(spec)
    masks = [item_subset(item) for item in workload.items]
    return solver_size(workload.domain_shape, [m for m in masks if m is not None])


def estimator(spec: ReleaseSpec, plan: Plan) -> str:
    """``least_squares`` or ``pgm`` for this spec and plan; :class:`SpecError` (public facts only,
    raised before anything is charged) when ``pgm`` is asked of a plan that cannot give it or of
    a workload too large to solve on one machine (``auto`` falls back to least squares)."""
    if spec.reconstruct == LEAST_SQUARES:
        return LEAST_SQUARES
    if not callable(getattr(plan.strategy, "consistent_answers", None)):
        if spec.reconstruct == PGM:
            raise SpecError(
                f"reconstruct: pgm needs a marginal-space plan (every workload item a marginal, "
                f"mechanism marginal_space or auto); the chosen mechanism is {plan.chosen!r}: use "
                "reconstruct: least_squares or auto"
            )
        return LEAST_SQUARES
    size = pgm_size(spec, plan)
    if size > MAX_PGM_NONZEROS:
        if spec.reconstruct == PGM:
            raise SpecError(
                f"reconstruct: pgm would solve over {size:,} table entries × sub-marginals, more "
                f"than the {MAX_PGM_NONZEROS:,} one machine handles: use reconstruct: "
                "least_squares or auto, or fewer or smaller marginals"
            )
        return LEAST_SQUARES
    return PGM


def apply(
    spec: ReleaseSpec,
    plan: Plan,
    measurement: Measurement,
    answers: dict[str, ItemAnswers],
    *,
    workload: Workload,
) -> dict[str, ItemAnswers]:
    """``answers`` as the spec's estimator gives them: unchanged for least squares; for ``pgm``
    every item's consistent tables, keeping the least-squares noise variances as ``noise-only``
    standard errors. O(ADMM iterations × Σ clique sizes × 2^degree)."""
    if estimator(spec, plan) != PGM:
        return answers
    estimates = measurement.strategy.consistent_answers(measurement.values, workload)
    return {
        name: ItemAnswers(
            estimates=np.asarray(estimates[name], dtype=np.float64),
            variances=answers[name].variances,
            interval="none",
            uncertainty="noise-only",
        )
        for name in answers
    }


def details(spec: ReleaseSpec, plan: Plan) -> dict[str, Any]:
    """The manifest's record of which estimator produced each table (public)."""
    chosen = estimator(spec, plan)
    names = [item.name for item in (plan.workload or build_workload(spec)).items]
    record: dict[str, Any] = {"estimator": chosen, "tables_by_estimator": {chosen: names}}
    if chosen == PGM:
        record["estimator_note"] = PGM_NOTE
    return record
