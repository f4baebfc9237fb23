"""The strategy store: public, data-independent results kept in memory and on disk, by public key.

Strategy optimisation is data-independent and can be slow, so its result is kept under
``$DPRELEASE_HOME/strategies/<key>.npz`` and reused by every later plan, run and process (the key
hashes the workload fingerprint — domain, items, matrix contents — the noise kind, the template
settings and a version, so a changed workload never hits a stale entry).  The same store, in its own
folder, keeps privately *released* intermediates such as DAWA's partition together with the ledger
receipt that paid for them (public once released; their key includes the keyed input fingerprint).

Safe under concurrent writers: each entry is one file written to a temporary name and renamed into
place, so a reader sees a whole entry or none.  Bounded: past ``max_entries`` files, the least
recently used (by modification time, refreshed on every hit) are evicted.  A process also keeps the
last entries it used in memory."""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections import OrderedDict
from pathlib import Path

import numpy as np

from dprelease.catalog.home import default_home
from dprelease.mechanisms.primitives.protocol import StoredStrategy

DEFAULT_MAX_ENTRIES = 512
MEMORY_ENTRIES = 32
_PARAMETERS = "__parameters__"
# (root, key) -> ((inode, size) of the file it was read from, entry): a rewritten file is re-read.
_MEMORY: OrderedDict[tuple[Path, str], tuple[tuple[int, int], StoredStrategy]] = OrderedDict()


def _stamp(path: Path) -> tuple[int, int, int]:
    status = path.stat()
    return status.st_mtime_ns, status.st_ino, status.st_size


class StrategyStore:
    """One folder of entries (``<key>.npz``: named arrays plus the parameters as JSON)."""

    def __init__(self, root: Path | None = None, *, max_entries: int = DEFAULT_MAX_ENTRIES) -> None:
        if max_entries < 1:
            raise ValueError(f"max_entries ({max_entries}) must be >= 1")
        self.root = (root or default_home() / "strategies").resolve()
        self.max_entries = max_entries

    @classmethod
    def released(cls, catalog_url: str) -> StrategyStore:
        """The store of privately released intermediates of one catalog (with their receipts)."""
        scope = hashlib.sha256(catalog_url.encode()).hexdigest()[:16]
        return cls(default_home() / "released" / scope)

    def load(self, key: str) -> StoredStrategy | None:
        path = self._path(key)
        try:
            os.utime(path)  # a hit makes the entry the most recently used (eviction order)
            stamp = _stamp(path)
        except OSError:  # missing or evicted
            _MEMORY.pop((self.root, key), None)
            return None
        remembered = _MEMORY.get((self.root, key))
        if remembered is not None and remembered[0] == stamp[1:]:
            _MEMORY.move_to_end((self.root, key))
            return remembered[1]
        try:
            with np.load(path, allow_pickle=False) as data:
                arrays = {name: data[name] for name in data.files if name != _PARAMETERS}
                parameters = json.loads(str(data[_PARAMETERS]))
        except (OSError, ValueError, KeyError):  # damaged, or written by an older version
            return None
        stored = StoredStrategy(parameters=parameters, arrays=arrays)
        self._remember(key, stored, stamp)
        return stored

    def save(self, key: str, stored: StoredStrategy) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        handle, temporary = tempfile.mkstemp(dir=self.root, suffix=".tmp")
        with os.fdopen(handle, "wb") as stream:
            np.savez(
                stream,
                **{_PARAMETERS: np.array(json.dumps(stored.parameters, sort_keys=True))},
                **stored.arrays,
            )
        os.replace(temporary, self._path(key))
        self._remember(key, stored, _stamp(self._path(key)))
        self._evict()

    def keys(self) -> list[str]:
        return sorted(path.stem for path in self.root.glob("*.npz"))

    def _path(self, key: str) -> Path:
        return self.root / f"{key}.npz"

    def _remember(self, key: str, stored: StoredStrategy, stamp: tuple[int, int, int]) -> None:
        _MEMORY[(self.root, key)] = (stamp[1:], stored)
        _MEMORY.move_to_end((self.root, key))
        while len(_MEMORY) > MEMORY_ENTRIES:
            _MEMORY.popitem(last=False)

    def _evict(self) -> None:
        """Drop the least recently used entries beyond ``max_entries``. O(entries log entries)."""
        entries = []
        for path in self.root.glob("*.npz"):
            try:
                entries.append((path.stat().st_mtime, path))
            except FileNotFoundError:  # evicted by a concurrent writer
                continue
        for _mtime, path in sorted(entries)[: max(0, len(entries) - self.max_entries)]:
            path.unlink(missing_ok=True)
            _MEMORY.pop((self.root, path.stem), None)
