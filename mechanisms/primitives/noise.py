"""Privacy noise: the one interface every mechanism draws noise through, and its vetted implementation.

Noise is never drawn from ``numpy.random`` in production code.  A ``NoiseSampler`` adds noise of a
given scale to confidential values; production uses :class:`OpenDPSampler` (OpenDP's
floating-point-safe samplers).  Tests inject a seeded or zero-noise sampler from ``tests/samplers.py``.

The noise *scale* and the privacy *cost* come from one object, :class:`NoiseMechanism`: the cost is
what OpenDP's privacy map reports for that scale and sensitivity (it includes OpenDP's
discretisation slack), never a nominal value typed elsewhere.
"""

from __future__ import annotations

import functools
import math
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

import numpy as np

from dprelease.mechanisms.primitives.privacy import Measure, PrivacyCost, rho_for_epsilon_delta


@runtime_checkable
class NoiseSampler(Protocol):
    """Adds independent noise to every entry of ``values`` and returns a new float64 array.

    ``values`` are confidential (strategy answers A·x); the returned array is safe to release once
    the matching privacy cost has been charged.
    """

    def add_laplace(self, values: np.ndarray, *, scale: float) -> np.ndarray:
        """``values`` + i.i.d. Laplace(0, scale) noise (variance 2·scale²)."""
        ...

    def add_gaussian(self, values: np.ndarray, *, sigma: float) -> np.ndarray:
        """``values`` + i.i.d. Normal(0, sigma²) noise."""
        ...


NoiseKind = Literal["laplace", "gaussian"]
NOISE_KINDS: tuple[str, ...] = ("laplace", "gaussian")
SENSITIVITY_NORM: dict[str, int] = {"laplace": 1, "gaussian": 2}
"""The column norm a noise kind's sensitivity is measured in (L1 calibrates Laplace, L2 Gaussian).
Also the ``norm`` token strategy-store keys and stored parameters have always held (1 or 2)."""


def noise_for_norm(norm: object) -> NoiseKind:
    """The noise kind of a stored ``norm`` token (1 or 2), for entries written with that token."""
    for kind, value in SENSITIVITY_NORM.items():
        if norm == value:
            return kind  # type: ignore[return-value]
    raise ValueError(f"norm ({norm!r}) must be 1 (Laplace) or 2 (Gaussian)")


def validate_noise(noise: str) -> None:
    """Raise unless ``noise`` is one of :data:`NOISE_KINDS`."""
    if noise not in NOISE_KINDS:
        raise ValueError(f"noise ({noise!r}) must be one of {NOISE_KINDS}")


# OpenDP's discretisation granularity 2**k.  k = -40 keeps the privacy-map slack tiny (about 2e-7
# relative at 1e6 values) while sampling faster than OpenDP's default k (benchmarks/noise_bench.py).
OPENDP_K = -40
# Below this many values, sharding across threads costs more than it saves.
_MIN_SHARD = 50_000
_MAX_SHARD = 1_000_000


@dataclass(frozen=True, kw_only=True)
class NoiseMechanism:
    """Noise kind, scale and the privacy cost it buys, computed together from one sensitivity.

    Privacy: adding i.i.d. noise of ``scale`` to a query vector whose ``sensitivity`` (L1 for
    Laplace, L2 for Gaussian, already multiplied by the privacy unit's contribution bound) is as
    given satisfies ``cost``, which is the value OpenDP's privacy map reports for a vector of
    ``size`` values (it includes the floating-point discretisation slack).
    """

    kind: NoiseKind
    scale: float
    sensitivity: float
    size: int
    cost: PrivacyCost

    @property
    def variance(self) -> float:
        """Variance of one noise draw: 2b² for Laplace(b), σ² for Gaussian(σ)."""
        return 2 * self.scale**2 if self.kind == "laplace" else self.scale**2

    def apply(self, values: np.ndarray, *, sampler: NoiseSampler) -> np.ndarray:
        """Release ``values`` with this mechanism's noise. Charge ``cost`` before calling."""
        values = np.asarray(values, dtype=np.float64)
        if values.size != self.size:
            raise ValueError(
                f"values has {values.size} entries but the mechanism was calibrated for {self.size}"
            )
        if self.kind == "laplace":
            return sampler.add_laplace(values, scale=self.scale)
        return sampler.add_gaussian(values, sigma=self.scale)


def noise_kind_for(measure: Measure) -> NoiseKind:
    """Laplace for pure ε; Gaussian for ρ-zCDP and (ε, δ)."""
    return "laplace" if measure == "pure" else "gaussian"


def calibrate(*, target: PrivacyCost, sensitivity: float, size: int) -> NoiseMechanism:
    """The least noise whose OpenDP-reported cost does not exceed ``target``.

    The scale starts at the textbook value (Δ/ε; Δ/√(2ρ); the classic zCDP conversion for (ε, δ)) and
    is raised until OpenDP's map (which adds discretisation slack) is within the target, so a spec
    that asks for ε = 1 is charged at most 1.  O(1) map evaluations; no noise is drawn.
    """
    if not (math.isfinite(sensitivity) and sensitivity > 0):
        raise ValueError(f"sensitivity ({sensitivity}) must be finite and > 0")
    if size < 1:
        raise ValueError(f"size ({size}) must be >= 1")
    if target.measure == "pure":
        if not target.epsilon > 0:
            raise ValueError(f"epsilon ({target.epsilon}) must be > 0")
        scale = sensitivity / target.epsilon
        for _ in range(8):
            spent = _opendp_cost("laplace", scale=scale, sensitivity=sensitivity, size=size)
            if spent.epsilon <= target.epsilon:
                break
            scale *= spent.epsilon / target.epsilon * (1 + 1e-12)
        return NoiseMechanism(
            kind="laplace", scale=scale, sensitivity=sensitivity, size=size, cost=spent
        )
    if target.measure == "zcdp":
        if not target.rho > 0:
            raise ValueError(f"rho ({target.rho}) must be > 0")
        scale = sensitivity / math.sqrt(2 * target.rho)
        for _ in range(8):
            spent = _opendp_cost("gaussian", scale=scale, sensitivity=sensitivity, size=size)
            if spent.rho <= target.rho:
                break
            scale *= math.sqrt(spent.rho / target.rho) * (1 + 1e-12)
        return NoiseMechanism(
            kind="gaussian", scale=scale, sensitivity=sensitivity, size=size, cost=spent
        )
    # (ε, δ): bisect σ between a safe upper value (classic conversion) and a clearly-too-small one.
    rho = rho_for_epsilon_delta(epsilon=target.epsilon, delta=target.delta)
    high = sensitivity / math.sqrt(2 * rho) * 1.001
    low = high / 4
    for _ in range(40):  # O(40) map evaluations, relative precision ~1e-12
        mid = (low + high) / 2
        spent = _opendp_cost(
            "gaussian", scale=mid, sensitivity=sensitivity, size=size, delta=target.delta
        )
        if spent.epsilon <= target.epsilon:
            high = mid
        else:
            low = mid
    spent = _opendp_cost(
        "gaussian", scale=high, sensitivity=sensitivity, size=size, delta=target.delta
    )
    return NoiseMechanism(
        kind="gaussian", scale=high, sensitivity=sensitivity, size=size, cost=spent
    )


def _opendp_measurement(kind: NoiseKind, *, scale: float, size: int) -> Any:
    dp = _opendp()
    domain = dp.vector_domain(dp.atom_domain(T=float, nan=False), size=size)
    if kind == "laplace":
        return dp.m.make_laplace(domain, dp.l1_distance(T=float), scale=scale, k=OPENDP_K)
    return dp.m.make_gaussian(domain, dp.l2_distance(T=float), scale=scale, k=OPENDP_K)


@functools.lru_cache(maxsize=4096)
def _opendp_cost(
    kind: NoiseKind, *, scale: float, sensitivity: float, size: int, delta: float | None = None
) -> PrivacyCost:
    """The privacy map of the exact OpenDP measurement that :class:`OpenDPSampler` runs.

    Memoised: a deterministic function of these public arguments, and building the measurement
    is not free."""
    measurement = _opendp_measurement(kind, scale=scale, size=size)
    if kind == "laplace":
        return PrivacyCost(measure="pure", epsilon=float(measurement.map(sensitivity)))
    if delta is None:
        return PrivacyCost(measure="zcdp", rho=float(measurement.map(sensitivity)))
    dp = _opendp()
    approx = dp.c.make_fix_delta(dp.c.make_zCDP_to_approxDP(measurement), delta)
    epsilon, reported_delta = approx.map(sensitivity)
    return PrivacyCost(measure="approx", epsilon=float(epsilon), delta=float(reported_delta))


def _opendp() -> Any:
    import opendp.prelude as dp  # imported lazily: only the noise step needs it

    dp.enable_features("contrib")
    return dp


class OpenDPSampler:
    """The vetted sampler: OpenDP's floating-point-safe Laplace and Gaussian measurements.

    Large vectors are split into shards sampled on parallel threads (OpenDP's FFI calls release the
    GIL).  Sharding does not change the output distribution: every coordinate still receives
    independent noise of the same scale from the same discretised sampler (k = ``OPENDP_K``).
    """

    def __init__(self, *, threads: int | None = None) -> None:
        self.threads = max(1, threads if threads is not None else (os.cpu_count() or 1))

    def add_laplace(self, values: np.ndarray, *, scale: float) -> np.ndarray:
        return self._run("laplace", values, scale)

    def add_gaussian(self, values: np.ndarray, *, sigma: float) -> np.ndarray:
        return self._run("gaussian", values, sigma)

    def _run(self, kind: NoiseKind, values: np.ndarray, scale: float) -> np.ndarray:
        if not (math.isfinite(scale) and scale > 0):
            raise ValueError(f"noise scale ({scale}) must be finite and > 0")
        flat = np.ascontiguousarray(values, dtype=np.float64).ravel()
        if not np.all(np.isfinite(flat)):
            raise ValueError("values to be noised must all be finite")
        # at most _MAX_SHARD values per OpenDP call: its FFI holds ~100 B per value in flight,
        # so memory is O(threads × _MAX_SHARD), not O(size)
        shards = max(1, min(self.threads, flat.size // _MIN_SHARD), -(-flat.size // _MAX_SHARD))
        pieces = np.array_split(flat, shards)

        def sample(piece: np.ndarray) -> np.ndarray:
            measurement = _opendp_measurement(kind, scale=scale, size=piece.size)
            return np.asarray(measurement(piece), dtype=np.float64)  # O(size)

        if shards == 1:
            noisy = sample(flat)
        else:
            with ThreadPoolExecutor(max_workers=min(self.threads, shards)) as pool:
                noisy = np.concatenate(list(pool.map(sample, pieces)))
        return noisy.reshape(np.shape(values))


def production_sampler() -> NoiseSampler:
    """The sampler every release uses.  There is deliberately no setting that changes it."""
    return OpenDPSampler()


@dataclass(frozen=True, kw_only=True, repr=False)
class NoiseShard:
    """One contiguous piece of a measurement's confidential answers, to be noised on a worker.

    Built only by the choke point (after the ledger is charged).  ``token`` is a one-time name
    (16 bytes from the OS CSPRNG) of this shard of this measurement: it lets the choke point
    recognise a result that belongs to another shard or comes back twice.  There is no seed field:
    the worker's vetted sampler draws from its own OS CSPRNG, so no noise is ever derived from a
    user value or repeated across shards.  ``values`` are confidential and never print.
    """

    index: int
    count: int
    token: bytes
    kind: NoiseKind
    scale: float
    values: np.ndarray = field(compare=False)

    def __repr__(self) -> str:
        return (
            f"NoiseShard(index={self.index}, count={self.count}, kind={self.kind!r}, "
            f"size={np.size(self.values)}, values=<redacted>)"
        )


@dataclass(frozen=True, kw_only=True, repr=False)
class NoisyShard:
    """A shard's answers after noise, with the shard's token and a fresh per-draw id.

    ``draw`` (16 bytes from the worker's OS CSPRNG) differs between two executions of one shard, so
    the choke point can tell "the same result returned twice" from "the shard was noised twice".
    """

    index: int
    token: bytes
    draw: bytes
    values: np.ndarray = field(compare=False)

    def __repr__(self) -> str:
        return f"NoisyShard(index={self.index}, size={np.size(self.values)})"


def noise_shard(shard: NoiseShard) -> NoisyShard:
    """Noise one shard with the vetted sampler, single-threaded (the cluster supplies parallelism).

    A pure top-level function so a shard mapper can ship it to another process.  Privacy: only the
    choke point calls it (through its shard mapper), after charging the ledger for the whole
    measurement; every coordinate gets independent noise of ``shard.scale`` from OpenDP, whose
    randomness comes from the OS CSPRNG of the process that runs it.  O(shard size).
    """
    validate_noise(shard.kind)
    sampler = OpenDPSampler(threads=1)
    if shard.kind == "laplace":
        noisy = sampler.add_laplace(shard.values, scale=shard.scale)
    else:
        noisy = sampler.add_gaussian(shard.values, sigma=shard.scale)
    return NoisyShard(index=shard.index, token=shard.token, draw=os.urandom(16), values=noisy)
