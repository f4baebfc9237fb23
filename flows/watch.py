"""The arrival watcher: announce complete new Parquet files in a landing folder as Prefect events.

``dprelease watch DIR`` polls DIR recursively and emits one ``dprelease.data.arrived`` event per
complete new Parquet file (resource ``dprelease.dataset.<dataset id>``, payload ``{path,
fingerprint}``); deployments of specs with ``trigger: arrival`` run a release on it.

Complete: size and mtime unchanged across two polls and a readable Parquet footer (temporary names
starting with ``.``/``_`` or ending in ``.tmp``/``.part``/... are never looked at); a non-Parquet
file is logged once and skipped.

At most once per content (every announcement spends budget): the keyed fingerprint (HMAC under the
catalog key) is claimed in :class:`catalog.watch_state.WatchState` *before* the event is emitted,
and given back if emission fails.  A duplicated delivery is skipped by the deployed flow
(``on_unchanged: skip``).

Dataset: with ``--spec-dir``, every ``trigger: arrival`` spec whose ``dataset.source`` is the
file, a folder holding it or a glob matching it; without, the first folder under DIR.
"""

from __future__ import annotations

import asyncio
import fnmatch
import glob as globlib
import logging
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

from dprelease.catalog.errors import DprReleaseError
from dprelease.catalog.keys import CatalogKey, catalog_key
from dprelease.catalog.ledger.database import default_url
from dprelease.catalog.watch_state import WatchState

ARRIVAL_EVENT = "dprelease.data.arrived"
RESOURCE_PREFIX = "dprelease.dataset."
PARQUET_MAGIC = b"PAR1"
TEMPORARY_SUFFIXES = (".tmp", ".temp", ".part", ".partial", ".inprogress", ".crdownload", "~")
_DATASET_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")

logger = logging.getLogger("dprelease.watch")


def resource_id(dataset_id: str) -> str:
    """The Prefect resource id arrival events of ``dataset_id`` carry (triggers match on it)."""
    if not _DATASET_ID.match(dataset_id):
        raise ValueError(
            f"dataset id ({dataset_id!r}) must match {_DATASET_ID.pattern} (letters, digits, _ . -)"
        )
    return RESOURCE_PREFIX + dataset_id


@dataclass(frozen=True, kw_only=True)
class ArrivalEvent:
    """One announcement: ``path`` (absolute) of a complete Parquet file for ``dataset_id``."""

    dataset_id: str
    path: str
    fingerprint: str
    size: int

    @property
    def resource(self) -> dict[str, str]:
        return {
            "prefect.resource.id": resource_id(self.dataset_id),
            "prefect.resource.name": Path(self.path).name,
        }

    @property
    def payload(self) -> dict[str, str]:
        return {"path": self.path, "fingerprint": self.fingerprint}


Emitter = Callable[[ArrivalEvent], None]
DatasetResolver = Callable[[Path], list[str]]


def file_fingerprint(path: str | Path, *, key: CatalogKey | None = None) -> str:
    """Keyed fingerprint of the file's bytes (content only: a renamed copy has the same one).

    Privacy: HMAC-SHA256 under the catalog's key (default: the default catalog's), never a plain
    hash, so an announced fingerprint cannot confirm a guessed confidential file.  O(bytes).
    """
    secret = key or catalog_key(default_url())

    def blocks() -> Iterator[bytes]:
        with open(path, "rb") as handle:
            yield from iter(lambda: handle.read(1 << 20), b"")  # streaming

    return secret.fingerprint(blocks())


def is_temporary_name(path: Path) -> bool:
    """Names writers use while a file is incomplete (or metadata markers such as ``_SUCCESS``)."""
    name = path.name
    return name.startswith((".", "_")) or name.lower().endswith(TEMPORARY_SUFFIXES)


def parquet_verdict(path: Path) -> str:
    """``"complete"``, ``"incomplete"`` (a Parquet file still being written) or ``"not-parquet"``."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    with open(path, "rb") as handle:
        head = handle.read(len(PARQUET_MAGIC))
    if head != PARQUET_MAGIC:
        return "not-parquet"
    try:
        pq.read_metadata(path)  # reads the footer only
    except (pa.ArrowInvalid, OSError):
        return "incomplete"
    return "complete"


def folder_resolver(root: Path) -> DatasetResolver:
    """Dataset id = the first folder under ``root`` (``root/<dataset id>/…/file.parquet``)."""
    root = root.resolve()

    def resolve(path: Path) -> list[str]:
        parts = path.resolve().relative_to(root).parts
        if len(parts) < 2 or not _DATASET_ID.match(parts[0]):
            return []
        return [parts[0]]

    return resolve


def _source_matches(source: str, path: Path) -> bool:
    source_path = Path(source)
    if globlib.has_magic(source):
        return fnmatch.fnmatch(str(path), source)
    if source_path.is_dir():
        return source_path.resolve() in path.parents
    return source_path.resolve() == path


def spec_files(folder: Path) -> list[Path]:
    """The YAML files directly inside ``folder`` (sorted)."""
    return sorted(p for pattern in ("*.yaml", "*.yml") for p in folder.glob(pattern) if p.is_file())


class SpecResolver:
    """Dataset ids of the arrival-triggered specs in a folder whose source covers a file; specs
    are re-read when a spec file changes, an invalid one is logged and ignored."""

    def __init__(self, spec_dir: Path) -> None:
        if not spec_dir.is_dir():
            raise ValueError(f"spec dir ({str(spec_dir)!r}) must be an existing folder")
        self.spec_dir = spec_dir
        self._signature: tuple[tuple[str, int], ...] | None = None
        self._sources: list[tuple[str, str]] = []  # (dataset id, source)

    def _reload_if_changed(self) -> None:
        from dprelease.catalog.spec.load import load_spec

        files = spec_files(self.spec_dir)
        signature = tuple((str(p), p.stat().st_mtime_ns) for p in files)
        if signature == self._signature:
            return
        self._signature = signature
        sources = []
        for path in files:
            try:
                spec = load_spec(path)
            except DprReleaseError as exc:
                logger.error("ignoring spec %s: %s", path, exc)
                continue
            if spec.trigger != "arrival":
                continue
            if spec.dataset.source is None:
                logger.warning(
                    "spec %s has trigger: arrival but no dataset.source; no file can match it", path
                )
                continue
            sources.append((spec.dataset.id, spec.dataset.source))
        self._sources = sources

    def __call__(self, path: Path) -> list[str]:
        self._reload_if_changed()
        return sorted({d for d, source in self._sources if _source_matches(source, path.resolve())})


_Stat = tuple[int, int, int]  # (size, mtime_ns, ctime_ns): a chmod changes ctime only


class Watcher:
    """Polls a folder and announces complete new Parquet files (see the module docstring)."""

    def __init__(
        self,
        directory: Path,
        *,
        state: WatchState,
        emitter: Emitter,
        resolve_datasets: DatasetResolver | None = None,
    ) -> None:
        if not directory.is_dir():
            raise ValueError(f"watch dir ({str(directory)!r}) must be an existing folder")
        self.directory = directory.resolve()
        self.state = state
        self.emitter = emitter
        self.resolve_datasets = resolve_datasets or folder_resolver(self.directory)
        self._last_seen: dict[Path, _Stat] = {}  # files still settling: their stat at the last poll
        self._settled: dict[Path, _Stat] = {}  # files dealt with, in this exact state
        self._waiting_logged: set[tuple[Path, _Stat]] = set()

    def poll(self) -> list[ArrivalEvent]:
        """One pass over the folder, O(files + new bytes)."""
        emitted: list[ArrivalEvent] = []
        present: set[Path] = set()
        for path in sorted(self.directory.rglob("*")):
            parts = path.relative_to(self.directory).parts
            if not path.is_file() or any(is_temporary_name(Path(part)) for part in parts):
                continue
            present.add(path)
            try:
                info = path.stat()
            except FileNotFoundError:  # renamed or removed while we looked
                continue
            stat = (info.st_size, info.st_mtime_ns, info.st_ctime_ns)
            if self._settled.get(path) == stat:
                continue
            self._settled.pop(path, None)
            if path.suffix.lower() != ".parquet":
                logger.warning(
                    "skipping %s: not a Parquet file (name does not end in .parquet)", path
                )
                self._settled[path] = stat
                continue
            previous = self._last_seen.get(path)
            self._last_seen[path] = stat
            if previous != stat or stat[0] == 0:
                continue  # first sighting, still being written, or an empty placeholder
            if self._consider(path, stat, emitted):
                self._settled[path] = stat
                self._last_seen.pop(path, None)
        self._last_seen = {path: stat for path, stat in self._last_seen.items() if path in present}
        self._settled = {path: stat for path, stat in self._settled.items() if path in present}
        self._waiting_logged = {entry for entry in self._waiting_logged if entry[0] in present}
        return emitted

    def _consider(self, path: Path, stat: _Stat, emitted: list[ArrivalEvent]) -> bool:
        """Announce a size-stable file; True when it is dealt with (False: look again later)."""
        try:
            verdict = parquet_verdict(path)
        except FileNotFoundError:
            return False
        except OSError as exc:  # unreadable: skip until the file (or its permissions) change
            logger.warning("skipping %s: cannot read it (%s)", path, exc)
            return True
        if verdict == "not-parquet":
            logger.warning("skipping %s: not a Parquet file (no PAR1 header)", path)
            return True
        if verdict == "incomplete":
            if (path, stat) not in self._waiting_logged:
                self._waiting_logged.add((path, stat))
                logger.info("waiting for %s: Parquet footer not written yet", path)
            return False
        fingerprint = file_fingerprint(path)
        after = path.stat()
        if (after.st_size, after.st_mtime_ns, after.st_ctime_ns) != stat:
            return False  # changed while hashing: look again at the next poll
        datasets = self.resolve_datasets(path)
        if not datasets:
            why = "no arrival-triggered spec covers it, or it is not under DIR/<dataset id>/"
            logger.warning("skipping %s: no dataset for it (%s)", path, why)
            return True
        dealt_with = True
        for dataset_id in datasets:
            event = ArrivalEvent(
                dataset_id=dataset_id, path=str(path), fingerprint=fingerprint, size=stat[0]
            )
            if not self.state.claim(**asdict(event)):  # the event's four fields
                earlier = self.state.announcement(dataset_id=dataset_id, fingerprint=fingerprint)
                logger.info(
                    "not announcing %s for %s: the same content was announced before (%s)",
                    path,
                    dataset_id,
                    earlier.path if earlier else "?",
                )
                continue
            try:
                self.emitter(event)
            except Exception as exc:  # any emitter failure: give the claim back, retry next poll
                self.state.unclaim(dataset_id=dataset_id, fingerprint=fingerprint)
                logger.error("could not announce %s for %s: %s", path, dataset_id, exc)
                dealt_with = False
                continue
            logger.info(
                "announced %s for dataset %s (fingerprint %s…)", path, dataset_id, fingerprint[:12]
            )
            emitted.append(event)
        return dealt_with

    def run(
        self,
        *,
        interval_seconds: float,
        max_polls: int | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> list[ArrivalEvent]:
        """Poll every ``interval_seconds``; stop after ``max_polls`` polls (None: until interrupted)."""
        if not interval_seconds > 0:
            raise ValueError(f"interval_seconds ({interval_seconds}) must be > 0")
        if max_polls is not None and max_polls < 1:
            raise ValueError(f"max_polls ({max_polls}) must be >= 1")
        from sqlalchemy.exc import SQLAlchemyError

        emitted: list[ArrivalEvent] = []
        polls = 0
        while True:
            try:
                emitted.extend(self.poll())
            except (OSError, SQLAlchemyError) as exc:  # a transient folder or catalog problem
                logger.error(
                    "poll of %s failed, retrying in %g s: %s", self.directory, interval_seconds, exc
                )
            polls += 1
            if max_polls is not None and polls >= max_polls:
                return emitted
            sleep(interval_seconds)


def prefect_emitter(api_url: str, *, connect_attempts: int = 3) -> Emitter:
    """Send each event to the Prefect API at ``api_url`` and wait for the server's acknowledgement;
    raise on any failure (connection refused, authentication), so the watcher retries the file."""
    if not api_url.startswith(("http://", "https://")):
        raise ValueError(f"api_url ({api_url!r}) must be an http(s) URL of a Prefect API")

    async def send(event: ArrivalEvent) -> None:
        from prefect.events.clients import PrefectEventsClient
        from prefect.events.schemas.events import Event

        client = PrefectEventsClient(
            api_url=api_url, reconnection_attempts=connect_attempts, checkpoint_every=1
        )
        async with client:  # checkpoint_every=1: emit() returns after the server's pong
            await client.emit(
                Event(event=ARRIVAL_EVENT, resource=event.resource, payload=event.payload)
            )

    def emit(event: ArrivalEvent) -> None:
        asyncio.run(send(event))

    return emit


def logging_emitter(event: ArrivalEvent) -> None:
    """Dry run: log the event instead of sending it."""
    logger.info(
        "dry run: would emit %s for %s with payload %s",
        ARRIVAL_EVENT,
        event.resource,
        event.payload,
    )


@dataclass(frozen=True, kw_only=True)
class AdoptionReport:
    """``dprelease watch --adopt-claims-from OLD_URL``: what the new catalog now remembers."""

    adopted: int  # re-keyed and claimed in the new catalog
    already: int  # the new catalog had claimed that content already
    changed: int  # the file's bytes differ from what was announced: it is new content
    missing: int  # the file is gone: its fingerprint cannot be re-keyed (a copy reappearing is new)


def adopt_claims(*, source_url: str, target_url: str | None = None) -> AdoptionReport:
    """Carry the watcher's arrival claims from the catalog at ``source_url`` (e.g. the SQLite
    catalog before a move to PostgreSQL) into the catalog at ``target_url`` (default: the current
    one), so files already announced are not announced again.

    Fingerprints are keyed with each catalog's own key, so a claim cannot be copied as it is: each
    announced file still on disk is hashed under the old key (it must match the claim, else its
    content changed and it is new) and claimed under the new key.  O(bytes of announced files).
    """
    target = target_url or default_url()
    if source_url == target:
        raise ValueError(f"source_url ({source_url!r}) must differ from the target catalog")
    old_key, new_key = catalog_key(source_url), catalog_key(target)
    old, new = WatchState(source_url), WatchState(target)
    adopted = already = changed = missing = 0
    for claim in old.announcements():
        path = Path(claim.path)
        if not path.is_file():
            missing += 1
            continue
        if file_fingerprint(path, key=old_key) != claim.fingerprint:
            changed += 1
            continue
        if new.claim(
            dataset_id=claim.dataset_id,
            fingerprint=file_fingerprint(path, key=new_key),
            path=claim.path,
            size=claim.size,
        ):
            adopted += 1
        else:
            already += 1
    return AdoptionReport(adopted=adopted, already=already, changed=changed, missing=missing)
