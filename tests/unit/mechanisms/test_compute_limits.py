"""Deadlines, progress reports, interruptible heavy calls and cost models (mechanisms.primitives.compute_limits)."""

from __future__ import annotations

import math
import re
import threading
import time

import numpy as np
import pytest

from dprelease.mechanisms.primitives import compute_limits
from dprelease.mechanisms.primitives.compute_limits import (
    BLOCK_FLOPS,
    LAPACK_THREAD_FLOPS,
    TimeLimitReached,
    WorkLimit,
    blocked_matmul,
    eigh_seconds,
    interruptible,
    predict_eigen_design_seconds,
    report,
    scaled,
    svd_seconds,
)


def test_no_limit_never_expires() -> None:
    limit = WorkLimit()
    assert not limit.expired()
    assert limit.remaining() == math.inf
    assert math.isnan(limit.fraction_used())
    limit.check()  # does not raise


def test_zero_limit_is_expired_at_once() -> None:
    limit = WorkLimit(time_limit=0)
    assert limit.expired()
    assert limit.remaining() == 0.0
    assert limit.fraction_used() == 1.0
    with pytest.raises(TimeLimitReached, match="time limit of 0 s reached"):
        limit.check()


def test_limit_counts_from_its_start() -> None:
    started = time.monotonic() - 10.0
    assert WorkLimit(time_limit=5.0, started=started).expired()
    fresh = WorkLimit(time_limit=5.0, started=started)
    assert fresh.remaining() == 0.0
    running = WorkLimit(time_limit=100.0, started=started)
    assert not running.expired()
    assert 89.0 < running.remaining() <= 90.0
    assert 0.09 < running.fraction_used() < 0.11
    assert 9.9 < running.elapsed() < 11.0


def test_nested_limit_is_what_remains_and_never_zero() -> None:
    """A stage inside a plan gets the plan's remaining time; past the deadline still one step."""
    started = time.monotonic() - 10.0
    assert WorkLimit().nested_limit() is None
    assert (
        WorkLimit(time_limit=5.0, started=started).nested_limit() == compute_limits.MIN_TIME_LIMIT
    )
    nested = WorkLimit(time_limit=100.0, started=started).nested_limit()
    assert nested is not None and 89.0 < nested <= 90.0


def test_limit_is_frozen() -> None:
    limit = WorkLimit(time_limit=1.0)
    with pytest.raises(AttributeError):
        limit.time_limit = 2.0  # type: ignore[misc]
    assert isinstance(limit.time_limit, float)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (-1.0, "time_limit (-1.0) must be None or a finite number >= 0"),
        (math.inf, "time_limit (inf) must be None or a finite number >= 0"),
        (math.nan, "time_limit (nan) must be None or a finite number >= 0"),
        (True, "time_limit (True) must be None or a finite number >= 0"),
        ("5", "time_limit ('5') must be None or a finite number >= 0"),
    ],
    ids=["negative", "inf", "nan", "bool", "string"],
)
def test_limit_validator(value: object, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        WorkLimit(time_limit=value)  # type: ignore[arg-type]


def test_limit_start_validator() -> None:
    with pytest.raises(ValueError, match=re.escape("started (nan) must be a finite")):
        WorkLimit(time_limit=1.0, started=math.nan)


def test_report_clamps_and_passes_nan() -> None:
    calls: list[tuple[float, str]] = []
    report(lambda f, m: calls.append((f, m)), 1.5, "over")
    report(lambda f, m: calls.append((f, m)), -0.5, "under")
    report(lambda f, m: calls.append((f, m)), math.nan, "unknown")
    report(lambda f, m: calls.append((f, m)), 0.25, "quarter")
    report(None, 0.5, "nobody listens")
    assert calls[0] == (1.0, "over") and calls[1] == (0.0, "under")
    assert math.isnan(calls[2][0]) and calls[3] == (0.25, "quarter")


def test_scaled_maps_a_stage_into_its_share() -> None:
    calls: list[float] = []
    stage = scaled(lambda f, m: calls.append(f), 0.5, 0.75)
    assert stage is not None
    stage(0.0, "a")
    stage(1.0, "b")
    stage(math.nan, "c")
    assert calls[:2] == [0.5, 0.75] and math.isnan(calls[2])
    assert scaled(None, 0.0, 1.0) is None


@pytest.mark.parametrize("block_flops", [BLOCK_FLOPS, 1e3], ids=["one-call", "blocked"])
def test_blocked_matmul_equals_matmul(block_flops: float, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(compute_limits, "BLOCK_FLOPS", block_flops)
    rng = np.random.default_rng(0)
    left = rng.standard_normal((37, 20))
    right = rng.standard_normal((20, 11))
    np.testing.assert_allclose(blocked_matmul(left, right), left @ right, rtol=1e-13, atol=1e-13)
    with pytest.raises(TimeLimitReached):  # a passed limit stops the product
        blocked_matmul(left, right, limit=WorkLimit(time_limit=0))


def test_blocked_matmul_checks_the_limit() -> None:
    with pytest.raises(TimeLimitReached):
        blocked_matmul(np.ones((2, 2)), np.ones((2, 2)), limit=WorkLimit(time_limit=0))
    assert blocked_matmul(np.ones((2, 2)), np.ones((2, 2)), limit=WorkLimit()).sum() == 8.0


@pytest.mark.parametrize("flops", [1.0, 2 * LAPACK_THREAD_FLOPS], ids=["direct", "thread"])
def test_interruptible_returns_and_raises(flops: float) -> None:
    threads: list[str] = []

    def work() -> int:
        threads.append(threading.current_thread().name)
        return 42

    assert interruptible(work, flops=flops) == 42
    assert (threads[0] == "dprelease-lapack") == (flops > LAPACK_THREAD_FLOPS)

    def fail() -> None:
        raise np.linalg.LinAlgError("not positive definite")

    with pytest.raises(np.linalg.LinAlgError, match="not positive definite"):
        interruptible(fail, flops=flops)


def test_cost_models_grow_as_cubes() -> None:
    assert eigh_seconds(2048) == pytest.approx(8 * eigh_seconds(1024))
    assert svd_seconds(2048, 1024) == pytest.approx(8 * svd_seconds(1024, 512))
    assert svd_seconds(100, 3000) == svd_seconds(3000, 100)
    small, large = predict_eigen_design_seconds(256), predict_eigen_design_seconds(2048)
    assert 0 < small < large
    assert large == pytest.approx(0.005 + 5 * eigh_seconds(2048))


@pytest.mark.parametrize("value", [0, -3, 2.5, True])
def test_eigen_predictor_validates_sizes(value: object) -> None:
    with pytest.raises(ValueError, match=re.escape(f"num_cells ({value!r}) must be an integer")):
        predict_eigen_design_seconds(value)  # type: ignore[arg-type]
