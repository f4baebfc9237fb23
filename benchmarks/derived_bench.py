"""Derived statistics against OpenDP's own mean and quantile measurements at the same ε.

Seeded synthetic ages (public randomness; default 10,000 people, skewed, integers 0..99).  For each
statistic set, both sides spend the same pure ε on the same people and are run ``--trials`` times;
errors are against the exact statistic of the raw data:

* **mean** — ours: a spec ``{mean: age}`` planned by ``auto`` (the support queries count, Σu·h,
  Σ(u − ½)·h over the age cells), measured through the choke point with the production (OpenDP)
  sampler, the mean by post-processing with its delta-method ``std_error``.  OpenDP:
  (a) ``clamp >> resize(n) >> mean >> laplace`` with the size n *known* (public n, an advantage
  ours does not have), (b) ``clamp >> sum >> laplace`` and ``count >> laplace`` at ε/2 each, ratio.
* **quantiles 0.5 and 0.9** — ours: ``{quantiles: {of: age, q: [0.5, 0.9]}}`` (one CDF measured at ε,
  both levels read from it).  OpenDP: ``make_private_quantile`` (exponential mechanism over the 100
  integer candidates), ε/2 per level.
* **5-year cells** — the same with age in cells of 5 years (binning error enters ours: the stated
  ``binning_error`` bound is printed beside it).

Columns: RMSE (mean) or mean absolute error (quantiles) of each side, ``ratio`` = ours / OpenDP
(below 1: ours is more accurate), and for ours the average reported ``std_error``, the empirical
coverage of the 95% interval and the stated binning error bound.  Means are scored against the raw
data's mean (ours then includes its binning error; coverage is of the *binned* mean, which is what
the noise interval claims — the binning bound is stated separately).  Quantiles are scored against
each side's own noise-free answer: the definitions differ at ties (ours: the inverted CDF, the
integer where the CDF first reaches q; OpenDP: the candidate of best exponential-mechanism score,
which may be one below), and both are printed; coverage is of the raw inverted-CDF quantile.

Usage (from the repository root)::

    .venv/bin/python benchmarks/derived_bench.py          # 10,000 people, 200 trials, ε 0.1 and 1
    .venv/bin/python benchmarks/derived_bench.py --people 2000 --trials 100 --epsilons 0.5
"""

from __future__ import annotations

import argparse
import atexit
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import opendp.prelude as dp

from dprelease.catalog.confidential.choke_point import ProtectedCells
from dprelease.catalog.planning.planner import make_plan
from dprelease.catalog.planning.strategy_store import StrategyStore
from dprelease.catalog.publishing.tables import derived_tables
from dprelease.catalog.spec.load import parse_spec
from dprelease.catalog.spec.model import ReleaseSpec, derived_column
from dprelease.mechanisms import derived
from dprelease.mechanisms.primitives.privacy import PrivacyCost
from dprelease.mechanisms.primitives.protocol import MeasureContext

SEED = 20261125
UPPER = 99.0
LEVELS = (0.5, 0.9)
SCRATCH = Path(tempfile.mkdtemp(prefix="derived-bench-"))
"""Strategy stores of this run (public strategies only; not the user's store), removed at exit."""
atexit.register(shutil.rmtree, SCRATCH, ignore_errors=True)


class _NoLedger:
    """The benchmark spends on synthetic data: nothing to record."""

    def charge(self, cost: PrivacyCost, *, label: str) -> str:
        return "bench"

    def holds(self, receipt_id: str) -> bool:
        return False


def synthetic_ages(people: int, rng: np.random.Generator) -> np.ndarray:
    """Skewed integer ages 0..99 (a gamma shape, clipped)."""
    return np.clip(np.round(rng.gamma(4.0, 9.0, people)), 0, UPPER).astype(np.int64)


def spec_for(item: dict[str, Any], *, epsilon: float, width: int) -> ReleaseSpec:
    return parse_spec(
        {
            "name": "derived-bench",
            "dataset": {"id": "bench", "budget": {"epsilon": 100}},
            "domain": {"age": {"min": 0, "max": int(UPPER), "width": width}},
            "workload": [{"name": "stat", **item}],
            "privacy": {"epsilon": epsilon},
        }
    )


def ours(spec: ReleaseSpec, ages: np.ndarray, *, trials: int) -> tuple[list[Any], float, str]:
    """``trials`` releases of the spec's derived table (real choke point and sampler)."""
    plan = make_plan(spec, cache=StrategyStore(SCRATCH / "strategies"))
    width = spec.domain["age"].width  # type: ignore[union-attr]
    cells = np.bincount(ages // width, minlength=spec.num_cells).astype(np.float64)
    protected = ProtectedCells(cells, domain_shape=spec.domain_shape, contribution_bound=1)
    context = MeasureContext(
        target=spec.privacy_target(),
        accountant=_NoLedger(),
        label="bench",
        contribution_bound=1,
        input_fingerprint="b" * 64,
        dataset_id="bench",
        released=StrategyStore(SCRATCH / "released"),
    )
    tables = []
    start = time.perf_counter()
    for _ in range(trials):
        measurement = plan.mechanism.measure(plan.strategy, protected, context=context)
        answers = plan.mechanism.reconstruct(measurement, workload=plan.workload)
        tables.append(derived_tables(spec, answers)["stat"])
    return tables, (time.perf_counter() - start) / trials, plan.chosen


def _calibrated(make: Any, epsilon: float) -> Any:
    return make(dp.binary_search_param(make, d_in=1, d_out=epsilon))


def opendp_means(ages: np.ndarray, *, epsilon: float, trials: int) -> dict[str, np.ndarray]:
    """(a) sized mean with known n; (b) noisy sum / noisy count, ε/2 each."""
    space = (dp.vector_domain(dp.atom_domain(T=float, nan=False)), dp.symmetric_distance())
    data = ages.astype(float).tolist()
    clamped = space >> dp.t.then_clamp((0.0, UPPER))
    sized = _calibrated(
        lambda s: (
            clamped
            >> dp.t.then_resize(size=len(data), constant=UPPER / 2)
            >> dp.t.then_mean()
            >> dp.m.then_laplace(s)
        ),
        epsilon,
    )
    noisy_sum = _calibrated(
        lambda s: clamped >> dp.t.then_sum() >> dp.m.then_laplace(s), epsilon / 2
    )
    noisy_count = _calibrated(
        lambda s: space >> dp.t.then_count() >> dp.m.then_laplace(s), epsilon / 2
    )
    sized_values = np.array([sized(data) for _ in range(trials)])
    ratio = np.array([noisy_sum(data) / max(float(noisy_count(data)), 1.0) for _ in range(trials)])
    return {"sized": sized_values, "sum/count": np.clip(ratio, 0.0, UPPER)}


def opendp_quantiles(ages: np.ndarray, *, epsilon: float, trials: int) -> np.ndarray:
    """``make_private_quantile`` per level at ε / levels; (trials, levels)."""
    space = (dp.vector_domain(dp.atom_domain(T=float, nan=False)), dp.symmetric_distance())
    candidates = [float(v) for v in range(int(UPPER) + 1)]
    data = ages.astype(float).tolist()
    measurements = [
        _calibrated(
            lambda s, q=q: (
                space
                >> dp.m.then_private_quantile(
                    dp.max_divergence(), candidates=candidates, alpha=q, scale=s
                )
            ),
            epsilon / len(LEVELS),
        )
        for q in LEVELS
    ]
    return np.array([[m(data) for m in measurements] for _ in range(trials)])


def _ratio(ours: float, theirs: float) -> str:
    if theirs > 0:
        return f"{ours / theirs:.2f}"
    return "1.00" if ours == 0 else "inf"  # OpenDP exact in every trial


def rmse(values: np.ndarray, truth: float) -> float:
    return float(np.sqrt(np.mean((np.asarray(values) - truth) ** 2)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--people", type=int, default=10_000)
    parser.add_argument("--trials", type=int, default=200)
    parser.add_argument("--epsilons", type=float, nargs="+", default=[0.1, 1.0])
    args = parser.parse_args()
    dp.enable_features("contrib")
    ages = synthetic_ages(args.people, np.random.default_rng(SEED))
    for eps in args.epsilons:
        compare(ages, epsilon=eps, trials=args.trials)
    print(
        "ratio = ours / OpenDP (< 1: ours more accurate).  OpenDP 'sized' knows n exactly, "
        "'sum/count' splits ε;\nquantiles: OpenDP spends ε/2 per level, ours reads both levels "
        "from one CDF measured at ε; each side's error is against its own noise-free answer."
    )


def compare(ages: np.ndarray, *, epsilon: float, trials: int) -> None:
    """One table: ours against OpenDP at ``epsilon`` over ``trials`` runs."""
    eps = epsilon
    true_mean = float(ages.mean())
    true_q = [float(np.quantile(ages, q, method="inverted_cdf")) for q in LEVELS]
    opendp_exact = opendp_quantiles(ages, epsilon=1e4, trials=1)[0]  # its noise-free answers
    print(
        f"\n{ages.size:,} people, ages 0..99, ε = {eps:g} (pure), {trials} trials; "
        f"raw mean {true_mean:.4f}; inverted-CDF quantiles {true_q}, OpenDP's noise-free "
        f"{[float(v) for v in opendp_exact]}"
    )
    header = (
        f"{'statistic':<28}{'ours':>9}{'OpenDP':>9}{'ratio':>7}"
        f"{'ours se':>9}{'coverage':>10}{'binning':>9}  ours: mechanism, s/release"
    )
    print(header)
    print("-" * len(header))
    opendp_mean = opendp_means(ages, epsilon=eps, trials=trials)
    opendp_q = opendp_quantiles(ages, epsilon=eps, trials=trials)
    for width in (1, 5):
        cells = f"{width}-year"
        spec = spec_for({"mean": "age"}, epsilon=eps, width=width)
        tables, seconds, chosen = ours(spec, ages, trials=trials)
        rep = derived_column(spec, spec.workload[0]).representative
        binned_mean = float(np.mean(rep[ages // width]))
        estimate, se, low, high, binning = _column(tables, 0)
        ours_rmse = rmse(estimate, true_mean)
        covered = np.mean((low <= binned_mean) & (binned_mean <= high))
        for label, values in opendp_mean.items():
            theirs = rmse(values, true_mean)
            print(
                f"{f'mean ({cells}) vs {label}':<28}{ours_rmse:>9.4f}{theirs:>9.4f}"
                f"{_ratio(ours_rmse, theirs):>7}{se.mean():>9.4f}{covered:>10.1%}{binning:>9.2f}"
                f"  {chosen}, {seconds:.3f}"
            )
        spec = spec_for({"quantiles": {"of": "age", "q": list(LEVELS)}}, epsilon=eps, width=width)
        tables, seconds, chosen = ours(spec, ages, trials=trials)
        own = _noise_free_quantiles(spec, ages, width)
        for j, q in enumerate(LEVELS):
            estimate, se, low, high, binning = _column(tables, j)
            mine = float(np.mean(np.abs(estimate - own[j])))
            theirs = float(np.mean(np.abs(opendp_q[:, j] - opendp_exact[j])))
            covered = np.mean((low <= true_q[j]) & (true_q[j] <= high))
            print(
                f"{f'q{q:g} ({cells}), MAE':<28}{mine:>9.4f}{theirs:>9.4f}"
                f"{_ratio(mine, theirs):>7}{se.mean():>9.4f}{covered:>10.1%}{binning:>9.2f}"
                f"  {chosen}, {seconds:.3f}"
            )


def _column(tables: list[Any], row: int) -> tuple[np.ndarray, ...]:
    """Per trial: estimate, std_error, ci_low, ci_high of ``row``; and its binning error."""
    values = [
        np.array([t[name][row].as_py() for t in tables])
        for name in ("estimate", "std_error", "ci_low", "ci_high")
    ]
    return (*values, tables[0]["binning_error"][row].as_py())


def _noise_free_quantiles(spec: ReleaseSpec, ages: np.ndarray, width: int) -> np.ndarray:
    """Our estimator on the exact counts (what ours answers without noise)."""
    column = derived_column(spec, spec.workload[0])
    cdf = np.cumsum(np.bincount(ages // width, minlength=column.size)).astype(np.float64)[None, :]
    tiny = np.full(cdf.shape, 1e-12)
    rows = derived.quantiles(cdf, tiny, np.full(cdf.shape, "noise"), column=column, levels=LEVELS)
    return rows.estimate


if __name__ == "__main__":
    main()
