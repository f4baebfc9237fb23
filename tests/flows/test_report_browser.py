"""The audit report as people see it: rendered by headless Chromium (Debian's ``chromium``).

Two zero-noise releases of one dataset are run through the ``release`` flow, so the second
report has a budget timeline with a past charge.  Its ``report.html`` is opened from disk (no
server, no network) and must render: a non-blank screenshot, no console message at all (the
report has no scripts), every ``<img>`` a decodable embedded PNG, no external resource, and the
key numbers (release id, privacy charged, budget before/after, candidate RMSEs, lower bound,
reviewer) in the rendered text.  The same checks run on a deliberately broken page to prove they
can fail.  Skipped only when ``/usr/bin/chromium`` is missing (CI installs it in ``.ci/run``).
"""

from __future__ import annotations

import base64
import io
import json
import subprocess
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pytest

from catalog.ledger import Catalog
from catalog.report import _cost, _fmt
from catalog.review import review
from tests.flows.conftest import write_spec

CHROMIUM = Path("/usr/bin/chromium")
pytestmark = [
    pytest.mark.flow,
    pytest.mark.skipif(
        not CHROMIUM.exists(), reason="needs Debian's chromium at /usr/bin/chromium"
    ),
]
CONSOLE_MARKERS = (":CONSOLE", "Uncaught", "Failed to load resource", "net::ERR_")
WINDOW = (1200, 3000)


class PageDom(HTMLParser):
    """Images, external references and visible text of a DOM dump."""

    def __init__(self) -> None:
        super().__init__()
        self.images: list[str] = []
        self.external: list[str] = []
        self.text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        values = dict(attrs)
        if tag == "img":
            self.images.append(values.get("src") or "")
        for name in ("src", "href"):
            target = values.get(name) or ""
            if target.startswith(("http:", "https:", "//")):
                self.external.append(target)

    def handle_data(self, data: str) -> None:
        self.text.append(data)


def _chromium(page: Path, profile: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            str(CHROMIUM),
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            f"--user-data-dir={profile}",
            f"--window-size={WINDOW[0]},{WINDOW[1]}",
            "--enable-logging=stderr",
            "--v=0",
            *extra,
            page.resolve().as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def _decode_png(data: bytes) -> np.ndarray:
    import matplotlib.image

    if not data.startswith(b"\x89PNG\r\n\x1a\n"):
        raise ValueError("not a PNG signature")
    return np.asarray(matplotlib.image.imread(io.BytesIO(data), format="png"))


@dataclass(frozen=True, kw_only=True)
class Rendered:
    problems: list[str]
    text: str
    images: int


def render_and_check(page: Path, work: Path) -> Rendered:
    """Screenshot + DOM dump of ``page``; every problem a reader would notice, as a line."""
    problems: list[str] = []
    screenshot = work / f"{page.stem}.png"
    shot = _chromium(page, work / "profile-shot", f"--screenshot={screenshot}")
    if shot.returncode != 0 or not screenshot.exists():
        problems.append(f"no screenshot (exit {shot.returncode}): {shot.stderr[-2000:]}")
    else:
        pixels = _decode_png(screenshot.read_bytes())
        if pixels.shape[:2] != (WINDOW[1], WINDOW[0]):
            problems.append(f"screenshot is {pixels.shape[:2]}, not {WINDOW[::-1]}")
        ink = np.mean(pixels[..., :3] < 0.9)  # share of pixels that are not (near) white
        if ink < 0.01:
            problems.append(f"screenshot is blank ({ink:.2%} non-white pixels)")
    dump = _chromium(page, work / "profile-dom", "--dump-dom")
    for log in (shot.stderr, dump.stderr):
        problems += [
            f"console: {line.strip()}"
            for line in log.splitlines()
            if any(marker in line for marker in CONSOLE_MARKERS)
        ]
    dom = PageDom()
    dom.feed(dump.stdout)
    if not dom.images:
        problems.append("the page has no images")
    for index, source in enumerate(dom.images):
        prefix = "data:image/png;base64,"
        if not source.startswith(prefix):
            problems.append(f"image {index} is not an embedded PNG: {source[:60]!r}")
            continue
        try:
            pixels = _decode_png(base64.b64decode(source[len(prefix) :], validate=True))
        except ValueError as exc:
            problems.append(f"image {index} does not decode: {exc}")
            continue
        if min(pixels.shape[:2]) < 50:
            problems.append(f"image {index} is only {pixels.shape[:2]} pixels")
    problems += [f"external resource {target}" for target in dom.external]
    return Rendered(problems=problems, text=" ".join(dom.text), images=len(dom.images))


def test_the_audit_report_renders_in_headless_chromium(
    tmp_path: Path, tiny_dataset: Path, zero_noise, prefect_harness
) -> None:
    from flows.release_flow import release_flow

    catalog_url = f"sqlite:///{tmp_path / 'catalog.db'}"
    spec_path = write_spec(tmp_path, tiny_dataset, privacy={"epsilon": 0.75})
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

    rendered = render_and_check(directory / "report.html", tmp_path)

    assert rendered.problems == []
    # error plot, budget timeline, one plot per table (up to four)
    assert rendered.images >= 3
    text = rendered.text
    assert staged.release_id in text and earlier.release_id in text  # the ledger timeline
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
    assert "privacy budget spent over time" in (directory / "report.html").read_text()


def test_the_browser_checks_can_fail(tmp_path: Path) -> None:
    broken = tmp_path / "broken.html"
    broken.write_text(
        "<!DOCTYPE html><html><body><p>broken</p>"
        "<img src='missing.png'><img src='data:image/png;base64,AAAA'>"
        "<img src='https://example.org/x.png'>"
        "<script>console.error('boom'); throw new Error('kaput');</script></body></html>"
    )
    problems = render_and_check(broken, tmp_path).problems
    assert any(p.startswith("screenshot is blank") for p in problems), problems
    assert any("console:" in p and "boom" in p for p in problems), problems
    assert any("console:" in p and "Uncaught Error: kaput" in p for p in problems), problems
    assert any("image 0 is not an embedded PNG" in p for p in problems), problems
    assert any("image 1 does not decode" in p for p in problems), problems
    assert any("external resource https://example.org/x.png" in p for p in problems), problems
