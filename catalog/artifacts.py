"""The release directory: writing tables and the manifest, publishing, and offline verification.

Layout (DESIGN.md)::

    <DIR>/<release_id>/
      manifest.json          ids, spec + fingerprints, code version, mechanism, cost, receipts,
                             sha256 of every other file, review status
      tables/<item>.parquet
      report.html
      validation/            output-validation results (JSON) and Data Docs

``verify`` recomputes every hash, looks for missing or extra files, checks the manifest against the
sha256 the catalog recorded when it was written, checks every ledger receipt against the catalog,
and re-reads the validation results.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
from importlib import metadata as importlib_metadata
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from catalog.errors import CatalogError, VerificationError
from catalog.ledger import Catalog

MANIFEST = "manifest.json"


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def code_version() -> dict[str, str | None]:
    """Package version and, when run from a git checkout, the commit."""
    try:
        version = importlib_metadata.version("dprelease")
    except importlib_metadata.PackageNotFoundError:  # pragma: no cover - always installed
        version = None
    commit = None
    try:
        here = Path(__file__).resolve().parent
        commit = subprocess.run(
            ["git", "-C", str(here), "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            timeout=5,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        commit = None
    return {"package": version, "git_commit": commit or None}


def write_table(directory: Path, name: str, table: pa.Table) -> Path:
    path = directory / "tables" / f"{name}.parquet"
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, path)
    return path


def artifact_hashes(directory: Path) -> dict[str, str]:
    """sha256 of every file under ``directory`` except the manifest, keyed by relative path."""
    return {
        str(path.relative_to(directory)): sha256_file(path)
        for path in sorted(directory.rglob("*"))
        if path.is_file() and path != directory / MANIFEST
    }


def write_manifest(directory: Path, manifest: dict[str, Any]) -> str:
    """Write ``manifest.json`` with the hashes of every artifact; return the manifest's sha256."""
    manifest = dict(manifest)
    manifest["artifacts"] = artifact_hashes(directory)
    text = json.dumps(manifest, indent=2, sort_keys=True, default=str) + "\n"
    (directory / MANIFEST).write_text(text)
    return hashlib.sha256(text.encode()).hexdigest()


def read_manifest(directory: Path) -> dict[str, Any]:
    path = directory / MANIFEST
    if not path.is_file():
        raise VerificationError(f"{directory} has no {MANIFEST}")
    try:
        manifest = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise VerificationError(f"{path} is not valid JSON: {exc}") from None
    if not isinstance(manifest, dict):
        raise VerificationError(f"{path} must hold a JSON object, not {type(manifest).__name__}")
    return manifest


def update_review(directory: Path, review: dict[str, Any], *, status: str) -> str:
    """Record a review decision in the manifest (hashes are recomputed); return the new sha256."""
    manifest = read_manifest(directory)
    manifest.setdefault("review", {"status": "staged", "trail": []})
    manifest["review"]["trail"].append(review)
    manifest["review"]["status"] = status
    return write_manifest(directory, manifest)


def publish(directory: Path, destination: Path) -> Path:
    """Copy an approved release to the published location (refuses to overwrite)."""
    target = destination / directory.name
    if target.exists():
        raise CatalogError(f"published copy {target} already exists; refusing to overwrite it")
    destination.mkdir(parents=True, exist_ok=True)
    shutil.copytree(directory, target)
    return target


def verify(directory: Path, catalog: Catalog) -> list[str]:
    """Everything that does not match, as readable lines; raise if anything does not match."""
    directory = Path(directory)
    problems: list[str] = []
    manifest = read_manifest(directory)
    recorded = manifest.get("artifacts", {})
    actual = artifact_hashes(directory)
    for name, digest in sorted(recorded.items()):
        if name not in actual:
            problems.append(f"missing artifact {name}")
        elif actual[name] != digest:
            problems.append(
                f"artifact {name} was modified (sha256 {actual[name][:12]}…, manifest says {digest[:12]}…)"
            )
    for name in sorted(set(actual) - set(recorded)):
        problems.append(f"unexpected file {name} is not in the manifest")
    release_id = manifest.get("release_id")
    try:
        record = catalog.release(str(release_id))
    except CatalogError:
        problems.append(f"release {release_id!r} is not in the catalog at {catalog.url}")
        record = None
    manifest_digest = sha256_file(directory / MANIFEST)
    if record is not None:
        if record.manifest_sha256 != manifest_digest:
            problems.append(
                "manifest.json was modified: its sha256 does not match the one the catalog recorded"
            )
        entries = {entry.receipt_id: entry for entry in catalog.ledger_entries(record.dataset_id)}
        for receipt in manifest.get("ledger_receipts", []):
            entry = entries.get(receipt.get("receipt_id"))
            if entry is None:
                problems.append(f"ledger receipt {receipt.get('receipt_id')} is not in the ledger")
                continue
            paid_by = receipt.get("paid_by_release", release_id)
            if entry.release_id != paid_by:
                problems.append(
                    f"ledger receipt {entry.receipt_id} belongs to release {entry.release_id}, "
                    f"the manifest says {paid_by}"
                )
            if entry.cost.as_dict() != receipt.get("cost"):
                problems.append(
                    f"ledger receipt {entry.receipt_id} charged {entry.cost.as_dict()}, manifest says {receipt.get('cost')}"
                )
    validation = directory / "validation" / "results.json"
    if not validation.is_file():
        problems.append("validation/results.json is missing")
    else:
        try:
            results = json.loads(validation.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            problems.append(f"validation/results.json is not valid JSON: {exc}")
        else:
            if not isinstance(results, dict) or not results.get("success"):
                problems.append("validation results record a failure")
    for name in manifest.get("tables", []):
        path = directory / "tables" / f"{name}.parquet"
        if path.is_file():
            try:
                pq.read_metadata(path)
            except (pa.ArrowInvalid, OSError) as exc:
                problems.append(f"table {name} is not readable Parquet: {exc}")
    if problems:
        raise VerificationError(
            f"release {directory} failed verification:\n" + "\n".join(f"  - {p}" for p in problems)
        )
    return problems
