"""The audit report as people see it: rendered by headless Chromium (Debian's ``chromium``) with the
network disabled, driven over the DevTools protocol (``tests/flows/chromium.py``).

Two zero-noise releases of one dataset are run through the ``release`` flow, so the second report
has a budget timeline with a past charge.  Its ``report.html`` is opened from disk and must render
with no console message, no failed request and no request that is not a file or an embedded data
URI; every section is screenshotted (and must not be blank); every table is complete behind its
pager, which pages correctly, with a CSV link to a file holding the same rows; categorical labels
replace codes; the key numbers are in the text.  The Great Expectations Data Docs open offline
too: their bundled scripts fill the index table and the icon font loads.  The same checks run on a
deliberately broken page to prove they can fail.  Skipped only when ``/usr/bin/chromium`` is
missing (CI installs it in ``.ci/run``).
"""

from __future__ import annotations

import io
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.csv as pa_csv
import pyarrow.parquet as pq
import pytest

from dprelease.catalog.ledger.store import Catalog
from dprelease.catalog.publishing.report import _cost, _fmt
from dprelease.catalog.review.decisions import review
from tests.flows.chromium import CHROMIUM, Browser
from tests.flows.conftest import write_spec

pytestmark = [
    pytest.mark.flow,
    pytest.mark.skipif(
        not CHROMIUM.exists(), reason="needs Debian's chromium at /usr/bin/chromium"
    ),
]
SECTIONS = ("#summary", "#budget", "#method", "#tables", "#validation", "#review")
LABELS = ["Ex", "Why", "Zed"]


def ink(png: bytes) -> float:
    """Share of pixels that are not (near) white."""
    import matplotlib.image

    pixels = np.asarray(matplotlib.image.imread(io.BytesIO(png), format="png"))
    return float(np.mean(pixels[..., :3] < 0.9))


@dataclass(frozen=True, kw_only=True)
class Inspected:
    problems: list[str]
    text: str
    shots: dict[str, Path]


def network_problems(browser: Browser) -> list[str]:
    problems = [f"console: {line}" for line in browser.events.console]
    problems += [f"failed request {line}" for line in browser.events.failed]
    problems += [
        f"network request {url}"
        for url in browser.events.requests
        if not url.startswith(("file:", "data:"))
    ]
    return problems


def inspect(page: Path, work: Path, *, sections: tuple[str, ...]) -> Inspected:
    """Open ``page`` offline; screenshot each section; every problem a reader would notice."""
    problems: list[str] = []
    shots: dict[str, Path] = {}
    with Browser(offline=True) as browser:
        browser.open(page)
        for selector in sections:
            if not browser.evaluate(f"!!document.querySelector({json.dumps(selector)})"):
                problems.append(f"no section {selector}")
                continue
            shot = browser.screenshot(work / f"{page.stem}-{selector[1:]}.png", selector=selector)
            shots[selector] = shot
            if ink(shot.read_bytes()) < 0.01:
                problems.append(f"section {selector} is blank")
        if not sections:
            shot = browser.screenshot(work / f"{page.stem}.png")
            if ink(shot.read_bytes()) < 0.01:
                problems.append("page is blank")
        broken = browser.evaluate(
            "[...document.images].filter(i => !i.complete || i.naturalWidth < 50)"
            ".map(i => (i.getAttribute('src') || '').slice(0, 60))"
        )
        problems += [f"image does not load: {src!r}" for src in broken]
        browser.settle(0.5)
        problems += network_problems(browser)
        text = browser.evaluate("document.body.innerText")
    return Inspected(problems=problems, text=text, shots=shots)


def rows_shown(browser: Browser, table: int) -> list[list[str]]:
    return browser.evaluate(
        f"[...document.querySelectorAll('#t{table} tbody tr')]"
        ".map(r => [...r.cells].map(c => c.textContent))"
    )


def expected_rows(path: Path, start: int, stop: int) -> list[list[str]]:
    table = pq.read_table(path).slice(start, stop - start)
    return [[_fmt(v) for v in row.values()] for row in table.to_pylist()]


def test_the_audit_report_renders_offline_in_headless_chromium(
    tmp_path: Path, tiny_dataset: Path, zero_noise, prefect_harness
) -> None:
    from dprelease.flows.release_flow import release_flow

    catalog_url = f"sqlite:///{tmp_path / 'catalog.db'}"
    domain = {
        "a": {"min": 0, "max": 9},
        "b": {"values": ["x", "y", "z"], "value_labels": LABELS},
        "c": {"min": 0, "max": 3},
    }
    spec_path = write_spec(tmp_path, tiny_dataset, privacy={"epsilon": 0.75}, domain=domain)
    earlier = release_flow(
        spec_path=str(spec_path), out_dir=str(tmp_path / "out"), catalog_url=catalog_url
    )
    staged = release_flow(
        spec_path=str(spec_path), out_dir=str(tmp_path / "out"), catalog_url=catalog_url
    )
    catalog = Catalog(catalog_url)
    review(catalog, earlier.release_id, approve=False, reviewer="Grace", note="superseded")
    review(catalog, staged.release_id, approve=True, reviewer="Ada", note="checked")
    directory = Path(staged.directory)
    manifest = json.loads((directory / "manifest.json").read_text())
    names = manifest["tables"]
    shots = tmp_path / "shots"
    shots.mkdir()

    sections = SECTIONS + tuple(f"#t{k}" for k in range(len(names)))
    seen = inspect(directory / "report.html", shots, sections=sections)

    assert seen.problems == []
    assert set(seen.shots) == set(sections)
    text = seen.text
    assert staged.release_id in text and earlier.release_id in text  # the ledger
    assert _cost(manifest["privacy"]["charged"]) in text
    assert (
        _cost(manifest["budget"]["before"]) in text and _cost(manifest["budget"]["after"]) in text
    )
    assert manifest["input_fingerprint"] in text
    for candidate in manifest["plan"]["candidates"]:
        if candidate.get("rmse") is not None:
            assert _fmt(candidate["rmse"]) in text, candidate["mechanism"]
    assert _fmt(manifest["plan"]["lower_bound_rmse"]) in text
    assert "Ada" in text and "checked" in text and "published" in text
    assert "checks on 5 tables passed" in text

    with Browser(offline=True) as browser:
        browser.open(directory / "report.html")
        # every table: a chart fitting its model once scrolled to, and a CSV with the same rows
        for index, name in enumerate(names):
            browser.screenshot(tmp_path / "scroll.png", selector=f"#t{index}")
            kinds = browser.evaluate(
                f"[...document.querySelectorAll('#t{index} svg.chart')].map(s => s.getAttribute('aria-label'))"
            )
            assert len(kinds) == 1, (name, kinds)
            link = browser.evaluate(f"document.querySelector('#t{index} a.csv').href")
            csv = Path(link.removeprefix("file://"))
            parquet = directory / "tables" / f"{name}.parquet"
            assert csv == directory / "tables" / f"{name}.csv" and csv.is_file()
            assert pa_csv.read_csv(csv).num_rows == pq.read_metadata(parquet).num_rows
        charts = dict(
            zip(
                names,
                browser.evaluate(
                    "[...document.querySelectorAll('section.tbl svg.chart')]"
                    ".map(s => s.getAttribute('aria-label'))"
                ),
                strict=True,
            )
        )
        assert charts["a_by_b"].startswith("heat map") and charts["a_cdf"].startswith("step")
        assert charts["a_halves"].startswith("bar chart") and charts["c_ranges"].startswith("step")

        # categorical labels, not codes, in the rows and the heat map
        a_by_b = names.index("a_by_b")
        first = rows_shown(browser, a_by_b)
        assert [row[1] for row in first[:3]] == LABELS
        assert all(
            label in browser.evaluate(f"document.querySelector('#t{a_by_b} svg').textContent")
            for label in LABELS
        )

        # paging: 30 rows in pages of 25, rendered exactly as the server renders page one
        parquet = directory / "tables" / "a_by_b.parquet"
        assert first == expected_rows(parquet, 0, 25)
        browser.evaluate(f"document.querySelector('#t{a_by_b} button[data-go=next]').click()")
        assert rows_shown(browser, a_by_b) == expected_rows(parquet, 25, 30)
        assert browser.evaluate(f"document.querySelector('#t{a_by_b} .pos').textContent") == (
            "rows 26–30 of 30"
        )
        browser.evaluate(
            f"(() => {{ const s = document.querySelector('#t{a_by_b} select');"
            " s.value = s.options[s.options.length - 1].value;"
            " s.dispatchEvent(new Event('change', {bubbles: true})); })()"
        )
        assert rows_shown(browser, a_by_b) == expected_rows(parquet, 0, 30)
        browser.settle(0.3)
        assert network_problems(browser) == []

    # the Data Docs, offline: the bundled scripts build the index table; the icon font loads
    docs = directory / "validation" / "docs"
    with Browser(offline=True) as browser:
        browser.open(docs / "index.html")
        browser.settle(1.0)
        rows = browser.evaluate("document.querySelectorAll('table tbody tr').length")
        icons = browser.evaluate(
            "[...document.querySelectorAll('i.fas')].map(i => i.getBoundingClientRect().width)"
        )
        fonts = browser.evaluate(
            "[...document.fonts].filter(f => f.family.includes('Font Awesome')"
            " && f.status === 'loaded').map(f => f.weight)"
        )
        shot = browser.screenshot(shots / "datadocs.png")
        assert network_problems(browser) == []
    assert rows >= len(names)
    assert icons and min(icons) > 0 and "900" in fonts  # the solid icon font, from the bundle
    assert ink(shot.read_bytes()) > 0.01
    pages = sorted(docs.rglob("*.html"))  # index, one suite and one result page per table
    assert len(pages) == 1 + 2 * len(names)
    with Browser(offline=True) as browser:
        for page in pages:
            browser.open(page)
        browser.settle(0.5)
        assert network_problems(browser) == []
    assert inspect(pages[-1], shots, sections=()).problems == []


def test_the_browser_checks_can_fail(tmp_path: Path) -> None:
    broken = tmp_path / "broken.html"
    broken.write_text(
        "<!DOCTYPE html><html><body><section id='summary'></section><p>x</p>"
        "<img src='missing.png'><img src='data:image/png;base64,AAAA'>"
        "<img src='https://example.org/x.png'>"
        "<script>console.error('boom'); throw new Error('kaput');</script></body></html>"
    )
    problems = inspect(broken, tmp_path, sections=("#summary", "#nowhere")).problems

    def has(*parts: str) -> Any:
        return any(all(part in p for part in parts) for p in problems)

    assert has("section #summary is blank"), problems
    assert has("no section #nowhere"), problems
    assert has("console:", "boom"), problems
    assert has("console: exception:", "kaput"), problems
    assert has("image does not load: 'missing.png'"), problems
    assert has("image does not load: 'data:image/png;base64,AAAA'"), problems
    assert has("failed request", "missing.png"), problems
    assert has("network request https://example.org/x.png"), problems


def test_the_index_of_a_split_report_searches_and_its_table_pages_page(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Above ``SPLIT_FROM`` tables (lowered here): the search box filters the index by name (all
    words, any case), each row links to the table's own page, which pages and links back."""
    from dprelease.catalog.publishing import report
    from tests.unit.catalog.test_report import manifest as report_manifest
    from tests.unit.catalog.test_report import render, spec_with, tables_of
    from tests.unit.catalog.test_report_scale import named_tables

    monkeypatch.setattr(report, "SPLIT_FROM", 2)
    long = tables_of(
        spec_with(
            {"age": {"min": 0, "max": 9}, "c": {"min": 0, "max": 3}},
            [{"name": "age_by_c", "marginal": ["age", "c"]}],
        )
    )
    tables = {**named_tables(), **long}
    (tmp_path / "report").mkdir()
    (tmp_path / "report.html").write_text(render(tables))
    for relative, text in report.table_pages(report_manifest(), tables):
        (tmp_path / relative).write_text(text)
    visible = (
        "[...document.querySelectorAll('#table-index .ir:not(.ih)')]"
        ".filter(r => r.offsetParent !== null).map(r => r.dataset.name)"
    )

    def search(browser: Browser, text: str) -> list[str]:
        browser.evaluate(
            f"(() => {{ const b = document.getElementById('table-search'); b.value = {json.dumps(text)};"
            " b.dispatchEvent(new Event('input')); return 0; })()"
        )
        return browser.evaluate(visible)

    with Browser(offline=True) as browser:
        browser.open(tmp_path / "report.html")
        assert browser.evaluate(visible) == list(tables)
        assert search(browser, "AGE") == ["age_by_sex", "by_age", "age_by_c"]
        assert search(browser, "by sex") == ["by_sex", "age_by_sex"]
        assert browser.evaluate("document.getElementById('table-count').textContent") == (
            f"2 of {len(tables)} tables"
        )
        assert search(browser, "<b>&") == ["odd<b>&'\"#? name"]
        assert search(browser, "nothing such") == []
        assert search(browser, "") == list(tables)
        link = browser.evaluate(
            "document.querySelector('#table-index .ir[data-name=\"age_by_c\"] a').href"
        )
        browser.settle(0.2)
        assert network_problems(browser) == []
    with Browser(offline=True) as browser:
        browser.open(Path(link.removeprefix("file://")))
        assert browser.evaluate("document.querySelector('h3').textContent").startswith("age_by_c")
        browser.evaluate("document.querySelector('button[data-go=next]').click()")
        assert browser.evaluate("document.querySelector('.pos').textContent") == "rows 26–40 of 40"
        back = browser.evaluate("document.querySelector('nav.toc a').href")
        assert back == (tmp_path / "report.html").as_uri() + "#tables"
        csv = browser.evaluate("document.querySelector('a.csv').href")
        assert csv == (tmp_path / "tables" / "age_by_c.csv").as_uri()
        browser.settle(0.2)
        assert network_problems(browser) == []
