"""The arrival watcher without a server: an injected emitter and polls driven by the test.

What is proven: a complete Parquet file is announced exactly once, only after its size settled
across two polls; files written under a temporary name and renamed, and files written in place
(growing, or stalled before the Parquet footer) are not announced early; the same content is never
announced twice (another name, a restarted watcher); changed content is; files that are not
Parquet are logged and skipped without stopping the watcher; a failed emission is retried; which
dataset a file belongs to (landing sub-folders, arrival-triggered specs); and every validator.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import sqlalchemy as sa
import yaml
from typer.testing import CliRunner

from dprelease.catalog.errors import CatalogError
from dprelease.catalog.watch_state import ReviewRuns, WatchState
from dprelease.flows.watch import (
    ARRIVAL_EVENT,
    ArrivalEvent,
    SpecResolver,
    Watcher,
    is_temporary_name,
    parquet_verdict,
    prefect_emitter,
    resource_id,
)

DATASET = "census"


def keyed(data: bytes) -> str:
    """The watcher's fingerprint of ``data``: HMAC-SHA256 under the current catalog's key."""
    from dprelease.catalog.keys import catalog_key
    from dprelease.catalog.ledger.database import default_url

    return catalog_key(default_url()).fingerprint([data])


class RecordingEmitter:
    """Stands in for the Prefect events client: records events, can be told to fail."""

    def __init__(self, *, failures: int = 0) -> None:
        self.events: list[ArrivalEvent] = []
        self.failures = failures

    def __call__(self, event: ArrivalEvent) -> None:
        if self.failures:
            self.failures -= 1
            raise ConnectionError("server unreachable")
        self.events.append(event)


def parquet_bytes(tmp_path: Path, *, seed: int, rows: int = 200) -> bytes:
    rng = np.random.default_rng(seed)  # public randomness: synthetic test data
    scratch = tmp_path / f"scratch-{seed}-{rows}.bin"
    pq.write_table(pa.table({"age": rng.integers(17, 90, rows)}), scratch)
    data = scratch.read_bytes()
    scratch.unlink()
    return data


@pytest.fixture
def landing(tmp_path: Path) -> Path:
    folder = tmp_path / "landing"
    (folder / DATASET).mkdir(parents=True)
    return folder


@pytest.fixture
def state_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'catalog.db'}"


def make_watcher(landing: Path, state_url: str, emitter: RecordingEmitter, **kwargs) -> Watcher:
    return Watcher(landing, state=WatchState(state_url), emitter=emitter, **kwargs)


def test_a_complete_file_is_announced_once_after_its_size_settles(
    tmp_path: Path, landing: Path, state_url: str
) -> None:
    data = parquet_bytes(tmp_path, seed=1)
    path = landing / DATASET / "2026-11.parquet"
    path.write_bytes(data)
    emitter = RecordingEmitter()
    watcher = make_watcher(landing, state_url, emitter)
    assert watcher.poll() == []  # first sighting: the size may still change
    [event] = watcher.poll()
    assert event == ArrivalEvent(
        dataset_id=DATASET,
        path=str(path.resolve()),
        fingerprint=keyed(data),
        size=len(data),
    )
    assert event.resource["prefect.resource.id"] == "dprelease.dataset.census"
    assert event.payload == {"path": str(path.resolve()), "fingerprint": event.fingerprint}
    assert ARRIVAL_EVENT == "dprelease.data.arrived"
    assert watcher.poll() == [] and watcher.poll() == []
    assert emitter.events == [event]


def test_written_under_a_temporary_name_then_renamed(
    tmp_path: Path, landing: Path, state_url: str
) -> None:
    emitter = RecordingEmitter()
    watcher = make_watcher(landing, state_url, emitter)
    data = parquet_bytes(tmp_path, seed=2)
    for temporary in (".2026-11.parquet", "2026-11.parquet.tmp", "_2026-11.parquet"):
        (landing / DATASET / temporary).write_bytes(data[: len(data) // 2])
    assert watcher.poll() == [] and watcher.poll() == []
    staging = landing / DATASET / "2026-11.parquet.part"
    staging.write_bytes(data)
    assert watcher.poll() == [] and watcher.poll() == []
    final = landing / DATASET / "2026-11.parquet"
    staging.rename(final)
    assert watcher.poll() == []
    [event] = watcher.poll()
    assert event.path == str(final.resolve())
    assert event.fingerprint == keyed(data)


def test_a_partial_write_in_place_is_not_announced_until_the_footer_is_there(
    tmp_path: Path, landing: Path, state_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    emitter = RecordingEmitter()
    watcher = make_watcher(landing, state_url, emitter)
    data = parquet_bytes(tmp_path, seed=3)
    path = landing / DATASET / "big.parquet"
    path.write_bytes(data[:40])
    assert watcher.poll() == []
    with open(path, "ab") as handle:  # still growing: not announced
        handle.write(data[40 : len(data) // 2])
    caplog.set_level(logging.INFO, logger="dprelease.watch")
    assert watcher.poll() == []
    # the writer stalls: the size is stable, but there is no Parquet footer yet
    assert watcher.poll() == [] and watcher.poll() == []
    assert parquet_verdict(path) == "incomplete"
    waiting = [r for r in caplog.records if "footer not written yet" in r.getMessage()]
    assert len(waiting) == 1  # logged once, not at every poll
    with open(path, "ab") as handle:
        handle.write(data[len(data) // 2 :])
    assert watcher.poll() == []
    [event] = watcher.poll()
    assert event.fingerprint == keyed(data)
    assert emitter.events == [event]


def test_the_same_content_is_never_announced_twice(
    tmp_path: Path, landing: Path, state_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="dprelease.watch")
    data = parquet_bytes(tmp_path, seed=4)
    first = landing / DATASET / "a.parquet"
    first.write_bytes(data)
    emitter = RecordingEmitter()
    watcher = make_watcher(landing, state_url, emitter)
    watcher.poll()
    assert len(watcher.poll()) == 1
    copy = landing / DATASET / "copy-of-a.parquet"  # a duplicate file under another name
    copy.write_bytes(data)
    assert watcher.poll() == [] and watcher.poll() == []
    assert any(
        "announced before" in r.getMessage() and str(first.resolve()) in r.getMessage()
        for r in caplog.records
    )
    restarted = make_watcher(landing, state_url, emitter)  # fingerprints survive a restart
    assert restarted.poll() == [] and restarted.poll() == []
    assert len(emitter.events) == 1
    assert [a.path for a in WatchState(state_url).announcements(DATASET)] == [str(first.resolve())]


def test_changed_content_is_announced_again(tmp_path: Path, landing: Path, state_url: str) -> None:
    path = landing / DATASET / "monthly.parquet"
    path.write_bytes(parquet_bytes(tmp_path, seed=5))
    emitter = RecordingEmitter()
    watcher = make_watcher(landing, state_url, emitter)
    watcher.poll()
    watcher.poll()
    replacement = parquet_bytes(tmp_path, seed=6, rows=300)
    path.write_bytes(replacement)
    os.utime(path, ns=(path.stat().st_atime_ns, path.stat().st_mtime_ns + 1_000_000))
    assert watcher.poll() == []
    [event] = watcher.poll()
    assert event.fingerprint == keyed(replacement)
    assert len({e.fingerprint for e in emitter.events}) == 2


def test_files_that_are_not_parquet_are_logged_and_skipped(
    tmp_path: Path, landing: Path, state_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="dprelease.watch")
    (landing / DATASET / "notes.csv").write_text("age\n17\n")
    (landing / DATASET / "fake.parquet").write_text("age,sex\n17,F\n")  # CSV under a .parquet name
    (landing / DATASET / "empty.parquet").write_bytes(b"")  # an empty placeholder: never complete
    good = landing / DATASET / "good.parquet"
    good.write_bytes(parquet_bytes(tmp_path, seed=7))
    emitter = RecordingEmitter()
    watcher = make_watcher(landing, state_url, emitter)
    watcher.poll()
    [event] = watcher.poll()
    watcher.poll()
    assert event.path == str(good.resolve())
    skipped = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert sum("notes.csv" in m and "not a Parquet file" in m for m in skipped) == 1
    assert sum("fake.parquet" in m and "no PAR1 header" in m for m in skipped) == 1
    assert not any("empty.parquet" in m for m in skipped)
    assert [e.path for e in emitter.events] == [str(good.resolve())]


def test_a_failed_emission_gives_the_claim_back_and_is_retried(
    tmp_path: Path, landing: Path, state_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    path = landing / DATASET / "retry.parquet"
    path.write_bytes(parquet_bytes(tmp_path, seed=8))
    emitter = RecordingEmitter(failures=1)
    watcher = make_watcher(landing, state_url, emitter)
    watcher.poll()
    assert watcher.poll() == []
    assert "could not announce" in caplog.text and "server unreachable" in caplog.text
    assert WatchState(state_url).announcements() == []
    [event] = watcher.poll()
    assert event.path == str(path.resolve())
    assert len(WatchState(state_url).announcements()) == 1


def test_files_outside_a_dataset_folder_are_skipped(
    tmp_path: Path, landing: Path, state_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    (landing / "loose.parquet").write_bytes(parquet_bytes(tmp_path, seed=9))
    emitter = RecordingEmitter()
    watcher = make_watcher(landing, state_url, emitter)
    assert watcher.poll() == [] and watcher.poll() == []
    assert "no dataset for it" in caplog.text
    assert emitter.events == []


def _write_spec(folder: Path, name: str, dataset_id: str, source: str, **extra: object) -> Path:
    spec = {
        "name": name,
        "dataset": {"id": dataset_id, "source": source, "budget": {"epsilon": 1.0}},
        "domain": {"age": {"min": 17, "max": 90}},
        "workload": [{"name": "ages", "prefix": "age"}],
        "privacy": {"epsilon": 0.5},
        **extra,
    }
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def test_arrival_specs_decide_which_dataset_a_file_belongs_to(
    tmp_path: Path, landing: Path, state_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    specs = tmp_path / "specs"
    specs.mkdir()
    (landing / "monthly").mkdir()
    _write_spec(specs, "by-folder", "income", str(landing / "monthly"), trigger="arrival")
    _write_spec(
        specs, "by-glob", "income-2", str(landing / "monthly" / "2026-*.parquet"), trigger="arrival"
    )
    _write_spec(specs, "not-triggered", "other", str(landing / "monthly"))
    (specs / "broken.yaml").write_text("name: broken\n")
    resolver = SpecResolver(specs)
    assert resolver(landing / "monthly" / "2026-11.parquet") == ["income", "income-2"]
    assert resolver(landing / "monthly" / "summary.parquet") == ["income"]
    assert resolver(landing / DATASET / "x.parquet") == []
    assert "ignoring spec" in caplog.text and "broken.yaml" in caplog.text

    (landing / "monthly" / "2026-11.parquet").write_bytes(parquet_bytes(tmp_path, seed=10))
    emitter = RecordingEmitter()
    watcher = make_watcher(landing, state_url, emitter, resolve_datasets=resolver)
    watcher.poll()
    assert sorted(e.dataset_id for e in watcher.poll()) == ["income", "income-2"]
    # a spec added later is picked up without restarting the watcher
    _write_spec(specs, "late", "late-ds", str(landing / DATASET), trigger="arrival")
    assert resolver(landing / DATASET / "x.parquet") == ["late-ds"]


def test_run_polls_a_bounded_number_of_times(tmp_path: Path, landing: Path, state_url: str) -> None:
    (landing / DATASET / "f.parquet").write_bytes(parquet_bytes(tmp_path, seed=11))
    sleeps: list[float] = []
    emitter = RecordingEmitter()
    events = make_watcher(landing, state_url, emitter).run(
        interval_seconds=0.25, max_polls=3, sleep=sleeps.append
    )
    assert len(events) == 1 and sleeps == [0.25, 0.25]


def test_an_unreadable_file_is_skipped_and_the_watcher_keeps_going(
    tmp_path: Path,
    landing: Path,
    state_url: str,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import dprelease.flows.watch

    locked = landing / DATASET / "locked.parquet"
    locked.write_bytes(parquet_bytes(tmp_path, seed=13))
    good = landing / DATASET / "good.parquet"
    good.write_bytes(parquet_bytes(tmp_path, seed=14))
    real_verdict = dprelease.flows.watch.parquet_verdict

    def verdict(path: Path) -> str:
        if path.name == "locked.parquet":
            raise PermissionError(13, "Permission denied")
        return real_verdict(path)

    monkeypatch.setattr(dprelease.flows.watch, "parquet_verdict", verdict)
    emitter = RecordingEmitter()
    watcher = make_watcher(landing, state_url, emitter)
    watcher.poll()
    assert [e.path for e in watcher.poll()] == [str(good.resolve())]
    assert "cannot read it" in caplog.text and "locked.parquet" in caplog.text


def test_run_survives_a_failed_poll(
    landing: Path, state_url: str, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    watcher = make_watcher(landing, state_url, RecordingEmitter())
    outcomes: list[str] = []

    def flaky_poll() -> list[ArrivalEvent]:
        outcomes.append("poll")
        if len(outcomes) == 1:
            raise OSError("stale NFS handle")
        return []

    monkeypatch.setattr(watcher, "poll", flaky_poll)
    assert watcher.run(interval_seconds=1, max_polls=2, sleep=lambda _: None) == []
    assert outcomes == ["poll", "poll"]
    assert "poll of" in caplog.text and "stale NFS handle" in caplog.text


def test_helpers() -> None:
    assert is_temporary_name(Path("x.parquet.tmp")) and is_temporary_name(Path("_SUCCESS"))
    assert is_temporary_name(Path(".hidden.parquet")) and not is_temporary_name(Path("x.parquet"))
    assert resource_id("adult") == "dprelease.dataset.adult"


def test_review_runs_round_trip(state_url: str) -> None:
    runs = ReviewRuns(state_url)
    assert runs.get("r1") is None
    runs.record(release_id="r1", flow_run_id="f1", api_url="http://127.0.0.1:4200/api")
    run = runs.get("r1")
    assert run is not None and run.status == "awaiting" and run.flow_run_id == "f1"
    runs.mark("r1", status="decided")
    assert runs.get("r1").status == "decided"  # type: ignore[union-attr]
    runs.record(release_id="r2", flow_run_id="f2", api_url=None, publish_dir="/srv/public")
    assert runs.get("r2").publish_dir == "/srv/public"  # type: ignore[union-attr]


def test_a_review_runs_table_of_an_earlier_version_gains_the_publish_dir_column(
    tmp_path: Path,
) -> None:
    """What an approval publishes to is kept with the paused run; a table created before that
    column existed gets it when the tables are opened, and its rows read as before."""
    url = f"sqlite:///{tmp_path / 'catalog.db'}"
    engine = sa.create_engine(url)
    with engine.begin() as conn:
        conn.exec_driver_sql(
            "CREATE TABLE review_runs (release_id VARCHAR(128) PRIMARY KEY, flow_run_id "
            "VARCHAR(64) NOT NULL, api_url TEXT, status VARCHAR(16) NOT NULL, created_at "
            "VARCHAR(40) NOT NULL, updated_at VARCHAR(40) NOT NULL)"
        )
        conn.exec_driver_sql(
            "INSERT INTO review_runs VALUES ('old', 'f0', NULL, 'awaiting', 't', 't')"
        )
    engine.dispose()
    runs = ReviewRuns(url)
    assert runs.get("old").publish_dir is None  # type: ignore[union-attr]
    runs.record(release_id="new", flow_run_id="f1", api_url=None, publish_dir="/pub")
    assert runs.get("new").publish_dir == "/pub"  # type: ignore[union-attr]


# --- validators fire --------------------------------------------------------------------------


def test_validators(tmp_path: Path, landing: Path, state_url: str) -> None:
    emitter = RecordingEmitter()
    with pytest.raises(ValueError, match=r"watch dir \('.*missing'\) must be an existing folder"):
        make_watcher(tmp_path / "missing", state_url, emitter)
    watcher = make_watcher(landing, state_url, emitter)
    with pytest.raises(ValueError, match=r"interval_seconds \(0\) must be > 0"):
        watcher.run(interval_seconds=0, max_polls=1)
    with pytest.raises(ValueError, match=r"max_polls \(0\) must be >= 1"):
        watcher.run(interval_seconds=1, max_polls=0)
    with pytest.raises(ValueError, match=r"dataset id \('no spaces!'\) must match"):
        resource_id("no spaces!")
    with pytest.raises(ValueError, match=r"spec dir \('.*nowhere'\) must be an existing folder"):
        SpecResolver(tmp_path / "nowhere")
    with pytest.raises(ValueError, match=r"api_url \('ftp://x'\) must be an http\(s\) URL"):
        prefect_emitter("ftp://x")
    state = WatchState(state_url)
    with pytest.raises(ValueError, match=r"fingerprint \('abc'\) must be a lowercase hex sha256"):
        state.claim(dataset_id=DATASET, fingerprint="abc", path="p", size=1)
    with pytest.raises(ValueError, match=r"size \(-1\) must be >= 0"):
        state.claim(dataset_id=DATASET, fingerprint="0" * 64, path="p", size=-1)
    runs = ReviewRuns(state_url)
    with pytest.raises(ValueError, match=r"status \('done'\) must be one of"):
        runs.mark("r1", status="done")
    with pytest.raises(CatalogError, match=r"release 'nope' has no flow run awaiting review"):
        runs.mark("nope", status="decided")


# --- the CLI, without a server ------------------------------------------------------------------


def test_watch_cli_dry_run_announces_nothing_for_real(
    tmp_path: Path, landing: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from dprelease.flows.cli import app

    monkeypatch.setenv("DPRELEASE_HOME", str(tmp_path / "home"))
    (landing / DATASET / "f.parquet").write_bytes(parquet_bytes(tmp_path, seed=12))
    runner = CliRunner()
    result = runner.invoke(
        app, ["watch", str(landing), "--dry-run", "--once", "--interval", "0.05"]
    )
    assert result.exit_code == 0, result.output
    assert "announced 1 file(s)" in result.stdout
    assert not (tmp_path / "home" / "catalog.db").exists()  # a dry run remembers nothing
    both = runner.invoke(app, ["watch", str(landing), "--once", "--max-polls", "3", "--dry-run"])
    assert both.exit_code == 2 and "give --once or --max-polls, not both" in both.output
    missing = runner.invoke(app, ["watch", str(tmp_path / "absent"), "--dry-run", "--once"])
    assert missing.exit_code == 2 and "must be an existing folder" in missing.output


def test_watch_and_deploy_cli_need_a_prefect_server(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from dprelease.flows.cli import app

    monkeypatch.setenv("DPRELEASE_HOME", str(tmp_path / "home"))
    runner = CliRunner()
    with temporary_settings(restore_defaults={PREFECT_API_URL}):
        watched = runner.invoke(app, ["watch", str(tmp_path), "--once"])
        deployed = runner.invoke(app, ["deploy", str(tmp_path)])
    for result in (watched, deployed):
        assert result.exit_code == 2  # a user error: start a server or point PREFECT_API_URL at one
        assert "needs a running Prefect server" in result.output
