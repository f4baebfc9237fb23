"""A thin, lazily imported wrapper around Great Expectations (GX 1.x, ephemeral context).

GX takes seconds to import, so only :func:`run_suites` imports it.  Each call builds a fresh
ephemeral context, runs the suites on pandas frames, optionally writes Data Docs, and returns a
JSON-ready summary.

Privacy: summaries and Data Docs hold observed values and unexpected counts and values, so only
released (noisy) values and public metadata may be validated here (``catalog.validation.checks``).  The
confidential input is checked with numpy inside ``catalog.confidential.source``, never with GX.
"""

from __future__ import annotations

import logging
import os
import re
import warnings
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

# GX would otherwise print tqdm progress bars and could look for analytics settings.
os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")


def load() -> Any:
    """Import GX, return ``(gx, gxe)`` (the validation service does this once, before it listens)."""
    logging.getLogger("great_expectations").setLevel(logging.WARNING)  # no INFO chatter per run
    with warnings.catch_warnings():
        # GX 1.24 imports the deprecated sre_constants/sre_parse modules.
        warnings.filterwarnings("ignore", message="module 'sre_", category=DeprecationWarning)
        import great_expectations as gx
        import great_expectations.expectations as gxe
    for name in list(logging.root.manager.loggerDict):
        if name.startswith("great_expectations"):
            logging.getLogger(name).setLevel(logging.WARNING)
    return gx, gxe


def _gx_kwargs(kwargs: dict[str, Any]) -> dict[str, Any]:
    """``where_not: (column, value)`` becomes GX's row condition ``column != value``."""
    kwargs = dict(kwargs)
    if "where_not" in kwargs:
        from great_expectations.expectations.row_conditions import Column

        column, value = kwargs.pop("where_not")
        kwargs["row_condition"] = Column(column) != value
    return kwargs


def _class_name(expectation_type: str) -> str:
    return "".join(part.capitalize() for part in expectation_type.split("_"))


if TYPE_CHECKING:
    import pandas as pd

Jobs = list[tuple[str, "pd.DataFrame", list[tuple[str, dict[str, Any]]]]]
"""``(name, frame, expectations)`` per suite; expectations are ``(snake_case GX type, kwargs)``."""


def run_suites_here(jobs: Jobs, *, docs_dir: Path | None = None) -> dict[str, dict[str, Any]]:
    """Run each ``(name, frame, expectations)`` in one ephemeral GX context.

    ``where_not: (column, value)`` in kwargs restricts an expectation to the rows where ``column
    != value``.  Returns, per name, ``success``, ``statistics`` and one entry per expectation
    (type, column, kwargs, success, observed value).  With ``docs_dir`` the context's Data Docs
    (all suites) are written there."""
    gx, gxe = load()
    from great_expectations.data_context.types.base import ProgressBarsConfig

    context = gx.get_context(mode="ephemeral")
    context.variables.progress_bars = ProgressBarsConfig(globally=False)
    source = context.data_sources.add_pandas(name="dprelease")
    definitions = []
    for name, frame, expectations in jobs:
        safe = re.sub(r"[^A-Za-z0-9_]", "_", name)
        batch = source.add_dataframe_asset(name=safe).add_batch_definition_whole_dataframe(safe)
        # all expectations at construction: one store write per suite (add_expectation writes
        # the whole suite again each time)
        suite = context.suites.add(
            gx.ExpectationSuite(
                name=safe,
                expectations=[
                    getattr(gxe, _class_name(expectation_type))(**_gx_kwargs(kwargs))
                    for expectation_type, kwargs in expectations
                ],
            )
        )
        definition = context.validation_definitions.add(
            gx.ValidationDefinition(name=safe, data=batch, suite=suite)
        )
        definitions.append((name, frame, definition))
    if docs_dir is not None:
        from dprelease.catalog.validation.docs_views import site_views

        docs_dir.mkdir(parents=True, exist_ok=True)
        context.add_data_docs_site(
            site_name="release_docs",
            site_config={
                "class_name": "SiteBuilder",
                **site_views(),  # GX's views, each template compiled once per process
                "store_backend": {
                    "class_name": "TupleFilesystemStoreBackend",
                    "base_directory": str(docs_dir),
                },
            },
        )
    summaries: dict[str, dict[str, Any]] = {}
    for name, frame, definition in definitions:
        if docs_dir is not None:
            checkpoint = context.checkpoints.add(
                gx.Checkpoint(
                    name=f"{definition.name}_checkpoint",
                    validation_definitions=[definition],
                    actions=[],  # docs are built once below: per-run updates cost O(tables²)
                    result_format={"result_format": "SUMMARY"},
                )
            )
            run = checkpoint.run(batch_parameters={"dataframe": frame})
            result = next(iter(run.run_results.values()))
        else:
            result = definition.run(batch_parameters={"dataframe": frame}, result_format="SUMMARY")
        summaries[name] = _summarise(name, result)
    if docs_dir is not None:
        context.build_data_docs(site_names=["release_docs"])  # O(tables), all suites' results
        make_docs_offline(docs_dir)
    return summaries


ASSETS = Path(__file__).resolve().parents[1] / "assets" / "datadocs"
VENDOR = "static/vendor"  # inside the docs folder
_CDN = (
    r"https://(?:unpkg\.com|cdnjs\.cloudflare\.com|code\.jquery\.com|maxcdn\.bootstrapcdn\.com"
    r"|stackpath\.bootstrapcdn\.com|cdn\.jsdelivr\.net)/"
)
LOCAL_COPIES: dict[str, str] = {
    "jquery-3.7.1.min.js": "js/jquery-3.7.1.min.js",
    "popper.js/1.12.9/umd/popper.min.js": "js/popper-1.12.9.min.js",
    "bootstrap/4.3.1/css/bootstrap.min.css": "css/bootstrap-4.3.1.min.css",
    "bootstrap/4.3.1/js/bootstrap.min.js": "js/bootstrap-4.3.1.min.js",
    "bootstrap-table@1.19.1/dist/bootstrap-table.min.css": "css/bootstrap-table-1.19.1.min.css",
    "bootstrap-table@1.19.1/dist/bootstrap-table.min.js": "js/bootstrap-table-1.19.1.min.js",
    "filter-control/bootstrap-table-filter-control.min.css": (
        "css/bootstrap-table-filter-control-1.19.1.min.css"
    ),
    "filter-control/bootstrap-table-filter-control.css": (
        "css/bootstrap-table-filter-control-1.19.1.min.css"
    ),
    "filter-control/bootstrap-table-filter-control.min.js": (
        "js/bootstrap-table-filter-control-1.19.1.min.js"
    ),
    "bootstrap-datepicker/1.9.0/css/bootstrap-datepicker.min.css": (
        "css/bootstrap-datepicker-1.9.0.min.css"
    ),
    "bootstrap-datepicker/1.9.0/js/bootstrap-datepicker.min.js": (
        "js/bootstrap-datepicker-1.9.0.min.js"
    ),
    "font-awesome/6.6.0/css/all.min.css": "css/fontawesome-6.6.0.min.css",
}
"""CDN URL ending -> bundled copy (``catalog/assets/datadocs``; versions and licences in its README)."""
DROPPED = ("npm/vega@", "npm/vega-lite@", "npm/vega-embed@", "bootstrap-dark@")
"""Resources the pages dprelease writes never use (charts of profiling expectations, a dark theme)."""
_TAG = re.compile(
    r"<(?P<tag>script|link)\b[^>]*?(?:src|href)=[\"'](?P<url>" + _CDN + r"[^\"']+)[\"'][^>]*>"
    r"(?:\s*</script>)?",
    re.IGNORECASE,
)
_FAVICON = re.compile(r"href=[\"'](?:\./|\.\./)*static/images/favicon\.ico[\"']")
_LOGO = re.compile(r"https://great-expectations-web-assets\.s3\.[^\"')]+?\.png(?:\?[^\"')]*)?")
LOGO = "static/images/logo-long.png"  # inside the docs folder (GX's own static files)
_EXTERNAL = r"(?:[a-z][a-z0-9+.-]*:(?<!data:)|//)"  # a scheme other than data:, or //host
_CSS_URL = re.compile(r"url\(\s*[\"']?(?P<url>" + _EXTERNAL + r"[^\"')\s]*)", re.IGNORECASE)
_CSS_IMPORT = re.compile(
    r"@import\s+(?:url\(\s*)?[\"']?(?P<url>" + _EXTERNAL + r"[^\"')\s;]*)", re.IGNORECASE
)
_HTML_RESOURCE = re.compile(
    r"<(?:script|link|img|iframe|embed|object|source|audio|video|track|input)\b[^>]*?"
    r"\b(?:src|href|data|srcset|poster)\s*=\s*[\"']?(?P<url>" + _EXTERNAL + r"[^\"'\s>]*)",
    re.IGNORECASE,
)
_JS_LOAD = re.compile(
    r"(?:\bimport\s*\(|\bimportScripts\s*\(|\bfetch\s*\(|\.(?:src|href)\s*=|"
    r"\bnew\s+(?:WebSocket|EventSource|Worker)\s*\()\s*[\"'`](?P<url>" + _EXTERNAL + r"[^\"'`]*)",
    re.IGNORECASE,
)
_SCANNERS = {
    ".html": (_HTML_RESOURCE, _CSS_URL, _CSS_IMPORT),  # CSS rules: <style> blocks, style=""
    ".htm": (_HTML_RESOURCE, _CSS_URL, _CSS_IMPORT),
    ".css": (_CSS_URL, _CSS_IMPORT),
    ".js": (_JS_LOAD, _CSS_URL, _CSS_IMPORT),
}


def external_references(path: Path) -> list[str]:
    """The network resources an HTML, CSS or JS file would load when opened (empty for other
    files): ``src``/``href`` of resource tags, CSS ``url(...)`` and ``@import``, and JS loads of a
    literal URL.  A plain ``<a href>`` link is not a resource.  O(bytes)."""
    scanners = _SCANNERS.get(path.suffix.lower())
    if scanners is None:
        return []
    text = path.read_text(errors="replace")
    return list(
        dict.fromkeys(m.group("url") for scanner in scanners for m in scanner.finditer(text))
    )


class OfflineDocsError(RuntimeError):
    """A Data Docs page loads a resource from the network that no bundled copy replaces."""


def make_docs_offline(docs_dir: Path) -> list[Path]:
    """Copy the bundled CSS/JS/fonts into ``docs_dir`` and point every page at them. O(pages).

    Each CDN ``<script>``/``<link>`` becomes a relative link to ``static/vendor/``; unused ones
    (:data:`DROPPED`) are removed with their ``integrity``/``crossorigin`` attributes (which a
    ``file://`` page cannot satisfy); the S3 logo (in pages and in GX's style sheet) becomes the
    logo inside the GX package.  Raises :class:`OfflineDocsError` naming the file and URL of any
    other network resource of a page, style sheet or script (:func:`external_references`).
    """
    import shutil

    shutil.copytree(ASSETS, docs_dir / VENDOR, copy_function=shutil.copyfile, dirs_exist_ok=True)
    pages = sorted(docs_dir.rglob("*.html"))
    for page in pages:
        up = "../" * (len(page.relative_to(docs_dir).parts) - 1)
        text = _TAG.sub(partial(_local_tag, up=up, page=page), page.read_text())
        text = _LOGO.sub(f"{up}{LOGO}", text)
        # GX links the favicon of pages four folders deep one folder too high
        text = _FAVICON.sub(f'href="{up}static/images/favicon.ico"', text)
        page.write_text(text)
    for sheet in sorted(docs_dir.rglob("*.css")):  # GX's styles load its logo from S3
        logo = os.path.relpath(docs_dir / LOGO, sheet.parent)
        text = sheet.read_text()
        if _LOGO.search(text):
            sheet.write_text(_LOGO.sub(logo, text))
    for written in sorted(docs_dir.rglob("*")):
        remote = external_references(written) if written.is_file() else []
        if remote:
            raise OfflineDocsError(
                f"Data Docs file {written.relative_to(docs_dir)} loads {remote[0]}, which has no "
                f"bundled copy in {ASSETS}"
            )
    return pages


def _local_tag(match: re.Match[str], *, up: str, page: Path) -> str:
    url = match.group("url")
    if any(marker in url for marker in DROPPED):
        return ""
    local = next((copy for end, copy in LOCAL_COPIES.items() if url.endswith(end)), None)
    if local is None:
        raise OfflineDocsError(
            f"Data Docs page {page.name} loads {url}, which has no bundled copy in {ASSETS}"
        )
    if match.group("tag").lower() == "script":
        return f'<script src="{up}{VENDOR}/{local}"></script>'
    return f'<link rel="stylesheet" href="{up}{VENDOR}/{local}">'


def _summarise(name: str, result: Any) -> dict[str, Any]:
    entries = []
    for item in result.results:
        config = item.expectation_config
        kwargs = {k: v for k, v in dict(config.kwargs).items() if k != "batch_id"}
        details = item.result or {}
        entries.append(
            {
                "expectation": config.type,
                "column": kwargs.get("column"),
                "kwargs": _jsonable(kwargs),
                "success": bool(item.success),
                "observed_value": _jsonable(details.get("observed_value")),
                "unexpected_count": _jsonable(details.get("unexpected_count")),
            }
        )
    return {
        "suite": name,
        "success": bool(result.success),
        "statistics": _jsonable(dict(result.statistics)),
        "results": entries,
    }


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if hasattr(value, "item") and callable(value.item):
        return value.item()
    if isinstance(value, float | int | str | bool) or value is None:
        return value
    return str(value)
