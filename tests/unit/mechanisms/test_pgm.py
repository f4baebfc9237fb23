"""``mechanisms.pgm``: the local-consistency estimator against a generic solver and the dense
marginals on small domains; the tree model and its sampler; every validator fires."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.optimize import minimize

from dprelease.mechanisms.marginal_space import MarginalSpaceStrategy, marginal_of
from dprelease.mechanisms.pgm import (
    _Lattice,
    chow_liu_tree,
    consistent_marginals,
    mutual_information,
    sample_tree,
)
from dprelease.mechanisms.primitives.marginal_strategies import MarginalWeights
from dprelease.mechanisms.primitives.noise import NoiseKind
from dprelease.mechanisms.primitives.operators import Identity, Total
from dprelease.mechanisms.primitives.subset_family import down_closure, maximal_masks
from dprelease.mechanisms.primitives.workload import Workload, WorkloadItem

SHAPE = (2, 3, 2)
CLIQUES = [0b011, 0b101, 0b110]  # all pairs of three attributes: a loop (local ≠ marginal polytope)


def _components_of(
    x: np.ndarray, shape: tuple[int, ...], masks: list[int]
) -> dict[int, np.ndarray]:
    """Centred components ``C_T M_T x`` of a full vector (dense, for tests)."""
    d = len(shape)
    out = {}
    for t in masks:
        axes = tuple(i for i in range(d) if t >> i & 1)
        table = marginal_of(x, shape, axes)
        for axis in range(table.ndim):
            table = table - table.mean(axis=axis, keepdims=True)
        out[t] = np.asarray(table, dtype=np.float64)
    return out


def _noisy(
    rng: np.random.Generator, scale: float
) -> tuple[dict[int, np.ndarray], dict[int, float]]:
    x = rng.poisson(3.0, size=math.prod(SHAPE)).astype(np.float64)
    x[rng.random(x.size) < 0.4] = 0.0
    closure = down_closure(CLIQUES)
    truth = _components_of(x, SHAPE, closure)
    noisy = {t: v + (scale * rng.standard_normal(v.shape) if t else 0.0) for t, v in truth.items()}
    centred = {}
    for t, v in noisy.items():
        for axis in range(v.ndim):
            v = v - v.mean(axis=axis, keepdims=True)
        centred[t] = v
    precisions = {t: float(rng.uniform(0.5, 2.0)) for t in closure}
    return centred, precisions


def _forward(lattice: _Lattice, v: dict[int, np.ndarray]) -> dict[int, np.ndarray]:
    """``B v`` as one table per clique."""
    return lattice._tables(lattice.forward_flat(lattice.pack(v)), lattice.starts, lattice.cliques)


def _objective(
    v: dict[int, np.ndarray], target: dict[int, np.ndarray], lam: dict[int, float]
) -> float:
    return sum(lam[t] * float(np.sum((v[t] - target[t]) ** 2)) for t in target)


def test_admm_reaches_the_constrained_minimum_of_a_generic_solver(rng: np.random.Generator) -> None:
    target, lam = _noisy(rng, scale=4.0)
    result = consistent_marginals(
        domain_shape=SHAPE,
        cliques=CLIQUES,
        estimates=target,
        precisions=lam,
        tolerance=1e-9,
        max_iterations=20000,
    )
    lattice = _Lattice(SHAPE, CLIQUES)
    tables = _forward(lattice, result.components)
    assert min(float(t.min()) for t in tables.values()) >= 0.0
    # generic solver over the free (centred) coordinates: v_T = basis_T · θ_T, v_∅ held fixed
    closure = [t for t in lattice.closure if t]
    bases = {}
    for t in closure:
        shape_t = lattice.table_shape(t)
        dense = np.eye(math.prod(shape_t)).reshape(-1, *shape_t)
        for axis in range(1, dense.ndim):
            dense = dense - dense.mean(axis=axis, keepdims=True)
        u, _, _ = np.linalg.svd(dense.reshape(len(dense), -1).T)
        bases[t] = u[:, : math.prod(n - 1 for n in shape_t)]  # an orthonormal basis of V_T
    sizes = [bases[t].shape[1] for t in closure]

    def unpack(theta: np.ndarray) -> dict[int, np.ndarray]:
        v, start = {0: target[0]}, 0
        for t, k in zip(closure, sizes, strict=True):
            v[t] = (bases[t] @ theta[start : start + k]).reshape(lattice.table_shape(t))
            start += k
        return v

    theta0 = np.concatenate([bases[t].T @ target[t].ravel() for t in closure])
    cons = {
        "type": "ineq",
        "fun": lambda th: np.concatenate(
            [b.ravel() for b in _forward(lattice, unpack(th)).values()]
        ),
    }
    generic = minimize(
        lambda th: _objective(unpack(th), target, lam),
        theta0,
        constraints=[cons],
        method="SLSQP",
        options={"ftol": 1e-12, "maxiter": 1000},
    )
    assert generic.success
    ours = _objective(dict(result.components), target, lam)
    best = _objective(unpack(generic.x), target, lam)
    assert ours <= best * (1 + 1e-4) + 1e-6
    assert ours >= best * (1 - 1e-4) - 1e-6  # and the generic solver is not beaten by a bug


def test_tables_are_consistent_and_nonnegative_under_heavy_noise(rng: np.random.Generator) -> None:
    target, lam = _noisy(rng, scale=20.0)
    result = consistent_marginals(
        domain_shape=SHAPE, cliques=CLIQUES, estimates=target, precisions=lam
    )
    for mask in CLIQUES:
        assert result.marginal(mask).min() >= 0.0
    d = len(SHAPE)
    for axis in range(d):
        margins = [
            result.marginal(mask).sum(
                axis=tuple(
                    k for k, a in enumerate(i for i in range(d) if mask >> i & 1) if a != axis
                )
            )
            for mask in CLIQUES
            if mask >> axis & 1
        ]
        for other in margins[1:]:
            np.testing.assert_allclose(other, margins[0], rtol=0, atol=1e-9)
        np.testing.assert_allclose(result.marginal(1 << axis), margins[0], rtol=0, atol=1e-9)
    assert float(result.marginal(0)) == pytest.approx(float(target[0]))  # the total is kept


def test_noise_free_measurements_give_the_true_marginals(rng: np.random.Generator) -> None:
    x = rng.poisson(2.0, size=math.prod(SHAPE)).astype(np.float64)
    x[:4] = 0.0
    closure = down_closure(CLIQUES)
    truth = _components_of(x, SHAPE, closure)
    result = consistent_marginals(
        domain_shape=SHAPE, cliques=CLIQUES, estimates=truth, precisions=dict.fromkeys(closure, 1.0)
    )
    assert result.mixing <= 1e-8  # only the round-off margin
    for mask in CLIQUES:
        axes = tuple(i for i in range(3) if mask >> i & 1)
        np.testing.assert_allclose(result.marginal(mask), marginal_of(x, SHAPE, axes), atol=1e-6)


@pytest.mark.parametrize(
    ("basis", "noise", "weights"),
    [
        ("marginal", "laplace", [0.25, 0, 0, 0.25, 0, 0.25, 0.25, 0]),  # Laplace: plain marginals
        ("centred", "gaussian", [0.3, 0.3, 0.3, 0.3, 0.3, 0.3, 0.3, 0]),  # Gaussian: subset-eigen
    ],
)
def test_the_strategy_estimator_matches_dense_marginals_without_noise(
    rng: np.random.Generator, basis: str, noise: NoiseKind, weights: list[float]
) -> None:
    """``MarginalSpaceStrategy.consistent_answers`` (zero noise) returns the dense marginals of
    x for every item, in both bases of the marginal-space plan."""
    weights = MarginalWeights(
        domain_shape=SHAPE,
        basis=basis,
        weights=np.array(weights),
        noise=noise,
        unit_total_error=1.0,
    )
    strategy = MarginalSpaceStrategy(name="marginal_space", weights=weights, parameters={})
    items = tuple(
        WorkloadItem(
            name=f"m{mask}",
            factors=tuple(Identity(n) if mask >> i & 1 else Total(n) for i, n in enumerate(SHAPE)),
        )
        for mask in CLIQUES
    )
    workload = Workload(domain_shape=SHAPE, items=items)
    x = rng.poisson(4.0, size=math.prod(SHAPE)).astype(np.float64)
    answers = strategy.consistent_answers(strategy.apply(x), workload)
    for item, mask in zip(items, CLIQUES, strict=True):
        axes = tuple(i for i in range(3) if mask >> i & 1)
        np.testing.assert_allclose(
            answers[item.name], marginal_of(x, SHAPE, axes).ravel(), atol=1e-8
        )


def test_a_nonpositive_total_gives_empty_tables(rng: np.random.Generator) -> None:
    target, lam = _noisy(rng, scale=1.0)
    target[0] = np.array(-5.0)
    result = consistent_marginals(
        domain_shape=SHAPE, cliques=CLIQUES, estimates=target, precisions=lam
    )
    for mask in CLIQUES:
        assert not result.marginal(mask).any()


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"cliques": []}, "at least one clique"),
        ({"tolerance": 0.0}, r"tolerance \(0.0\) must be > 0"),
        ({"max_iterations": 0}, r"max_iterations \(0\) must be >= 1"),
        ({"drop": 0b001}, r"component \(0,\) of a clique is missing"),
        ({"precision": -1.0}, r"precisions\[\(0, 1\)\] \(-1.0\) must be >= 0"),
        ({"all_zero": True}, "at least one component must be measured"),
    ],
)
def test_validators_fire(rng: np.random.Generator, change: dict, message: str) -> None:
    target, lam = _noisy(rng, scale=1.0)
    if "drop" in change:
        del target[change["drop"]]
    if "precision" in change:
        lam[0b011] = change["precision"]
    if change.get("all_zero"):
        lam = dict.fromkeys(lam, 0.0)
    kwargs = {k: v for k, v in change.items() if k in ("cliques", "tolerance", "max_iterations")}
    with pytest.raises(ValueError, match=message):
        consistent_marginals(
            domain_shape=SHAPE,
            **{"cliques": CLIQUES, "estimates": target, "precisions": lam, **kwargs},
        )


def test_maximal_masks_and_a_marginal_outside_every_clique() -> None:
    assert maximal_masks([0b001, 0b011, 0b011, 0b100]) == [0b011, 0b100]
    closure = down_closure([0b011])
    result = consistent_marginals(
        domain_shape=SHAPE,
        cliques=[0b011],
        estimates={
            t: np.zeros(tuple(SHAPE[a] for a in range(3) if t >> a & 1)) + (6.0 if t == 0 else 0.0)
            for t in closure
        },
        precisions=dict.fromkeys(closure, 1.0),
    )
    np.testing.assert_allclose(result.marginal(0b011), np.ones((2, 3)))
    with pytest.raises(ValueError, match=r"no clique covers the attributes \(0, 2\)"):
        result.marginal(0b101)


def test_chow_liu_recovers_a_chain_and_sampling_follows_it(rng: np.random.Generator) -> None:
    """A chain 0 → 1 → 2 with strong dependence: the tree has edges (0,1) and (1,2); samples
    reproduce the pair table (chi-square at 1e-6) and reject an independent one."""
    from scipy.stats import chisquare

    p0 = np.array([0.3, 0.7])
    p10 = np.array([[0.9, 0.05, 0.05], [0.1, 0.1, 0.8]])
    p21 = np.array([[0.95, 0.05], [0.5, 0.5], [0.1, 0.9]])
    joint = p0[:, None, None] * p10[:, :, None] * p21[None, :, :]
    one = {i: joint.sum(axis=tuple(j for j in range(3) if j != i)) for i in range(3)}
    two = {(i, j): joint.sum(axis=3 - i - j) for i in range(3) for j in range(i + 1, 3)}
    model = chow_liu_tree(domain_shape=(2, 3, 2), one_way=one, two_way=two)
    edges = {tuple(sorted((c, p))) for c, p in enumerate(model.parent) if p >= 0}
    assert edges == {(0, 1), (1, 2)}
    rows = 40000
    sample = sample_tree(model, rows=rows, rng=rng)
    observed = np.bincount(sample[:, 0] * 3 + sample[:, 1], minlength=6)
    assert chisquare(observed, two[(0, 1)].ravel() * rows).pvalue > 1e-6
    independent = np.outer(one[0], one[1]).ravel() * rows
    assert chisquare(observed, independent).pvalue < 1e-6
    assert mutual_information(two[(0, 1)]) > mutual_information(two[(0, 2)])


def test_tree_validators_fire(rng: np.random.Generator) -> None:
    with pytest.raises(ValueError, match=r"one_way: attributes \[1\] have no table"):
        chow_liu_tree(domain_shape=(2, 2), one_way={0: np.ones(2)}, two_way={})
    model = chow_liu_tree(domain_shape=(2,), one_way={0: np.zeros(2)}, two_way={})
    with pytest.raises(ValueError, match="rows \\(-1\\) must be >= 0"):
        sample_tree(model, rows=-1, rng=rng)
    with pytest.raises(ValueError, match="no positive mass"):
        sample_tree(model, rows=3, rng=rng)


def test_degenerate_cliques_the_total_alone_and_one_attribute() -> None:
    alone = consistent_marginals(
        domain_shape=(2, 3), cliques=[0], estimates={0: np.array(5.0)}, precisions={0: 1.0}
    )
    assert float(alone.marginal(0)) == 5.0
    one = consistent_marginals(
        domain_shape=(2, 3),
        cliques=[0b01, 0],
        estimates={0: np.array(5.0), 0b01: np.array([-9.0, 9.0])},
        precisions={0: 1.0, 0b01: 1.0},
    )
    # the nearest non-negative split of a total of 5 to (-9 + 2.5, 9 + 2.5) is (0, 5)
    np.testing.assert_allclose(one.marginal(0b01), [0.0, 5.0], atol=1e-6)
