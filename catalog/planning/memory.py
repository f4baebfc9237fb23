"""Peak memory of each release stage, predicted from public sizes before any data is read.

Sizes only: cells, queries, measured strategy rows, released rows and the Parquet input's
uncompressed size from its file metadata (never a data value).  ``run`` refuses a release whose
prediction exceeds :func:`memory_limit` before the budget is charged.  Costs O(files) metadata
reads; no row is parsed."""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dprelease.catalog.errors import MemoryLimitError, SettingError
from dprelease.mechanisms.primitives.workload import magnitude

ENV = "DPRELEASE_MEMORY_LIMIT"
BASE_BYTES = 330e6  # measured: the `dprelease run` process's imports (prefect, GX) and catalog
FLOAT = 8.0
# bytes held per unit of size at each stage's peak (copies alive together, measured on the
# benchmark specs with benchmarks/memory_bench.py)
INGEST_PER_INPUT_BYTE = 3.0  # Arrow table + numpy copy + cell index
MEASURE_PER_ROW = 4 * FLOAT  # strategy answers, noise, noisy answers, scratch
RECONSTRUCT_PER_QUERY = 1400.0  # estimates, variances, intervals, labels and table columns
RECONSTRUCT_PER_CELL = 6 * FLOAT
VALIDATE_PER_ROW = 400.0  # pandas frame of a released table (object columns) + GX copies
STAGE_PER_ROW = 200.0  # report charts and Parquet writer buffers
_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12}


@dataclass(frozen=True, kw_only=True)
class MemoryPrediction:
    """Predicted peak bytes of the whole process in each stage, and the size that drives it."""

    stages: tuple[tuple[str, float, str], ...]  # (stage, bytes, driving size)

    @property
    def peak(self) -> tuple[str, float, str]:
        return max(self.stages, key=lambda stage: stage[1])

    def to_json(self) -> dict[str, Any]:
        stage, peak, driver = self.peak
        return {
            "stages": {name: {"bytes": int(b), "driven_by": d} for name, b, d in self.stages},
            "peak_stage": stage,
            "peak_bytes": int(peak),
            "driven_by": driver,
        }


def parquet_bytes(source: Any, columns: list[str]) -> int:
    """Decoded bytes of ``columns`` in the Parquet input, from file metadata only."""
    import pyarrow.parquet as pq

    if source is None:
        return 0
    path = Path(str(source))
    files = sorted(path.rglob("*.parquet")) if path.is_dir() else [path]
    total = 0
    for file in files:
        try:
            metadata = pq.ParquetFile(file).metadata
        except (OSError, ValueError):
            continue  # unreadable here: ingest refuses it with its own message
        for g in range(metadata.num_row_groups):
            group = metadata.row_group(g)
            for c in range(group.num_columns):
                column = group.column(c)
                if column.path_in_schema in columns:
                    # decoded in memory: at least 8 bytes a value (dictionary pages are smaller)
                    total += max(column.total_uncompressed_size, int(FLOAT * group.num_rows))
    return total


def predict(
    *,
    cells: int,
    queries: int,
    strategy_rows: int,
    released_rows: int,
    input_bytes: int,
    input_kind: str = "cells",
) -> MemoryPrediction:
    """Per-stage predicted peak of the process (base imports included); pure arithmetic."""
    # only a cells-input mechanism forms the cell vector; the others count and reconstruct
    # in the space of their measured queries
    held = cells if input_kind == "cells" else 0
    counted = cells if input_kind == "cells" else strategy_rows
    ingested = f"{input_bytes:,} bytes of Parquet input and {magnitude(counted)} counted cells"
    measured = f"{strategy_rows:,} measured strategy rows"
    released = f"{released_rows:,} released rows"
    stages = (
        ("ingest", BASE_BYTES + INGEST_PER_INPUT_BYTE * input_bytes + FLOAT * counted, ingested),
        ("measure", BASE_BYTES + MEASURE_PER_ROW * strategy_rows + FLOAT * counted, measured),
        (
            "reconstruct",
            BASE_BYTES + RECONSTRUCT_PER_QUERY * queries + RECONSTRUCT_PER_CELL * held,
            f"{queries:,} queries x {magnitude(cells)} cells"
            if input_kind == "cells"
            else f"{queries:,} queries (no cell vector is held)",
        ),
        ("validate", BASE_BYTES + VALIDATE_PER_ROW * released_rows, released),
        ("stage", BASE_BYTES + STAGE_PER_ROW * released_rows, released),
    )
    return MemoryPrediction(stages=stages)


def predict_plan(spec: Any, plan: Any) -> MemoryPrediction:
    """The prediction for a planned release (sizes from the plan and the input's metadata)."""
    strategy_rows = int(getattr(plan.strategy, "num_queries", plan.num_queries) or 0)
    return predict(
        cells=plan.num_cells,
        queries=plan.num_queries,
        strategy_rows=strategy_rows,
        released_rows=sum(plan.item_queries.values()),
        input_bytes=parquet_bytes(getattr(spec.dataset, "source", None), list(spec.domain)),
        input_kind=getattr(plan.mechanism, "input_kind", "cells"),
    )


def parse_limit(text: str) -> int:
    """``2GB``, ``1500MB``, ``1000000`` (bytes) -> bytes; anything else raises SettingError."""
    raw = text.strip().upper().replace(" ", "")
    number = raw.rstrip("KMGTB")
    unit = raw[len(number) :]
    try:
        value = float(number)
    except ValueError:
        value = -1.0
    if unit not in _UNITS or not value > 0 or value != value or value == float("inf"):
        raise SettingError(
            f"{ENV}={text!r} must be a positive size: bytes, or a number with KB, MB, GB or TB "
            "(e.g. 2GB, 1500MB)"
        )
    return int(value * _UNITS[unit])


def memory_limit() -> tuple[int, str] | None:
    """(bytes, where it comes from): DPRELEASE_MEMORY_LIMIT when set, else MemAvailable from
    /proc/meminfo; None where there is neither."""
    text = os.environ.get(ENV)
    if text is not None and text.strip():
        return parse_limit(text), ENV
    with contextlib.suppress(OSError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024, "MemAvailable"
    return None


def _size(value: float) -> str:
    return f"{value / 1e9:.3g} GB" if value >= 1e9 else f"{value / 1e6:.3g} MB"


def check_memory(prediction: MemoryPrediction) -> None:
    """Refuse (MemoryLimitError, exit 2) a release predicted past the limit; before any data is
    read."""
    limit = memory_limit()
    if limit is None:
        return
    stage, peak, driver = prediction.peak
    if peak > limit[0]:
        raise MemoryLimitError(
            f"{stage} needs ~{_size(peak)} for {driver}; limit {_size(limit[0])} ({limit[1]}): "
            "raise the limit, run on a larger machine, or narrow the workload"
        )
