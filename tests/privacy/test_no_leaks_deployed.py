"""No confidential value escapes through the arrival watcher or the deployed release (issue 13).

The sentinel files of ``test_no_leaks`` (every data-error class, the contribution bound and
``on_out_of_domain: drop``) land in a watched folder, one dataset per case, each with an
arrival-triggered spec.  One watcher cycle (two polls) announces them through the Prefect emitter
to the session's test server (recording every event), ``dprelease watch --dry-run`` logs them,
and each announcement is then released in-process by ``release_deployment_flow`` with exactly the
parameters an arrival trigger passes (file path and fingerprint).  A data error must fail the run
with a column-and-rule ``DataError``; a run that stages is approved through the paused run's typed
input, so the published copy exists too.

Then the events, the watch state, every log record (Prefect's loggers at DEBUG, also sent to the
server) and every file under the state home, the Prefect home, result storage, the cache, the
test server's SQLite database (``prefect_test_harness`` keeps it, with its -wal file, in its own
temporary folder named by ``PREFECT_SERVER_DATABASE_CONNECTION_URL``; compacted before this
module's runs: :func:`_compact`), and the release and publish folders are searched for the
sentinels.

The scan can fail: figures planted through the same channels (an exception that fails a flow
run, a run log line, an event payload) are found in the database files it reads, and the
failures' rule texts and the watcher's events are there too, so the scan reads where a leak would
land.  Only the harness's ``127.0.0.1:<port>`` is blanked (a free port: public, and a 4-digit one
could equal a sentinel by chance).
"""

from __future__ import annotations

import contextlib
import logging
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar
from uuid import UUID

import pytest
from prefect import flow, get_run_logger
from typer.testing import CliRunner

from dprelease.catalog.errors import DataError
from dprelease.catalog.ledger.store import Catalog
from dprelease.catalog.watch_state import Announcement, ReviewRuns, WatchState
from dprelease.flows.watch import (
    ARRIVAL_EVENT,
    ArrivalEvent,
    SpecResolver,
    Watcher,
    prefect_emitter,
)
from tests.privacy.test_no_leaks import (
    ALL_SENTINELS,
    CASES,
    Case,
    leaks,
    leaks_in,
    read_tree,
    write_case,
)

pytestmark = [pytest.mark.flow, pytest.mark.usefixtures("prefect_harness")]

# figures planted on purpose (not sentinels: the no-leak scan must not see them, the plant scan must)
PLANTS = {"failed-run exception": 6173, "run log": 6197, "event payload": 6199}
REVIEW_TIMEOUT_SECONDS = 120  # a staged run is approved within seconds; this only bounds a failure
SETTLE_TIMEOUT_SECONDS = 120.0  # the server's event persister flushes every 5 s
T = TypeVar("T")


@dataclass(frozen=True, kw_only=True)
class Outcome:
    case: Case
    flow_run_id: UUID
    result: Any  # the DataError raised, or the DeployedRelease returned
    state_message: str


@dataclass(frozen=True, kw_only=True)
class Deployed:
    root: Path
    events: list[ArrivalEvent]
    announcements: list[Announcement]
    dry_run_output: str
    dry_run_exit_code: int
    outcomes: list[Outcome]
    log_text: str
    files: dict[Path, bytes]
    database: Path
    mask: tuple[bytes, ...]


class _Recorder(logging.Handler):
    """Every record formatted with its traceback, as a log file would hold it."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.setFormatter(logging.Formatter("%(name)s %(levelname)s %(message)s"))
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(self.format(record))


@contextlib.contextmanager
def _recording_logs() -> Iterator[_Recorder]:
    """Prefect's and dprelease's loggers at DEBUG (sent to the server, too), recorded at the root."""
    recorder = _Recorder()
    root = logging.getLogger()
    levels = {name: logging.getLogger(name).level for name in ("prefect", "dprelease")}
    root.addHandler(recorder)
    for name in levels:
        logging.getLogger(name).setLevel(logging.DEBUG)
    try:
        yield recorder
    finally:
        root.removeHandler(recorder)
        for name, level in levels.items():
            logging.getLogger(name).setLevel(level)


def _wait_for(check: Callable[[], T | None], *, what: str, timeout: float) -> T:
    deadline = time.monotonic() + timeout
    while not (value := check()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(0.5)
    return value


def _approve_when_paused(dataset_id: str, problems: list[str]) -> threading.Thread:
    """A reviewer: once the dataset's release waits for review, approve it through the run input."""
    from prefect.client.orchestration import get_client
    from prefect.flow_runs import resume_flow_run

    def paused_run() -> UUID | None:
        for record in Catalog().releases(dataset_id=dataset_id):
            waiting = ReviewRuns().get(record.id)
            if waiting is not None:
                with get_client(sync_client=True) as client:
                    state = client.read_flow_run(UUID(waiting.flow_run_id)).state
                if state is not None and state.is_paused():
                    return UUID(waiting.flow_run_id)
        return None

    def approve() -> None:
        try:
            run_id = _wait_for(paused_run, what=f"{dataset_id} to pause", timeout=240.0)
            resume_flow_run(run_id, run_input={"approve": True, "reviewer": "Ada", "note": "ok"})
        except Exception as exc:  # reported by the fixture (a thread's exception is lost)
            problems.append(f"approving {dataset_id}: {exc!r}")

    thread = threading.Thread(target=approve, name=f"approve-{dataset_id}", daemon=True)
    thread.start()
    return thread


@flow(name="leak-plant", persist_result=False)
def _plant_flow() -> None:
    get_run_logger().info("planted figure %d", PLANTS["run log"])
    raise ValueError(f"planted figure {PLANTS['failed-run exception']}")


def _settled(flow_runs: list[UUID], plant_run: UUID) -> bool:
    """The server stored what the runs sent: the events (the plant last), the plant's log line,
    and every task run of the deployed runs and their subflows in a final state."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import (
        FlowRunFilter,
        FlowRunFilterId,
        FlowRunFilterParentFlowRunId,
        LogFilter,
        LogFilterFlowRunId,
    )
    from prefect.events.filters import EventFilter, EventNameFilter

    with get_client(sync_client=True) as client:
        page = client.read_events(
            EventFilter(event=EventNameFilter(name=[ARRIVAL_EVENT])), limit=50
        )
        if not any(str(PLANTS["event payload"]) in e.payload.get("path", "") for e in page.events):
            return False
        logs = client.read_logs(LogFilter(flow_run_id=LogFilterFlowRunId(any_=[plant_run])))
        if not any(str(PLANTS["run log"]) in log.message for log in logs):
            return False
        children = client.read_flow_runs(
            flow_run_filter=FlowRunFilter(
                parent_flow_run_id=FlowRunFilterParentFlowRunId(any_=flow_runs)
            )
        )
        ids = flow_runs + [child.id for child in children]
        tasks = client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=ids)))
    ingests = [t for t in tasks if t.name.startswith("ingest")]
    return len(ingests) == len(CASES) and all(t.state and t.state.is_final() for t in tasks)


def _release_each_announcement(
    root: Path, specs: Path, events: dict[str, ArrivalEvent]
) -> list[Outcome]:
    """What the arrival trigger runs for each event, one release per case, in this process."""
    from prefect.client.orchestration import get_client

    from dprelease.flows.deployed_release import release_deployment_flow

    outcomes = []
    problems: list[str] = []
    for case in CASES:
        dataset_id = f"leak-{case.name}"
        reviewer = None if case.rule else _approve_when_paused(dataset_id, problems)
        state = release_deployment_flow(
            spec_path=str(specs / f"{case.name}.yaml"),
            out_dir=str(root / "releases"),
            publish_dir=str(root / "published"),
            source_override=events[dataset_id].payload["path"],
            expected_fingerprint=events[dataset_id].payload["fingerprint"],
            review_timeout_seconds=REVIEW_TIMEOUT_SECONDS,
            return_state=True,
        )
        if reviewer is not None:
            reviewer.join(timeout=REVIEW_TIMEOUT_SECONDS)
        run_id = state.state_details.flow_run_id
        with get_client(sync_client=True) as client:
            stored = client.read_flow_run(run_id).state
        outcomes.append(
            Outcome(
                case=case,
                flow_run_id=run_id,
                result=state.result(raise_on_failure=False),
                state_message=(stored.message or "") if stored else "",
            )
        )
    assert not problems, problems
    return outcomes


def _compact(database: Path) -> None:
    """Rewrite the session's test server database without free space and empty its -wal file,
    so the raw-byte scan reads what this module's runs leave (live rows, and the pages and frames
    they free or supersede), not fragments of earlier modules' timestamps, where any 4-digit
    figure turns up by chance (a CI run once found "1871" between two index cells).  Bounded:
    the checkpoint is retried while the server is writing."""
    with contextlib.closing(sqlite3.connect(database, timeout=60)) as db:
        db.execute("VACUUM")
        deadline = time.monotonic() + 60
        while db.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()[0] != 0:
            if time.monotonic() > deadline:
                raise AssertionError(f"{database}: its -wal file stayed busy for 60 s")
            time.sleep(0.1)


@pytest.fixture(scope="module")
def deployed(tmp_path_factory: pytest.TempPathFactory) -> Deployed:
    from prefect.events.worker import EventsWorker
    from prefect.logging.handlers import APILogWorker
    from prefect.settings import PREFECT_API_URL, PREFECT_SERVER_DATABASE_CONNECTION_URL

    from dprelease.flows.cli import app

    database = Path(PREFECT_SERVER_DATABASE_CONNECTION_URL.value().split(":///", 1)[1])
    _compact(database)
    root = tmp_path_factory.mktemp("leaks-deployed")
    landing, specs = root / "landing", root / "specs"
    for case in CASES:
        write_case(landing / case.name, case, spec_dir=specs, trigger="arrival")
    api_url = PREFECT_API_URL.value()
    send = prefect_emitter(api_url)
    recorded: list[ArrivalEvent] = []

    def emitter(event: ArrivalEvent) -> None:
        send(event)
        recorded.append(event)

    with _recording_logs() as logs:
        watcher = Watcher(
            landing, state=WatchState(), emitter=emitter, resolve_datasets=SpecResolver(specs)
        )
        watcher.run(interval_seconds=0.05, max_polls=2)  # what `dprelease watch --once` does
        assert len(recorded) == len(CASES), recorded  # one announcement per case's file
        polls = ["--once", "--interval", "0.05", "--dry-run"]
        dry_run = CliRunner().invoke(app, ["watch", str(landing), "--spec-dir", str(specs), *polls])
        outcomes = _release_each_announcement(
            root, specs, {event.dataset_id: event for event in recorded}
        )
        plant = _plant_flow(return_state=True)
        send(
            ArrivalEvent(
                dataset_id="leak-plant",
                path=f"/planted/{PLANTS['event payload']}.parquet",
                fingerprint="0" * 64,
                size=1,
            )
        )
        APILogWorker.drain_all(timeout=30, at_exit=False)
        EventsWorker.drain_all(timeout=30, at_exit=False)
        _wait_for(
            lambda: _settled([o.flow_run_id for o in outcomes], plant.state_details.flow_run_id),
            what="the server to store the runs' events, logs and task runs",
            timeout=SETTLE_TIMEOUT_SECONDS,
        )
    homes = ("DPRELEASE_HOME", "PREFECT_HOME", "PREFECT_RESULTS_LOCAL_STORAGE_PATH")
    files = read_tree(
        *(Path(os.environ[name]) for name in (*homes, "DPRELEASE_CACHE_DIR")),
        database.parent,
        root,
        exclude=(landing,),  # the confidential input itself
    )
    host = api_url.split("//", 1)[1].split("/", 1)[0]  # 127.0.0.1:<port>
    return Deployed(
        root=root,
        events=recorded,
        announcements=WatchState().announcements(),
        dry_run_output=dry_run.output,
        dry_run_exit_code=dry_run.exit_code,
        outcomes=outcomes,
        log_text="\n".join(logs.lines),
        files=files,
        database=database,
        mask=(host.encode(),),
    )


# --- the watcher -----------------------------------------------------------------------------------


def test_the_watcher_announces_each_file_and_nothing_it_carries_is_a_sentinel(
    deployed: Deployed,
) -> None:
    by_dataset = {event.dataset_id: event for event in deployed.events}
    assert sorted(by_dataset) == sorted(f"leak-{case.name}" for case in CASES)
    for case in CASES:
        event = by_dataset[f"leak-{case.name}"]
        assert Path(event.path).name == f"{case.name}.parquet"
        for shown in (repr(event), repr(event.payload), repr(event.resource)):
            assert not leaks(shown.encode()), shown
    mine = [a for a in deployed.announcements if a.dataset_id.startswith("leak-")]
    assert len(mine) == len(CASES)
    for announcement in mine:
        assert not leaks(repr(announcement).encode()), announcement


def test_the_dry_run_watcher_prints_no_sentinel(deployed: Deployed) -> None:
    assert deployed.dry_run_exit_code == 0, deployed.dry_run_output
    assert f"announced {len(CASES)} file(s)" in deployed.dry_run_output
    assert "would emit dprelease.data.arrived" in deployed.dry_run_output
    assert not leaks(deployed.dry_run_output.encode()), deployed.dry_run_output


# --- the deployed release ----------------------------------------------------------------------------


def test_each_data_error_fails_the_deployed_release_by_column_and_rule(deployed: Deployed) -> None:
    for outcome in deployed.outcomes:
        where = f"{outcome.case.name}: {outcome.result!r} / {outcome.state_message}"
        if outcome.case.rule:
            assert isinstance(outcome.result, DataError), where
            assert outcome.case.rule in str(outcome.result), where
            assert "dprelease check SPEC" in str(outcome.result), where
            assert outcome.case.rule in outcome.state_message, where
        else:  # staged, approved through the paused run's input, published
            assert outcome.result.status == "published", where
            assert Path(outcome.result.published_directory).is_dir(), where
        for text in (str(outcome.result), repr(outcome.result), outcome.state_message):
            assert not leaks(text.encode()), where


def test_no_log_record_carries_a_sentinel(deployed: Deployed) -> None:
    assert "DataError" in deployed.log_text  # the failures were logged, with their tracebacks
    found = leaks(deployed.log_text.encode())
    assert not found, "\n".join(found)


def test_no_file_under_the_homes_carries_a_sentinel(deployed: Deployed) -> None:
    found = leaks_in(deployed.files, mask=deployed.mask)
    assert not found, "\n".join(found)


# --- the scan reads where a leak would land --------------------------------------------------------


def _database_files(deployed: Deployed) -> dict[Path, bytes]:
    return {p: c for p, c in deployed.files.items() if p.name.startswith(deployed.database.name)}


def test_the_scan_read_the_servers_database_with_the_failures_and_the_events(
    deployed: Deployed,
) -> None:
    database = b"".join(_database_files(deployed).values())
    assert len(database) > 100_000, sorted(_database_files(deployed))
    for case in CASES:
        if case.rule:  # the failure's message was stored: where a count would have gone
            assert case.rule.encode() in database, case.name
    assert ARRIVAL_EVENT.encode() in database
    assert all(event.fingerprint.encode() in database for event in deployed.events)
    staged = [p for p in deployed.files if p.is_relative_to(deployed.root / "published")]
    assert any(p.name == "manifest.json" for p in staged), staged
    home = Path(os.environ["DPRELEASE_HOME"])
    assert home / "catalog.db" in deployed.files  # the ledger, release records, watch state
    assert any(p.is_relative_to(home / "prefect-results") for p in deployed.files)  # plan results


@pytest.mark.parametrize("channel", sorted(PLANTS))
def test_the_scan_finds_a_figure_planted_in_the_servers_database(
    deployed: Deployed, channel: str
) -> None:
    assert not set(PLANTS.values()) & set(ALL_SENTINELS)
    assert leaks_in(_database_files(deployed), mask=deployed.mask, sentinels=[PLANTS[channel]])
