"""Data Docs written into a release load nothing from the network: pages, style sheets and
scripts (issue 26 item 5: GX's style sheet loaded its logo from S3 through CSS ``url(...)``)."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest

from dprelease.catalog.validation import gx
from dprelease.catalog.validation.checks import table_expectations
from dprelease.catalog.validation.gx import OfflineDocsError, external_references, make_docs_offline

GX_STYLE = """.navbar-brand a {
    background: url('https://great-expectations-web-assets.s3.us-east-2.amazonaws.com/full_logo_dark.png') 0 0 no-repeat;
}
"""


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


@pytest.mark.parametrize(
    ("text", "found"),
    [
        ("a { background: url(https://x.example/a.png) }", ["https://x.example/a.png"]),
        ("a { background: url( 'http://x.example/a.png' ) }", ["http://x.example/a.png"]),
        ('a { background: url("//x.example/a.png") }', ["//x.example/a.png"]),
        ("@import url(https://fonts.example/css);", ["https://fonts.example/css"]),
        ('@import "https://fonts.example/css";', ["https://fonts.example/css"]),
        ("a { background: url(../images/logo.png) }", []),
        (
            "a { background: url(\"data:image/svg+xml,%3csvg xmlns='http://www.w3.org/2000/svg'\") }",
            [],
        ),
        ("@import 'local.css';", []),
    ],
)
def test_css_urls_and_imports_from_the_network_are_found(
    tmp_path: Path, text: str, found: list[str]
) -> None:
    assert external_references(write(tmp_path / "s.css", text)) == found


def test_pages_and_scripts_are_scanned_too(tmp_path: Path) -> None:
    page = write(
        tmp_path / "p.html",
        '<a href="https://greatexpectations.io">GX</a><img src="https://x.example/i.png">'
        "<style>b { background: url(https://x.example/b.png) }</style>",
    )
    assert external_references(page) == ["https://x.example/i.png", "https://x.example/b.png"]
    script = write(
        tmp_path / "s.js",
        '/*! (c) https://getbootstrap.com/ */ var a="http://www.w3.org/2000/svg";'
        'fetch("https://x.example/data.json")',
    )
    assert external_references(script) == ["https://x.example/data.json"]
    assert external_references(write(tmp_path / "n.txt", "url(https://x.example)")) == []


def test_gx_style_sheet_logo_becomes_the_local_logo(tmp_path: Path) -> None:
    sheet = write(tmp_path / "static/styles/data_docs_default_styles.css", GX_STYLE)
    make_docs_offline(tmp_path)
    text = sheet.read_text()
    assert "url('../images/logo-long.png')" in text and "amazonaws" not in text
    assert external_references(sheet) == []


def test_a_style_sheet_with_another_external_url_is_refused_by_name(tmp_path: Path) -> None:
    write(tmp_path / "static/styles/extra.css", "@import url(https://fonts.example/css);")
    with pytest.raises(
        OfflineDocsError, match=r"static/styles/extra\.css loads https://fonts\.example/css"
    ):
        make_docs_offline(tmp_path)
    write(tmp_path / "static/styles/extra.css", "b { background: url(//cdn.example/b.png) }")
    with pytest.raises(OfflineDocsError, match=r"extra\.css loads //cdn\.example/b\.png"):
        make_docs_offline(tmp_path)


def test_real_data_docs_reference_nothing_external(tmp_path: Path) -> None:
    """Data Docs as a release writes them (GX's pages, styles and images, the bundled vendor
    files): no HTML, CSS or JS file loads anything from the network."""
    table = pa.table(
        {
            "v": [0, 1, 2],
            "estimate": [1.0, 2.0, 3.0],
            "std_error": [1.0, 1.0, 1.0],
            "ci_low": [0.0, 1.0, 2.0],
            "ci_high": [2.0, 3.0, 4.0],
            "uncertainty": ["noise-only"] * 3,
        }
    )
    docs = tmp_path / "validation" / "docs"
    jobs = [("t", table.to_pandas(), table_expectations(table, expected_rows=3))]
    gx.run_suites_here(jobs, docs_dir=docs)
    files = [p for p in docs.rglob("*") if p.suffix in (".html", ".css", ".js")]
    assert any(p.name == "data_docs_default_styles.css" for p in files)
    assert sum(p.suffix == ".js" for p in files) >= 5 and sum(p.suffix == ".html" for p in files)
    assert {str(p.relative_to(docs)): external_references(p) for p in files} == {
        str(p.relative_to(docs)): [] for p in files
    }
    assert (docs / gx.LOGO).is_file()
