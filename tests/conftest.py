"""Shared test configuration.

Prefect and dprelease state go to a temporary home (set before Prefect is imported).  Tests that
run flows use the session-scoped ``prefect_harness`` fixture (one temporary Prefect server for the
whole session, generous start-up timeout); pure code is tested without Prefect.
"""

from __future__ import annotations

import contextlib
import os
import tempfile

_HOME = tempfile.mkdtemp(prefix="dprelease-tests-")
os.environ["DPRELEASE_HOME"] = os.path.join(_HOME, "dprelease")
os.environ["PREFECT_HOME"] = os.path.join(_HOME, "prefect")
os.environ.setdefault("PREFECT_RESULTS_LOCAL_STORAGE_PATH", os.path.join(_HOME, "prefect-results"))
os.environ["DO_NOT_TRACK"] = "1"
# Multi-threaded BLAS only contends on small matrices on 2 cores (10-50x slower under load).
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ["PREFECT_SERVER_ANALYTICS_ENABLED"] = "false"
os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")
os.environ["PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS"] = "300"
os.environ["PREFECT_UI_ENABLED"] = "false"
os.makedirs(os.environ["PREFECT_HOME"], exist_ok=True)
# a shared local server started by a CLI test stops itself soon after the session (tests that start
# one also stop it by PID)
os.environ["DPRELEASE_SERVER_IDLE_SECONDS"] = "60"
# the migrated, empty Prefect database (flows/server.py, keyed by Prefect's version) is shared by the
# xdist workers and by later runs: the suite migrates at most once (tests/prefect_template.py)
os.environ["DPRELEASE_CACHE_DIR"] = os.path.join(tempfile.gettempdir(), "dprelease-test-cache")
os.environ.pop("DPRELEASE_CATALOG_URL", None)
os.environ.pop("PREFECT_API_URL", None)

from collections.abc import Iterator  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import numpy as np  # noqa: E402
import pytest  # noqa: E402
from _pytest.nodeid import coerce_node_id  # noqa: E402

# a real PostgreSQL server for the session, and catalog URLs on both backends (tests/pg_server.py)
from tests.pg_server import catalog_url, postgres_server  # noqa: E402, F401

# --- parallel runs (pytest-xdist, ``-n 3 --dist loadgroup --no-loadscope-reorder`` in addopts) -----
# Each worker is its own process with its own temporary home, Prefect test server, PostgreSQL and
# Dask cluster (session-scoped fixtures are per worker).  Tests go one at a time to whichever worker
# is free, except: a module with a module- or class-scoped fixture (a started server, a release
# built once) runs on one worker, so that set-up is paid once; the tests that use the session's
# Dask cluster share one worker, so one cluster starts.  The longest tests are handed out first
# (a long test started last is the run's tail).  The two longest mostly wait (on cron minutes, on
# deployed runs), so the next worker gets CPU-bound work meanwhile: the unit tests, then the
# modules with a server of their own, then the flow tests, and last the short privacy,
# statistical and architecture tests, so the run ends on short tests.
LONGEST_FIRST = (
    "tests/flows/test_series_arrival.py",  # 24 arrivals, one deployed run each
    "tests/flows/test_operations_e2e.py::test_scheduled_",  # ≥ 5 cron ticks of one minute
    "tests/statistical/test_interval_coverage.py::test_dawa_",
    "tests/statistical/test_interval_coverage.py::test_data_independent_",
    "tests/statistical/test_interval_coverage.py::test_lrm_",
    "tests/statistical/test_derived_std_error.py",
)


def _group(item: pytest.Item) -> str | None:
    fixtures = getattr(item, "_fixtureinfo", None)
    names = fixtures.names_closure if fixtures is not None else ()
    if "dask_address" in names:
        return "dask"
    defs = fixtures.name2fixturedefs if fixtures is not None else {}
    if any(d.scope in ("module", "class", "package") for ds in defs.values() for d in ds):
        return item.path.stem
    return None


# --- the fast tier: pytest tests/unit tests/architecture -m fast (README).  ``services`` marks a
# test that needs a server process: the Prefect test server, PostgreSQL, a Dask cluster, or one its
# module starts itself; ``slow`` one of the few pure-code tests of several seconds; ``fast`` what is
# left of tests/unit and tests/architecture (no flow, statistical, services or slow mark).
SERVICE_FIXTURES = frozenset({"prefect_harness", "postgres_server", "dask_address"})
SERVICE_MODULES = frozenset(
    {
        "tests/unit/catalog/test_validation_service.py",  # the GX validation service
        "tests/unit/catalog/test_engine.py",  # local Dask clusters
        "tests/unit/test_pg_server.py",  # PostgreSQL
        "tests/unit/test_run_starter.py",  # the run starter
    }
)

SLOW = (  # nodeid prefixes
    "tests/unit/catalog/test_validation_batches.py",  # Great Expectations suites
    "tests/unit/catalog/test_docs_views.py",
    "tests/unit/catalog/test_validation_intervals.py",
    "tests/unit/catalog/test_pgm_release.py",  # releases, then synthetic data
    "tests/unit/catalog/test_artifacts.py",  # a release built once for the module
    "tests/unit/mechanisms/test_gram.py::test_eigen_design_plans_all_ranges_of_2048_cells",
    "tests/unit/test_ldp.py::test_optimizer_prefix_128_beats_the_reference_code",
)
FAST_PATHS = ("tests/unit/", "tests/architecture/")


def _needs_services(item: pytest.Item) -> bool:
    fixtures = getattr(item, "_fixtureinfo", None)
    if fixtures is not None and SERVICE_FIXTURES & set(fixtures.names_closure):
        return True
    callspec = getattr(item, "callspec", None)
    if callspec is not None and callspec.params.get("catalog_url") == "postgresql":
        return True
    return item.nodeid.split("::", 1)[0] in SERVICE_MODULES


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if _needs_services(item):
            item.add_marker(pytest.mark.services)
        if item.nodeid.startswith(SLOW):
            item.add_marker(pytest.mark.slow)
        marked = {"flow", "statistical", "services", "slow"} & {m.name for m in item.iter_markers()}
        if item.nodeid.startswith(FAST_PATHS) and not marked:
            item.add_marker(pytest.mark.fast)
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return  # a serial run keeps the collection order
    for item in items:
        group = _group(item)
        if group is not None:
            # what --dist loadgroup does with an xdist_group mark: pytest-xdist 3.8 sets
            # item._nodeid, which pytest 9 no longer reads (the nodeid comes from item._id)
            item._id = coerce_node_id(f"{item.nodeid}@{group}")

    def rank(item: pytest.Item) -> int:
        hits = [i for i, prefix in enumerate(LONGEST_FIRST) if item.nodeid.startswith(prefix)]
        if hits:
            return hits[0]
        grouped = _group(item) is not None
        if item.nodeid.startswith("tests/unit/") and not grouped:
            return len(LONGEST_FIRST)
        if grouped:
            return len(LONGEST_FIRST) + 1
        return len(LONGEST_FIRST) + (2 if item.nodeid.startswith("tests/flows/") else 3)

    items.sort(key=rank)  # stable: the collection order within a rank


@pytest.fixture(scope="session")
def prefect_harness() -> Iterator[None]:
    import prefect.testing.utilities as harness

    from tests.prefect_template import NO_BLOCK_REGISTRATION, seed_prefect_db

    def seeded_mkdtemp() -> str:
        # the harness keeps its SQLite database in a folder it makes with mkdtemp; the migrated
        # template copied there first spares its server the migrations (same schema, same rows)
        folder = tempfile.mkdtemp(prefix="dprelease-harness-")
        seed_prefect_db(Path(folder) / "prefect-test.db")
        return folder

    with pytest.MonkeyPatch.context() as patch, contextlib.ExitStack() as stack:
        patch.setattr(harness, "mkdtemp", seeded_mkdtemp)
        with pytest.MonkeyPatch.context() as starting:  # the server's environment only
            for name, value in NO_BLOCK_REGISTRATION.items():
                starting.setenv(name, value)
            stack.enter_context(harness.prefect_test_harness(server_startup_timeout=300))
        # in-process flow runs go as in `dprelease run` and a deployed run's release subflow:
        # without heartbeats, whose thread sleeps in 1 s steps and is joined at each run's end
        from prefect.settings import PREFECT_FLOWS_HEARTBEAT_FREQUENCY, temporary_settings

        stack.enter_context(temporary_settings({PREFECT_FLOWS_HEARTBEAT_FREQUENCY: None}))
        yield


@pytest.fixture
def rng() -> np.random.Generator:
    """Public randomness for test data, from a fixed seed."""
    return np.random.default_rng(20261122)


@pytest.fixture
def zero_noise(monkeypatch: pytest.MonkeyPatch):
    """Replace the production sampler with the zero-noise oracle for this test only."""
    from dprelease.mechanisms.primitives import noise
    from tests.samplers import ZeroNoise

    sampler = ZeroNoise()
    monkeypatch.setattr(noise, "production_sampler", lambda: sampler)
    return sampler


@pytest.fixture(scope="session")
def dask_logs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where the session's Dask scheduler and workers write their logs."""
    return tmp_path_factory.mktemp("dask")


_DASK: dict[str, Any] = {}  # this process's running cluster: its address and its ExitStack


@pytest.fixture
def dask_address(dask_logs: Path) -> str:
    """A Dask scheduler and two 2 GB workers on loopback, started by the ``dask`` CLI
    (:mod:`tests.dask_cluster`) for the first test that needs it and stopped by PID after the last
    of a row of such tests (:func:`pytest_runtest_teardown`; under xdist they are one group on one
    worker, so one cluster starts), not left idling until the session ends."""
    if "address" not in _DASK:
        from tests.dask_cluster import dask_cluster

        stack = contextlib.ExitStack()
        _DASK["address"] = stack.enter_context(dask_cluster(dask_logs))
        _DASK["stack"] = stack
    return str(_DASK["address"])


def _stop_dask() -> None:
    stack = _DASK.pop("stack", None)
    _DASK.pop("address", None)
    if stack is not None:
        stack.close()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """Stop the Dask cluster once the next test does not use it, after this test's fixtures
    (a client of the cluster) were torn down."""
    result = yield
    if "address" in _DASK and (nextitem is None or "dask_address" not in _fixtures(nextitem)):
        _stop_dask()
    return result


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    _stop_dask()


def _fixtures(item: pytest.Item) -> tuple[str, ...]:
    info = getattr(item, "_fixtureinfo", None)
    return tuple(info.names_closure) if info is not None else ()
