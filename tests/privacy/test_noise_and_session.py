"""Privacy obligations: cost from OpenDP's map, one object for scale and cost, charge before noise."""

from __future__ import annotations

import pickle

import numpy as np
import opendp.prelude as dp
import pytest

from dprelease.catalog.confidential.choke_point import ProtectedCells
from dprelease.mechanisms.primitives import noise
from dprelease.mechanisms.primitives.noise import (
    NoiseMechanism,
    OpenDPSampler,
    calibrate,
    production_sampler,
)
from dprelease.mechanisms.primitives.privacy import (
    BudgetExceededError,
    MeasureMismatchError,
    PrivacyCost,
    convert,
    cost_from_dict,
    rho_for_epsilon_delta,
)
from dprelease.mechanisms.primitives.strategies import build_kron_strategy

dp.enable_features("contrib")


def _domain(size: int):
    return dp.vector_domain(dp.atom_domain(T=float, nan=False), size=size)


@pytest.mark.parametrize("sensitivity", [1.0, 3.0, 10.0])
def test_laplace_cost_is_the_opendp_map_and_within_target(sensitivity: float) -> None:
    mechanism = calibrate(
        target=PrivacyCost(measure="pure", epsilon=0.5), sensitivity=sensitivity, size=1000
    )
    measurement = dp.m.make_laplace(
        _domain(1000), dp.l1_distance(T=float), scale=mechanism.scale, k=-40
    )
    assert mechanism.cost.epsilon == pytest.approx(measurement.map(sensitivity), rel=1e-12)
    assert mechanism.cost.epsilon <= 0.5
    assert mechanism.scale == pytest.approx(sensitivity / 0.5, rel=1e-5)  # textbook scale + slack
    assert mechanism.variance == pytest.approx(2 * mechanism.scale**2)


def test_gaussian_rho_cost_is_the_opendp_map() -> None:
    mechanism = calibrate(target=PrivacyCost(measure="zcdp", rho=0.5), sensitivity=2.0, size=500)
    measurement = dp.m.make_gaussian(
        _domain(500), dp.l2_distance(T=float), scale=mechanism.scale, k=-40
    )
    assert mechanism.cost.rho == pytest.approx(measurement.map(2.0), rel=1e-12)
    assert mechanism.cost.rho <= 0.5
    assert mechanism.scale == pytest.approx(2.0, rel=1e-5)  # sigma = Delta / sqrt(2 rho)


def test_gaussian_epsilon_delta_is_calibrated_through_opendp() -> None:
    target = PrivacyCost(measure="approx", epsilon=1.0, delta=1e-9)
    mechanism = calibrate(target=target, sensitivity=1.0, size=100)
    base = dp.m.make_gaussian(_domain(100), dp.l2_distance(T=float), scale=mechanism.scale, k=-40)
    approx = dp.c.make_fix_delta(dp.c.make_zCDP_to_approxDP(base), 1e-9)
    epsilon, delta = approx.map(1.0)
    assert mechanism.cost.epsilon == pytest.approx(epsilon, rel=1e-12)
    assert delta == 1e-9 and mechanism.cost.delta == 1e-9
    assert 0.999 <= mechanism.cost.epsilon <= 1.0  # the bisection uses the budget, never more
    # tighter than the classic conversion's sigma
    classic = 1.0 / np.sqrt(2 * rho_for_epsilon_delta(epsilon=1.0, delta=1e-9))
    assert mechanism.scale < classic


def test_calibration_validation_fires() -> None:
    with pytest.raises(ValueError, match=r"sensitivity \(0.0\) must be finite and > 0"):
        calibrate(target=PrivacyCost(measure="pure", epsilon=1), sensitivity=0.0, size=3)
    with pytest.raises(ValueError, match=r"size \(0\) must be >= 1"):
        calibrate(target=PrivacyCost(measure="pure", epsilon=1), sensitivity=1.0, size=0)
    with pytest.raises(ValueError, match=r"epsilon \(0.0\) must be > 0"):
        calibrate(target=PrivacyCost(measure="pure", epsilon=0.0), sensitivity=1.0, size=3)
    with pytest.raises(ValueError, match=r"rho \(0.0\) must be > 0"):
        calibrate(target=PrivacyCost(measure="zcdp", rho=0.0), sensitivity=1.0, size=3)
    with pytest.raises(ValueError, match=r"delta \(1.0\) must be in \(0, 1\)"):
        rho_for_epsilon_delta(epsilon=1.0, delta=1.0)


def test_privacy_cost_arithmetic_and_conversion() -> None:
    a = PrivacyCost(measure="pure", epsilon=0.5)
    assert (a + a).epsilon == 1.0
    assert convert(a, to="zcdp").rho == pytest.approx(0.125)
    assert convert(a, to="approx").as_dict() == {"epsilon": 0.5, "delta": 0.0}
    with pytest.raises(MeasureMismatchError, match="cannot be charged to a pure budget"):
        convert(PrivacyCost(measure="zcdp", rho=0.1), to="pure")
    with pytest.raises(MeasureMismatchError, match="cannot add"):
        a + PrivacyCost(measure="zcdp", rho=0.1)
    with pytest.raises(ValueError, match=r"epsilon \(-1.0\) must be finite and >= 0"):
        PrivacyCost(measure="pure", epsilon=-1.0)
    with pytest.raises(ValueError, match="a pure-DP cost has only epsilon"):
        PrivacyCost(measure="pure", epsilon=1.0, rho=0.1)
    with pytest.raises(ValueError, match="must be exactly one of"):
        cost_from_dict({"epsilon": 1.0, "rho": 0.2})
    cap = PrivacyCost(measure="approx", epsilon=2.0, delta=1e-6)
    assert PrivacyCost(measure="approx", epsilon=1.0, delta=2e-6).exceeds(cap)
    assert not PrivacyCost(measure="approx", epsilon=2.0, delta=1e-6).exceeds(cap)


class _SpyAccountant:
    def __init__(self, events: list[str], *, refuse: bool = False) -> None:
        self.events = events
        self.refuse = refuse
        self.charged: list[PrivacyCost] = []

    def charge(self, cost: PrivacyCost, *, label: str) -> str:
        self.events.append("charge")
        if self.refuse:
            raise BudgetExceededError("refused by the test accountant")
        self.charged.append(cost)
        return "receipt-1"


class _SpySampler:
    def __init__(self, events: list[str]) -> None:
        self.events = events

    def add_laplace(self, values: np.ndarray, *, scale: float) -> np.ndarray:
        self.events.append("noise")
        return np.asarray(values, dtype=float)

    def add_gaussian(self, values: np.ndarray, *, sigma: float) -> np.ndarray:
        self.events.append("noise")
        return np.asarray(values, dtype=float)


def test_session_charges_before_noise_and_charges_what_it_calibrated(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    events: list[str] = []
    monkeypatch.setattr(noise, "production_sampler", lambda: _SpySampler(events))
    cells = ProtectedCells(np.arange(8.0), domain_shape=(8,), contribution_bound=3)
    strategy = build_kron_strategy("hierarchical", attribute_roles=[(8, "ordered")])
    accountant = _SpyAccountant(events)
    result = cells.measure(
        strategy, target=PrivacyCost(measure="pure", epsilon=1.0), accountant=accountant, label="t"
    )
    assert events == ["charge", "noise"]
    assert accountant.charged == [result.noise.cost]
    # sensitivity = strategy L1 (1 + log2 8 = 4) x contribution bound 3
    assert result.noise.sensitivity == pytest.approx(12.0)
    assert result.noise.scale == pytest.approx(12.0, rel=1e-5)
    np.testing.assert_allclose(result.values, strategy.apply(np.arange(8.0)))


def test_refused_charge_draws_no_noise(monkeypatch: pytest.MonkeyPatch) -> None:
    events: list[str] = []
    monkeypatch.setattr(noise, "production_sampler", lambda: _SpySampler(events))
    cells = ProtectedCells(np.ones(4), domain_shape=(4,), contribution_bound=1)
    strategy = build_kron_strategy("identity", attribute_roles=[(4, "ordered")])
    with pytest.raises(BudgetExceededError):
        cells.measure(
            strategy,
            target=PrivacyCost(measure="zcdp", rho=0.5),
            accountant=_SpyAccountant(events, refuse=True),
            label="t",
        )
    assert events == ["charge"]


def test_protected_cells_cannot_be_pickled_or_printed() -> None:
    cells = ProtectedCells(np.array([123456.0, 7.0]), domain_shape=(2,), contribution_bound=1)
    with pytest.raises(TypeError, match="cannot be pickled"):
        pickle.dumps(cells)
    assert "123456" not in repr(cells) and "redacted" in repr(cells)
    assert not any(
        name.endswith("cells") and not name.startswith("_ProtectedCells") for name in vars(cells)
    )


def test_protected_cells_validation_fires() -> None:
    with pytest.raises(ValueError, match="different size"):
        ProtectedCells(np.ones(3), domain_shape=(4,), contribution_bound=1)
    with pytest.raises(ValueError, match=r"contribution_bound \(0\) must be >= 1"):
        ProtectedCells(np.ones(4), domain_shape=(4,), contribution_bound=0)


def test_production_sampler_is_opendp() -> None:
    assert isinstance(production_sampler(), OpenDPSampler)


def test_opendp_sampler_shards_preserve_shape_and_reject_bad_input() -> None:
    sampler = OpenDPSampler(threads=2)
    values = np.zeros((120_000,))
    noisy = sampler.add_laplace(values, scale=1.0)
    assert noisy.shape == values.shape and np.isfinite(noisy).all() and noisy.std() > 0.5
    with pytest.raises(ValueError, match=r"noise scale \(0.0\) must be finite and > 0"):
        sampler.add_gaussian(values, sigma=0.0)
    with pytest.raises(ValueError, match="must all be finite"):
        sampler.add_laplace(np.array([1.0, np.nan]), scale=1.0)


def test_mechanism_refuses_a_vector_of_another_size() -> None:
    mechanism = NoiseMechanism(
        kind="laplace",
        scale=1.0,
        sensitivity=1.0,
        size=3,
        cost=PrivacyCost(measure="pure", epsilon=1.0),
    )
    with pytest.raises(ValueError, match="calibrated for 3"):
        mechanism.apply(np.zeros(4), sampler=OpenDPSampler())
