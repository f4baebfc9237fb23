"""Test-only noise samplers.  They live under tests/ so production code cannot import them."""

from __future__ import annotations

import numpy as np


class ZeroNoise:
    """Adds no noise: a plumbing oracle (the release must equal the exact answers)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, int, float]] = []

    def add_laplace(self, values: np.ndarray, *, scale: float) -> np.ndarray:
        self.calls.append(("laplace", int(np.size(values)), float(scale)))
        return np.array(values, dtype=np.float64, copy=True)

    def add_gaussian(self, values: np.ndarray, *, sigma: float) -> np.ndarray:
        self.calls.append(("gaussian", int(np.size(values)), float(sigma)))
        return np.array(values, dtype=np.float64, copy=True)


class SeededNumpyNoise:
    """numpy noise from an explicit Generator: reproducible, NOT floating-point safe (tests only)."""

    def __init__(self, rng: np.random.Generator) -> None:
        self.rng = rng
        self.calls: list[tuple[str, int, float]] = []

    def add_laplace(self, values: np.ndarray, *, scale: float) -> np.ndarray:
        self.calls.append(("laplace", int(np.size(values)), float(scale)))
        values = np.asarray(values, dtype=np.float64)
        return values + self.rng.laplace(0.0, scale, size=values.shape)

    def add_gaussian(self, values: np.ndarray, *, sigma: float) -> np.ndarray:
        self.calls.append(("gaussian", int(np.size(values)), float(sigma)))
        values = np.asarray(values, dtype=np.float64)
        return values + self.rng.normal(0.0, sigma, size=values.shape)
