"""The release directory: writing tables and the manifest, publishing, and offline verification.

Layout: ``<DIR>/<release_id>/`` holds ``manifest.json`` (ids, spec and fingerprints, code version,
mechanism, cost, receipts, the sha256 of every other file, review status), ``tables/<item>.parquet``,
``report.html`` and ``validation/`` (results and Data Docs).

``verify`` recomputes every hash, finds missing and extra files, and checks the manifest's sha256
and the release's status against the catalog (only a published release may sit in a published
location), the ledger's hash chain, receipts and recorded chain head, and the input fingerprint's
key (given the input, the keyed fingerprint itself).  A manifest is untrusted input: a path that
leaves the release directory, or a symbolic link inside it, is reported and never read.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import uuid
from importlib import metadata as importlib_metadata
from pathlib import Path, PurePosixPath, PureWindowsPath
from typing import Any, NoReturn

import pyarrow as pa
import pyarrow.parquet as pq

from dprelease.catalog.errors import CatalogError, VerificationError
from dprelease.catalog.ledger.chain import GENESIS
from dprelease.catalog.ledger.leases import ReleaseRecord
from dprelease.catalog.ledger.store import Catalog

MANIFEST = "manifest.json"
MANIFEST_KEY_ID = "input_fingerprint_key_id"  # id of the catalog key the input fingerprint used
MANIFEST_CHAIN_HEAD = "ledger_chain_head"  # Catalog.chain_head(dataset).as_dict() after the charges
PUBLISHED_FOLDER = "published"
SHOWN_PROBLEMS = 50
"""Problems a failed ``verify`` names in its message; the exception's ``problems`` hold all."""


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
    try:
        commit = subprocess.run(
            ["git", "-C", str(Path(__file__).resolve().parent), "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            timeout=5,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        commit = None
    return {"package": version, "git_commit": commit or None}


def write_table(directory: Path, name: str, table: pa.Table) -> Path:
    """``tables/<name>.parquet`` and, for the report's download links, ``tables/<name>.csv``
    (same rows and columns, full precision, empty cells for nulls). O(rows)."""
    path = directory / "tables" / f"{name}.parquet"
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, path)
    write_csv(table, path.with_suffix(".csv"))
    return path


def write_csv(table: pa.Table, path: Path) -> Path:
    import pyarrow.csv as pa_csv

    pa_csv.write_csv(table, path, pa_csv.WriteOptions(quoting_style="needed"))
    return path


def scan_release_files(directory: Path) -> tuple[dict[str, str], list[str]]:
    """Hashes of the regular files under ``directory`` (not the manifest) and the relative paths
    of symbolic links, which are never followed or read. O(bytes)."""
    hashes: dict[str, str] = {}
    links: list[str] = []
    for root, dirs, files in os.walk(directory, followlinks=False):
        for name in dirs + files:
            path = Path(root) / name
            relative = path.relative_to(directory).as_posix()
            if path.is_symlink():
                links.append(relative)
            elif name in files and relative != MANIFEST and path.is_file():
                hashes[relative] = sha256_file(path)
    return dict(sorted(hashes.items())), sorted(links)


def _inside(directory: Path, name: Any, *, resolved: Path | None = None) -> bool:
    """Is ``name`` (from an untrusted manifest) a relative path that stays inside ``directory``?

    ``resolved``: ``directory.resolve()`` when the caller checks many names (resolved once)."""
    if not isinstance(name, str) or not name or "\0" in name or "\\" in name:
        return False
    if PurePosixPath(name).is_absolute() or PureWindowsPath(name).is_absolute():
        return False
    if ".." in PurePosixPath(name).parts:
        return False
    root = directory.resolve() if resolved is None else resolved
    return (directory / name).resolve().is_relative_to(root)


def write_manifest(directory: Path, manifest: dict[str, Any]) -> str:
    """Write ``manifest.json`` with the sha256 of every other file (by relative path); return the
    manifest's sha256."""
    hashes, links = scan_release_files(directory)
    if links:
        raise CatalogError(
            f"release directory {directory} holds symbolic links ({', '.join(links)}); a release "
            "holds regular files only"
        )
    text = json.dumps({**manifest, "artifacts": hashes}, indent=2, sort_keys=True, default=str)
    text += "\n"
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


def publish(directory: Path, destination: Path) -> Path:
    """Copy an approved release to the published location (refuses to overwrite).

    The copy is made under a temporary name and renamed into place, so ``destination`` holds a
    complete copy or none; a crash leaves only a ``.<id>.partial-*`` folder, which
    :func:`discard_partial_copies` removes.
    """
    target = destination / directory.name
    if target.exists():
        raise CatalogError(f"published copy {target} already exists; refusing to overwrite it")
    destination.mkdir(parents=True, exist_ok=True)
    partial = destination / f".{directory.name}.partial-{uuid.uuid4().hex[:8]}"
    try:
        shutil.copytree(directory, partial)
        os.rename(partial, target)  # atomic within one file system
    except OSError as exc:
        shutil.rmtree(partial, ignore_errors=True)
        raise CatalogError(f"publishing {directory.name} to {destination} failed: {exc}") from None
    return target


def discard_partial_copies(destination: Path, release_id: str) -> list[Path]:
    """Remove the unfinished copies an interrupted :func:`publish` of ``release_id`` left."""
    leftovers = sorted(destination.glob(f".{release_id}.partial-*")) if destination.is_dir() else []
    for path in leftovers:
        shutil.rmtree(path)
    return leftovers


def verify(directory: Path, catalog: Catalog, *, input_path: str | Path | None = None) -> list[str]:
    """Everything that does not match, as readable lines; raise if anything does not match.

    ``input_path`` (the release's input file, directory or glob, for a holder of the catalog key):
    the keyed input fingerprint is recomputed and compared; without it only the key id is checked.
    """
    directory = Path(directory)
    manifest = read_manifest(directory)
    problems = _file_problems(directory, manifest)
    release_id = manifest.get("release_id")
    try:
        record = catalog.release(str(release_id))
    except CatalogError:
        problems.append(f"release {release_id!r} is not in the catalog at {catalog.url}")
        record = None
    if record is not None:
        if record.manifest_sha256 != sha256_file(directory / MANIFEST):
            problems.append(
                "manifest.json was modified: its sha256 does not match the one the catalog recorded"
            )
        problems += _status_problems(directory, record)
        problems += [f"ledger: {problem}" for problem in catalog.verify_chain()]
        problems += _receipt_problems(manifest, record, catalog)
    problems += _fingerprint_problems(manifest, catalog, input_path)
    problems += _validation_problems(directory, manifest)
    if problems:
        raise_problems(directory, problems)
    return problems


def raise_problems(directory: Path, problems: list[str] | tuple[str, ...]) -> NoReturn:
    """Raise :class:`VerificationError` naming the first :data:`SHOWN_PROBLEMS` of ``problems``
    (all of them in its ``problems``)."""
    shown = [f"  - {p}" for p in problems[:SHOWN_PROBLEMS]]
    if len(problems) > SHOWN_PROBLEMS:
        shown.append(
            f"  … and {len(problems) - SHOWN_PROBLEMS:,} more (`dprelease verify --json` "
            "lists every problem)"
        )
    raise VerificationError(
        f"release {directory} failed verification ({len(problems):,} problems):\n"
        + "\n".join(shown),
        problems=tuple(problems),
    )


def _file_problems(directory: Path, manifest: dict[str, Any]) -> list[str]:
    problems: list[str] = []
    recorded = manifest.get("artifacts", {})
    if not isinstance(recorded, dict):
        problems.append("manifest field 'artifacts' must map relative paths to sha256 digests")
        recorded = {}
    actual, links = scan_release_files(directory)
    root = directory.resolve()
    problems += [
        f"{link} is a symbolic link; a release holds regular files only (not followed)"
        for link in links
    ]
    for name, digest in sorted(recorded.items()):
        if not _inside(directory, name, resolved=root):
            problems.append(
                f"manifest lists artifact {name!r} outside the release directory (absolute or "
                "'..' path); it was not read"
            )
        elif name not in actual:
            if name not in links:
                problems.append(f"missing artifact {name}")
        elif actual[name] != digest:
            problems.append(
                f"artifact {name} was modified (sha256 {actual[name][:12]}…, manifest says {str(digest)[:12]}…)"
            )
    for name in sorted(set(actual) - set(recorded)):
        problems.append(f"unexpected file {name} is not in the manifest")
    return problems


def _status_problems(directory: Path, record: ReleaseRecord) -> list[str]:
    """Only a published release may sit in a published location; an approval must have finished."""
    problems = []
    if record.status == "approved":
        problems.append(
            f"release {record.id} is approved but its publication did not finish; run "
            f"`dprelease review {record.id} --approve --reviewer NAME` again to finish it"
        )
    here = directory.resolve()
    published_here = PUBLISHED_FOLDER in here.parts[:-1] or (
        record.published_directory is not None
        and Path(record.published_directory).resolve() == here
    )
    if published_here and record.status != "published":
        problems.append(
            f"release {record.id} is {record.status} in the catalog, but {directory} is a "
            "published location: only an approved and published release may be there"
        )
    return problems


def _receipt_problems(
    manifest: dict[str, Any], record: ReleaseRecord, catalog: Catalog
) -> list[str]:
    """Every receipt is a ledger entry with the same content; the recorded chain head is on the
    catalog's chain."""
    problems: list[str] = []
    entries = catalog.ledger_entries()
    by_receipt = {entry.receipt_id: entry for entry in entries}
    receipts = manifest.get("ledger_receipts", [])
    if not isinstance(receipts, list) or not all(isinstance(r, dict) for r in receipts):
        return ["manifest field 'ledger_receipts' must be a list of receipts (objects)"]
    for receipt in receipts:
        entry = by_receipt.get(receipt.get("receipt_id"))
        if entry is None or entry.dataset_id != record.dataset_id:
            problems.append(f"ledger receipt {receipt.get('receipt_id')} is not in the ledger")
            continue
        paid_by = receipt.get("paid_by_release", record.id)
        if entry.release_id != paid_by:
            problems.append(
                f"ledger receipt {entry.receipt_id} belongs to release {entry.release_id}, "
                f"the manifest says {paid_by}"
            )
        if entry.cost.as_dict() != receipt.get("cost"):
            problems.append(
                f"ledger receipt {entry.receipt_id} charged {entry.cost.as_dict()}, manifest says {receipt.get('cost')}"
            )
        for field in ("label", "seq", "entry_hash", "partition"):
            if field in receipt and receipt[field] != getattr(entry, field):
                problems.append(
                    f"ledger receipt {entry.receipt_id} has {field} {getattr(entry, field)!r} in "
                    f"the ledger, the manifest says {receipt[field]!r}"
                )
    head = manifest.get(MANIFEST_CHAIN_HEAD)
    if head is not None:
        seq = head.get("seq") if isinstance(head, dict) else None
        digest = head.get("entry_hash") if isinstance(head, dict) else None
        on_chain = {entry.seq: entry.entry_hash for entry in entries}
        if not isinstance(seq, int) or isinstance(seq, bool) or not isinstance(digest, str):
            problems.append(f"manifest field {MANIFEST_CHAIN_HEAD!r} must hold seq and entry_hash")
        elif (GENESIS if seq == 0 else on_chain.get(seq)) != digest:
            problems.append(
                f"the ledger chain head the manifest records (entry #{seq}) is not on the "
                "catalog's chain: the ledger was rewritten, or the release comes from another "
                "catalog"
            )
    return problems


def _fingerprint_problems(
    manifest: dict[str, Any], catalog: Catalog, input_path: str | Path | None
) -> list[str]:
    recorded = manifest.get(MANIFEST_KEY_ID)
    if input_path is None and recorded is None:
        return []
    from dprelease.catalog.keys import catalog_key, key_present

    if not key_present(catalog.url):
        return [f"the catalog at {catalog.url} has no fingerprint key to check the input with"]
    key = catalog_key(catalog.url)
    if recorded is not None and recorded != key.key_id:
        return [
            f"the input fingerprint was keyed with key {recorded}, the catalog's key is "
            f"{key.key_id}: the key was replaced, or the release comes from another catalog"
        ]
    if input_path is None:
        return []
    from dprelease.catalog.confidential.source import content_fingerprint, list_source_files
    from dprelease.catalog.errors import DataError

    try:
        files, partitioned_dir = list_source_files(str(input_path))
        actual = content_fingerprint(files, partitioned_dir, key=key)
    except (DataError, OSError) as exc:
        return [f"input {input_path} cannot be fingerprinted: {exc}"]
    if actual != manifest.get("input_fingerprint"):
        return [
            f"input {input_path} does not match the release's input fingerprint (HMAC-SHA256 "
            f"under catalog key {key.key_id})"
        ]
    return []


def _validation_problems(directory: Path, manifest: dict[str, Any]) -> list[str]:
    problems = []
    validation = directory / "validation" / "results.json"
    if validation.is_symlink():
        pass  # reported (and not read) with the files
    elif not validation.is_file():
        problems.append("validation/results.json is missing")
    else:
        try:
            results = json.loads(validation.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            problems.append(f"validation/results.json is not valid JSON: {exc}")
        else:
            if not isinstance(results, dict) or not results.get("success"):
                problems.append("validation results record a failure")
    tables = manifest.get("tables", [])
    folder = (directory / "tables").resolve()
    for name in tables if isinstance(tables, list) else []:
        if (
            not isinstance(name, str)
            or not _inside(directory / "tables", f"{name}.parquet", resolved=folder)
            or ("/" in name)
        ):
            problems.append(f"manifest table name {name!r} is not a plain name; it was not read")
            continue
        path = directory / "tables" / f"{name}.parquet"
        if path.is_file() and not path.is_symlink():
            try:
                pq.read_metadata(path)
            except (pa.ArrowInvalid, OSError) as exc:
                problems.append(f"table {name} is not readable Parquet: {exc}")
    return problems
