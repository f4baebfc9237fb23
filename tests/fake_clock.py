"""A controllable clock for time-limit tests (mechanisms.primitives.compute_limits reads it)."""

from __future__ import annotations

import pytest

from dprelease.mechanisms.primitives import compute_limits


class FakeClock:
    """Seconds that pass only when a test says so (``advance``), read by every WorkLimit."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def install_fake_clock(monkeypatch: pytest.MonkeyPatch) -> FakeClock:
    """Replace the clock of :mod:`mechanisms.primitives.compute_limits` for the rest of the test."""
    clock = FakeClock()
    monkeypatch.setattr(compute_limits, "_now", clock)
    return clock
