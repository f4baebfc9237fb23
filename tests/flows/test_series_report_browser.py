"""A series period's audit report as people see it: headless Chromium, network disabled (as in
``test_report_browser.py``): the page renders with no console message and no request that is not a
file or data URI, the ``#series`` section is drawn (not blank) with one chart per charted row of
every table, and its text names the period of the horizon.  Skipped only when
``/usr/bin/chromium`` is missing."""

from __future__ import annotations

from pathlib import Path

import pytest

from dprelease.catalog.ledger.store import Catalog
from dprelease.catalog.review.decisions import review
from tests.flows.chromium import CHROMIUM, Browser
from tests.flows.test_report_browser import SECTIONS, inspect
from tests.unit.catalog.test_series_report import run_period, series_data, series_spec, write_period

pytestmark = [
    pytest.mark.flow,
    pytest.mark.skipif(
        not CHROMIUM.exists(), reason="needs Debian's chromium at /usr/bin/chromium"
    ),
]


def test_a_series_report_renders_its_charts_offline(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DPRELEASE_HOME", str(tmp_path / "home"))
    data = tmp_path / "data"
    data.mkdir()
    catalog = Catalog()
    spec = series_spec(data)
    for period in (1, 2, 3):
        write_period(data, period)
        directory = run_period(spec, catalog, tmp_path / "out")
        if period < 3:
            review(catalog, directory.name, approve=True, reviewer="Ada", note="checked")
    report = directory / "report.html"
    shots = tmp_path / "shots"
    shots.mkdir()
    seen = inspect(report, shots, sections=(*SECTIONS, "#series"))
    assert seen.problems == []
    assert "Period 3 of 4" in seen.text
    charted = sum(len(t["rows"]) for t in series_data(report)["tables"].values())
    with Browser(offline=True) as browser:
        browser.open(report)
        drawn = browser.evaluate("document.querySelectorAll('#series svg.chart').length")
        bands = browser.evaluate("document.querySelectorAll('#series svg.chart path.band').length")
    assert drawn == charted and bands == charted
