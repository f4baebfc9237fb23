"""A thin, lazily imported wrapper around Great Expectations (GX 1.x, ephemeral context).

GX takes 6–10 s to import, so it is imported inside :func:`run_suites` only.  Each call builds a
fresh ephemeral context (names must be unique per context), runs the suites on pandas frames,
optionally writes Data Docs into a chosen directory, and returns a JSON-ready summary.

Privacy: summaries and Data Docs hold observed values and unexpected counts and values, so only
released (noisy) values and public metadata may be validated here (``catalog.validation``).  The
confidential input is checked with numpy inside ``catalog.source``, never with GX.
"""

from __future__ import annotations

import logging
import os
import re
import warnings
from pathlib import Path
from typing import Any

import pandas as pd

# GX would otherwise print tqdm progress bars and could look for analytics settings.
os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")


def _gx() -> Any:
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


def run_suites(
    jobs: list[tuple[str, pd.DataFrame, list[tuple[str, dict[str, Any]]]]],
    *,
    docs_dir: Path | None = None,
) -> dict[str, dict[str, Any]]:
    """Run each ``(name, frame, expectations)`` in one ephemeral GX context.

    ``expectations`` are ``(snake_case GX type, kwargs)`` pairs; ``where_not: (column, value)``
    in kwargs restricts an expectation to the rows where ``column != value``.  Returns, per name, ``success``,
    ``statistics`` and one entry per expectation (type, column, kwargs, success, observed value).
    With ``docs_dir`` the context's Data Docs (all suites) are written there.
    """
    gx, gxe = _gx()
    from great_expectations.data_context.types.base import ProgressBarsConfig

    context = gx.get_context(mode="ephemeral")
    context.variables.progress_bars = ProgressBarsConfig(globally=False)
    source = context.data_sources.add_pandas(name="dprelease")
    definitions = []
    for name, frame, expectations in jobs:
        safe = re.sub(r"[^A-Za-z0-9_]", "_", name)
        batch = source.add_dataframe_asset(name=safe).add_batch_definition_whole_dataframe(safe)
        suite = context.suites.add(gx.ExpectationSuite(name=safe))
        for expectation_type, kwargs in expectations:
            suite.add_expectation(getattr(gxe, _class_name(expectation_type))(**_gx_kwargs(kwargs)))
        definition = context.validation_definitions.add(
            gx.ValidationDefinition(name=safe, data=batch, suite=suite)
        )
        definitions.append((name, frame, definition))
    if docs_dir is not None:
        docs_dir.mkdir(parents=True, exist_ok=True)
        context.add_data_docs_site(
            site_name="release_docs",
            site_config={
                "class_name": "SiteBuilder",
                "site_index_builder": {"class_name": "DefaultSiteIndexBuilder"},
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
    return summaries


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
