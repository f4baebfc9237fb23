"""Everything public about one release, in one dictionary (``dprelease show ID [--json]``).

The catalog is the authority (status, ledger receipts, review decisions); the release's manifest
adds what only it holds (the plan, the mechanism's noise, the budget before and after, the
tables).  A manifest that is missing or whose sha256 differs from the one the catalog recorded is
still shown, with that problem named: ``dprelease verify`` says what changed.  Nothing here is a
count or a data value: the released tables are named by path only.
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Any

from dprelease.catalog.errors import VerificationError
from dprelease.catalog.ledger.chain import DECISION_KIND
from dprelease.catalog.ledger.store import Catalog
from dprelease.catalog.publishing import artifacts
from dprelease.catalog.review import decisions as reviewing


def describe_release(catalog: Catalog, release_id: str) -> dict[str, Any]:
    """Release record, spec name, mechanism and plan, charges with receipts, budget, review
    status and trail, artifact paths, synthetic files sampled from it (``dprelease synth``).
    O(ledger entries of the dataset)."""
    from dprelease.catalog.publishing.synthetic import (
        synthetic_records,  # imports the pgm core: only `show` needs it
    )

    record = catalog.release(release_id)
    manifest, problem = _manifest(record.directory, record.manifest_sha256)
    receipts = [
        {
            "seq": entry.seq,
            "receipt_id": entry.receipt_id,
            "label": entry.label,
            "charge": entry.cost.as_dict(),
            "created_at": entry.created_at,
            "entry_hash": entry.entry_hash,
        }
        for entry in catalog.ledger_entries(record.dataset_id)
        # a decision's entry anchors it in the chain (the review trail shows it), never a charge
        if entry.release_id == release_id and entry.kind != DECISION_KIND
    ]
    mechanism = manifest.get("mechanism") or {}
    plan = manifest.get("plan") or {}
    return {
        "release": asdict(record),
        "mechanism": {
            key: mechanism[key] for key in ("name", "model", "reason", "noise") if key in mechanism
        },
        "plan": {
            key: plan[key]
            for key in ("chosen", "reason", "lower_bound_rmse", "num_queries", "num_cells")
            if key in plan
        },
        "charged": (manifest.get("privacy") or {}).get("charged"),
        "receipts": receipts,
        "budget": manifest.get("budget"),
        "review": reviewing.status(catalog, release_id),
        "paths": _paths(record.directory, record.published_directory, manifest),
        "synthetic": [asdict(item) for item in synthetic_records(catalog, release_id)],
        "manifest_problem": problem,
    }


def _manifest(
    directory: str | None, recorded_sha256: str | None
) -> tuple[dict[str, Any], str | None]:
    if directory is None:
        return {}, None
    try:
        manifest = artifacts.read_manifest(Path(directory))
    except VerificationError as exc:
        return {}, str(exc)
    path = Path(directory) / artifacts.MANIFEST
    if recorded_sha256 and artifacts.sha256_file(path) != recorded_sha256:
        return manifest, (
            f"{path} differs from the manifest the catalog recorded; run `dprelease verify` on it"
        )
    return manifest, None


def _paths(
    directory: str | None, published: str | None, manifest: dict[str, Any]
) -> dict[str, str | None]:
    if directory is None:
        return {"directory": None, "published_directory": published}
    root = Path(directory)
    paths: dict[str, str | None] = {
        "directory": str(root),
        "manifest": str(root / artifacts.MANIFEST),
        "report": str(root / "report.html"),
        "validation": str(root / "validation" / "results.json"),
    }
    for name in manifest.get("tables") or []:
        paths[f"table {name}"] = str(root / "tables" / f"{name}.parquet")
    paths["published_directory"] = published
    return paths
