"""The operator's guide (deploy/README.md), run step by step against real processes.

A Prefect server, a worker and the arrival watcher are started by ``deploy/start-*.sh`` on
127.0.0.1 (a free port) in a temporary ``DPRELEASE_HOME`` with a temporary run registry, and
stopped by ``deploy/stop.sh`` with every wait bounded; the module's finalizer stops whatever is
still recorded (by pid *and* start time) so no process outlives it.  It proves:

* one Prefect server per database: ``start-server.sh`` refuses while the shared server of
  ``dprelease run`` serves the same ``PREFECT_HOME``, and ``dprelease`` commands use the script's
  server instead of starting a second one on its database;
* ``stop.sh`` finds what the scripts started after ``DPRELEASE_HOME`` changed, and never signals
  a process it cannot prove it started;
* re-running ``dprelease deploy`` keeps a paused schedule (and a paused deployment) paused, and
  refuses a spec whose ``review.notify`` block is missing on the server;
* the watcher's claims move with the catalog from SQLite to PostgreSQL (``--adopt-claims-from``);
* the backup and restore steps of the SQLite and PostgreSQL catalogs with their key and anchor;
* logs under ``$DPRELEASE_HOME/run`` survive a ``copytruncate`` rotation;
* the container example is coherent (static: no network to build images here), and the guide
  cites only files the repository contains.
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from tests.pg_server import PostgresServer, free_port

pytestmark = [pytest.mark.flow]

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
BIN = Path(sys.executable).parent
SCRIPT_TIMEOUT = 240.0  # start-server.sh waits up to 120 s for health; a fresh DB migrates first
WAIT = 90.0
T = TypeVar("T")


def _wait_for(check: Callable[[], T | None], *, what: str, timeout: float = WAIT) -> T:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(0.5)


def _clean_env(**extra: str) -> dict[str, str]:
    """The test's environment without the session's Prefect and dprelease settings."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("PREFECT_", "DPRELEASE_")) or k == "DPRELEASE_CACHE_DIR"
    }
    env["DPRELEASE_VALIDATION_SERVICE"] = "off"  # the shared server's GX service: not needed here
    env.update(extra)
    return env


def _run(
    command: list[str], env: dict[str, str], *, timeout: float = SCRIPT_TIMEOUT, cwd: Path = ROOT
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        command, env=env, capture_output=True, text=True, timeout=timeout, cwd=cwd, check=False
    )


def _script(name: str, *args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return _run(["bash", str(DEPLOY / name), *args], env)


def _proc_start(pid: int) -> str | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat[stat.rfind(")") + 2 :].split()[19]


def _registry(path: Path) -> dict[str, dict[str, str]]:
    entries = {}
    for file in sorted(path.glob("*.run")) if path.is_dir() else []:
        entries[file.stem] = dict(
            line.split("=", 1) for line in file.read_text().splitlines() if "=" in line
        )
    return entries


def _kill_recorded(registry: Path) -> None:
    """Last resort of the finalizer: SIGKILL what the registry records, if pid and start match."""
    for entry in _registry(registry).values():
        pid = int(entry["pid"])
        if _proc_start(pid) == entry["start"]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def _write_parquet(path: Path, *, seed: int) -> None:
    rng = np.random.default_rng(seed)  # public randomness: synthetic test data
    table = pa.table(
        {
            "a": pa.array(rng.integers(0, 10, 200), pa.int16()),
            "b": pa.array(rng.choice(["x", "y", "z"], 200)),
        }
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    scratch = path.with_name(path.name + ".tmp")
    pq.write_table(table, scratch)
    scratch.rename(path)


def _spec(name: str, dataset_id: str, source: Path, **extra: Any) -> dict[str, Any]:
    return {
        "name": name,
        "dataset": {"id": dataset_id, "source": str(source), "budget": {"epsilon": 5.0}},
        "domain": {"a": {"min": 0, "max": 9}, "b": {"values": ["x", "y", "z"]}},
        "workload": [{"name": "a_by_b", "marginal": ["a", "b"]}],
        "mechanism": "identity",
        "privacy": {"epsilon": 1.0},
        **extra,
    }


# --- the operator's installation -------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class Site:
    base: Path
    home: Path
    registry: Path
    env: dict[str, str]  # what an operator exports: DPRELEASE_HOME, registry, port
    api_url: str
    landing: Path
    specs: Path

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        return _run([str(BIN / "dprelease"), *args], {**self.env, "PREFECT_API_URL": self.api_url})

    @contextlib.contextmanager
    def api(self) -> Iterator[Any]:
        from prefect.client.orchestration import get_client
        from prefect.settings import PREFECT_API_URL, temporary_settings

        with (
            temporary_settings(updates={PREFECT_API_URL: self.api_url}),
            get_client(sync_client=True) as client,
        ):
            yield client


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Site]:
    base = tmp_path_factory.mktemp("site")
    home, registry = base / "home", base / "registry"
    port = free_port()
    landing, specs = base / "landing", base / "specs"
    specs.mkdir()
    (specs / "arrival.yaml").write_text(
        yaml.safe_dump(
            _spec("site-arrival", "site-arrival", landing / "site-arrival", trigger="arrival")
        )
    )
    env = _clean_env(
        DPRELEASE_HOME=str(home),
        DPRELEASE_RUN_REGISTRY=str(registry),
        DPRELEASE_SERVER_PORT=str(port),
        DPRELEASE_LANDING=str(landing),
        DPRELEASE_SPECS=str(specs),
        DPRELEASE_WATCH_INTERVAL="1",
    )
    try:
        started = _script("start-server.sh", env=env)
        assert started.returncode == 0, started.stdout + started.stderr
        yield Site(
            base=base,
            home=home,
            registry=registry,
            env=env,
            api_url=f"http://127.0.0.1:{port}/api",
            landing=landing,
            specs=specs,
        )
    finally:
        _script("stop.sh", env=env)
        _kill_recorded(registry)


# --- 1. one Prefect server per database --------------------------------------------------------------
def test_dprelease_commands_use_the_deploy_server_on_the_same_database(site: Site) -> None:
    probe = (
        "from dprelease.flows import server; c = server.connect(); "
        "print(c.url); print(server.read_record() is None)"
    )
    found = _run([sys.executable, "-c", probe], site.env, timeout=120)
    assert found.returncode == 0, found.stderr
    url, no_shared = found.stdout.split()
    assert url == site.api_url  # not a second server on .../prefect/prefect.db
    assert no_shared == "True"
    status = _run([str(BIN / "dprelease"), "server", "status"], site.env, timeout=60)
    assert status.stdout.startswith("deploy: " + site.api_url), status.stdout
    again = _script("start-server.sh", env=site.env)
    assert again.returncode == 0 and "already running" in again.stdout, again.stdout


def test_start_server_refuses_while_the_shared_server_serves_the_same_database(
    tmp_path: Path,
) -> None:
    env = _clean_env(
        DPRELEASE_HOME=str(tmp_path / "home"),
        DPRELEASE_RUN_REGISTRY=str(tmp_path / "registry"),
        DPRELEASE_SERVER_PORT=str(free_port()),
    )
    shared = _run(
        [sys.executable, "-c", "from dprelease.flows import server; print(server.connect().url)"],
        env,
        timeout=200,
    )
    try:
        assert shared.returncode == 0, shared.stderr
        refused = _script("start-server.sh", env=env)
        assert refused.returncode == 3, refused.stdout + refused.stderr
        assert "one server per database" in refused.stderr
        assert "dprelease server stop" in refused.stderr
        assert _registry(tmp_path / "registry") == {}  # nothing was started
    finally:
        _run([str(BIN / "dprelease"), "server", "stop"], env, timeout=60)
        _kill_recorded(tmp_path / "registry")


# --- 2. the run registry never signals another process -----------------------------------------------
def test_stop_never_signals_a_process_it_did_not_start(tmp_path: Path) -> None:
    home, registry = tmp_path / "home", tmp_path / "registry"
    (home / "run").mkdir(parents=True)
    registry.mkdir()
    env = _clean_env(DPRELEASE_HOME=str(home), DPRELEASE_RUN_REGISTRY=str(registry))
    stranger = subprocess.Popen(["sleep", "120"])
    try:
        start = _proc_start(stranger.pid)
        # a pid file of the old layout, and registry entries whose start time or command differ
        (home / "run" / "server.pid").write_text(f"{stranger.pid}\n")
        (home / "run" / "worker.pid").write_text(f"{stranger.pid}\n")
        (registry / "server.run").write_text(
            f"pid={stranger.pid}\nstart=1\nmarker=sleep\nhome={home}\n"
        )
        (registry / "worker.run").write_text(
            f"pid={stranger.pid}\nstart={start}\nmarker=worker start --pool\nhome={home}\n"
        )
        stopped = _script("stop.sh", env=env)
        assert stopped.returncode == 0, stopped.stderr
        assert stranger.poll() is None, "stop.sh signalled a process it did not start"
        assert "not running" in stopped.stdout
        assert _registry(registry) == {}  # the stale entries are gone
    finally:
        stranger.kill()
        stranger.wait(timeout=10)


# --- 3. deploy keeps pauses and checks notification blocks -------------------------------------------
def test_redeploy_keeps_paused_schedules_and_deployments_paused(site: Site) -> None:
    data = site.base / "data" / "paused.parquet"
    _write_parquet(data, seed=3)
    folder = site.base / "paused-specs"
    folder.mkdir()
    cron = {"cron": "0 6 1 * *", "timezone": "UTC"}
    (folder / "a.yaml").write_text(yaml.safe_dump(_spec("keep-paused", "kp", data, schedule=cron)))
    (folder / "b.yaml").write_text(yaml.safe_dump(_spec("keep-off", "ko", data, schedule=cron)))
    first = site.cli("deploy", str(folder))
    assert first.returncode == 0, first.stdout + first.stderr
    # the guide's commands for pausing a schedule, and the UI's pause of a whole deployment
    prefect_env = {**site.env, "PREFECT_API_URL": site.api_url}
    listed = _run(
        [str(BIN / "prefect"), "deployment", "schedule", "ls", "release-deployment/keep-paused"],
        prefect_env,
        timeout=120,
    )
    assert listed.returncode == 0, listed.stdout + listed.stderr
    with site.api() as client:
        (schedule,) = client.read_deployment_by_name("release-deployment/keep-paused").schedules
    assert str(schedule.id)[:8] in listed.stdout  # the id the operator copies from `ls`
    paused = _run(
        [
            str(BIN / "prefect"),
            "--no-prompt",
            "deployment",
            "schedule",
            "pause",
            "release-deployment/keep-paused",
            str(schedule.id),
        ],
        prefect_env,
        timeout=120,
    )
    assert paused.returncode == 0, paused.stdout + paused.stderr
    with site.api() as client:
        client.pause_deployment(client.read_deployment_by_name("release-deployment/keep-off").id)
    again = site.cli("deploy", str(folder))
    assert again.returncode == 0, again.stdout + again.stderr
    with site.api() as client:
        kept = client.read_deployment_by_name("release-deployment/keep-paused")
        off = client.read_deployment_by_name("release-deployment/keep-off")
    assert [s.active for s in kept.schedules] == [False]
    assert off.paused is True
    assert kept.paused is False  # nothing else changed: only what the operator paused


def test_deploy_refuses_a_missing_notification_block_then_runs_and_cancels(site: Site) -> None:
    data = site.base / "data" / "notify.parquet"
    _write_parquet(data, seed=4)
    spec = site.base / "notify.yaml"
    review = {"approvers": 1, "notify": "custom-webhook/site-reviewers"}
    spec.write_text(yaml.safe_dump(_spec("notified", "nt", data, review=review)))
    refused = site.cli("deploy", str(spec))
    assert refused.returncode == 2, refused.stdout + refused.stderr
    said = " ".join((refused.stdout + refused.stderr).split())
    assert "review.notify" in said and "custom-webhook/site-reviewers" in said, said
    from prefect.exceptions import ObjectNotFound

    with site.api() as client, pytest.raises(ObjectNotFound):
        client.read_deployment_by_name("release-deployment/notified")
    saved = _script(
        "setup-notifications.sh", "site-reviewers", "http://127.0.0.1:9/hook", env=site.env
    )
    assert saved.returncode == 0, saved.stdout + saved.stderr
    accepted = site.cli("deploy", str(spec))
    assert accepted.returncode == 0, accepted.stdout + accepted.stderr

    # the guide's run on demand, listing and cancelling (no worker yet: the run stays queued)
    prefect_env = {**site.env, "PREFECT_API_URL": site.api_url}
    prefect = str(BIN / "prefect")
    started = _run([prefect, "deployment", "run", "release-deployment/notified"], prefect_env)
    assert started.returncode == 0, started.stdout + started.stderr
    with site.api() as client:
        deployment = client.read_deployment_by_name("release-deployment/notified")
        from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterId

        (run,) = client.read_flow_runs(
            deployment_filter=DeploymentFilter(id=DeploymentFilterId(any_=[deployment.id]))
        )
    listed = _run([prefect, "flow-run", "ls", "--flow-name", "release-deployment"], prefect_env)
    assert listed.returncode == 0 and str(run.id)[:8] in listed.stdout, listed.stdout
    cancelled = _run([prefect, "flow-run", "cancel", str(run.id)], prefect_env)
    assert cancelled.returncode == 0, cancelled.stdout + cancelled.stderr

    def cancelled_state() -> bool:
        with site.api() as client:
            return client.read_flow_run(run.id).state.type.value == "CANCELLED"

    _wait_for(cancelled_state, what="the cancelled run")


# --- 6. worker and watcher; logs and their rotation; stop after DPRELEASE_HOME changed -----------------
def test_worker_and_watcher_run_log_rotate_and_stop_after_the_home_changed(site: Site) -> None:
    """Runs last in the module: it stops the server too."""
    from dprelease.catalog.watch_state import WatchState

    worker = _script("start-worker.sh", env=site.env)
    assert worker.returncode == 0, worker.stdout + worker.stderr
    watcher = _script("start-watcher.sh", env=site.env)
    assert watcher.returncode == 0, watcher.stdout + watcher.stderr
    status = _script("status.sh", env=site.env)
    assert status.returncode == 0, status.stdout
    assert re.search(r"server: running .* healthy", status.stdout), status.stdout
    recorded = _registry(site.registry)
    assert set(recorded) == {"server", "worker", "watcher"}
    run = site.home / "run"
    catalog = f"sqlite:///{site.home / 'catalog.db'}"

    def announced(count: int) -> bool:
        return len(WatchState(catalog).announcements("site-arrival")) >= count

    _write_parquet(site.landing / "site-arrival" / "first.parquet", seed=1)
    _wait_for(lambda: announced(1), what="the watcher's first announcement")
    assert (run / "worker.log").stat().st_size > 0
    # logrotate's copytruncate: copy, then truncate in place; the writers append (O_APPEND), so
    # their next lines start the truncated file instead of landing after a hole of NUL bytes
    log = run / "watcher.log"
    _wait_for(lambda: "first.parquet" in log.read_text(), what="the watcher's log line")
    (run / "watcher.log.1").write_bytes(log.read_bytes())
    os.truncate(log, 0)
    _write_parquet(site.landing / "site-arrival" / "second.parquet", seed=2)
    _wait_for(lambda: announced(2), what="the second announcement")
    _wait_for(lambda: "second.parquet" in log.read_text(), what="a log line after rotation")
    assert not log.read_bytes().startswith(b"\0")

    elsewhere = {**site.env, "DPRELEASE_HOME": str(site.base / "another-home")}
    stopped = _script("stop.sh", env=elsewhere)
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    assert stopped.stdout.count("stopped") == 3, stopped.stdout
    for name, entry in recorded.items():
        assert _proc_start(int(entry["pid"])) != entry["start"], f"{name} still runs"
    after = _script("status.sh", env=site.env)
    assert after.returncode == 1 and after.stdout.count("not running") == 3, after.stdout
    assert not (site.home / "prefect" / "deploy-server.json").exists()


def test_the_postgresql_path_starts_and_stops_in_the_documented_order(
    tmp_path: Path, postgres_server: PostgresServer
) -> None:
    """deploy/postgres.md: server on PostgreSQL, then worker and watcher with the catalog there,
    with DPRELEASE_HOME changed between the server and the others; stop.sh finds all three."""
    from dprelease.catalog.watch_state import WatchState

    prefect_db = postgres_server.create_database("prefect")
    catalog = postgres_server.create_database("catalog")
    landing, specs, registry = tmp_path / "landing", tmp_path / "specs", tmp_path / "registry"
    specs.mkdir()
    (specs / "arrival.yaml").write_text(
        yaml.safe_dump(_spec("pg-arrival", "pg-arrival", landing / "pg-arrival", trigger="arrival"))
    )
    port = free_port()
    server_env = _clean_env(
        DPRELEASE_HOME=str(tmp_path / "first-home"),
        DPRELEASE_RUN_REGISTRY=str(registry),
        DPRELEASE_SERVER_PORT=str(port),
        PREFECT_API_DATABASE_CONNECTION_URL=prefect_db.replace("+psycopg", "+asyncpg", 1),
    )
    shared_env = {
        **server_env,
        "DPRELEASE_HOME": str(tmp_path / "shared"),
        "DPRELEASE_CATALOG_URL": catalog,
        "PREFECT_API_URL": f"http://127.0.0.1:{port}/api",
        "DPRELEASE_SPECS": str(specs),
        "DPRELEASE_WATCH_INTERVAL": "1",
    }
    try:
        for script, env in (
            ("start-server.sh", server_env),
            ("start-worker.sh", shared_env),
            ("start-watcher.sh", shared_env),
        ):
            args = (str(landing),) if script == "start-watcher.sh" else ()
            started = _script(script, *args, env=env)
            assert started.returncode == 0, f"{script}: {started.stdout}{started.stderr}"
        assert not (tmp_path / "first-home" / "prefect" / "prefect.db").exists()  # on PostgreSQL
        _write_parquet(landing / "pg-arrival" / "one.parquet", seed=8)
        _wait_for(
            lambda: WatchState(catalog).announcements("pg-arrival"),
            what="the watcher's claim in the PostgreSQL catalog",
        )
        recorded = _registry(registry)
        status = _script("status.sh", env=shared_env)
        assert status.returncode == 0, status.stdout
        stopped = _script("stop.sh", env=shared_env)
        assert stopped.returncode == 0 and stopped.stdout.count("stopped") == 3, stopped.stdout
        for name, entry in recorded.items():
            assert _proc_start(int(entry["pid"])) != entry["start"], f"{name} still runs"
    finally:
        _script("stop.sh", env=shared_env)
        _kill_recorded(registry)


# --- 4. the watcher's claims move from SQLite to PostgreSQL ------------------------------------------
def test_claims_adopted_from_sqlite_are_not_announced_again_on_postgresql(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, postgres_server: PostgresServer
) -> None:
    from dprelease.catalog.watch_state import WatchState
    from dprelease.flows.watch import Watcher

    home, landing = tmp_path / "home", tmp_path / "landing"
    monkeypatch.setenv("DPRELEASE_HOME", str(home))
    monkeypatch.delenv("DPRELEASE_CATALOG_URL", raising=False)
    _write_parquet(landing / "ds" / "old.parquet", seed=5)

    def announce() -> list[str]:
        events: list[Any] = []
        Watcher(landing, state=WatchState(), emitter=events.append).run(
            interval_seconds=0.05, max_polls=2
        )
        return sorted(Path(e.path).name for e in events)

    assert announce() == ["old.parquet"]  # on SQLite
    pg_url = postgres_server.create_database("claims")
    monkeypatch.setenv("DPRELEASE_CATALOG_URL", pg_url)
    env = _clean_env(DPRELEASE_HOME=str(home), DPRELEASE_CATALOG_URL=pg_url)
    adopted = _run(
        [
            str(BIN / "dprelease"),
            "watch",
            str(landing),
            "--adopt-claims-from",
            f"sqlite:///{home / 'catalog.db'}",
        ],
        env,
        timeout=120,
    )
    assert adopted.returncode == 0, adopted.stdout + adopted.stderr
    assert "claims adopted 1" in adopted.stdout, adopted.stdout
    _write_parquet(landing / "ds" / "new.parquet", seed=6)
    assert announce() == ["new.parquet"]  # the old file is not announced again


# --- backup and restore of the catalogs with their key and anchor ------------------------------------
def _charge(url: str, label: str) -> float:
    from dprelease.catalog.ledger.store import Catalog
    from dprelease.mechanisms.primitives.privacy import PrivacyCost

    catalog = Catalog(url)
    catalog.ensure_dataset("bk", cap=PrivacyCost(measure="pure", epsilon=5.0))
    release = f"r-{label}"
    catalog.create_release(
        release_id=release, name="n", dataset_id="bk", spec_fingerprint="f" * 64, mechanism="m"
    )
    catalog.charge("bk", PrivacyCost(measure="pure", epsilon=0.5), release_id=release, label=label)
    assert catalog.verify_chain() == []
    return float(catalog.spent("bk").epsilon)


def test_sqlite_catalog_backup_and_restore_with_key_and_anchor(tmp_path: Path) -> None:
    home, backup = tmp_path / "home", tmp_path / "backup"
    home.mkdir()
    url = f"sqlite:///{home / 'catalog.db'}"
    assert _charge(url, "one") == 0.5
    env = _clean_env(DPRELEASE_HOME=str(home), BACKUP=str(backup))
    # deploy/README.md "Backup and restore": the commands, as documented
    steps = _guide_block("sqlite-backup")
    done = _run(["bash", "-euc", steps], env, timeout=60)
    assert done.returncode == 0, done.stderr
    assert _charge(url, "two") == 1.0  # a charge after the backup: lost by the restore
    restored = _run(["bash", "-euc", _guide_block("sqlite-restore")], env, timeout=60)
    assert restored.returncode == 0, restored.stderr
    assert _charge(url, "three") == 1.0  # the backup's 0.5 plus this one, chain and anchor intact


def test_postgresql_catalog_backup_and_restore_with_key_and_anchor(
    tmp_path: Path, postgres_server: PostgresServer
) -> None:
    home, backup = tmp_path / "home", tmp_path / "backup"
    home.mkdir()
    url = postgres_server.create_database("backup")
    assert _charge_in(home, url, "one") == 0.5
    env = _clean_env(
        DPRELEASE_HOME=str(home),
        DPRELEASE_CATALOG_URL=url,
        BACKUP=str(backup),
        PGHOST="127.0.0.1",
        PGPORT=str(postgres_server.port),
        PGUSER="dprelease",
        PGDATABASE=url.rsplit("/", 1)[1],
        PATH=f"{postgres_server.bin_dir}:{os.environ['PATH']}",
    )
    done = _run(["bash", "-euc", _guide_block("postgres-backup")], env, timeout=120)
    assert done.returncode == 0, done.stderr
    assert _charge_in(home, url, "two") == 1.0
    restored = _run(["bash", "-euc", _guide_block("postgres-restore")], env, timeout=120)
    assert restored.returncode == 0, restored.stderr
    assert _charge_in(home, url, "three") == 1.0


def _charge_in(home: Path, url: str, label: str) -> float:
    """A charge in a fresh process with ``DPRELEASE_HOME=home`` (the key of a server URL is there)."""
    code = (
        "import sys; from tests.flows.test_deploy_ops import _charge; "
        "print(_charge(sys.argv[1], sys.argv[2]))"
    )
    done = _run(
        [sys.executable, "-c", code, url, label],
        _clean_env(DPRELEASE_HOME=str(home)),
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return float(done.stdout.split()[-1])


def _guide_block(name: str) -> str:
    """The shell block of deploy/README.md introduced by ``<!-- block: NAME -->``."""
    text = (DEPLOY / "README.md").read_text()
    found = re.search(rf"<!-- block: {re.escape(name)} -->\s*```bash\n(.*?)```", text, re.S)
    assert found, f"deploy/README.md has no block {name!r}"
    return found.group(1)


# --- 5. the container example (static: no network to build images here) -----------------------------
def _containerfile() -> list[tuple[str, str]]:
    text = (DEPLOY / "Containerfile").read_text().replace("\\\n", " ")
    lines = [line.strip() for line in text.splitlines()]
    return [
        (line.split(None, 1)[0].upper(), line.split(None, 1)[1] if " " in line else "")
        for line in lines
        if line and not line.startswith("#")
    ]


def test_the_container_example_is_coherent() -> None:
    instructions = _containerfile()
    env: dict[str, str] = {}
    install_seen = False
    for op, rest in instructions:
        if op == "ENV":
            for token in shlex.split(rest):
                key, _, value = token.partition("=")
                env[key] = value
        if op == "RUN" and "./install.sh" in rest:
            install_seen = True
            cache = env.get("DPRELEASE_CACHE_DIR", "")
            # install.sh prepares the Prefect database in the cache: it must outlive the image's
            # clean-up and be readable by the user the image runs as
            assert cache and not cache.startswith("/root"), cache
            for removed in re.findall(r"rm -rf ([^&;]+)", rest):
                for target in removed.split():
                    assert not (cache + "/").startswith(target.rstrip("/") + "/"), target
    assert install_seen
    users = [rest for op, rest in instructions if op == "USER"]
    assert users == ["dprelease"]
    compose = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    shared = compose["x-dprelease"]
    assert "DPRELEASE_OPERATOR" in shared["environment"]
    mounts = {}
    for volume in shared["volumes"]:
        host, container = volume.split(":")[:2]
        if host.startswith("."):
            mounts[(DEPLOY / host).resolve()] = Path(container)
    specs_host = (DEPLOY / "specs").resolve()
    assert specs_host in mounts, "deploy/specs is not mounted"
    specs_in = mounts[specs_host]
    watcher = compose["services"]["watcher"]["command"]
    assert watcher[watcher.index("--spec-dir") + 1] == str(specs_in)

    def inside(path: Path) -> Path | None:
        for host, container in mounts.items():
            if path.is_relative_to(container):
                return host / path.relative_to(container)
        return None

    for spec in sorted(specs_host.glob("*.yaml")):
        source = yaml.safe_load(spec.read_text())["dataset"]["source"]
        resolved = Path(os.path.normpath(specs_in / source))
        on_host = inside(resolved)
        assert on_host is not None, f"{spec.name}: {source} resolves to {resolved}, not mounted"
        # the same relative source on the host names the same file or folder
        assert on_host == (spec.parent / source).resolve(), spec.name


# --- 6. the guide cites only files the repository contains -------------------------------------------
def test_the_operator_documents_cite_only_files_the_repository_contains() -> None:
    documents = [
        *DEPLOY.glob("*.md"),
        DEPLOY / "profiles.toml",
        DEPLOY / "Containerfile",
        DEPLOY / "compose.yaml",
        DEPLOY / "prefect.yaml",
        *DEPLOY.glob("*.sh"),
    ]
    cited = re.compile(r"(?<![\w/.$-])((?:[\w-]+/)*[\w.-]+\.(?:py|md|sh|toml|yaml|txt))\b")
    missing = []
    for document in documents:
        text = document.read_text()
        assert "ecosystem notes" not in text and "§" not in text, document.name
        for name in set(cited.findall(text)):
            # catalog-<hash>.key names a pattern; spec.yaml is the reader's own spec in an example
            if name.startswith(("catalog-", ".")) or name == "spec.yaml":
                continue
            candidates = [ROOT / name, DEPLOY / name]
            if "/" not in name:
                candidates += list(ROOT.glob(f"*/{name}")) + list(ROOT.glob(f"*/*/{name}"))
            if not any(c.exists() for c in candidates):
                missing.append(f"{document.name}: {name}")
    assert missing == []


def test_a_guide_block_is_found_by_name() -> None:
    """The backup tests run the guide's own blocks: a renamed block must fail, not pass."""
    with pytest.raises(AssertionError, match="no block"):
        _guide_block("no-such-block")
    assert "sqlite3" in _guide_block("sqlite-backup")


def test_adopting_claims_counts_changed_and_missing_files_and_refuses_one_catalog(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from dprelease.catalog.keys import catalog_key
    from dprelease.catalog.watch_state import WatchState
    from dprelease.flows.watch import adopt_claims, file_fingerprint

    monkeypatch.setenv("DPRELEASE_HOME", str(tmp_path / "home"))
    old_url, new_url = f"sqlite:///{tmp_path / 'old.db'}", f"sqlite:///{tmp_path / 'new.db'}"
    old = WatchState(old_url)
    for name, seed in (("kept", 1), ("changed", 2), ("gone", 3)):
        path = tmp_path / "landing" / f"{name}.parquet"
        _write_parquet(path, seed=seed)
        fingerprint = file_fingerprint(path, key=catalog_key(old_url))
        old.claim(dataset_id="ds", fingerprint=fingerprint, path=str(path), size=1)
    _write_parquet(tmp_path / "landing" / "changed.parquet", seed=9)
    (tmp_path / "landing" / "gone.parquet").unlink()
    first = adopt_claims(source_url=old_url, target_url=new_url)
    assert (first.adopted, first.already, first.changed, first.missing) == (1, 0, 1, 1)
    kept = tmp_path / "landing" / "kept.parquet"
    (claim,) = WatchState(new_url).announcements("ds")
    assert claim.fingerprint == file_fingerprint(kept, key=catalog_key(new_url))  # re-keyed
    again = adopt_claims(source_url=old_url, target_url=new_url)
    assert (again.adopted, again.already) == (0, 1)
    with pytest.raises(ValueError, match=r"source_url .* must differ"):
        adopt_claims(source_url=new_url, target_url=new_url)
