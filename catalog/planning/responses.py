"""The public side of local-model collections (``model: local``): the published strategy.

In the local model every user randomises their own item on their device with the published
strategy and sends one response index; ``dataset.source`` holds the responses.
:func:`plan_strategy`, :func:`write_strategy_artifact` and :func:`read_strategy_artifact` make the
public artifact of ``dprelease ldp strategy`` (``strategy.npy`` + ``strategy.json``), the same
strategy ``dprelease run`` plans (one strategy store, one key).  Reading response files and
simulating clients is :mod:`catalog.confidential.responses`."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from dprelease.catalog.errors import DataError, SpecError
from dprelease.catalog.planning.planner import make_plan
from dprelease.catalog.planning.strategy_store import StrategyStore
from dprelease.catalog.spec.model import ReleaseSpec
from dprelease.mechanisms import registry
from dprelease.mechanisms.local import randomizer
from dprelease.mechanisms.primitives.protocol import StoredStrategy, StrategyCache

STRATEGY_ARRAY = "strategy.npy"
STRATEGY_JSON = "strategy.json"
PRIVACY_UNIT = "one user, one randomised response (local model)"


class PublishedStrategy(Protocol):
    """What this module needs of a local-model strategy (the planned one, or a published one)."""

    name: str
    randomiser: randomizer.LDPStrategy
    parameters: Mapping[str, Any]

    @property
    def fingerprint(self) -> str: ...

    @property
    def epsilon(self) -> float: ...

    def stored(self) -> StoredStrategy: ...

    def response_counts(self, counts: np.ndarray) -> Any:
        """The mechanism's measurement input from the counts per response index."""


def require_local(spec: ReleaseSpec) -> None:
    if spec.model != "local":
        raise SpecError(
            f"spec {spec.name!r} has model {spec.model!r}; the LDP pipeline needs model: local"
        )


def plan_strategy(
    spec: ReleaseSpec,
    *,
    cache: StrategyCache | None = None,
    progress: Callable[[str], None] | None = None,
) -> PublishedStrategy:
    """The spec's strategy exactly as ``dprelease run`` plans it (data-free; the strategy store
    keeps it, so a later run or another process reuses it)."""
    require_local(spec)
    plan = make_plan(spec, cache=cache if cache is not None else StrategyStore(), progress=progress)
    return plan.strategy


def default_strategy_dir(spec: ReleaseSpec) -> Path:
    return Path("ldp-strategies") / spec.name


def strategy_summary(strategy: PublishedStrategy) -> dict[str, Any]:
    """The ``dprelease ldp strategy --json`` object (variances per user, N = 1)."""
    record = strategy.parameters
    return {
        "mechanism": strategy.name,
        "worst_variance": record["worst_variance"],
        "average_variance": record["average_variance"],
        "baselines": {
            name: {"worst_variance": b["worst_variance"], "average_variance": b["average_variance"]}
            for name, b in record["baselines"].items()
        },
    }


def write_strategy_artifact(
    spec: ReleaseSpec, strategy: PublishedStrategy, directory: Path
) -> tuple[Path, Path]:
    """Publish ``strategy.npy`` (Q, float64, ``m x n``) and ``strategy.json`` (its record)."""
    directory.mkdir(parents=True, exist_ok=True)
    array_path = directory / STRATEGY_ARRAY
    json_path = directory / STRATEGY_JSON
    stored = strategy.stored()
    np.save(array_path, stored.arrays["Q"], allow_pickle=False)
    record = {**stored.parameters, "spec_name": spec.name, "spec_fingerprint": spec.fingerprint()}
    json_path.write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
    return array_path, json_path


def read_strategy_artifact(directory: Path) -> PublishedStrategy:
    """Read and check a published strategy: ε-LDP (exactly) and its fingerprint matches the JSON."""
    array_path = Path(directory) / STRATEGY_ARRAY
    json_path = Path(directory) / STRATEGY_JSON
    try:
        record = json.loads(json_path.read_text())
        matrix = np.load(array_path, allow_pickle=False)
        mechanism = registry.get(str(record["mechanism"]), model=str(record["model"]))
        restore = mechanism.restore  # type: ignore[attr-defined]
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise DataError(
            f"cannot read the LDP strategy in {str(directory)!r} ({STRATEGY_ARRAY} and "
            f"{STRATEGY_JSON} from `dprelease ldp strategy`): {exc}"
        ) from None
    try:
        return restore(StoredStrategy(parameters=record, arrays={"Q": matrix}))
    except (TypeError, ValueError) as exc:
        raise DataError(f"{array_path} {exc}") from None


def check_strategy_fits(spec: ReleaseSpec, strategy: PublishedStrategy) -> None:
    """The strategy must randomise this spec's cells at this spec's per-user ε."""
    require_local(spec)
    epsilon = spec.privacy_target().epsilon
    n = strategy.randomiser.domain_size
    if n != spec.num_cells:
        raise DataError(
            f"the strategy has {n} columns but the spec's domain has {spec.num_cells} cells; it "
            "was optimised for another domain"
        )
    if strategy.epsilon != epsilon:
        raise DataError(
            f"the strategy is {strategy.epsilon}-LDP but the spec asks for epsilon {epsilon} per user"
        )
