"""Operations against a real ``prefect server start`` and a real process worker.

The module starts its own server on 127.0.0.1 (a free port, its own PREFECT_HOME) and a worker on
the ``dprelease-process`` pool, registers deployments with ``dprelease deploy`` (a subprocess, as
an operator would), and proves:

* a deployment with a short interval schedule runs a release (which pauses for review, and a
  rejection through ``dprelease review`` resumes the paused run and keeps the budget spent);
* an arrival event emitted by ``dprelease watch`` starts a release of exactly that file;
* a paused release approved through the Prefect API gets published (and invalid input is refused
  while the run stays paused);
* a second concurrent release of the same dataset waits for the first (one slot per dataset),
  and a run nobody reviews in time fails while its release stays staged for ``dprelease review``;
* a file changed after its announcement is refused before any budget is spent.

Without a server: what ``dprelease deploy`` builds for a spec, that ``deploy/prefect.yaml``
matches the example specs and the flow, the ``budget`` timeline, and every validator.

Every wait is bounded; the worker and the server are stopped by PID at the end (SIGTERM, then
SIGINT, then SIGKILL).  In-process Prefect calls are pointed at this server explicitly with
``temporary_settings``, so the session's ``prefect_test_harness`` (if running) is untouched.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import sqlite3
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar
from uuid import UUID

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from dprelease.catalog.ledger.store import Catalog
from dprelease.catalog.publishing import artifacts
from dprelease.catalog.watch_state import ReviewRuns
from dprelease.flows.flow_run_process import COMMAND
from tests.prefect_template import NO_BLOCK_REGISTRATION, seed_prefect_db

pytestmark = [pytest.mark.flow]

BIN = Path(sys.executable).parent
POOL = "dprelease-process"
SERVER_START_TIMEOUT = 240.0  # a fresh database runs all migrations: 16-30 s measured, 2 cores
RUN_TIMEOUT = 240.0  # worker pick-up + a flow-run process (imports prefect and GX) + the release
T = TypeVar("T")


def keyed(data: bytes, catalog_url: str | None = None) -> str:
    """The watcher's fingerprint of ``data``: HMAC-SHA256 under the catalog's key."""
    from dprelease.catalog.keys import catalog_key
    from dprelease.catalog.ledger.database import default_url

    return catalog_key(catalog_url or default_url()).fingerprint([data])


@dataclass(frozen=True, kw_only=True)
class Operations:
    """The running server and worker, and the environment operators' commands run with."""

    api_url: str
    base: Path
    env: dict[str, str]
    catalog_url: str
    specs: dict[str, Path]
    landing: Path
    logs: dict[str, Path]

    def diagnostics(self) -> str:
        return "\n".join(
            f"--- last lines of {name} log ---\n" + "\n".join(path.read_text().splitlines()[-40:])
            for name, path in self.logs.items()
            if path.exists()
        )

    def cli(self, *args: str, timeout: float = 180.0) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(BIN / "dprelease"), *args],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
            cwd=self.base,
            check=False,
        )

    @contextlib.contextmanager
    def api(self) -> Iterator[Any]:
        """A sync Prefect client of *this* server."""
        from prefect.client.orchestration import get_client
        from prefect.settings import PREFECT_API_URL, temporary_settings

        with (
            temporary_settings(updates={PREFECT_API_URL: self.api_url}),
            get_client(sync_client=True) as client,
        ):
            yield client


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _healthy(api_url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{api_url}/health", timeout=2) as response:
            return response.status == 200 and json.loads(response.read()) is True
    except (OSError, ValueError):
        return False


def _wait_for(
    check: Callable[[], T | None], *, what: str, timeout: float, ops: Operations | None = None
) -> T:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(
                f"timed out after {timeout:.0f} s waiting for {what}\n"
                + (ops.diagnostics() if ops else "")
            )
        time.sleep(1.0)


def _children(pid: int) -> list[int]:
    """PIDs whose parent is ``pid`` (the flow-run processes a worker started)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                stat = (entry / "stat").read_text()
                if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                    found.append(int(entry.name))
    return found


def _stop(process: subprocess.Popen[bytes], *, grace: tuple[float, float] = (5.0, 20.0)) -> None:
    """SIGTERM, then SIGINT (a Prefect worker does not stop on SIGTERM), then SIGKILL; bounded waits."""
    for sig, wait in ((signal.SIGTERM, grace[0]), (signal.SIGINT, grace[1])):
        if process.poll() is not None:
            return
        process.send_signal(sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=wait)
    if process.poll() is None:
        process.kill()
        process.wait(timeout=10)


def _write_tiny_parquet(path: Path, *, seed: int) -> None:
    rng = np.random.default_rng(seed)  # public randomness: synthetic test data
    rows = 400
    table = pa.table(
        {
            "a": pa.array(rng.integers(0, 10, rows), pa.int16()),
            "b": pa.array(rng.choice(["x", "y", "z"], rows)),
        }
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    scratch = path.with_name(path.name + ".tmp")  # written, then renamed: what the watcher expects
    pq.write_table(table, scratch)
    scratch.rename(path)


def _spec(name: str, dataset_id: str, source: Path, *, cap: float, **extra: Any) -> dict[str, Any]:
    return {
        "name": name,
        "dataset": {"id": dataset_id, "source": str(source), "budget": {"epsilon": cap}},
        "domain": {"a": {"min": 0, "max": 9}, "b": {"values": ["x", "y", "z"]}},
        "workload": [
            {"name": "a_by_b", "marginal": ["a", "b"]},
            {"name": "a_cdf", "prefix": "a"},
        ],
        "mechanism": "identity",
        "privacy": {"epsilon": 1.0},
        **extra,
    }


@pytest.fixture(scope="module")
def ops(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Operations]:
    base = tmp_path_factory.mktemp("operations")
    data = base / "data" / "tiny.parquet"
    _write_tiny_parquet(data, seed=7)
    landing = base / "landing"
    (landing / "ops-arrival").mkdir(parents=True)
    specs_dir, schedule_dir = base / "specs", base / "scheduled"
    specs_dir.mkdir()
    schedule_dir.mkdir()
    specs = {
        "scheduled": (schedule_dir, _spec("ops-scheduled", "ops-sched", data, cap=1.0)),
        "arrival": (
            specs_dir,
            _spec(
                "ops-arrival", "ops-arrival", landing / "ops-arrival", cap=5.0, trigger="arrival"
            ),
        ),
        "manual": (specs_dir, _spec("ops-manual", "ops-manual", data, cap=5.0)),
        "serial": (specs_dir, _spec("ops-serial", "ops-serial", data, cap=5.0)),
        "two": (specs_dir, _spec("ops-two", "ops-two", data, cap=5.0, review={"approvers": 2})),
    }
    spec_paths = {}
    for key, (folder, spec) in specs.items():
        spec_paths[key] = folder / f"{spec['name']}.yaml"
        spec_paths[key].write_text(yaml.safe_dump(spec))
    with serve(base, specs=spec_paths, landing=landing, deploy=[str(specs_dir)]) as operations:
        yield operations


@contextlib.contextmanager
def serve(
    base: Path,
    *,
    specs: dict[str, Path],
    landing: Path,
    deploy: list[str],
    review_timeout: int = 600,
    pool_limit: int | None = None,
    worker_env: dict[str, str] | None = None,
) -> Iterator[Operations]:
    """A ``prefect server`` on a free loopback port (its own PREFECT_HOME under ``base``), then
    ``dprelease deploy *deploy``, then a process worker (``pool_limit``: flow runs at a time);
    everything is stopped by PID on exit."""
    port = _free_port()
    api_url = f"http://127.0.0.1:{port}/api"
    quiet = {
        "DO_NOT_TRACK": "1",
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "PREFECT_UI_ENABLED": "false",
        "PREFECT_LOGGING_LEVEL": "INFO",
    }
    server_env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    server_env.update(quiet, PREFECT_HOME=str(base / "server-home"), **NO_BLOCK_REGISTRATION)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "DPRELEASE_"))}
    env.update(
        quiet,
        PREFECT_API_URL=api_url,
        PREFECT_HOME=str(base / "client-home"),
        DPRELEASE_HOME=str(base / "dprelease"),
        PREFECT_WORKER_QUERY_SECONDS="1",
        PREFECT_WORKER_PREFETCH_SECONDS="2",
    )
    logs = {"server": base / "server.log", "worker": base / "worker.log"}
    seed_prefect_db(base / "server-home" / "prefect.db")  # migrated once per suite, then copied
    server_log = open(logs["server"], "wb")  # noqa: SIM115 - closed at teardown
    server = subprocess.Popen(
        [
            str(BIN / "prefect"),
            *("server", "start", "--host", "127.0.0.1", "--port", str(port)),
            *("--analytics-off", "--no-ui"),
        ],
        env=server_env,
        stdout=server_log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    worker: subprocess.Popen[bytes] | None = None
    worker_log = open(logs["worker"], "wb")  # noqa: SIM115 - closed at teardown
    operations = Operations(
        api_url=api_url,
        base=base,
        env=env,
        catalog_url=f"sqlite:///{base / 'dprelease' / 'catalog.db'}",
        specs=specs,
        landing=landing,
        logs=logs,
    )
    flow_processes: list[int] = []
    try:
        _wait_for(
            lambda: server.poll() is None and _healthy(api_url),
            what=f"the Prefect server on port {port} (exit code {server.poll()})",
            timeout=SERVER_START_TIMEOUT,
            ops=operations,
        )
        deployed = operations.cli("deploy", *deploy, "--review-timeout", str(review_timeout))
        assert deployed.returncode == 0, deployed.stdout + deployed.stderr
        if pool_limit is not None:
            from prefect.client.schemas.actions import WorkPoolUpdate

            with operations.api() as client:
                client.update_work_pool(POOL, WorkPoolUpdate(concurrency_limit=pool_limit))
        worker = subprocess.Popen(
            # as deploy/start-worker.sh runs it: a GX validation service beside the worker
            [
                str(BIN / "python"),
                "-m",
                "dprelease.flows.worker_host",
                "--",
                str(BIN / "prefect"),
                "worker",
                "start",
                "--pool",
                POOL,
                "--install-policy",
                "never",
            ],
            env={**env, **(worker_env or {})},  # e.g. the service key's name, DPRELEASE_KEY
            cwd=base,
            stdout=worker_log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        yield operations
    finally:
        if worker is not None:
            children = _children(worker.pid)  # flow-run processes, the run starter and its runs
            flow_processes = [*children, *(run for pid in children for run in _children(pid))]
            _stop(worker)
            for pid in flow_processes:  # flow runs the worker started and left behind
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        _stop(server, grace=(20.0, 10.0))
        server_log.close()
        worker_log.close()


# --- without a server: what `dprelease deploy` builds, deploy/prefect.yaml, validators ----------

ROOT = Path(__file__).resolve().parents[2]


def test_each_spec_becomes_a_deployment_with_its_schedule_trigger_pool_and_parameters(
    tmp_path: Path,
) -> None:
    from dprelease.catalog.spec.load import load_spec
    from dprelease.flows.deployments import build_deployment

    source = tmp_path / "landing"
    path = tmp_path / "monthly.yaml"
    path.write_text(
        yaml.safe_dump(
            _spec(
                "monthly",
                "census",
                source,
                cap=3.0,
                schedule={"cron": "0 6 1 * *", "timezone": "Europe/Paris"},
                trigger="arrival",
            )
        )
    )
    deployment = build_deployment(
        path,
        load_spec(path),
        out_dir=tmp_path / "out",
        catalog_url=None,
        publish_dir=tmp_path / "pub",
        review_timeout_seconds=3600,
        interval_seconds=60,
    )
    assert deployment.full_name == "release-deployment/monthly"
    assert deployment.entrypoint == "dprelease.flows.deployed_release.release_deployment_flow"
    assert deployment.work_pool_name == POOL
    assert deployment.job_variables == {"command": COMMAND}  # the engine without a supervisor
    assert "dataset:census" in deployment.tags
    cron, interval = (s.schedule for s in deployment.schedules)
    assert (cron.cron, cron.timezone) == ("0 6 1 * *", "Europe/Paris")
    assert interval.interval.total_seconds() == 60
    [trigger] = deployment.triggers
    assert trigger.expect == {"dprelease.data.arrived"}
    assert trigger.match.root == {"prefect.resource.id": "dprelease.dataset.census"}
    assert trigger.parameters == {
        "source_override": "{{ event.payload.path }}",
        "expected_fingerprint": "{{ event.payload.fingerprint }}",
    }
    assert deployment.parameters == {
        "spec_path": str(path.resolve()),
        "out_dir": str((tmp_path / "out").resolve()),
        "publish_dir": str((tmp_path / "pub").resolve()),
        "review_timeout_seconds": 3600,
    }  # public only: no catalog URL unless it is a local file (a server URL may hold a password)
    plain = tmp_path / "plain.yaml"
    plain.write_text(yaml.safe_dump(_spec("plain", "census", source, cap=3.0)))
    on_demand = build_deployment(plain, load_spec(plain), catalog_url="sqlite:////x/catalog.db")
    assert not on_demand.schedules and not on_demand.triggers
    assert on_demand.parameters["catalog_url"] == "sqlite:////x/catalog.db"


def test_deploy_prefect_yaml_matches_the_example_specs_and_the_flow() -> None:
    import inspect

    from dprelease.catalog.spec.load import load_spec
    from dprelease.flows.deployed_release import release_deployment_flow
    from dprelease.flows.watch import ARRIVAL_EVENT, resource_id

    config = yaml.safe_load((ROOT / "deploy" / "prefect.yaml").read_text())
    flow_parameters = set(inspect.signature(release_deployment_flow.fn).parameters)
    assert len(config["deployments"]) == 2
    for entry in config["deployments"]:
        path, function = entry["entrypoint"].split(":")
        assert (ROOT / path).is_file() and function == release_deployment_flow.fn.__name__
        assert entry["work_pool"]["name"] == POOL
        assert entry["work_pool"]["job_variables"] == {"command": COMMAND}
        spec = load_spec(ROOT / entry["parameters"]["spec_path"])
        assert entry["name"] == spec.name
        assert set(entry["parameters"]) <= flow_parameters
        if spec.schedule is not None:
            assert entry["schedules"] == [
                {"cron": spec.schedule.cron, "timezone": spec.schedule.timezone}
            ]
        if spec.trigger == "arrival":
            [trigger] = entry["triggers"]
            assert trigger["expect"] == [ARRIVAL_EVENT]
            assert trigger["match"] == {"prefect.resource.id": resource_id(spec.dataset.id)}
            assert set(trigger["parameters"]) <= flow_parameters


def test_deployment_validators(tmp_path: Path) -> None:
    from dprelease.catalog.errors import CatalogError, SpecError
    from dprelease.catalog.spec.load import load_spec
    from dprelease.catalog.watch_state import ReviewRun
    from dprelease.flows.deployed_release import release_deployment_flow, resume_review
    from dprelease.flows.deployments import build_deployment, deploy_specs, find_specs

    with pytest.raises(SpecError, match=r"specs dir '.*nowhere' is not a folder"):
        find_specs(tmp_path / "nowhere")
    with pytest.raises(SpecError, match=r"holds no \*\.yaml or \*\.yml spec"):
        find_specs(tmp_path)
    first, second = tmp_path / "a.yaml", tmp_path / "b.yaml"
    for path in (first, second):
        path.write_text(yaml.safe_dump(_spec("same-name", "census", tmp_path, cap=1.0)))
    with pytest.raises(SpecError, match=r"share the name 'same-name'"):
        deploy_specs([first, second])  # refused before anything is registered (no server here)
    spec = load_spec(first)
    with pytest.raises(ValueError, match=r"review_timeout_seconds \(0\) must be >= 1"):
        build_deployment(first, spec, review_timeout_seconds=0)
    with pytest.raises(ValueError, match=r"interval_seconds \(0.5\) must be >= 1"):
        build_deployment(first, spec, interval_seconds=0.5)
    with pytest.raises(ValueError, match=r"review_timeout_seconds \(0\) must be >= 1"):
        release_deployment_flow.fn(spec_path=str(first), review_timeout_seconds=0)
    run = ReviewRun(
        release_id="r",
        flow_run_id="f",
        api_url=None,
        status="awaiting",
        created_at="",
        updated_at="",
    )
    catalog = Catalog(f"sqlite:///{tmp_path / 'catalog.db'}")
    with pytest.raises(CatalogError, match=r"reviewer \(' '\) must name a person"):
        resume_review(run, approve=True, reviewer=" ", note="", catalog=catalog)
    with pytest.raises(ValueError, match=r"wait_seconds \(0\) must be > 0"):
        resume_review(run, approve=True, reviewer="Ada", note="", catalog=catalog, wait_seconds=0)


def test_budget_shows_the_ledger_as_a_timeline_with_the_cumulative_spend(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from typer.testing import CliRunner

    from dprelease.flows.cli import app
    from dprelease.mechanisms.primitives.privacy import PrivacyCost

    monkeypatch.setenv("DPRELEASE_HOME", str(tmp_path))
    catalog = Catalog()
    catalog.ensure_dataset("census", cap=PrivacyCost(measure="pure", epsilon=2.0))
    for k, epsilon in enumerate((0.5, 0.25, 1.0)):
        charge = PrivacyCost(measure="pure", epsilon=epsilon)
        catalog.charge("census", charge, release_id=f"release-{k}", label=f"charge {k}")
    result = CliRunner().invoke(app, ["budget", "census"])
    assert result.exit_code == 0, result.output
    rows = [
        [cell.strip() for cell in line.split("│")[1:-1]]
        for line in result.stdout.splitlines()
        if "release-" in line
    ]
    assert [(row[2], row[3], row[4], row[5]) for row in rows] == [
        ("release-0", "epsilon=0.5", "epsilon=0.5", "epsilon=1.5"),
        ("release-1", "epsilon=0.25", "epsilon=0.75", "epsilon=1.25"),
        ("release-2", "epsilon=1", "epsilon=1.75", "epsilon=0.25"),
    ]


# --- helpers on the API -------------------------------------------------------------------------


def _deployment(ops: Operations, name: str) -> Any:
    with ops.api() as client:
        return client.read_deployment_by_name(f"release-deployment/{name}")


def _runs_of(ops: Operations, deployment_id: UUID, *, scheduled: bool = False) -> list[Any]:
    with ops.api() as client:
        return _runs_with(client, deployment_id, scheduled=scheduled)


def _runs_with(client: Any, *deployment_ids: UUID, scheduled: bool = False) -> list[Any]:
    """The deployments' runs that left the Scheduled state, or all of them with ``scheduled``,
    through an open client (a poll that opens one each second spends 45 ms of CPU on it).  A
    deployment on a schedule has up to 100 runs ahead; polls that read them all each second
    spent more CPU, here and in the server, than the runs they waited for."""
    from prefect.client.schemas.filters import (
        FlowRunFilter,
        FlowRunFilterDeploymentId,
        FlowRunFilterState,
        FlowRunFilterStateType,
    )
    from prefect.client.schemas.objects import StateType

    started = FlowRunFilterState(type=FlowRunFilterStateType(not_any_=[StateType.SCHEDULED]))
    return client.read_flow_runs(
        flow_run_filter=FlowRunFilter(
            deployment_id=FlowRunFilterDeploymentId(any_=list(deployment_ids)),
            state=None if scheduled else started,
        )
    )


def _state_of(ops: Operations, run_id: UUID) -> Any:
    with ops.api() as client:
        return client.read_flow_run(run_id)


def _wait_paused(ops: Operations, run_id: UUID) -> Any:
    with ops.api() as client:  # one client for the whole wait

        def paused() -> Any:
            run = client.read_flow_run(run_id)
            if run.state.is_final():
                raise AssertionError(f"run {run.name} ended {run.state!r}\n{ops.diagnostics()}")
            return run if run.state.is_paused() else None

        return _wait_for(
            paused, what=f"flow run {run_id} to pause for review", timeout=RUN_TIMEOUT, ops=ops
        )


def _wait_final(ops: Operations, run_id: UUID) -> Any:
    with ops.api() as client:  # one client for the whole wait
        return _wait_for(
            lambda: (run := client.read_flow_run(run_id)).state.is_final() and run,
            what=f"flow run {run_id} to finish",
            timeout=RUN_TIMEOUT,
            ops=ops,
        )


def _resume(ops: Operations, run_id: UUID, run_input: dict[str, Any]) -> None:
    from prefect.flow_runs import resume_flow_run
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with temporary_settings(updates={PREFECT_API_URL: ops.api_url}):
        resume_flow_run(run_id, run_input=run_input)


def _heartbeats(ops: Operations, run_id: UUID) -> int:
    """How many ``prefect.flow-run.heartbeat`` events of ``run_id`` the server stored."""
    database = ops.base / "server-home" / "prefect.db"
    with contextlib.closing(sqlite3.connect(f"file:{database}?mode=ro", uri=True)) as db:
        [(count,)] = db.execute(
            "SELECT count(*) FROM events WHERE event = 'prefect.flow-run.heartbeat' "
            "AND resource_id = ?",
            (f"prefect.flow-run.{run_id}",),
        )
    return int(count)


def _only_release(ops: Operations, dataset_id: str) -> Any:
    [record] = Catalog(ops.catalog_url).releases(dataset_id=dataset_id)
    return record


# --- the tests ----------------------------------------------------------------------------------


def test_a_deployment_with_a_short_interval_schedule_runs_a_release(ops: Operations) -> None:
    deployed = ops.cli(
        "deploy", str(ops.specs["scheduled"]), "--every", "30", "--review-timeout", "600"
    )
    assert deployed.returncode == 0, deployed.stdout + deployed.stderr
    assert "every 30 s" in deployed.stdout and "dprelease-dataset-ops-sched" in deployed.stdout
    deployment = _deployment(ops, "ops-scheduled")
    assert [s.schedule.interval.total_seconds() for s in deployment.schedules] == [30.0]
    assert deployment.work_pool_name == POOL

    def started() -> Any:
        return _runs_of(ops, deployment.id)

    [first, *_] = _wait_for(started, what="the first scheduled run", timeout=RUN_TIMEOUT, ops=ops)
    assert first.auto_scheduled
    with ops.api() as client:
        client.pause_deployment(deployment.id)  # no more runs: the budget would refuse them anyway

    def one_paused() -> Any:
        return [r for r in _runs_of(ops, deployment.id) if r.state.is_paused()]

    [paused] = _wait_for(
        one_paused, what="the scheduled run to pause", timeout=RUN_TIMEOUT, ops=ops
    )
    record = _only_release(ops, "ops-sched")
    assert record.status == "staged" and record.name == "ops-scheduled"
    assert ReviewRuns(ops.catalog_url).get(record.id).flow_run_id == str(paused.id)

    # `dprelease review` resumes the paused run with the decision instead of deciding behind it
    rejected = ops.cli(
        "review", record.id, "--reject", "--reviewer", "Grace", "--note", "too coarse"
    )
    assert rejected.returncode == 0, rejected.stdout + rejected.stderr
    assert f"{record.id}: rejected (decided through flow run {paused.id})" in rejected.stdout
    assert _wait_final(ops, paused.id).state.is_completed()
    catalog = Catalog(ops.catalog_url)
    assert catalog.release(record.id).status == "rejected"
    [decision] = catalog.reviews(record.id)
    assert (decision.decision, decision.reviewer, decision.note) == (
        "rejected",
        "Grace",
        "too coarse",
    )
    assert catalog.spent("ops-sched").epsilon == pytest.approx(1.0, abs=1e-6)  # still spent
    manifest = artifacts.read_manifest(Path(record.directory))
    assert manifest["review"]["status"] == "rejected"
    assert manifest["review"]["trail"][0]["reviewer"] == "Grace"


def test_an_arrival_event_starts_a_release_for_that_file(ops: Operations) -> None:
    arrived = ops.landing / "ops-arrival" / "2026-11.parquet"
    _write_tiny_parquet(arrived, seed=11)
    (ops.landing / "ops-arrival" / "readme.txt").write_text("not data")
    fingerprint = keyed(arrived.read_bytes(), ops.catalog_url)  # the watcher's catalog key
    watched = ops.cli(
        "watch", str(ops.landing), "--spec-dir", str(ops.specs["arrival"].parent), "--once",
        "--interval", "1",
    )  # fmt: skip
    assert watched.returncode == 0, watched.stdout + watched.stderr
    assert "announced 1 file(s)" in watched.stdout
    assert "readme.txt: not a Parquet file" in watched.stderr

    deployment = _deployment(ops, "ops-arrival")
    [run] = _wait_for(
        lambda: _runs_of(ops, deployment.id, scheduled=True),
        what="the triggered run",
        timeout=RUN_TIMEOUT,
        ops=ops,
    )
    assert run.parameters["source_override"] == str(arrived)
    assert run.parameters["expected_fingerprint"] == fingerprint
    _wait_paused(ops, run.id)
    # the deployed run heartbeats for its process; its release subflow sends none of its own
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterParentFlowRunId

    _wait_for(lambda: _heartbeats(ops, run.id), what="the run's heartbeat", timeout=60, ops=ops)
    with ops.api() as client:
        [subflow] = client.read_flow_runs(
            flow_run_filter=FlowRunFilter(
                parent_flow_run_id=FlowRunFilterParentFlowRunId(any_=[run.id])
            )
        )
    assert subflow.state.is_completed() and _heartbeats(ops, subflow.id) == 0
    record = _only_release(ops, "ops-arrival")
    manifest = artifacts.read_manifest(Path(record.directory))
    assert manifest["input_files"] == ["2026-11.parquet"]
    assert record.input_fingerprint == manifest["input_fingerprint"]
    # the run validated in the worker's GX service (flows/worker_host.py), not in its own process
    worker_log = ops.logs["worker"].read_text()
    assert re.search(r"validation service \d+: validated \d+ suite\(s\)", worker_log), worker_log
    _resume(ops, run.id, {"approve": False, "reviewer": "Grace", "note": "arrival test"})
    assert _wait_final(ops, run.id).state.is_completed()
    assert Catalog(ops.catalog_url).release(record.id).status == "rejected"


def test_a_paused_release_approved_through_the_api_is_published(ops: Operations) -> None:
    deployment = _deployment(ops, "ops-manual")
    with ops.api() as client:
        created = client.create_flow_run_from_deployment(deployment.id)
    _wait_paused(ops, created.id)
    record = _only_release(ops, "ops-manual")
    assert record.status == "staged"

    from prefect.flow_runs import resume_flow_run
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with (
        temporary_settings(updates={PREFECT_API_URL: ops.api_url}),
        pytest.raises(RuntimeError, match="Cannot resume this run"),
    ):  # a blank reviewer is refused by the server and the run stays paused
        resume_flow_run(created.id, run_input={"approve": True, "reviewer": " "})
    assert _state_of(ops, created.id).state.is_paused()

    _resume(ops, created.id, {"approve": True, "reviewer": "Ada", "note": "checked"})
    finished = _wait_final(ops, created.id)
    assert finished.state.is_completed(), finished.state
    catalog = Catalog(ops.catalog_url)
    published = catalog.release(record.id)
    assert published.status == "published"
    assert published.published_directory is not None
    target = Path(published.published_directory)
    assert target.parent == ops.base / "published"
    artifacts.verify(target, catalog)  # hashes, manifest, ledger receipts, validation
    [decision] = catalog.reviews(record.id)
    assert (decision.decision, decision.reviewer, decision.note) == ("approved", "Ada", "checked")
    trail = artifacts.read_manifest(target)["review"]
    assert trail["status"] == "published"
    assert [(t["decision"], t["reviewer"], t["at"]) for t in trail["trail"]] == [
        ("approved", "Ada", decision.at)
    ]
    assert ReviewRuns(ops.catalog_url).get(record.id).status == "decided"
    assert "Ada" in (target / "report.html").read_text()


def test_two_approvers_each_decide_in_the_same_paused_run(ops: Operations) -> None:
    """``review.approvers: 2``: the run pauses again after the first approval, a second approval
    by the same reviewer is refused (nothing recorded) and awaited again, and the second distinct
    approval publishes the release."""
    deployment = _deployment(ops, "ops-two")
    with ops.api() as client:
        created = client.create_flow_run_from_deployment(deployment.id)
    _wait_paused(ops, created.id)
    record = _only_release(ops, "ops-two")
    catalog = Catalog(ops.catalog_url)

    def paused_at(key: str, reviews: int) -> Any:
        run = _wait_paused(ops, created.id)
        recorded = len(catalog.reviews(record.id))
        return run if run.state.state_details.pause_key == key and recorded == reviews else None

    def wait_paused_at(key: str, reviews: int) -> None:
        _wait_for(
            lambda: paused_at(key, reviews),
            what=f"the run to pause at {key} with {reviews} review(s)",
            timeout=RUN_TIMEOUT,
            ops=ops,
        )

    wait_paused_at("review-1", 0)
    _resume(ops, created.id, {"approve": True, "reviewer": "Ada", "note": "first"})
    wait_paused_at("review-2", 1)
    assert catalog.release(record.id).status == "staged"
    _resume(ops, created.id, {"approve": True, "reviewer": "ada", "note": "again"})
    wait_paused_at("review-3", 1)  # the same person twice: refused, nothing recorded
    _resume(ops, created.id, {"approve": True, "reviewer": "Grace", "note": "second"})
    finished = _wait_final(ops, created.id)
    assert finished.state.is_completed(), finished.state
    assert catalog.release(record.id).status == "published"
    assert [(r.decision, r.reviewer) for r in catalog.reviews(record.id)] == [
        ("approved", "Ada"),
        ("approved", "Grace"),
    ]
    assert ReviewRuns(ops.catalog_url).get(record.id).status == "decided"


def test_a_second_concurrent_release_of_the_same_dataset_waits_for_the_first(
    ops: Operations,
) -> None:
    """Two runs of one dataset created at once: the second waits in the dataset's work queue.  One is rejected through the API when it pauses; the other
    is left to time out in review (3 s), which fails the run, leaves the release staged, and lets
    `dprelease review` decide it in the catalog.  Which run gets the slot first does not matter."""
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterParentFlowRunId

    deployment = _deployment(ops, "ops-serial")
    deadline = time.monotonic() + 2 * RUN_TIMEOUT
    with ops.api() as client:
        limit = client.read_global_concurrency_limit_by_name("dprelease-dataset-ops-serial")
        assert limit.limit == 1
        reviewed, unreviewed = (
            client.create_flow_run_from_deployment(
                deployment.id, parameters={"review_timeout_seconds": timeout}
            )
            for timeout in (600, 3)
        )
    finished: dict[UUID, Any] = {}
    while len(finished) < 2:
        for parent in (reviewed, unreviewed):
            if parent.id in finished:
                continue
            run = _state_of(ops, parent.id)
            if run.state.is_final():
                finished[parent.id] = run
            elif run.state.is_paused() and parent.id == reviewed.id:
                _resume(ops, parent.id, {"approve": False, "reviewer": "Grace", "note": "no"})
        assert time.monotonic() < deadline, "timed out waiting for both runs\n" + ops.diagnostics()
        time.sleep(1.0)
    assert finished[reviewed.id].state.is_completed(), finished[reviewed.id].state
    timed_out = finished[unreviewed.id].state
    assert timed_out.is_failed() and "never resumed" in (timed_out.message or "")

    with ops.api() as client:
        releases = client.read_flow_runs(
            flow_run_filter=FlowRunFilter(
                parent_flow_run_id=FlowRunFilterParentFlowRunId(any_=[reviewed.id, unreviewed.id])
            )
        )
    assert len(releases) == 2
    first, second = sorted(releases, key=lambda run: run.start_time)
    # the two releases did not overlap ...
    assert second.start_time >= first.end_time, (first.end_time, second.start_time)
    # ... and the second deployed run waited on the server (the dataset's work queue, limit 1),
    # not as a process on the worker: it started only once the first release had ended
    later = max(finished.values(), key=lambda run: run.start_time)
    assert later.start_time >= first.end_time, (later.start_time, first.end_time)

    catalog = Catalog(ops.catalog_url)
    statuses = {r.status: r for r in catalog.releases(dataset_id="ops-serial")}
    assert sorted(statuses) == ["rejected", "staged"]
    assert catalog.spent("ops-serial").epsilon == pytest.approx(2.0, abs=1e-6)
    left = statuses["staged"]
    assert ReviewRuns(ops.catalog_url).get(left.id).status == "expired"
    approved = ops.cli("review", left.id, "--approve", "--reviewer", "Ada")
    assert approved.returncode == 0, approved.stdout + approved.stderr
    assert f"{left.id}: published" in approved.stdout
    assert "decided through flow run" not in approved.stdout  # decided in the catalog directly
    assert catalog.release(left.id).status == "published"


def test_a_file_changed_after_its_announcement_is_refused_before_any_charge(
    ops: Operations,
) -> None:
    """The deployed flow, called in-process against this server: no budget check, no charge."""
    from prefect.events.worker import EventsWorker
    from prefect.logging.handlers import APILogWorker
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from dprelease.catalog.errors import DataError
    from dprelease.flows.deployed_release import release_deployment_flow

    replaced = ops.base / "data" / "replaced.parquet"
    _write_tiny_parquet(replaced, seed=21)
    announced = keyed(b"the bytes that were announced")
    catalog = Catalog(ops.catalog_url)
    before = catalog.ledger_entries()
    with temporary_settings(updates={PREFECT_API_URL: ops.api_url}):
        with pytest.raises(DataError, match=r"changed since it was announced"):
            release_deployment_flow(
                spec_path=str(ops.specs["manual"]),
                out_dir=str(ops.base / "releases"),
                catalog_url=ops.catalog_url,
                source_override=str(replaced),
                expected_fingerprint=announced,
            )
        # send this run's logs and events now, while this server is still up
        APILogWorker.drain_all(timeout=10, at_exit=False)
        EventsWorker.drain_all(timeout=10, at_exit=False)
    assert catalog.ledger_entries() == before
