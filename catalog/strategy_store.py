"""On-disk store of optimised strategies, keyed by a fingerprint of what determines them.

Strategy optimisation is data-independent and can be slow, so its result is kept under
``$DPRELEASE_HOME/strategies/<key>.json`` and reused by every later run and process (the Prefect
task cache covers flow runs; this store also serves ``dprelease plan``, which runs without
Prefect).  The key hashes the workload fingerprint (domain, items, matrix contents), the noise
kind, the template settings and a version; a changed workload never hits a stale entry.  Entries
are written atomically (temporary file + rename), so concurrent writers cannot corrupt them.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from catalog.ledger import default_home

STORE_VERSION = "1"


def strategy_key(*, workload_fingerprint: str, template: str, settings: dict[str, Any]) -> str:
    raw = json.dumps(
        ["strategy", STORE_VERSION, workload_fingerprint, template, settings], sort_keys=True
    )
    return hashlib.sha256(raw.encode()).hexdigest()


class StrategyStore:
    """JSON entries, one per key, in one folder."""

    def __init__(self, root: Path | None = None) -> None:
        self.root = (root or default_home() / "strategies").resolve()

    def get(self, key: str) -> dict[str, Any] | None:
        path = self.root / f"{key}.json"
        try:
            entry = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError):
            return None
        return entry if isinstance(entry, dict) and entry.get("key") == key else None

    def put(self, key: str, parameters: dict[str, Any]) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        entry = {"key": key, "parameters": parameters}
        handle, temporary = tempfile.mkstemp(dir=self.root, suffix=".tmp")
        with os.fdopen(handle, "w") as stream:
            json.dump(entry, stream, sort_keys=True)
        os.replace(temporary, self.root / f"{key}.json")

    def put_arrays(self, key: str, arrays: dict[str, np.ndarray]) -> None:
        """Matrices of an entry (e.g. optimised per-attribute factors), atomically."""
        self.root.mkdir(parents=True, exist_ok=True)
        handle, temporary = tempfile.mkstemp(dir=self.root, suffix=".npz")
        with os.fdopen(handle, "wb") as stream:
            np.savez(stream, **arrays)
        os.replace(temporary, self.root / f"{key}.npz")

    def get_arrays(self, key: str) -> dict[str, np.ndarray] | None:
        try:
            with np.load(self.root / f"{key}.npz", allow_pickle=False) as data:
                return {name: data[name] for name in data.files}
        except (OSError, ValueError):
            return None
