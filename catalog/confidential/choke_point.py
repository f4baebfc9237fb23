"""The one place confidential cell counts live during a run, and the only path from them to noise.

:class:`ProtectedCells` holds the true cell vector in a private attribute with no accessor.  Its
:meth:`~ProtectedCells.measure` runs in a fixed order, which is the privacy argument:

1. sensitivity of the strategy (L1 for Laplace, L2 for Gaussian) × the contribution bound;
2. noise scale and cost from one :class:`~mechanisms.primitives.noise.NoiseMechanism`;
3. the accountant charges that cost (and may refuse) — **before** the data is touched;
4. only then ``A·x`` is computed and noised by the production sampler.

The object refuses pickling and redacts its ``repr``, so it cannot reach Prefect result storage,
logs or another process by accident.  :class:`ProtectedMarginals` is the same choke point for
domains too large for a cell vector: it holds only the confidential marginal tables a plan needs
and measures in the same order.

**Sharded noise** (a cluster; the choke point stays pure and never imports one).  Either class can
be given a *shard mapper* (:meth:`~ProtectedCells.with_shard_mapper`): a callable that runs a pure
top-level function once on every item of a sequence, e.g. on cluster workers, and returns the
results in order.  The rule, enforced here and not by the mapper:

* the ledger is charged **once**, for the whole measurement, before any shard is dispatched
  (steps 1-3 above are unchanged);
* ``A·x`` is split into contiguous shards; each is noised exactly once by the vetted sampler
  (:func:`mechanisms.primitives.noise.noise_shard`) in the process that runs it, with randomness from that
  process's OS CSPRNG: no seed is shipped, none is derived from a user value, none is repeated;
* every result must come back exactly once, in order, carrying its shard's one-time token: a
  missing, foreign, duplicated or re-drawn shard is refused;
* a failed shard is **never retried with fresh noise** (its first draw may already have been
  seen): on any shard failure the whole measurement fails with :class:`ShardedNoiseError`,
  nothing is returned, and the charge stands."""

from __future__ import annotations

import math
import secrets
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol, Self, TypeVar

import numpy as np

from dprelease.mechanisms.primitives import noise
from dprelease.mechanisms.primitives.noise import (
    NoiseMechanism,
    NoiseShard,
    NoisyShard,
    calibrate,
    noise_kind_for,
)
from dprelease.mechanisms.primitives.privacy import PrivacyCost
from dprelease.mechanisms.primitives.protected import (
    Accountant,
    MarginalMeasurableStrategy,
    MeasurableStrategy,
    NoisyMeasurement,
)

T = TypeVar("T")


# 2**20 answers (8 MB of float64) per shard: a cluster task's overhead is negligible next to its
# sampling (benchmarks/noise_cluster_bench.py), and 10^7 answers already make 10 tasks to balance.
DEFAULT_SHARD_SIZE = 1 << 20


class ShardMapper(Protocol):
    """Runs ``function`` once on every shard (on cluster workers, say); results in shard order.

    A mapper must not retry or re-run a shard.  The choke point refuses any result list that is
    not exactly one result per shard, in order; a mapper that cannot deliver that raises.
    """

    def __call__(
        self, function: Callable[[NoiseShard], NoisyShard], shards: Sequence[NoiseShard], /
    ) -> Sequence[NoisyShard]: ...


class ShardFailedError(Exception):
    """Raised by a shard mapper when shard ``index`` (None: unknown) failed; ``reason`` is public
    text only (never the message of the original exception, which may quote data)."""

    def __init__(self, index: int | None, reason: str) -> None:
        super().__init__(f"shard {index}: {reason}")
        self.index = index
        self.reason = reason


class ShardedNoiseError(RuntimeError):
    """A sharded measurement failed: nothing was released and its ledger charge stands."""


class _Protected:
    """What both choke points share: the contribution bound, the one calibrate -> charge -> noise
    path, the optional shard mapper, and the refusal to be pickled."""

    _shard_mapper: ShardMapper | None = None
    _shard_size: int = DEFAULT_SHARD_SIZE
    contribution_bound: int

    def _set_bound(self, contribution_bound: int) -> None:
        if contribution_bound < 1:
            raise ValueError(f"contribution_bound ({contribution_bound}) must be >= 1")
        self.contribution_bound = int(contribution_bound)

    def with_shard_mapper(
        self, shard_mapper: ShardMapper, *, shard_size: int = DEFAULT_SHARD_SIZE
    ) -> Self:
        """The same confidential values, noised shard by shard through ``shard_mapper``."""
        if isinstance(shard_size, bool) or not isinstance(shard_size, int) or shard_size < 1:
            raise ValueError(f"shard_size ({shard_size!r}) must be an integer >= 1")
        if not callable(shard_mapper):
            raise TypeError(f"shard_mapper ({type(shard_mapper).__name__}) must be callable")
        clone = object.__new__(type(self))
        clone.__dict__.update(self.__dict__)  # shares the read-only confidential values
        clone._shard_mapper = shard_mapper
        clone._shard_size = shard_size
        return clone

    def _release(
        self,
        strategy: MeasurableStrategy | MarginalMeasurableStrategy,
        answers: Callable[[], np.ndarray],
        *,
        target: PrivacyCost,
        accountant: Accountant,
        label: str,
    ) -> NoisyMeasurement:
        """Calibrate, charge, and only then compute ``answers()`` and noise them (locally or shard
        by shard): the privacy argument's order (module docstring), for both choke points."""
        kind = noise_kind_for(target.measure)
        sensitivity = strategy.sensitivity(noise=kind) * self.contribution_bound
        mechanism = calibrate(target=target, sensitivity=sensitivity, size=strategy.num_queries)
        receipt_id = accountant.charge(mechanism.cost, label=label)  # privacy: charge before noise
        if self._shard_mapper is None:
            noisy = mechanism.apply(answers(), sampler=noise.production_sampler())
        else:
            noisy = _noise_on_shards(
                mechanism,
                answers(),
                mapper=self._shard_mapper,
                shard_size=self._shard_size,
                receipt_id=receipt_id,
            )
        return NoisyMeasurement(
            label=label,
            strategy_name=strategy.name,
            values=noisy,
            noise=mechanism,
            receipt_id=receipt_id,
        )

    def __reduce__(self) -> Any:
        raise TypeError(
            f"{type(self).__name__} holds confidential data and cannot be pickled or persisted"
        )

    __getstate__ = __reduce__


def _noise_on_shards(
    mechanism: NoiseMechanism,
    answers: np.ndarray,
    *,
    mapper: ShardMapper,
    shard_size: int,
    receipt_id: str,
) -> np.ndarray:
    """Split, dispatch once, check every result, reassemble (module docstring). O(answers)."""
    flat = np.ascontiguousarray(answers, dtype=np.float64).ravel()
    if flat.size != mechanism.size:
        raise ValueError(
            f"values has {flat.size} entries but the mechanism was calibrated for {mechanism.size}"
        )
    count = max(1, math.ceil(flat.size / shard_size))
    shards = [
        NoiseShard(
            index=index,
            count=count,
            token=secrets.token_bytes(16),
            kind=mechanism.kind,
            scale=mechanism.scale,
            values=piece,
        )
        for index, piece in enumerate(np.array_split(flat, count))
    ]
    abandoned = (
        f"the measurement is abandoned: nothing is released, its ledger charge (receipt "
        f"{receipt_id}) stands, and no shard is noised again"
    )
    try:
        results = list(mapper(noise.noise_shard, shards))
    except ShardFailedError as exc:
        which = "a noise shard" if exc.index is None else f"noise shard {exc.index}"
        raise ShardedNoiseError(f"{which} of {count} failed ({exc.reason}); {abandoned}") from None
    except Exception as exc:  # privacy: the original message is not relayed (it may quote data)
        raise ShardedNoiseError(
            f"the shard mapper failed ({type(exc).__name__}) while noising {count} shards; "
            f"{abandoned}"
        ) from None
    return _assemble(shards, results, abandoned=abandoned)


def _assemble(shards: Sequence[NoiseShard], results: list[Any], *, abandoned: str) -> np.ndarray:
    """The noisy answers, once every shard came back exactly once and in order; else refused.
    Empties ``results`` while it copies them out."""
    count = len(shards)
    index_of = {shard.token: shard.index for shard in shards}
    draws: dict[bytes, bytes] = {}
    for position, result in enumerate(results):
        if not isinstance(result, NoisyShard) or result.token not in index_of:
            raise ShardedNoiseError(
                f"shard result {position} is not a noised shard of this measurement; {abandoned}"
            )
        index = index_of[result.token]
        if result.token in draws:
            twice = "returned twice" if draws[result.token] == result.draw else "noised twice"
            raise ShardedNoiseError(f"noise shard {index} of {count} was {twice}; {abandoned}")
        draws[result.token] = result.draw
        if index != position or result.index != index:
            raise ShardedNoiseError(
                f"noise shard {index} of {count} came back at position {position} (results "
                f"must be in shard order); {abandoned}"
            )
        if np.shape(result.values) != shards[index].values.shape:
            raise ShardedNoiseError(
                f"noise shard {index} of {count} came back with shape "
                f"{np.shape(result.values)}, not {shards[index].values.shape}; {abandoned}"
            )
    if len(draws) != count:
        missing = sorted(set(range(count)) - {index_of[token] for token in draws})
        raise ShardedNoiseError(f"noise shards {missing} of {count} never came back; {abandoned}")
    noisy = np.empty(sum(shard.values.size for shard in shards))
    start = 0
    for index, shard in enumerate(shards):
        noisy[start : start + shard.values.size] = results[index].values
        results[index] = None  # each shard's copy is freed once placed: peak O(answers + shard)
        start += shard.values.size
    return noisy


class ProtectedCells(_Protected):
    """Confidential cell counts over a public domain.

    The counts have no accessor and never print:

    >>> ProtectedCells([3.0, 4.0], domain_shape=(2,), contribution_bound=1)
    ProtectedCells(domain_shape=(2,), values=<redacted>)

    Parameters
    ----------
    cells:
        The true count per cell (row-major over ``domain_shape``).
    contribution_bound:
        Most rows one privacy unit can contribute (after bounding); multiplies every sensitivity.
    """

    def __init__(
        self, cells: np.ndarray, *, domain_shape: tuple[int, ...], contribution_bound: int
    ) -> None:
        cells = np.asarray(cells, dtype=np.float64).ravel()
        if cells.size != math.prod(domain_shape):
            raise ValueError(
                f"cells has {cells.size} entries but the domain {domain_shape} has a different size"
            )
        self._set_bound(contribution_bound)
        self.__cells = cells
        self.domain_shape = tuple(domain_shape)

    def measure(
        self,
        strategy: MeasurableStrategy,
        *,
        target: PrivacyCost,
        accountant: Accountant,
        label: str,
    ) -> NoisyMeasurement:
        """Charge, then release ``A·x`` + noise calibrated to ``target`` (see module docstring)."""
        return self._release(
            strategy,
            lambda: strategy.apply(self.__cells),
            target=target,
            accountant=accountant,
            label=label,
        )

    @classmethod
    def combination(
        cls, parts: Sequence[ProtectedCells], weights: Sequence[float]
    ) -> ProtectedCells:
        """``Σ_s weights[s]·parts[s]``, still protected (one period of a series measures the
        combination its time strategy row asks for).  O(parts · cells).

        Privacy: the result keeps the parts' contribution bound, so a measurement of it is
        calibrated and charged *per unit weight*: one privacy unit in part s changes it by
        ``|weights[s]|`` times that, and the accountant given to :meth:`measure` must charge each
        part ``weights[s]²`` (zCDP) times the cost it is handed."""
        shapes = {part.domain_shape for part in parts}
        bounds = {part.contribution_bound for part in parts}
        if len(parts) != len(weights) or not parts or len(shapes) != 1 or len(bounds) != 1:
            raise ValueError(
                f"a combination needs one weight per part ({len(parts)} parts, {len(weights)} "
                "weights) and parts of one domain and contribution bound"
            )
        total = sum(float(w) * part.__cells for part, w in zip(parts, weights, strict=True))
        return cls(total, domain_shape=shapes.pop(), contribution_bound=bounds.pop())

    def select(
        self,
        selector: Callable[[np.ndarray, noise.NoiseSampler], T],
        *,
        cost: PrivacyCost,
        accountant: Accountant,
        label: str,
    ) -> tuple[T, str]:
        """Charge ``cost``, then run a private ``selector(cells, sampler)`` and return its public output.

        The selector (e.g. DAWA's private partition) must itself satisfy ``cost`` for the
        contribution bound of this session; the caller is responsible for passing the bound in.
        """
        receipt_id = accountant.charge(cost, label=label)  # privacy: charge before the selector
        return selector(self.__cells.copy(), noise.production_sampler()), receipt_id

    def __repr__(self) -> str:
        return f"ProtectedCells(domain_shape={self.domain_shape}, values=<redacted>)"


class ProtectedMarginals(_Protected):
    """Confidential marginal tables over a public domain: the counts of each attribute subset.

    The marginal-space counterpart of :class:`ProtectedCells`, for domains whose full cell vector
    is never formed.  Tables are keyed by ascending axis tuples (``()`` is the total count), held
    read-only in a private attribute with no accessor, and never print:

    >>> ProtectedMarginals({(0,): [3.0, 4.0]}, domain_shape=(2, 3), contribution_bound=1)
    ProtectedMarginals(domain_shape=(2, 3), subsets=((0,),), values=<redacted>)

    :meth:`measure` keeps :class:`ProtectedCells`' order; the answers are computed marginal by
    marginal, after the charge.

    Privacy: every table must come from the same contribution-bounded rows, so one privacy unit
    changes each table by at most ``contribution_bound`` in L1; a strategy's sensitivity (column
    norms of its stacked terms over the full domain) then bounds the change of all its answers.
    """

    def __init__(
        self,
        tables: Mapping[tuple[int, ...], Any],
        *,
        domain_shape: tuple[int, ...],
        contribution_bound: int,
    ) -> None:
        self._set_bound(contribution_bound)
        shape = tuple(int(n) for n in domain_shape)
        stored: dict[tuple[int, ...], np.ndarray] = {}
        for key, values in tables.items():
            axes = tuple(int(a) for a in key)
            if list(axes) != sorted(set(axes)) or any(not 0 <= a < len(shape) for a in axes):
                raise ValueError(
                    f"marginal key {key!r} must be strictly increasing axes in [0, {len(shape)})"
                )
            table = np.array(values, dtype=np.float64)
            sizes = tuple(shape[a] for a in axes)
            if table.size != math.prod(sizes):
                raise ValueError(
                    f"the table for axes {axes} has {table.size} entries; its marginal has "
                    f"{math.prod(sizes)} cells {sizes}"
                )
            table = table.reshape(sizes)
            table.setflags(write=False)
            stored[axes] = table
        self.__tables = stored
        self.domain_shape = shape

    @classmethod
    def combination(
        cls, parts: Sequence[ProtectedMarginals], weights: Sequence[float]
    ) -> ProtectedMarginals:
        """``Σ_s weights[s]·parts[s]`` table by table, still protected; the privacy obligation of
        :meth:`ProtectedCells.combination` holds (charges per unit weight).  O(parts · cells)."""
        subsets = {part.subsets for part in parts}
        shapes = {part.domain_shape for part in parts}
        bounds = {part.contribution_bound for part in parts}
        if len(parts) != len(weights) or not parts or len(subsets) != 1:
            raise ValueError(
                f"a combination needs one weight per part ({len(parts)} parts, {len(weights)} "
                "weights) and parts holding the same marginals"
            )
        if len(shapes) != 1 or len(bounds) != 1:
            raise ValueError("a combination needs parts of one domain and contribution bound")
        tables = {
            axes: sum(
                float(w) * part.__tables[axes] for part, w in zip(parts, weights, strict=True)
            )
            for axes in subsets.pop()
        }
        return cls(tables, domain_shape=shapes.pop(), contribution_bound=bounds.pop())

    @property
    def subsets(self) -> tuple[tuple[int, ...], ...]:
        """The attribute subsets held (public: they come from the plan)."""
        return tuple(self.__tables)

    def measure(
        self,
        strategy: MarginalMeasurableStrategy,
        *,
        target: PrivacyCost,
        accountant: Accountant,
        label: str,
    ) -> NoisyMeasurement:
        """Charge, then release the strategy's answers + noise calibrated to ``target``.

        A strategy that reads a marginal not held here is refused before anything is charged.
        Cost: O(Σ marginal sizes) for the answers, plus the sampler's O(answers).
        """
        missing = [axes for axes in strategy.marginal_subsets if axes not in self.__tables]
        if missing:
            raise ValueError(
                f"strategy {strategy.name!r} reads marginals {missing} that were not counted"
            )
        tables = self.__tables
        return self._release(
            strategy,
            lambda: np.concatenate(
                [
                    np.ravel(strategy.term_answers(axes, tables[axes]))
                    for axes in strategy.marginal_subsets
                ]
            ),
            target=target,
            accountant=accountant,
            label=label,
        )

    def __repr__(self) -> str:
        return (
            f"ProtectedMarginals(domain_shape={self.domain_shape}, subsets={self.subsets}, "
            "values=<redacted>)"
        )
