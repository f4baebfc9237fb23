"""Task: write the manifest and report, mark the release staged, mirror a summary as a Prefect artifact."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
from prefect import task
from prefect.artifacts import create_markdown_artifact
from prefect.cache_policies import NO_CACHE

from catalog import release
from catalog.ledger.store import Catalog
from catalog.planning import Plan
from catalog.spec.model import ReleaseSpec
from mechanisms.privacy import PrivacyCost
from mechanisms.protocol import Measurement


@task(name="stage-release", cache_policy=NO_CACHE, persist_result=False)
def stage_task(
    spec: ReleaseSpec,
    plan: Plan,
    release_id: str,
    directory: str,
    ingested: release.Ingested,
    measurement: Measurement,
    tables: dict[str, pa.Table],
    validation: dict[str, Any],
    spent_before: PrivacyCost,
    catalog_url: str,
) -> release.StagedRelease:
    staged = release.stage(
        spec=spec,
        plan=plan,
        release_id=release_id,
        directory=Path(directory),
        ingested=ingested,
        measurement=measurement,
        tables=tables,
        validation=validation,
        spent_before=spent_before,
        catalog=Catalog(catalog_url),
    )
    create_markdown_artifact(
        key="release-summary",
        markdown=summary_markdown(spec, plan, staged),
        description=f"dprelease {staged.release_id}",
    )
    return staged


def summary_markdown(spec: ReleaseSpec, plan: Plan, staged: release.StagedRelease) -> str:
    """Public summary mirrored into the Prefect UI (the same facts as the manifest)."""
    lines = [
        f"# Release `{staged.release_id}` (staged, awaiting review)",
        f"* dataset: **{spec.dataset.id}**; spec `{spec.name}`",
        f"* mechanism: **{plan.chosen}** ({plan.reason})",
        f"* privacy charged: **{', '.join(f'{k}={v:.6g}' for k, v in staged.charged.items())}**",
        f"* expected RMSE: {_fmt(plan.candidate(plan.chosen).rmse)}; SVD lower bound: "
        + _fmt(plan.lower_bound_rmse),
        f"* artifacts: `{staged.directory}`",
        "",
        "| candidate | rmse |",
        "|---|---|",
    ]
    lines += [
        f"| {c.mechanism} | {c.rmse:.4g} |" if c.rmse is not None else f"| {c.mechanism} | n/a |"
        for c in plan.candidates
    ]
    return "\n".join(lines)


def _fmt(value: float | None) -> str:
    return "n/a (data-dependent)" if value is None else f"{value:.4g}"
