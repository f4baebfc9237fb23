"""Local-model (LDP) releases: workload → strategy Q (optimised, stored, published), simulated client
responses, response ingest and validation, the collection's ledger charge, estimates and tables.

In the local model (``model: local`` in a spec) every user randomises their own item on their
device with a *published* ε-LDP strategy ``Q`` (``mechanisms.ldp``) and sends one response index.
The server never sees a true item: it counts the responses into ``y`` and answers the workload
with ``V y`` where ``V`` is the reconstruction of Thm 3.10 (``V Q = W``).  Each item's table has
the usual ``estimate`` and ``std_error`` columns.

Stages (the Prefect tasks in ``tasks/ldp.py`` wrap them one to one):

1. :func:`ensure_strategy` — data-free: optimise ``Q`` for the spec's workload at the per-user ε,
   or reuse it from the on-disk :class:`~catalog.strategy_store.StrategyStore` (key: workload
   fingerprint, ε, optimiser settings); :func:`write_strategy_artifact` publishes it.
2. :func:`register` — dataset cap registered, the release recorded; the collection's ε is checked
   against the remaining budget *before any response is read* (unless this collection was already
   charged).
3. :func:`ingest_responses` — every responses file is validated (Parquet, an integer ``response``
   column, no nulls, indices in ``[0, m)``, the strategy fingerprint of the published ``Q``);
   any failure is a :class:`~catalog.errors.DataError` and nothing is charged.
4. :func:`charge_collection` — one ledger charge of the per-user ε per (dataset, strategy,
   responses content); a re-release of the same collection reuses the receipt.
5. :func:`estimate_tables` — post-processing of the responses.
6. :func:`validate` and :func:`stage` — the central pipeline's output checks, manifest and report.

Privacy: the ε-LDP guarantee is given by the client-side randomiser alone; the server side is
post-processing of responses, so re-estimating a collection costs nothing more.  The ledger records
what the collection cost each user (``pure`` ε, one response per user).

References
----------
R. McKenna, R. K. Maity, A. Mazumdar, G. Miklau, "A workload-adaptive mechanism for linear queries
under local differential privacy", PVLDB 13(11), 2020 (§3, Thm 3.4, 3.10, Cor 3.5-3.6, 5.7).
"""

from __future__ import annotations

import hashlib
import json
import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import sqlalchemy as sa

from catalog import artifacts
from catalog.errors import DataError, SpecError, ValidationFailedError
from catalog.ledger import Catalog, now
from catalog.planning import build_workload
from catalog.release import StagedRelease, write_report
from catalog.source import SourceFiles, check_schema, open_dataset, resolve_source
from catalog.spec import Categorical, ReleaseSpec
from catalog.strategy_store import StrategyStore, strategy_key
from catalog.tables import build_table
from catalog.validation import validate_tables
from mechanisms import ldp
from mechanisms.ldp import LDPStrategy
from mechanisms.operators import kron_dense
from mechanisms.privacy import PrivacyCost
from mechanisms.workload import Workload, WorkloadItem

MECHANISM_NAME = "ldp-optimized"
STRATEGY_TEMPLATE = "ldp-factorization"
LDP_STORE_VERSION = "1"
DEFAULT_ROWS_FACTOR = 4  # m = 4n outputs for the random start ([McKenna20] §4)
DEFAULT_ITERATIONS = 500  # within about 1 % of 1000 steps on Prefix-512 (see notes/ldp.md)
DEFAULT_TOLERANCE = 1e-5
MAX_LDP_CELLS = 2048  # one optimiser step is O(m n^2) with m = 4n: about 1.5 s at n = 2048
MAX_TABLE_ENTRIES = 25_000_000  # queries × cells of one item's dense rows (200 MB of float64)
V_CHUNK_ENTRIES = 4_000_000  # rows of V formed at a time
RAPPOR_MAX_CELLS = 16

RESPONSE_COLUMN = "response"
FINGERPRINT_COLUMN = "strategy_fingerprint"
FINGERPRINT_METADATA_KEY = b"dprelease.ldp.strategy_fingerprint"
EPSILON_METADATA_KEY = b"dprelease.ldp.epsilon"
COLLECTION_LABEL = "local-model collection (epsilon per user)"
STRATEGY_ARRAY = "strategy.npy"
STRATEGY_JSON = "strategy.json"


# --- spec checks and the workload ----------------------------------------------------------------


def require_local(spec: ReleaseSpec) -> float:
    """The per-user ε of a ``model: local`` spec; :class:`SpecError` for any other spec."""
    if spec.model != "local":
        raise SpecError(
            f"spec {spec.name!r} has model {spec.model!r}; the LDP pipeline needs model: local"
        )
    if spec.num_cells < 2:
        raise SpecError(f"the domain has {spec.num_cells} cell(s); local-model releases need >= 2")
    if spec.num_cells > MAX_LDP_CELLS:
        raise SpecError(
            f"the domain has {spec.num_cells:,} cells; a local-model strategy is optimised over at "
            f"most {MAX_LDP_CELLS:,} cells (each step costs O(m n^2) with m = 4n)"
        )
    return float(spec.privacy_target().epsilon)


def workload_gram(workload: Workload) -> np.ndarray:
    """``WᵀW = Σ_items ⊗_a G_{item,a}`` as a dense ``n x n`` matrix, never forming W. O(items n^2)."""
    gram = np.zeros((workload.num_cells, workload.num_cells))
    for factors in workload.gram_terms():
        term = np.ones((1, 1))
        for factor_gram in factors:
            term = np.kron(term, factor_gram)
        gram += term
    return gram


def workload_root(workload: Workload) -> np.ndarray:
    """An ``n x n`` matrix ``R`` with ``RᵀR = WᵀW`` (eigen square root).

    Every strategy-side quantity of ``mechanisms.ldp`` depends on W only through ``WᵀW`` (the
    optimiser, Thm 3.4 variances with the Thm 3.10 reconstruction, the row-space check) or through
    its singular values and Frobenius norm (Cor 5.7), which ``R`` shares; so ``R`` stands in for a
    workload of any number of queries at ``O(n^3)``.
    """
    gram = workload_gram(workload)
    eigenvalues, eigenvectors = np.linalg.eigh((gram + gram.T) / 2.0)  # O(n^3)
    return np.sqrt(np.clip(eigenvalues, 0.0, None))[:, None] * eigenvectors.T


# --- optimiser settings and strategy records ------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class OptimizerSettings:
    """Public settings that determine the optimised strategy (all part of the store key)."""

    rows_factor: int = DEFAULT_ROWS_FACTOR
    iterations: int = DEFAULT_ITERATIONS
    tolerance: float = DEFAULT_TOLERANCE
    seed: int
    """Public randomness of the random start, derived from the workload fingerprint and ε."""

    def __post_init__(self) -> None:
        if self.rows_factor < 1:
            raise ValueError(f"rows_factor ({self.rows_factor}) must be >= 1")
        if self.iterations < 0:
            raise ValueError(f"iterations ({self.iterations}) must be >= 0")
        if not 0.0 <= self.tolerance < 1.0:
            raise ValueError(f"tolerance ({self.tolerance}) must be in [0, 1)")
        if self.seed < 0:
            raise ValueError(f"seed ({self.seed}) must be >= 0")

    def key(self) -> dict[str, Any]:
        return asdict(self)


def settings_for(
    spec: ReleaseSpec,
    *,
    rows_factor: int = DEFAULT_ROWS_FACTOR,
    iterations: int = DEFAULT_ITERATIONS,
    tolerance: float = DEFAULT_TOLERANCE,
) -> OptimizerSettings:
    """Optimiser settings for ``spec``; the start's seed is a hash of public facts (recorded)."""
    epsilon = require_local(spec)
    digest = hashlib.sha256(f"{spec.workload_fingerprint()}:{epsilon!r}".encode()).hexdigest()
    return OptimizerSettings(
        rows_factor=rows_factor,
        iterations=iterations,
        tolerance=tolerance,
        seed=int(digest[:15], 16),
    )


def store_key(spec: ReleaseSpec, settings: OptimizerSettings) -> str:
    """StrategyStore key: workload fingerprint + per-user ε + optimiser settings + version."""
    return strategy_key(
        workload_fingerprint=spec.workload_fingerprint(),
        template=STRATEGY_TEMPLATE,
        settings={
            "epsilon": require_local(spec),
            "version": LDP_STORE_VERSION,
            **settings.key(),
        },
    )


@dataclass(frozen=True, kw_only=True)
class VarianceSummary:
    """Worst-case (Cor 3.5) and average-case (Cor 3.6) total variance per user (N = 1), with the
    Thm 3.10 reconstruction that releases use."""

    worst_variance: float
    average_variance: float
    rows: int

    def to_json(self) -> dict[str, float]:
        return {"worst_variance": self.worst_variance, "average_variance": self.average_variance}


@dataclass(frozen=True, kw_only=True)
class StrategyRecord:
    """Public facts of an optimised strategy (``strategy.json`` and the store entry)."""

    mechanism: str
    fingerprint: str
    store_key: str
    epsilon: float
    domain_size: int
    rows: int
    worst_variance: float
    average_variance: float
    lower_bound: float
    baselines: dict[str, VarianceSummary] = field(default_factory=dict)
    settings: dict[str, Any] = field(default_factory=dict)
    workload_fingerprint: str
    spec_fingerprint: str
    num_queries: int
    seconds: float

    def to_json(self) -> dict[str, Any]:
        """Everything, JSON-ready (``strategy.json``)."""
        data = asdict(self)
        data["baselines"] = {
            name: b.to_json() | {"rows": b.rows} for name, b in self.baselines.items()
        }
        data["variance_unit"] = "total variance of all workload queries per user (N = 1)"
        data["reconstruction"] = "V = W (Q^T D^-1 Q)^+ Q^T D^-1 (McKenna et al. 2020, Thm 3.10)"
        return data

    def cli_json(self) -> dict[str, Any]:
        """The ``dprelease ldp strategy --json`` object (variances per user, N = 1)."""
        return {
            "mechanism": self.mechanism,
            "worst_variance": self.worst_variance,
            "average_variance": self.average_variance,
            "baselines": {name: b.to_json() for name, b in self.baselines.items()},
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> StrategyRecord:
        baselines = {
            name: VarianceSummary(
                worst_variance=float(b["worst_variance"]),
                average_variance=float(b["average_variance"]),
                rows=int(b.get("rows", 0)),
            )
            for name, b in data["baselines"].items()
        }
        names = {f for f in cls.__dataclass_fields__ if f != "baselines"}
        return cls(baselines=baselines, **{k: v for k, v in data.items() if k in names})


def summarize(root: np.ndarray, strategy: LDPStrategy) -> VarianceSummary:
    """Per-user worst and average variance of ``strategy`` on the workload with ``RᵀR = WᵀW``."""
    per_type = ldp.per_type_variance(root, strategy)  # Thm 3.4 with Thm 3.10's V, O(m n^2 + n^3)
    return VarianceSummary(
        worst_variance=float(per_type.max()),
        average_variance=float(per_type.mean()),
        rows=strategy.num_outputs,
    )


def baseline_strategies(spec: ReleaseSpec) -> dict[str, LDPStrategy]:
    """The baselines that apply to the spec's domain.

    randomized_response and hadamard always; hierarchical (branching 4, Hadamard oracle) for one
    ordered attribute; rappor for at most 16 cells; fourier when every attribute is binary.
    """
    epsilon = require_local(spec)
    n = spec.num_cells
    baselines = {
        "randomized_response": ldp.randomized_response(n, epsilon=epsilon),
        "hadamard": ldp.hadamard(n, epsilon=epsilon),
    }
    attributes = list(spec.domain.values())
    if len(attributes) == 1 and (
        not isinstance(attributes[0], Categorical) or attributes[0].ordered
    ):
        baselines["hierarchical"] = ldp.hierarchical(n, epsilon=epsilon)
    if n <= RAPPOR_MAX_CELLS:
        baselines["rappor"] = ldp.rappor(n, epsilon=epsilon)
    if all(attribute.size == 2 for attribute in attributes):
        baselines["fourier"] = ldp.fourier(len(attributes), epsilon=epsilon)
    return baselines


def evaluate_baselines(spec: ReleaseSpec, root: np.ndarray) -> dict[str, VarianceSummary]:
    """Variance per user of every applicable baseline (a baseline that cannot answer the workload,
    i.e. W outside its row space, is left out)."""
    results = {}
    for name, strategy in baseline_strategies(spec).items():
        try:
            results[name] = summarize(root, strategy)
        except ValueError:
            continue
    return results


def ensure_strategy(
    spec: ReleaseSpec,
    *,
    settings: OptimizerSettings | None = None,
    store: StrategyStore | None = None,
    on_optimize: Callable[[str], None] | None = None,
) -> tuple[LDPStrategy, StrategyRecord]:
    """The spec's optimised strategy and its record, from the store or freshly optimised.

    The store entry (``<key>.npz`` with Q, then ``<key>.json`` with the record) is shared by every
    process using the same ``$DPRELEASE_HOME``.  A stored Q is re-validated (ε-LDP by construction
    of :class:`LDPStrategy`) and its fingerprint compared with the record.  ``on_optimize`` is
    called with a description before a (possibly long) optimisation starts.

    Privacy: data-free; Q is public.
    """
    epsilon = require_local(spec)
    settings = settings or settings_for(spec)
    store = store or StrategyStore()
    key = store_key(spec, settings)
    cached = _load_stored(store, key, epsilon)
    if cached is not None:
        return cached
    workload = build_workload(spec)
    root = workload_root(workload)
    n = spec.num_cells
    if on_optimize is not None:
        on_optimize(
            f"optimising the LDP strategy: n = {n}, m = {settings.rows_factor * n}, "
            f"epsilon = {epsilon:g}, up to {settings.iterations} steps"
        )
    started = time.perf_counter()
    strategy = ldp.optimize_strategy(
        root,
        epsilon=epsilon,
        rng=np.random.default_rng(settings.seed),  # public randomness: the random start
        rows=settings.rows_factor * n,
        iterations=settings.iterations,
        tolerance=settings.tolerance,
    )
    seconds = time.perf_counter() - started
    summary = summarize(root, strategy)
    record = StrategyRecord(
        mechanism="optimized",
        fingerprint=ldp.strategy_fingerprint(strategy),
        store_key=key,
        epsilon=epsilon,
        domain_size=n,
        rows=strategy.num_outputs,
        worst_variance=summary.worst_variance,
        average_variance=summary.average_variance,
        lower_bound=ldp.lower_bound(root, epsilon=epsilon),
        baselines=evaluate_baselines(spec, root),
        settings=settings.key(),
        workload_fingerprint=spec.workload_fingerprint(),
        spec_fingerprint=spec.fingerprint(),
        num_queries=workload.num_queries,
        seconds=seconds,
    )
    store.put_arrays(key, {"Q": np.asarray(strategy.Q)})
    store.put(key, record.to_json())  # written last: a record never points at missing arrays
    return strategy, record


def _load_stored(
    store: StrategyStore, key: str, epsilon: float
) -> tuple[LDPStrategy, StrategyRecord] | None:
    entry = store.get(key)
    arrays = store.get_arrays(key)
    if entry is None or arrays is None or "Q" not in arrays:
        return None
    try:
        record = StrategyRecord.from_json(dict(entry["parameters"]))
        strategy = LDPStrategy(name=record.mechanism, Q=arrays["Q"], epsilon=epsilon)
    except (KeyError, TypeError, ValueError):
        return None  # an unreadable or non-LDP entry is recomputed, never used
    if ldp.strategy_fingerprint(strategy) != record.fingerprint:
        return None
    return strategy, record


# --- the published artifact -----------------------------------------------------------------------


def default_strategy_dir(spec: ReleaseSpec) -> Path:
    return Path("ldp-strategies") / spec.name


def write_strategy_artifact(
    strategy: LDPStrategy, record: StrategyRecord, directory: Path
) -> tuple[Path, Path]:
    """Publish ``strategy.npy`` (Q, float64, ``m x n``) and ``strategy.json`` (the record)."""
    directory.mkdir(parents=True, exist_ok=True)
    array_path = directory / STRATEGY_ARRAY
    json_path = directory / STRATEGY_JSON
    np.save(array_path, np.asarray(strategy.Q), allow_pickle=False)
    json_path.write_text(json.dumps(record.to_json(), indent=2, sort_keys=True) + "\n")
    return array_path, json_path


def read_strategy_artifact(directory: Path) -> tuple[LDPStrategy, StrategyRecord]:
    """Read and check a published strategy: ε-LDP (exactly) and its fingerprint matches the JSON."""
    array_path = Path(directory) / STRATEGY_ARRAY
    json_path = Path(directory) / STRATEGY_JSON
    try:
        record = StrategyRecord.from_json(json.loads(json_path.read_text()))
        matrix = np.load(array_path, allow_pickle=False)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise DataError(
            f"cannot read the LDP strategy in {str(directory)!r} ({STRATEGY_ARRAY} and "
            f"{STRATEGY_JSON} from `dprelease ldp strategy`): {exc}"
        ) from None
    try:
        strategy = LDPStrategy(name=record.mechanism, Q=matrix, epsilon=record.epsilon)
    except ValueError as exc:
        raise DataError(f"{array_path} is not an epsilon-LDP strategy: {exc}") from None
    fingerprint = ldp.strategy_fingerprint(strategy)
    if fingerprint != record.fingerprint:
        raise DataError(
            f"{array_path} has fingerprint {fingerprint[:16]}…, but {json_path.name} says "
            f"{record.fingerprint[:16]}…; the artifact was modified"
        )
    return strategy, record


def check_strategy_fits(spec: ReleaseSpec, strategy: LDPStrategy) -> None:
    """The strategy must randomise this spec's cells at this spec's per-user ε."""
    epsilon = require_local(spec)
    if strategy.domain_size != spec.num_cells:
        raise DataError(
            f"the strategy has {strategy.domain_size} columns but the spec's domain has "
            f"{spec.num_cells} cells; it was optimised for another domain"
        )
    if strategy.epsilon != epsilon:
        raise DataError(
            f"the strategy is {strategy.epsilon}-LDP but the spec asks for epsilon {epsilon} per user"
        )


# --- client side: simulation ----------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class SimulationSummary:
    """What ``dprelease ldp simulate`` wrote (public)."""

    output: str
    num_responses: int
    dropped_rows: int
    strategy_fingerprint: str


def encode_items(spec: ReleaseSpec, source: str) -> tuple[np.ndarray, int]:
    """Cell index (row-major over the spec's domain) of every row of a Parquet of true items, and
    the number of rows dropped (``on_out_of_domain: drop``).  Same encoding as central releases.

    Privacy: reads true items; for simulation and tests only (real items never leave a device).
    """
    files = resolve_source(source)
    dataset = open_dataset(files, spec)
    check_schema(dataset, spec)
    try:
        table = dataset.to_table(columns=list(spec.domain))
    except (pa.ArrowException, OSError) as exc:
        raise DataError(f"cannot read {source!r} as Parquet: {exc}") from None
    if table.num_rows == 0:
        raise DataError(f"input {source!r} has no rows")
    valid = np.ones(table.num_rows, dtype=bool)
    per_attribute = []
    for name, attribute in spec.domain.items():
        column = table[name]
        if pa.types.is_dictionary(column.type):
            column = column.cast(column.type.value_type)
        distinct = pc.unique(column).drop_null()  # O(rows), Arrow compute
        position = pc.index_in(column, value_set=distinct)  # null for null rows
        missing = position.is_null().to_numpy(zero_copy_only=False)
        cell_of_distinct, in_domain = attribute.encode(distinct.to_numpy(zero_copy_only=False))
        safe = position.fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64)
        row_valid = ~missing & in_domain[safe] if len(distinct) else ~missing
        if spec.on_out_of_domain == "error" and not row_valid.all():
            bad = int((~row_valid).sum())
            raise DataError(
                f"column {name!r} has {bad} row(s) that are null or outside the public domain "
                "(fix the data, or set on_out_of_domain: drop)"
            )
        valid &= row_valid
        per_attribute.append(cell_of_distinct[safe] if len(distinct) else safe)
    items = np.ravel_multi_index(tuple(ix[valid] for ix in per_attribute), spec.domain_shape)
    return items.astype(np.int64), int((~valid).sum())


def write_responses(path: Path, responses: np.ndarray, strategy: LDPStrategy) -> None:
    """A responses Parquet: one int64 ``response`` per user; the strategy fingerprint and ε in the
    schema metadata (a collector may instead add a ``strategy_fingerprint`` column)."""
    metadata = {
        FINGERPRINT_METADATA_KEY: ldp.strategy_fingerprint(strategy).encode(),
        EPSILON_METADATA_KEY: repr(strategy.epsilon).encode(),
    }
    table = pa.table({RESPONSE_COLUMN: pa.array(responses, pa.int64())})
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table.replace_schema_metadata(metadata), path)


def simulate(
    spec: ReleaseSpec,
    strategy: LDPStrategy,
    *,
    input_path: str,
    output_path: Path,
    rng: np.random.Generator,
) -> SimulationSummary:
    """Randomise every row of a Parquet of true items with ``mechanisms.ldp.randomize``.

    Privacy: ``rng`` plays the part of each device's randomness.  A seeded generator is for
    simulation only; real clients draw from OS entropy and never share or log a seed.
    """
    check_strategy_fits(spec, strategy)
    items, dropped = encode_items(spec, input_path)
    responses = ldp.randomize(items, strategy, rng=rng)
    write_responses(output_path, responses, strategy)
    return SimulationSummary(
        output=str(output_path),
        num_responses=int(responses.size),
        dropped_rows=dropped,
        strategy_fingerprint=ldp.strategy_fingerprint(strategy),
    )


# --- server side: ingest --------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class IngestedResponses:
    """The response counts ``y`` of one collection and public facts about its files."""

    counts: np.ndarray
    num_responses: int
    responses_fingerprint: str
    files: tuple[str, ...]
    strategy_fingerprint: str


def responses_fingerprint(source: str) -> SourceFiles:
    """The responses files and the sha256 of their contents (reads no rows)."""
    return resolve_source(source)


def ingest_responses(source: str, strategy: LDPStrategy) -> IngestedResponses:
    """Validate every responses file and count the responses into ``y`` (length ``m``).

    Each file must be Parquet with an integer ``response`` column without nulls, every index in
    ``[0, m)``, and carry the fingerprint of ``strategy`` (schema metadata
    ``dprelease.ldp.strategy_fingerprint``, or a ``strategy_fingerprint`` column with that single
    value).  Violations raise :class:`DataError` naming the file, the value and the rule.
    """
    files = responses_fingerprint(source)
    expected = ldp.strategy_fingerprint(strategy)
    m = strategy.num_outputs
    counts = np.zeros(m, dtype=np.int64)
    for name in files.files:
        counts += _count_file(name, expected=expected, num_outputs=m)  # O(rows)
    total = int(counts.sum())
    if total < 2:
        raise DataError(
            f"the responses in {source!r} hold {total} response(s); an estimate needs at least 2"
        )
    return IngestedResponses(
        counts=counts,
        num_responses=total,
        responses_fingerprint=files.fingerprint,
        files=files.files,
        strategy_fingerprint=expected,
    )


def _count_file(name: str, *, expected: str, num_outputs: int) -> np.ndarray:
    label = Path(name).name
    try:
        parquet = pq.ParquetFile(name)
        schema = parquet.schema_arrow
    except (pa.ArrowException, OSError) as exc:
        raise DataError(f"responses file {label!r} is not a readable Parquet file: {exc}") from None
    if RESPONSE_COLUMN not in schema.names:
        raise DataError(
            f"responses file {label!r} has no {RESPONSE_COLUMN!r} column (it has {schema.names}); "
            "every row must be one user's response index"
        )
    column_type = schema.field(RESPONSE_COLUMN).type
    if not pa.types.is_integer(column_type):
        raise DataError(
            f"column {RESPONSE_COLUMN!r} in {label!r} has type {column_type}; response indices "
            "must be integers"
        )
    columns = [RESPONSE_COLUMN]
    declared = (schema.metadata or {}).get(FINGERPRINT_METADATA_KEY)
    if declared is None:
        if FINGERPRINT_COLUMN not in schema.names:
            raise DataError(
                f"responses file {label!r} carries no strategy fingerprint (schema metadata "
                f"{FINGERPRINT_METADATA_KEY.decode()!r} or a {FINGERPRINT_COLUMN!r} column); "
                "responses of an unknown strategy cannot be estimated"
            )
        columns.append(FINGERPRINT_COLUMN)
    try:
        table = parquet.read(columns=columns)
    except (pa.ArrowException, OSError) as exc:
        raise DataError(f"cannot read responses file {label!r}: {exc}") from None
    found = (
        [declared.decode(errors="replace")]
        if declared is not None
        else [str(v) for v in pc.unique(table[FINGERPRINT_COLUMN]).to_pylist()]
    )
    if found != [expected]:
        raise DataError(
            f"responses file {label!r} was randomised with strategy fingerprint(s) "
            f"{[f[:16] + '…' for f in found]}, but this release's strategy is {expected[:16]}…; "
            "responses must come from the published strategy of this spec"
        )
    responses = table[RESPONSE_COLUMN]
    if responses.null_count:
        raise DataError(
            f"column {RESPONSE_COLUMN!r} in {label!r} has {responses.null_count} null value(s); "
            "every row must hold one response index"
        )
    values = responses.to_numpy(zero_copy_only=False).astype(np.int64, copy=False)
    if values.size == 0:
        return np.zeros(num_outputs, dtype=np.int64)
    outside = int(((values < 0) | (values >= num_outputs)).sum())
    if outside:
        raise DataError(
            f"column {RESPONSE_COLUMN!r} in {label!r} has {outside} value(s) outside [0, "
            f"{num_outputs}) (min {int(values.min())}, max {int(values.max())}); the strategy has "
            f"{num_outputs} outputs"
        )
    return np.bincount(values, minlength=num_outputs)


# --- ledger: one charge per collection ------------------------------------------------------------

_collections_metadata = sa.MetaData()
ldp_collections = sa.Table(
    "ldp_collections",
    _collections_metadata,
    sa.Column("collection_key", sa.String(64), primary_key=True),
    sa.Column("dataset_id", sa.String(64), nullable=False),
    sa.Column("strategy_fingerprint", sa.String(64), nullable=False),
    sa.Column("responses_fingerprint", sa.String(64), nullable=False),
    sa.Column("epsilon", sa.Float, nullable=False),
    sa.Column("num_responses", sa.Integer, nullable=False),
    sa.Column("receipt_id", sa.String(64), nullable=False),
    sa.Column("release_id", sa.String(128), nullable=False),
    sa.Column("created_at", sa.String(40), nullable=False),
)


def collection_key(dataset_id: str, strategy_fingerprint: str, responses_fp: str) -> str:
    raw = json.dumps(["ldp-collection", dataset_id, strategy_fingerprint, responses_fp])
    return hashlib.sha256(raw.encode()).hexdigest()


def collection_cost(spec: ReleaseSpec) -> PrivacyCost:
    """What one collection costs each user: the per-user ε (pure; one response per user)."""
    return PrivacyCost(measure="pure", epsilon=require_local(spec))


def collection_label(spec: ReleaseSpec, key: str) -> str:
    return f"{spec.name}: {COLLECTION_LABEL} [collection {key[:32]}]"


@dataclass(frozen=True, kw_only=True)
class CollectionCharge:
    """The ledger receipt that paid for a collection (possibly in an earlier release)."""

    collection_key: str
    receipt_id: str
    paid_by_release: str
    cost: dict[str, float]
    reused: bool


class CollectionRegistry:
    """``ldp_collections`` in the catalog database: which collection was paid by which receipt."""

    def __init__(self, catalog: Catalog) -> None:
        self.catalog = catalog
        _collections_metadata.create_all(catalog.engine)

    def get(self, key: str) -> dict[str, Any] | None:
        with self.catalog.engine.connect() as conn:
            row = conn.execute(
                sa.select(ldp_collections).where(ldp_collections.c.collection_key == key)
            ).first()
        return None if row is None else dict(row._asdict())

    def record(self, **values: Any) -> None:
        try:
            with self.catalog.engine.begin() as conn:
                conn.execute(ldp_collections.insert().values(created_at=now(), **values))
        except sa.exc.IntegrityError:
            pass  # a concurrent release recorded the same collection first (both charged: safe)

    def for_dataset(self, dataset_id: str) -> list[dict[str, Any]]:
        with self.catalog.engine.connect() as conn:
            rows = conn.execute(
                sa.select(ldp_collections)
                .where(ldp_collections.c.dataset_id == dataset_id)
                .order_by(ldp_collections.c.created_at)
            ).all()
        return [dict(row._asdict()) for row in rows]


def _find_charge(catalog: Catalog, spec: ReleaseSpec, key: str) -> CollectionCharge | None:
    """An earlier charge of this collection: the registry, else its ledger label (a crash between
    the charge and the registry insert leaves only the label)."""
    registry = CollectionRegistry(catalog)
    found = registry.get(key)
    if found is not None:
        return CollectionCharge(
            collection_key=key,
            receipt_id=found["receipt_id"],
            paid_by_release=found["release_id"],
            cost=PrivacyCost(measure="pure", epsilon=found["epsilon"]).as_dict(),
            reused=True,
        )
    marker = f"[collection {key[:32]}]"
    for entry in catalog.ledger_entries(spec.dataset.id):
        if entry.label.endswith(marker):
            return CollectionCharge(
                collection_key=key,
                receipt_id=entry.receipt_id,
                paid_by_release=entry.release_id,
                cost=entry.cost.as_dict(),
                reused=True,
            )
    return None


def register(
    spec: ReleaseSpec,
    catalog: Catalog,
    *,
    release_id: str,
    strategy_fingerprint: str,
) -> PrivacyCost:
    """Register the dataset, refuse an over-budget collection before any response is read, record
    the release (status ``measuring``); return the budget spent before this release.

    The responses files are hashed (not parsed) to tell a new collection from a re-release.
    """
    if spec.dataset.source is None:
        raise DataError(
            "dataset.source is not set in the spec; a local-model release needs the responses"
        )
    catalog.ensure_dataset(spec.dataset.id, cap=spec.dataset.budget_cap())
    files = responses_fingerprint(spec.dataset.source)
    key = collection_key(spec.dataset.id, strategy_fingerprint, files.fingerprint)
    if _find_charge(catalog, spec, key) is None:
        catalog.check_budget(spec.dataset.id, collection_cost(spec))  # before any row is read
    before = catalog.spent(spec.dataset.id)
    catalog.create_release(
        release_id=release_id,
        name=spec.name,
        dataset_id=spec.dataset.id,
        spec_fingerprint=spec.fingerprint(),
        mechanism=MECHANISM_NAME,
    )
    return before


def charge_collection(
    spec: ReleaseSpec, catalog: Catalog, ingested: IngestedResponses, *, release_id: str
) -> CollectionCharge:
    """Charge the per-user ε once per (dataset, strategy, responses content); reuse otherwise.

    Privacy: the responses are ε-LDP when they arrive; this records their cost on the dataset's
    ledger (atomically checked against the cap).  Estimating an already charged collection again
    is post-processing and is not charged.  Two releases racing on one new collection may both
    charge it (conservative, never under-counted).
    """
    key = collection_key(
        spec.dataset.id, ingested.strategy_fingerprint, ingested.responses_fingerprint
    )
    catalog.update_release(release_id, input_fingerprint=ingested.responses_fingerprint)
    existing = _find_charge(catalog, spec, key)
    if existing is not None:
        CollectionRegistry(catalog).record(
            collection_key=key,
            dataset_id=spec.dataset.id,
            strategy_fingerprint=ingested.strategy_fingerprint,
            responses_fingerprint=ingested.responses_fingerprint,
            epsilon=existing.cost.get("epsilon", 0.0),
            num_responses=ingested.num_responses,
            receipt_id=existing.receipt_id,
            release_id=existing.paid_by_release,
        )
        return existing
    cost = collection_cost(spec)
    receipt_id = catalog.charge(
        spec.dataset.id, cost, release_id=release_id, label=collection_label(spec, key)
    )
    CollectionRegistry(catalog).record(
        collection_key=key,
        dataset_id=spec.dataset.id,
        strategy_fingerprint=ingested.strategy_fingerprint,
        responses_fingerprint=ingested.responses_fingerprint,
        epsilon=cost.epsilon,
        num_responses=ingested.num_responses,
        receipt_id=receipt_id,
        release_id=release_id,
    )
    return CollectionCharge(
        collection_key=key,
        receipt_id=receipt_id,
        paid_by_release=release_id,
        cost=cost.as_dict(),
        reused=False,
    )


# --- estimation and tables ------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class ItemEstimate:
    """One item's answers ``V y`` and their variance estimate (public: post-processing)."""

    answers: np.ndarray
    variance: np.ndarray


def least_squares_operator(strategy: LDPStrategy) -> np.ndarray:
    """``B = (Qᵀ D⁻¹ Q)⁺ Qᵀ D⁻¹`` (``n x m``), so that Thm 3.10's ``V = W B`` for every W in the
    row space of Q.  Needs Q of full column rank (every optimised strategy has it)."""
    return ldp.reconstruction(np.eye(strategy.domain_size), strategy)  # O(m n^2 + n^3)


def estimate_item(
    item: WorkloadItem, strategy: LDPStrategy, operator: np.ndarray, counts: np.ndarray
) -> ItemEstimate:
    """``ldp.estimate`` on the item's rows of ``V = W_item B``, formed a chunk of rows at a time.

    Cost ``O(p n m)`` for the item's ``p`` queries; memory ``V_CHUNK_ENTRIES`` floats.
    """
    n = strategy.domain_size
    if item.num_queries * n > MAX_TABLE_ENTRIES:
        raise SpecError(
            f"workload item {item.name!r} has {item.num_queries:,} queries over {n:,} cells; a "
            f"local-model release forms at most {MAX_TABLE_ENTRIES:,} query × cell entries per item"
        )
    rows = kron_dense(item.factors)  # O(p n)
    chunk = max(1, V_CHUNK_ENTRIES // max(strategy.num_outputs, 1))
    answers, variances = [], []
    for start in range(0, rows.shape[0], chunk):
        result = ldp.estimate(counts, rows[start : start + chunk] @ operator)  # O(chunk n m)
        answers.append(result.answers)
        variances.append(result.variance)
    return ItemEstimate(answers=np.concatenate(answers), variance=np.concatenate(variances))


def rounding_floor(item_answers: np.ndarray, num_responses: int, num_outputs: int) -> np.ndarray:
    """Floating-point error bound of ``V y``: ``m ε_mach (|answer| + N)``.

    A query the responses determine exactly (the total N, public in the local model) has zero
    sampling variance; its reported ``std_error`` is this rounding bound, so it stays > 0 as
    output validation requires.
    """
    return num_outputs * np.finfo(np.float64).eps * (np.abs(item_answers) + num_responses)


def estimate_tables(
    spec: ReleaseSpec, strategy: LDPStrategy, ingested: IngestedResponses
) -> dict[str, pa.Table]:
    """Every item's table: ``estimate`` = ``V y`` and ``std_error`` from the variance estimate
    ``N/(N-1)·[(V∘V) y − (V y)²/N]`` (``mechanisms.ldp.estimate``), with V of Thm 3.10.

    Privacy: post-processing of ε-LDP responses.
    """
    check_strategy_fits(spec, strategy)
    workload = build_workload(spec)
    operator = least_squares_operator(strategy)
    tables = {}
    for item in workload.items:
        result = estimate_item(item, strategy, operator, ingested.counts)
        floor = rounding_floor(result.answers, ingested.num_responses, strategy.num_outputs)
        tables[item.name] = build_table(
            spec,
            item,
            estimates=result.answers,
            unit_variances=np.maximum(result.variance, floor**2),
            noise_variance=1.0,
            nonnegative=spec.postprocess.nonnegative,
        )
    return tables


# --- validation and staging -----------------------------------------------------------------------


def release_directory(out_dir: str | Path, release_id: str) -> Path:
    return Path(out_dir).resolve() / release_id


def validate(spec: ReleaseSpec, tables: dict[str, pa.Table], *, directory: Path) -> dict[str, Any]:
    """Write the tables and run the central pipeline's output expectations on them."""
    for name, table in tables.items():
        artifacts.write_table(directory, name, table)
    expected_rows = {item.name: item.num_queries for item in build_workload(spec).items}
    return validate_tables(tables, expected_rows=expected_rows, directory=directory / "validation")


def _plan_json(record: StrategyRecord, num_responses: int, num_queries: int) -> dict[str, Any]:
    """The report's "mechanism and expected error" section for a local-model release: every
    candidate's worst-case RMSE per query at the observed number of responses."""

    def rmse(per_user: float) -> float:
        return math.sqrt(max(per_user, 0.0) * num_responses / num_queries)

    candidates = [
        {
            "mechanism": "optimized",
            "rmse": rmse(record.worst_variance),
            "total_variance": record.worst_variance * num_responses,
            "seconds": record.seconds,
            "note": f"{record.rows} outputs; worst case over the data",
        }
    ] + [
        {
            "mechanism": name,
            "rmse": rmse(b.worst_variance),
            "total_variance": b.worst_variance * num_responses,
            "seconds": 0.0,
            "note": f"{b.rows} outputs; baseline",
        }
        for name, b in record.baselines.items()
    ]
    return {
        "chosen": "optimized",
        "reason": (
            "workload factorization strategy optimised for this workload (McKenna et al. 2020, "
            "Problem 3.12); estimates with the reconstruction of Thm 3.10"
        ),
        "candidates": candidates,
        "lower_bound_rmse": rmse(record.lower_bound) if record.lower_bound > 0 else None,
        "lower_bound_note": "worst case over all epsilon-LDP factorization mechanisms (Cor 5.7)",
        "num_queries": num_queries,
        "model": "local",
    }


def stage(
    *,
    spec: ReleaseSpec,
    record: StrategyRecord,
    release_id: str,
    directory: Path,
    ingested: IngestedResponses,
    charge: CollectionCharge,
    tables: dict[str, pa.Table],
    validation: dict[str, Any],
    spent_before: PrivacyCost,
    catalog: Catalog,
) -> StagedRelease:
    """Manifest, report and catalog status ``staged`` (the central pipeline's artifacts, so
    ``dprelease review`` and ``dprelease verify`` work unchanged)."""
    if not validation["success"]:
        catalog.update_release(release_id, status="failed", directory=str(directory))
        raise ValidationFailedError(
            f"release {release_id} failed output validation; see {directory / 'validation'} "
            "(a charged collection stays charged)"
        )
    cap = catalog.cap(spec.dataset.id)
    after = catalog.spent(spec.dataset.id)
    receipts = [
        {
            "receipt_id": entry.receipt_id,
            "label": entry.label,
            "cost": entry.cost.as_dict(),
            "paid_by_release": entry.release_id,
        }
        for entry in catalog.ledger_entries(spec.dataset.id)
        if entry.receipt_id == charge.receipt_id
    ]
    charged = PrivacyCost.zero("pure") if charge.reused else collection_cost(spec)
    num_queries = sum(table.num_rows for table in tables.values())
    manifest: dict[str, Any] = {
        "release_id": release_id,
        "name": spec.name,
        "dataset_id": spec.dataset.id,
        "created_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "spec": spec.model_dump(mode="json"),
        "spec_fingerprint": spec.fingerprint(),
        "workload_fingerprint": spec.workload_fingerprint(),
        "input_fingerprint": ingested.responses_fingerprint,
        "input_files": [Path(f).name for f in ingested.files],
        "code_version": artifacts.code_version(),
        "privacy_unit": "one user, one randomised response (local model)",
        "mechanism": {
            "name": MECHANISM_NAME,
            "reason": "local model: users randomised their items with the published strategy",
            "parameters": {"strategy_fingerprint": record.fingerprint, "rows": record.rows},
            "noise": {
                "kind": "client-side epsilon-LDP randomiser",
                "scale": record.epsilon,
                "sensitivity": 1.0,
                "size": ingested.num_responses,
                "sampler": "on users' devices (mechanisms.ldp.randomize, OS entropy)",
            },
        },
        "privacy": {
            "requested": dict(spec.privacy),
            "charged": charged.as_dict(),
            "receipts_in_budget_measure": [r["cost"] for r in receipts],
            "model": "local: epsilon per user, charged once per collection",
        },
        "budget": {
            "cap": cap.as_dict(),
            "before": spent_before.as_dict(),
            "after": after.as_dict(),
            "remaining": after.remaining(cap).as_dict(),
        },
        "ledger_receipts": receipts,
        "plan": _plan_json(record, ingested.num_responses, num_queries),
        "tables": list(tables),
        "validation": {"success": validation["success"], "results": "validation/results.json"},
        "review": {"status": "staged", "trail": []},
        "ldp": {
            "epsilon_per_user": record.epsilon,
            "num_responses": ingested.num_responses,
            "strategy_fingerprint": record.fingerprint,
            "strategy_store_key": record.store_key,
            "strategy_rows": record.rows,
            "domain_size": record.domain_size,
            "promised_worst_variance_per_user": record.worst_variance,
            "promised_average_variance_per_user": record.average_variance,
            "lower_bound_per_user": record.lower_bound,
            "baselines": {name: b.to_json() for name, b in record.baselines.items()},
            "collection_key": charge.collection_key,
            "collection_receipt": charge.receipt_id,
            "collection_reused": charge.reused,
            "std_error": "sqrt of N/(N-1)[(V∘V)y - (Vy)^2/N], V of Thm 3.10",
        },
    }
    write_report(directory, manifest, catalog)
    digest = artifacts.write_manifest(directory, manifest)
    catalog.update_release(
        release_id, status="staged", directory=str(directory), manifest_sha256=digest
    )
    return StagedRelease(
        release_id=release_id,
        directory=str(directory),
        mechanism=MECHANISM_NAME,
        charged=charged.as_dict(),
        validation_success=True,
    )


def mark_failed(catalog: Catalog, release_id: str, directory: Path) -> None:
    """A release that stopped before staging is ``failed`` (its charge, if any, stays)."""
    if catalog.release(release_id).status == "measuring":
        catalog.update_release(
            release_id, status="failed", directory=str(directory) if directory.exists() else None
        )


__all__ = [
    "COLLECTION_LABEL",
    "CollectionCharge",
    "CollectionRegistry",
    "IngestedResponses",
    "OptimizerSettings",
    "SimulationSummary",
    "StrategyRecord",
    "VarianceSummary",
    "baseline_strategies",
    "charge_collection",
    "ensure_strategy",
    "estimate_tables",
    "ingest_responses",
    "read_strategy_artifact",
    "register",
    "settings_for",
    "simulate",
    "stage",
    "validate",
    "write_strategy_artifact",
]
