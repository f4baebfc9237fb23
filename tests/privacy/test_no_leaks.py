"""No confidential value leaves the choke point when the input is wrong (issue 13, item 1).

Each data-error class is planted with sentinel figures that occur nowhere else: an exact count
(7919 null ages, 3313 rows of the out-of-domain age 4242, 6661 rows of one person, 2719 rows without
a person id; 1871 nulls and 2357 rows of age 6397 left out by ``on_out_of_domain: drop``) or a raw
value (age 4242, the text "5077" in an integer column, person id 9433).  The errors go through the
counting code (in process: the exception, its pickle, the log records) and through ``dprelease
run`` as a subprocess; then stdout, stderr and every file under the state home, the Prefect home
(its SQLite database read as bytes, with its -wal file, and as a dump of its rows), result storage,
the user cache and the release directory are searched for the sentinels' decimal forms.
``test_no_leaks_deployed`` reuses the cases and the scanner for the watcher and the deployed flow.

A series whose periods are a column's values plants them in its period column: 4421 rows of the
undeclared period 6133 (refused under ``on_out_of_domain: error``) and, with 2861 null periods
too, a period released under ``drop``; ``show``, ``budget`` and ``verify`` of that release are
searched as well.

The sentinels are real: ``dprelease check`` (the custodian's local view) prints each of them, and
the scanner finds the old message format ("column 'age' has 7919 null value(s)"), so a leak would
fail these tests.
"""

from __future__ import annotations

import functools
import logging
import os
import pickle
import re
import shutil
import socket
import sqlite3
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from dprelease.catalog.confidential.check import check_data, format_report
from dprelease.catalog.confidential.source import (
    CountResult,
    check_period_values,
    count_cells,
    period_rows,
)
from dprelease.catalog.errors import DataError
from dprelease.catalog.spec.load import load_spec
from dprelease.catalog.spec.model import ReleaseSpec
from tests.prefect_template import migrated_prefect_db

NORMAL_ROWS = 1000  # in-domain rows in every file: ages 20..69, one person each


@dataclass(frozen=True)
class Case:
    name: str
    table: pa.Table
    sentinels: tuple[int, ...]
    spec: dict[str, Any]
    rule: str
    """What ``run`` must say instead (column and rule), or "" when the run succeeds."""
    unshown: tuple[int, ...] = ()
    """Sentinels ``dprelease check`` need not print (derived totals, a person id)."""


def _ages(extra: list[Any], *, type_: pa.DataType = pa.int64()) -> pa.Array:
    normal = [int(20 + k % 50) for k in range(NORMAL_ROWS)]
    if type_ == pa.string():
        normal = [str(v) for v in normal]
    return pa.array(extra + normal, type_)


def _persons(extra: list[Any]) -> pa.Array:
    return pa.array(extra + [100_000 + k for k in range(NORMAL_ROWS)], pa.int64())


def cases() -> list[Case]:
    bounded = {"privacy_unit": {"person_column": "pid", "max_rows": 5}}
    return [
        Case(
            "nulls",
            pa.table({"age": _ages([None] * 7919)}),
            (7919, 7919 + NORMAL_ROWS),
            {},
            "column 'age' has null values",
        ),
        Case(
            "out-of-domain",
            pa.table({"age": _ages([4242] * 3313)}),
            (4242, 3313, 3313 + NORMAL_ROWS),
            {},
            "column 'age' has values outside the public domain integers 0..99",
        ),
        Case(
            "wrong-type",
            pa.table({"age": _ages(["5077"] * 2221, type_=pa.string())}),
            (5077, 2221, 2221 + NORMAL_ROWS),
            {},
            "column 'age' does not hold integer values",
        ),
        Case(
            "over-the-bound",
            pa.table({"age": _ages([30] * 6661), "pid": _persons([9433] * 6661)}),
            (6661, 6661 - 5, 9433, 6661 + NORMAL_ROWS),
            bounded,
            "",  # bounding is silent: the release is staged
            unshown=(6661 - 5, 9433),
        ),
        Case(
            "null-person",
            pa.table({"age": _ages([31] * 2719), "pid": _persons([None] * 2719)}),
            (2719, 2719 + NORMAL_ROWS),
            bounded,
            "person column 'pid' has null values",
        ),
        Case(
            "dropped",
            pa.table({"age": _ages([None] * 1871 + [6397] * 2357)}),
            (1871, 2357, 6397, 1871 + 2357, 1871 + 2357 + NORMAL_ROWS),
            {"on_out_of_domain": "drop"},
            "",  # the way to proceed: nulls and out-of-domain rows are left out, silently
            unshown=(1871 + 2357,),
        ),
    ]


SERIES_YEARS = [2024, 2025, 2026]  # a column series' declared periods (public)


def series_cases() -> list[Case]:
    """A series whose periods are the values of column ``year`` (declared 2024..2026; 1000 rows of
    2024): 4421 rows of the undeclared year 6133 refused under ``on_out_of_domain: error``; with
    2861 null years too, period 2024 released under ``drop``."""

    def table(years: list[Any]) -> pa.Table:
        periods = pa.array(years + [SERIES_YEARS[0]] * NORMAL_ROWS, pa.int64())
        return pa.table({"year": periods, "age": _ages([30] * len(years))})

    spec = {
        "dataset": {"budget": {"rho": 10.0}, "partitions": {"column": "year"}},
        "privacy": {"rho": 0.5},
        "series": {
            "period": {"column": "year", "values": SERIES_YEARS},
            "horizon": len(SERIES_YEARS),
            "time_workload": ["period", "cumulative"],
        },
    }
    return [
        Case(
            "series",
            table([6133] * 4421),
            (6133, 4421, 4421 + NORMAL_ROWS),
            spec,
            "column 'year' (series.period.column) has values that are not series.period.values",
        ),
        Case(
            "series-drop",
            table([6133] * 4421 + [None] * 2861),
            (6133, 4421, 2861, 4421 + 2861, 4421 + 2861 + NORMAL_ROWS),
            spec | {"on_out_of_domain": "drop"},
            "",  # the undeclared and null years are left out, silently
            unshown=(4421 + 2861,),
        ),
    ]


CASES = cases()
SERIES_CASES = series_cases()
ALL_SENTINELS = sorted({s for case in (*CASES, *SERIES_CASES) for s in case.sentinels})


@functools.cache
def _sentinel_pattern(sentinels: tuple[int, ...]) -> re.Pattern[bytes]:
    forms = {
        form
        for value in sentinels
        for form in (str(value), f"{value:,}", f"{value:_}", f"{value:,}".replace(",", " "))
    }
    alternatives = b"|".join(re.escape(f.encode()) for f in sorted(forms, key=len, reverse=True))
    # one pass over the bytes, O(bytes): (?=\d) lets every other position fail at once
    return re.compile(rb"(?=\d)(?<![0-9A-Za-z._\-])(?:" + alternatives + rb")(?![0-9A-Za-z_\-])")


# Process ids are public, and on Linux they share the sentinels' range (pid_max 32768 by default), so
# a run's own pid once matched a sentinel.  Masked only where dprelease names a process as one: its
# server log ("supervisor 8919:", "prefect server pid 8919", "validation service 8919:"), messages
# ("(pid 8919", "its process 8919 on"), registry files ('"pid": 8919') and Prefect's
# "<host>:<pid>" infrastructure id.  A sentinel anywhere else is still a leak.
PROCESS_ID_PHRASES = re.compile(
    rb"(?<=supervisor )\d+(?=:)|(?<=validation service )\d+(?=:)|(?<=server pid )\d+"
    rb"|(?<=service pid )\d+|(?<=\(pid )\d+|(?<=its process )\d+(?= on )|(?<=\"pid\": )\d+"
    rb"|(?<=run starter )\d+(?=:)|(?<=flow-run process )\d+(?=:)|(?<=of run process )\d+(?= )"
    rb"|(?<=before run process )\d+(?=:)"
    + rb"|(?<="
    + re.escape(socket.gethostname().encode())
    + rb":)\d+"
)
PROCESS_ID_COLUMNS = {"releases": ("owner_pid", "owner_start"), "flow_run": ("infrastructure_pid",)}
"""Columns that hold a process's identity (pid, start time), set to NULL in :func:`sqlite_rows`."""


def leaks(data: bytes, sentinels: tuple[int, ...] | list[int] = ALL_SENTINELS) -> list[str]:
    """Every decimal form ("7919", "7,919", "7 919", "7_919") of a sentinel standing alone: not
    inside a longer number, word, hex id or UUID (where 4 digits turn up by chance), nor where a
    process id is named as one (:data:`PROCESS_ID_PHRASES`)."""
    found = []
    data = PROCESS_ID_PHRASES.sub(b"<pid>", data)
    for match in _sentinel_pattern(tuple(sorted(sentinels))).finditer(data):
        context = data[max(0, match.start() - 60) : match.end() + 60]
        found.append(f"{match.group().decode()}: ...{context!r}...")
    return found


def sqlite_rows(path: Path) -> bytes:
    """Every row of a SQLite database (with its -wal file) as SQL text.  In the raw file a value
    runs into the next column's bytes ("... 7919" then "2026-..."), hiding a number at its edge
    from :func:`leaks`; in the dump each value is quoted.  Read from a copy: the owner may be live."""
    with tempfile.TemporaryDirectory() as scratch:
        for suffix in ("", "-wal"):
            if Path(f"{path}{suffix}").is_file():
                shutil.copyfile(f"{path}{suffix}", Path(scratch) / f"copy.db{suffix}")
        connection = sqlite3.connect(Path(scratch) / "copy.db")
        try:
            tables = {row[0] for row in connection.execute("SELECT name FROM sqlite_master")}
            for table, columns in PROCESS_ID_COLUMNS.items():
                if table in tables:  # positional in the dump, so no phrase names them
                    connection.execute(f"UPDATE {table} SET {' = NULL, '.join(columns)} = NULL")
            return "\n".join(connection.iterdump()).encode()
        finally:
            connection.close()


def read_tree(*roots: Path, exclude: tuple[Path, ...] = ()) -> dict[Path, bytes]:
    """Every file under ``roots`` (not under ``exclude``) as raw bytes (SQLite databases with their
    -wal/-journal files, pickled results, logs), and each database's rows as ``<path> [rows]``.
    O(total bytes)."""
    files = {}
    for root in roots:
        for path in sorted(root.rglob("*")):
            if path.is_file() and not any(path.is_relative_to(skip) for skip in exclude):
                files[path] = path.read_bytes()
                if files[path].startswith(b"SQLite format 3\x00"):
                    files[path.with_name(f"{path.name} [rows]")] = sqlite_rows(path)
    return files


def leaks_in(
    files: dict[Path, bytes],
    *,
    mask: tuple[bytes, ...] = (),
    sentinels: tuple[int, ...] | list[int] = ALL_SENTINELS,
) -> list[str]:
    """Sentinel hits in ``files`` as "path: form: context"; each ``mask`` string (a public figure
    that may collide with a sentinel by chance, e.g. a server's port) is blanked first."""
    found = []
    for path, content in files.items():
        for public in mask:
            content = content.replace(public, b"<masked>")
        found += [f"{path}: {hit}" for hit in leaks(content, sentinels)]
    return found


def write_case(
    folder: Path, case: Case, *, spec_dir: Path | None = None, trigger: str | None = None
) -> Path:
    """The case's Parquet file in ``folder`` and its spec (returned) beside it; with ``spec_dir``,
    the spec goes there and its source is ``folder`` (where files of the dataset arrive)."""
    folder.mkdir(parents=True, exist_ok=True)
    pq.write_table(case.table, folder / f"{case.name}.parquet")
    spec_dir = spec_dir or folder
    spec_dir.mkdir(parents=True, exist_ok=True)
    spec = {
        "name": f"leak-{case.name}",
        "dataset": {
            "id": f"leak-{case.name}",
            "source": f"{case.name}.parquet" if spec_dir == folder else str(folder.resolve()),
            "budget": {"epsilon": 10.0},
        }
        | case.spec.get("dataset", {}),
        "domain": {"age": {"min": 0, "max": 99}},
        "workload": [{"name": "ages", "marginal": ["age"]}],
        "mechanism": "identity",
        "privacy": {"epsilon": 1.0},
        **{key: value for key, value in case.spec.items() if key != "dataset"},
        **({"trigger": trigger} if trigger else {}),
    }
    path = spec_dir / f"{case.name}.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


# --- the scanner and the sentinels can catch a leak ------------------------------------------------


def test_the_scanner_finds_a_count_in_the_old_message_format() -> None:
    assert leaks(b"DataError: column 'age' has 7919 null value(s); the domain")
    assert leaks(b'{"null_rows": 7919}')
    assert leaks(b"out of domain: 3,313 rows, e.g. 4242")
    assert not leaks(b"uuid 0a1b6661-6661-4c3d-8e9f-000000006661 sha 0f6661ab 0.66610 16661")


def test_the_scanner_passes_a_process_id_only_where_it_is_named_as_one(tmp_path: Path) -> None:
    host = socket.gethostname()
    for named in (
        b"2026-11-29T13:53:51+00:00 dprelease supervisor 8919: prefect server pid 7919 on port 45745",
        b"dprelease validation service 8919: validated 1 suite(s); validation service pid 7919",
        b"run of s.yaml (pid 8919, its process 7919 on vm is gone",
        b'{"pid": 8919, "start": "2961932"} ' + f"{host}:7919".encode(),
        b"dprelease run starter 8919: the requester of run process 7919 ended: run process killed",
        b"dprelease flow-run process 8919: the run starter ended before run process 7919: waiting",
    ):
        assert not leaks(named), named
    for leaked in (
        b"supervisor 8919 rows", b"pid 7919", b"7919: null rows", b"process 7919",
        b"run starter 7919 rows", b"run process 7919",
    ):  # fmt: skip
        assert leaks(leaked), leaked
    database = tmp_path / "catalog.db"
    with sqlite3.connect(database) as connection:
        connection.execute("CREATE TABLE releases (id TEXT, owner_pid INTEGER, owner_start TEXT)")
        connection.execute("INSERT INTO releases VALUES ('r1', 8919, '2961932')")
        connection.execute("CREATE TABLE notes (id TEXT, figure INTEGER)")
        connection.execute("INSERT INTO notes VALUES ('r1', 7919)")
    connection.close()
    rows = sqlite_rows(database)
    assert b"8919" not in rows and b"'r1',NULL,NULL" in rows
    assert [hit.split(":")[0] for hit in leaks(rows)] == ["7919"]  # the same number as a figure


def test_the_scanner_reads_a_databases_rows_including_its_write_ahead_log(tmp_path: Path) -> None:
    """A committed row still in the -wal file, its number run into the next column's bytes: the raw
    bytes hide it from :func:`leaks`, the ``[rows]`` dump of :func:`read_tree` shows it."""
    database = tmp_path / "state.db"
    connection = sqlite3.connect(database)
    try:
        connection.execute("PRAGMA journal_mode=WAL")
        connection.execute("PRAGMA wal_autocheckpoint=0")
        connection.execute("CREATE TABLE runs (message TEXT, at TEXT)")
        connection.execute("INSERT INTO runs VALUES ('null rows: 7919', '2026-11-25')")
        connection.commit()
        files = read_tree(tmp_path)  # while the writer is open: nothing checkpointed yet
    finally:
        connection.close()
    wal = tmp_path / "state.db-wal"
    assert b"null rows: 7919" in files[wal] and b"null rows: 7919" not in files[database]
    assert not leaks(files[database] + files[wal])
    assert leaks_in({p: c for p, c in files.items() if p.name == "state.db [rows]"})


@pytest.mark.parametrize("case", [*CASES, *SERIES_CASES], ids=lambda c: c.name)
def test_the_custodian_check_shows_every_sentinel(tmp_path: Path, case: Case) -> None:
    """Power: the planted figures are in the data and computable, so a leak is detectable."""
    report = format_report(check_data(load_spec(write_case(tmp_path, case))))
    shown = {int(v) for v in re.findall(r"(?<![\d.])\d[\d,]*(?![\d.])", report.replace(",", ""))}
    expected = set(case.sentinels) - set(case.unshown)
    if case.name == "wrong-type":
        expected = {2221 + NORMAL_ROWS}  # the type is shown, the values of a wrong column are not
    assert expected <= shown, report


# --- the counting code path (in process) -------------------------------------------------------------


def count_as_a_run_does(spec: ReleaseSpec) -> CountResult:
    """The cells a run counts: the whole source, or a column series' first period (its period
    column checked first, as the series reader does)."""
    if spec.series is None:
        return count_cells(spec)
    check_period_values(spec)
    return count_cells(spec, rows=period_rows(spec, 0))


@pytest.mark.parametrize("case", [*CASES, *SERIES_CASES], ids=lambda c: c.name)
def test_counting_errors_carry_no_sentinel(
    tmp_path: Path, case: Case, caplog: pytest.LogCaptureFixture
) -> None:
    spec = load_spec(write_case(tmp_path, case))
    caplog.set_level(logging.DEBUG)
    if not case.rule:
        result = count_as_a_run_does(spec)
        assert not leaks(repr(result).encode(), case.sentinels)
        assert not leaks(caplog.text.encode(), case.sentinels)
        return
    with pytest.raises(DataError) as raised:
        count_as_a_run_does(spec)
    error = raised.value
    for text in (str(error), repr(error), repr(error.args), caplog.text):
        assert not leaks(text.encode(), case.sentinels), text
    assert case.rule in str(error)
    assert "dprelease check SPEC" in str(error)
    # what Prefect would persist for a failed task: the pickled exception; and a chained cause
    assert not leaks(pickle.dumps(error), case.sentinels)
    for chained in (error.__cause__, error.__context__):
        if chained is not None and not error.__suppress_context__:
            assert not leaks(str(chained).encode(), case.sentinels), str(chained)


# --- dprelease run (subprocess, shared Prefect server, everything scanned) ------------------------


@dataclass(frozen=True)
class RunOutcome:
    case: Case
    returncode: int
    stdout: str
    stderr: str
    audits: tuple[tuple[str, subprocess.CompletedProcess[str]], ...] = ()
    """After a released series period: ``show``, ``budget`` and ``verify`` (command, result)."""


def _env(root: Path) -> dict[str, str]:
    keep = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("PREFECT_", "DPRELEASE_", "XDG_", "GX_"))
    }
    return {
        **keep,
        "HOME": str(root / "user"),
        "XDG_CACHE_HOME": str(root / "user" / "cache"),
        "DPRELEASE_HOME": str(root / "state"),
        "PREFECT_HOME": str(root / "prefect"),
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "DO_NOT_TRACK": "1",
        "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "180",
        "PYTHONDONTWRITEBYTECODE": "1",
    }


def _dprelease(*args: str, root: Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(Path(sys.executable).with_name("dprelease")), *args],
        cwd=cwd,
        env=_env(root),
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, list[RunOutcome]]]:
    root = tmp_path_factory.mktemp("leaks")
    data = root / "data"
    (root / "user").mkdir()
    # the user ran install.sh: the migrated, empty Prefect database waits in their cache (scanned too)
    template = migrated_prefect_db()
    cached = root / "user" / "cache" / "dprelease" / template.name
    cached.parent.mkdir(parents=True)
    shutil.copyfile(template, cached)
    outcomes = []
    try:
        for case in (*CASES, *SERIES_CASES):
            spec = write_case(data, case)
            done = _dprelease(
                "run", str(spec), "--out", str(root / "releases"), root=root, cwd=data
            )
            outcomes.append(RunOutcome(case, done.returncode, done.stdout, done.stderr))
        outcomes[-1] = _audited(outcomes[-1], root=root, cwd=data)
    finally:
        # the shared server flushes and stops: the database is complete when scanned
        _dprelease("server", "stop", root=root, cwd=data)
    yield root, outcomes


def _audited(outcome: RunOutcome, *, root: Path, cwd: Path) -> RunOutcome:
    """The released series period as anyone may look at it: ``show``, ``budget`` of both series'
    datasets (the refused one recorded its plan), ``verify`` of the release directory."""
    if "release id:" not in outcome.stdout:
        return outcome  # test_run_reports_each_problem_by_column_and_rule says why
    release_id = outcome.stdout.split("release id:")[1].split()[0]
    commands = [
        ("show", release_id),
        *(("budget", f"leak-{case.name}") for case in SERIES_CASES),
        ("verify", str(root / "releases" / release_id)),
    ]
    audits = tuple((" ".join(args), _dprelease(*args, root=root, cwd=cwd)) for args in commands)
    return replace(outcome, audits=audits)


@pytest.mark.flow
def test_run_reports_each_problem_by_column_and_rule(
    runs: tuple[Path, list[RunOutcome]],
) -> None:
    _, outcomes = runs
    for outcome in outcomes:
        where = f"{outcome.case.name}: {outcome.stdout}\n{outcome.stderr}"
        if outcome.case.rule:
            assert outcome.returncode == 2, where
            assert outcome.case.rule in outcome.stderr, where
            assert "dprelease check SPEC" in outcome.stderr, where
        else:
            assert outcome.returncode == 0, where
            assert "release id:" in outcome.stdout, where


@pytest.mark.flow
def test_run_output_carries_no_sentinel(runs: tuple[Path, list[RunOutcome]]) -> None:
    _, outcomes = runs
    for outcome in outcomes:
        for stream in (outcome.stdout, outcome.stderr):
            assert not leaks(stream.encode()), f"{outcome.case.name}: {stream}"


@pytest.mark.flow
def test_show_budget_and_verify_of_a_column_period_name_it_and_carry_no_sentinel(
    runs: tuple[Path, list[RunOutcome]],
) -> None:
    _, outcomes = runs
    (released,) = [o for o in outcomes if o.case.name == "series-drop"]
    assert [command.split()[0] for command, _ in released.audits] == [
        "show",
        "budget",
        "budget",
        "verify",
    ]
    for command, done in released.audits:
        assert done.returncode == 0, f"{command}: {done.stdout}\n{done.stderr}"
        for stream in (done.stdout, done.stderr):
            assert not leaks(stream.encode()), f"{command}: {stream}"
    shown, error_budget, drop_budget, _ = (" ".join(d.stdout.split()) for _, d in released.audits)
    assert "period 1 of 3 (year=2024;" in shown, shown
    # every declared period by its value: released (2024) and not yet released (2025, 2026)
    assert all(f"year={year}" in drop_budget for year in SERIES_YEARS), drop_budget
    assert "0 of 3 periods released" in error_budget, (
        error_budget
    )  # the refused run charged nothing


@pytest.mark.flow
def test_no_file_written_by_run_carries_a_sentinel(runs: tuple[Path, list[RunOutcome]]) -> None:
    root, _ = runs
    files = read_tree(root, exclude=(root / "data",))  # (the confidential input and the specs)
    found = leaks_in(files)
    assert not found, "\n".join(found)
    scanned = {"prefect database": 0, "release files": 0, "state files": 0}
    for path, content in files.items():
        if path.name.startswith("prefect.db"):
            scanned["prefect database"] += len(content)
        elif path.is_relative_to(root / "releases"):
            scanned["release files"] += 1
        elif path.is_relative_to(root / "state"):
            scanned["state files"] += 1
    # the scan covered what it claims: Prefect's database, a staged release, the state home
    assert scanned["prefect database"] > 100_000 and scanned["release files"] >= 3, scanned
    assert scanned["state files"] >= 1, scanned


def test_sentinels_are_distinct_from_the_normal_rows() -> None:
    """No sentinel is a figure the normal part of a file produces (ages 20..69, 20 rows each) or
    a declared (public) period of the series."""
    normal = set(range(20, 70)) | {NORMAL_ROWS, NORMAL_ROWS // 50} | set(SERIES_YEARS)
    assert not normal & set(ALL_SENTINELS)
    assert np.all(np.asarray(ALL_SENTINELS) > 999)
