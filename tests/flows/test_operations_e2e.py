"""Operations end to end, with real processes started the way ``deploy/README.md`` says.

For each catalog backend (SQLite in ``DPRELEASE_HOME``; PostgreSQL through
``DPRELEASE_CATALOG_URL``), concurrently, in its own temporary ``DPRELEASE_HOME`` and run registry:
``deploy/start-server.sh`` (a free loopback port), ``deploy/start-worker.sh``, ``dprelease deploy``,
``deploy/start-watcher.sh``; then, for at least ``TICKS`` cron ticks (one a minute):

* two cron deployments of one dataset fire at every tick; the dataset's work queue hands out one
  run at a time, so no run of the dataset is Pending or Running while another one is (a run that
  paused for review does not count: its release is staged and the dataset is free);
* the first run of each series releases and pauses; ``dprelease review`` resumes it (the decision
  reaches the catalog through the paused run); every later tick finds the input unchanged and
  skips with nothing charged (the dataset's spending does not move, ``skipped`` entries grow);
* two new files dropped in the landing folder are announced by the watcher, released by the
  arrival deployment and reviewed the same way;
* every run that started ends in a terminal state within a bounded wait, and ``deploy/stop.sh``
  leaves no process behind: none of the server, worker, watcher and flow-run processes, nor any
  process of their process groups.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from uuid import UUID

import pytest
import yaml

from dprelease.catalog.ledger.store import Catalog
from dprelease.catalog.watch_state import ReviewRuns
from tests.flows.test_operations import (
    _children,
    _free_port,
    _runs_with,
    _spec,
    _write_tiny_parquet,
)
from tests.prefect_template import migrated_prefect_db

pytestmark = [pytest.mark.flow]

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
TICKS = 5  # cron ticks every cron deployment must have completed
EVERY_MINUTE = "* * * * *"
SETUP_TIMEOUT = 300.0  # server start (16-34 s measured, two at once on 2 shared cores) + deploy
OBSERVE_TIMEOUT = (TICKS + 3) * 60.0  # first tick within a minute of deploying, plus slack
SETTLE_TIMEOUT = 180.0  # started runs end after the last tick (a run: 16-30 s measured)
EXIT_GRACE = 30.0  # seconds a process may take to exit once stop.sh returned
REVIEW_TIMEOUT = 600  # seconds a deployed run waits for its reviewer


@dataclass(kw_only=True)
class Stack:
    """One deployment of dprelease (server, worker, watcher) and what the test saw of it."""

    label: str
    base: Path
    env: dict[str, str]
    catalog_url: str
    api_url: str
    cron_dataset: str
    arrival_dataset: str
    landing: Path
    max_active_cron_runs: int = 0
    max_flow_processes: int = 0
    seen_paused: set[UUID] = field(default_factory=set)
    flow_processes: dict[int, tuple[str, int]] = field(default_factory=dict)  # pid -> (start, pgid)
    engine_groups: dict[int, int] = field(default_factory=dict)  # pid -> pgid, once it runs
    forked_runs: set[int] = field(default_factory=set)  # runs the worker's run starter forked
    reviews: dict[str, subprocess.Popen[str]] = field(default_factory=dict)

    def script(self, name: str, *args: str, timeout: float = 240.0) -> str:
        done = subprocess.run(
            ["bash", str(ROOT / "deploy" / name), *args],
            env=self.env,
            cwd=self.base,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
            start_new_session=True,
        )
        assert done.returncode == 0, f"{name}: {done.stdout}{done.stderr}\n{self.diagnostics()}"
        return done.stdout

    def cli(self, *args: str, timeout: float = 180.0) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(BIN / "dprelease"), *args],
            env=self.env,
            cwd=self.base,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    def diagnostics(self) -> str:
        logs = sorted((self.base / "home" / "run").glob("*.log"))
        return f"[{self.label}]\n" + "\n".join(
            f"--- last lines of {path.name} ---\n" + "\n".join(path.read_text().splitlines()[-30:])
            for path in logs
        )

    @contextlib.contextmanager
    def api(self) -> Iterator[Any]:
        from prefect.client.orchestration import get_client
        from prefect.settings import PREFECT_API_URL, temporary_settings

        with (
            temporary_settings(updates={PREFECT_API_URL: self.api_url}),
            get_client(sync_client=True) as client,
        ):
            yield client


def _registered(stack: Stack) -> dict[str, tuple[int, str]]:
    """The run registry of the deploy scripts: name -> (pid, start time)."""
    found = {}
    for path in (stack.base / "registry").glob("*.run"):
        fields = dict(line.split("=", 1) for line in path.read_text().splitlines() if "=" in line)
        found[path.name.removesuffix(".run")] = (int(fields["pid"]), fields["start"])
    return found


def _stat(pid: int) -> tuple[str, int] | None:
    """(start time, process group) of a live process, None when it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return fields[19], int(fields[2])


def _runs_the_engine(pid: int) -> bool:
    try:
        return b"prefect.engine" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def _is_run_starter(pid: int) -> bool:
    try:
        return b"dprelease.flows.run_starter" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def _make_stack(label: str, base: Path, catalog_url: str | None) -> Stack:
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "DPRELEASE_"))}
    migrated_prefect_db()  # start-server.sh seeds the new PREFECT_HOME from it, as after install.sh
    env.update(
        DPRELEASE_CACHE_DIR=os.environ["DPRELEASE_CACHE_DIR"],
        DO_NOT_TRACK="1",
        PREFECT_SERVER_ANALYTICS_ENABLED="false",
        PREFECT_UI_ENABLED="false",
        PREFECT_LOGGING_LEVEL="INFO",
        PREFECT_WORKER_QUERY_SECONDS="2",
        PREFECT_WORKER_PREFETCH_SECONDS="2",
        DPRELEASE_HOME=str(base / "home"),
        DPRELEASE_RUN_REGISTRY=str(base / "registry"),
        DPRELEASE_VENV=str(BIN.parent),
        DPRELEASE_SERVER_PORT=str(port),
        PREFECT_API_URL=f"http://127.0.0.1:{port}/api",  # what start-server.sh says to export
        PREFECT_HOME=str(base / "home" / "prefect"),
        DPRELEASE_LANDING=str(base / "landing"),
        DPRELEASE_SPECS=str(base / "specs"),
        DPRELEASE_WATCH_INTERVAL="1",
    )
    if catalog_url is not None:
        env["DPRELEASE_CATALOG_URL"] = catalog_url
    suffix = base.name[-8:].replace("_", "-")
    stack = Stack(
        label=label,
        base=base,
        env=env,
        catalog_url=catalog_url or f"sqlite:///{base / 'home' / 'catalog.db'}",
        api_url=env["PREFECT_API_URL"],
        cron_dataset=f"e2e-cron-{suffix}",
        arrival_dataset=f"e2e-arrival-{suffix}",
        landing=base / "landing",
    )
    data = base / "data" / "fixed.parquet"
    _write_tiny_parquet(data, seed=11)
    (stack.landing / stack.arrival_dataset).mkdir(parents=True)
    specs = base / "specs"
    specs.mkdir()
    schedule = {"cron": EVERY_MINUTE, "timezone": "UTC"}
    for spec in (
        _spec("e2e-cron-a", stack.cron_dataset, data, cap=5.0, schedule=schedule),
        _spec("e2e-cron-b", stack.cron_dataset, data, cap=5.0, schedule=schedule),
        _spec(
            "e2e-arrival",
            stack.arrival_dataset,
            stack.landing / stack.arrival_dataset,
            cap=5.0,
            trigger="arrival",
        ),
    ):
        (specs / f"{spec['name']}.yaml").write_text(yaml.safe_dump(spec))
    return stack


def _start(stack: Stack) -> dict[str, UUID]:
    """The scripts of deploy/README.md, in its order; returns the deployment ids by name."""
    stack.script("start-server.sh", timeout=SETUP_TIMEOUT)
    stack.script("start-worker.sh")
    deployed = stack.cli(
        "deploy", str(stack.base / "specs"), "--review-timeout", str(REVIEW_TIMEOUT)
    )
    assert deployed.returncode == 0, deployed.stdout + deployed.stderr + stack.diagnostics()
    stack.script("start-watcher.sh")
    with stack.api() as client:
        return {
            name: client.read_deployment_by_name(f"release-deployment/{name}").id
            for name in ("e2e-cron-a", "e2e-cron-b", "e2e-arrival")
        }


def _observe(
    stack: Stack,
    client: Any,
    deployments: dict[str, UUID],
    worker_pid: int,
    *,
    catalog: Catalog,
    awaiting: ReviewRuns,
) -> list[Any]:
    """One sample (one a second; ``client``, ``catalog`` and ``awaiting`` stay open across samples:
    a new client cost 45 ms of CPU, a new catalog object opens and checks its database, on
    PostgreSQL in a new server process): runs of the stack's deployments that left the Scheduled
    state; records what the assertions need and starts ``dprelease review`` for every release whose
    run is paused.  The scheduler keeps an hour of every-minute runs ahead (about 60 Scheduled runs
    per cron deployment); none of them is ever asserted on, and reading them each second cost more
    CPU than the rest of the test's sampling."""
    from prefect.client.schemas.objects import StateType

    runs = _runs_with(client, *deployments.values())
    cron_ids = {deployments["e2e-cron-a"], deployments["e2e-cron-b"]}
    for run in runs:
        if run.state is not None and run.state.is_paused():
            stack.seen_paused.add(run.id)
    active = [
        run
        for run in runs
        if run.deployment_id in cron_ids
        and run.state is not None
        and run.state.type in (StateType.PENDING, StateType.RUNNING)
        and run.id not in stack.seen_paused  # resumed for its review: the release is staged
    ]
    stack.max_active_cron_runs = max(stack.max_active_cron_runs, len(active))
    children = _children(worker_pid)
    stack.max_flow_processes = max(stack.max_flow_processes, len(children))
    for pid in children:
        stat = _stat(pid)
        if stat is not None:
            stack.flow_processes.setdefault(pid, stat)
            if _runs_the_engine(pid):  # after flows/flow_run_process.py's setsid and exec
                stack.engine_groups.setdefault(pid, stat[1])
            if _is_run_starter(pid):  # its children are the runs it forked (flows/run_starter.py)
                for run in _children(pid):
                    if (run_stat := _stat(run)) is not None:
                        stack.flow_processes.setdefault(run, run_stat)
                        # the latest sample: a run seen in the instant between fork and setsid
                        # is still in the starter's group
                        stack.engine_groups[run] = run_stat[1]
                        stack.forked_runs.add(run)
    for record in catalog.releases(status="staged"):
        run = awaiting.get(record.id)
        if (
            record.id not in stack.reviews
            and run is not None
            and UUID(run.flow_run_id) in stack.seen_paused
        ):
            stack.reviews[record.id] = subprocess.Popen(
                [str(BIN / "dprelease"), "review", record.id, "--approve", "--reviewer", "Ada"],
                env=stack.env,
                cwd=stack.base,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
    return runs


def _ticks_done(runs: list[Any], deployment_id: UUID) -> int:
    return sum(
        1
        for run in runs
        if run.deployment_id == deployment_id
        and run.auto_scheduled
        and run.state is not None
        and run.state.is_final()
    )


def _scenario(stack: Stack) -> None:
    deployments = _start(stack)
    worker_pid = _registered(stack)["worker"][0]
    catalog = Catalog(stack.catalog_url)
    awaiting = ReviewRuns(stack.catalog_url)
    arrivals = [stack.landing / stack.arrival_dataset / f"day-{day}.parquet" for day in (1, 2)]
    _write_tiny_parquet(arrivals[0], seed=21)
    with stack.api() as client:  # one client for every sample
        spent_after_first_releases: float | None = None
        deadline = time.monotonic() + OBSERVE_TIMEOUT
        while True:
            runs = _observe(
                stack, client, deployments, worker_pid, catalog=catalog, awaiting=awaiting
            )
            ticks = min(_ticks_done(runs, deployments[n]) for n in ("e2e-cron-a", "e2e-cron-b"))
            published = catalog.releases(dataset_id=stack.cron_dataset, status="published")
            if spent_after_first_releases is None and len(published) == 2:
                spent_after_first_releases = catalog.spent(stack.cron_dataset).epsilon
            if ticks >= 2 and not arrivals[1].exists():
                _write_tiny_parquet(arrivals[1], seed=22)  # a second file, a few minutes later
            if ticks >= TICKS and spent_after_first_releases is not None:
                break
            assert time.monotonic() < deadline, (
                f"{ticks} of {TICKS} ticks after {OBSERVE_TIMEOUT:.0f} s\n{stack.diagnostics()}"
            )
            time.sleep(1.0)

        # every run that started (left Scheduled) ends (its review, if any, is under way)
        deadline = time.monotonic() + SETTLE_TIMEOUT
        while True:
            runs = _observe(
                stack, client, deployments, worker_pid, catalog=catalog, awaiting=awaiting
            )
            unfinished = [run for run in runs if run.state is not None and not run.state.is_final()]
            arrived = catalog.releases(dataset_id=stack.arrival_dataset)
            if not unfinished and len(arrived) == 2 and all(r.status != "staged" for r in arrived):
                break
            assert time.monotonic() < deadline, (
                "runs not finished: "
                + ", ".join(f"{run.name} {run.state.name}" for run in unfinished)
                + f"; arrival releases {[r.status for r in arrived]}\n{stack.diagnostics()}"
            )
            time.sleep(1.0)

    # each flow-run process leads a process group of its own (flows/flow_run_process.py), and the
    # runs are forked by the worker's run starter (flows/run_starter.py)
    assert stack.engine_groups and all(pgid == pid for pid, pgid in stack.engine_groups.items()), (
        stack.engine_groups
    )
    assert stack.forked_runs, stack.engine_groups
    # no pile-up: never two runs of the cron dataset pending or running at once
    assert stack.max_active_cron_runs == 1, stack.max_active_cron_runs
    failed = [run for run in runs if run.state is not None and run.state.is_final()]
    assert all(run.state.is_completed() for run in failed), [
        (run.name, run.state.name, run.state.message) for run in failed
    ]
    # unchanged input: the two series released once each, every later tick skipped uncharged
    assert catalog.spent(stack.cron_dataset).epsilon == pytest.approx(spent_after_first_releases)
    assert spent_after_first_releases == pytest.approx(2.0)
    entries = catalog.ledger_entries(stack.cron_dataset)
    assert sum(e.kind == "charge" for e in entries) == 2
    assert sum(e.kind == "skipped" for e in entries) >= 2 * TICKS - 2
    # new files release, and the paused runs were resumed by `dprelease review`
    assert [r.status for r in catalog.releases(dataset_id=stack.arrival_dataset)] == [
        "published",
        "published",
    ]
    assert len(stack.reviews) == 4, sorted(stack.reviews)
    for release_id, review in stack.reviews.items():
        output, _ = review.communicate(timeout=120)
        assert review.returncode == 0, output
        assert f"{release_id}: published (decided through flow run" in output, output


def _stop_everything(stack: Stack) -> None:
    """``deploy/stop.sh``, then: no recorded process, flow-run process or member of their process
    groups is left."""
    recorded = _registered(stack)
    groups = {stat[1] for pid, _ in recorded.values() if (stat := _stat(pid)) is not None}
    groups |= {pgid for _, pgid in stack.flow_processes.values()}
    groups.discard(os.getpgrp())  # never this test's own group
    stack.script("stop.sh", timeout=180.0)

    def left_behind() -> list[str]:
        left = [
            f"{name} (pid {pid})"
            for name, (pid, start) in recorded.items()
            if (stat := _stat(pid)) is not None and stat[0] == start
        ]
        left += [
            f"flow run (pid {pid})"
            for pid, (start, _) in stack.flow_processes.items()
            if (stat := _stat(pid)) is not None and stat[0] == start
        ]
        for entry in Path("/proc").iterdir():
            stat = _stat(int(entry.name)) if entry.name.isdigit() else None
            if stat is not None and stat[1] in groups:
                left.append(f"pid {entry.name} of process group {stat[1]}")
        return left

    # a finished run's process may still be flushing its logs and events when stop.sh returns
    # (seen once under load): it must be gone within EXIT_GRACE, not at the same instant
    deadline = time.monotonic() + EXIT_GRACE
    while (left := left_behind()) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not left, f"left behind after deploy/stop.sh: {left}\n{stack.diagnostics()}"


def _run(stack: Stack) -> Stack:
    try:
        _scenario(stack)
    finally:
        for review in stack.reviews.values():
            if review.poll() is None:
                review.kill()
                review.wait(timeout=10)
        _stop_everything(stack)
    return stack


def test_scheduled_and_arrival_releases_run_reviewed_and_stop_cleanly_on_both_catalogs(
    tmp_path: Path, postgres_server: Any
) -> None:
    stacks = [
        _make_stack("sqlite", tmp_path / "sqlite", None),
        _make_stack("postgresql", tmp_path / "pg", postgres_server.create_database("e2e")),
    ]
    with ThreadPoolExecutor(max_workers=len(stacks)) as pool:
        finished = [future.result() for future in [pool.submit(_run, s) for s in stacks]]
    for stack in finished:
        print(
            f"{stack.label}: at most {stack.max_active_cron_runs} run of the cron dataset active, "
            f"{stack.max_flow_processes} flow-run processes at once, "
            f"{len(stack.flow_processes)} flow-run processes in all"
        )


def test_every_deployment_of_a_dataset_goes_to_its_one_run_at_a_time_queue(tmp_path: Path) -> None:
    from dprelease.catalog.spec.load import load_spec
    from dprelease.flows.deployments import build_deployment, dataset_queue_name

    data = tmp_path / "data.parquet"
    _write_tiny_parquet(data, seed=3)
    queues = set()
    for name in ("one", "two"):
        path = tmp_path / f"{name}.yaml"
        path.write_text(yaml.safe_dump(_spec(name, "shared", data, cap=5.0)))
        queues.add(build_deployment(path, load_spec(path)).work_queue_name)
    assert queues == {dataset_queue_name("shared")} == {"dataset-shared"}


def test_deploy_prefect_yaml_puts_each_deployment_in_its_dataset_queue() -> None:
    from dprelease.catalog.spec.load import load_spec
    from dprelease.flows.deployments import dataset_queue_name

    config = yaml.safe_load((ROOT / "deploy" / "prefect.yaml").read_text())
    for entry in config["deployments"]:
        spec = load_spec(ROOT / entry["parameters"]["spec_path"])
        assert entry["work_pool"]["work_queue_name"] == dataset_queue_name(spec.dataset.id)
