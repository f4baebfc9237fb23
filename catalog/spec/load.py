"""From a YAML file to a validated spec, and the size checks that refuse, from the spec alone, a
release this machine cannot run."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from dprelease.catalog.errors import SpecError
from dprelease.catalog.spec.domain import error_message
from dprelease.catalog.spec.limits import (
    MAX_PLAN_CELLS,
    MAX_RELEASE_CELLS,
    MAX_RELEASE_QUERIES,
    MAX_SPEC_BYTES,
    MAX_SPEC_DEPTH,
)
from dprelease.catalog.spec.model import ReleaseSpec, item_num_queries
from dprelease.mechanisms import registry
from dprelease.mechanisms.primitives.workload import magnitude


def parse_spec(data: Any, *, source: str = "<spec>") -> ReleaseSpec:
    """Validate a spec mapping; raise :class:`SpecError` naming field, value and rule."""
    if not isinstance(data, dict):
        raise SpecError(
            f"{source}: a release spec must be a YAML mapping, got {type(data).__name__}"
        )
    try:
        return ReleaseSpec.model_validate(data)
    except ValidationError as exc:
        raise SpecError(f"{source}: invalid release spec:\n" + _format_errors(exc)) from None


class _SpecLoader(yaml.SafeLoader):
    """PyYAML's safe loader without anchors and aliases, and with bounded nesting.

    An alias re-uses a node, so nine nested aliases expand to 10⁹ strings ("billion laughs") while
    the file stays under 1 kB; a spec never needs them.  Refused at the first anchor or alias
    event, before anything is expanded: O(size of the file).
    """

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        event = self.peek_event()
        problem = None
        if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None) is not None:
            kind = "alias *" if isinstance(event, yaml.AliasEvent) else "anchor &"
            problem = (
                f"YAML {kind}{event.anchor} is not allowed in a release spec (anchors, aliases "
                "and merge keys are refused: write the value out)"
            )
        elif self._depth >= MAX_SPEC_DEPTH:
            problem = (
                f"YAML nesting deeper than {MAX_SPEC_DEPTH} levels is not allowed in a release spec"
            )
        if problem is not None:
            raise yaml.composer.ComposerError(None, None, problem, event.start_mark)
        self._depth += 1
        try:
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


def read_spec_yaml(path: Path) -> Any:
    """The YAML document of a spec file: at most ``MAX_SPEC_BYTES``, UTF-8, no anchors/aliases."""
    try:
        with open(path, "rb") as handle:
            raw = handle.read(MAX_SPEC_BYTES + 1)  # never more, even from a growing file or a FIFO
    except OSError as exc:
        raise SpecError(f"spec file {str(path)!r} cannot be read: {exc.strerror}") from None
    if len(raw) > MAX_SPEC_BYTES:
        raise SpecError(
            f"{path}: the spec file is larger than {MAX_SPEC_BYTES:,} bytes (1 MiB), the limit for "
            "a release spec; put large workload matrices in .npy files (workload item `matrix`)"
        )
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SpecError(
            f"{path}: not UTF-8 text (byte {exc.start}); a release spec is a UTF-8 YAML file"
        ) from None
    try:
        return yaml.load(text, Loader=_SpecLoader)  # a SafeLoader subclass
    except (yaml.YAMLError, ValueError) as exc:  # ValueError: e.g. an integer of 4300+ digits
        raise SpecError(f"{path}: not valid YAML: {exc}") from None


def load_spec(path: str | Path) -> ReleaseSpec:
    """Read and validate a YAML spec.  A relative ``dataset.source`` is resolved against the spec's folder."""
    path = Path(path)
    if not path.is_file():
        raise SpecError(f"spec file {str(path)!r} does not exist")
    spec = parse_spec(read_spec_yaml(path), source=str(path))
    items = [
        item.model_copy(update={"matrix": str((path.parent / item.matrix).resolve())})
        if item.matrix is not None and not Path(item.matrix).is_absolute()
        else item
        for item in spec.workload
    ]
    spec = spec.model_copy(update={"workload": items})
    for item in spec.workload:
        if item.matrix is not None and item.attributes is not None:
            try:
                item.load_matrix(columns=spec.domain[item.attributes[0]].size)
            except ValueError as exc:
                raise SpecError(f"{path}: invalid release spec:\n  - workload: {exc}") from None
    source = spec.dataset.source
    if source is not None and not Path(source).is_absolute():
        resolved = str((path.parent / source).resolve())
        spec = spec.model_copy(
            update={"dataset": spec.dataset.model_copy(update={"source": resolved})}
        )
    return spec


def _format_errors(exc: ValidationError) -> str:
    lines = []
    for error in exc.errors(include_url=False):
        location = ".".join(str(part) for part in error["loc"]) or "spec"
        message = error_message(error)
        value = error.get("input")
        shown = (
            "" if isinstance(value, dict | list) and len(repr(value)) > 120 else f" (got {value!r})"
        )
        lines.append(f"  - {location}: {message}{shown}")
    return "\n".join(lines)


def require_source(spec: ReleaseSpec) -> None:
    """Refuse a release whose spec names no ``dataset.source`` (``plan`` works without one)."""
    if spec.dataset.source is None:
        raise SpecError(
            "dataset.source is not set in the spec; plan works without it, run does not"
        )


def check_runnable(spec: ReleaseSpec) -> None:
    """Refuse, from the spec alone, a central release this machine cannot run; call it before any
    data is read (``plan`` does not need it: it works up to ``MAX_PLAN_CELLS``, and at any size
    for a workload of marginals, whose marginal-space reader checks its measured subsets' cells).

    Raises :class:`SpecError` naming the size and the limit: no ``dataset.source``, a cell vector of
    more than ``MAX_RELEASE_CELLS`` cells, or output tables of more than ``MAX_RELEASE_QUERIES``
    rows together.  O(attributes × workload items); reads no data.
    """
    require_source(spec)
    if spec.num_cells > MAX_RELEASE_CELLS:
        raise SpecError(
            f"domain: the domain has {magnitude(spec.num_cells)} cells "
            f"({' × '.join(map(str, spec.domain_shape))}); a release counts at most "
            f"{MAX_RELEASE_CELLS:,} cells on one machine (plan works up to {MAX_PLAN_CELLS:.0e}, "
            "any size for a workload of marginals): use wider bins or fewer attributes"
            + (
                ", or mechanism: marginal_space (it counts only its measured subsets)"
                if spec.all_marginals
                else ""
            )
        )
    _check_release_rows({item.name: item_num_queries(spec, item) for item in spec.workload})


def _check_release_rows(sizes: dict[str, int], *, lower_bound: bool = False) -> None:
    """Refuse output tables above ``MAX_RELEASE_QUERIES`` rows, naming the largest item."""
    if sum(sizes.values()) > MAX_RELEASE_QUERIES:
        largest = max(sizes, key=lambda name: sizes[name])
        raise SpecError(
            f"workload: the output tables would have {'at least ' if lower_bound else ''}"
            f"{sum(sizes.values()):,} rows (item {largest!r}: {sizes[largest]:,}); a release "
            f"writes at most {MAX_RELEASE_QUERIES:,} rows: drop or narrow the largest items"
        )


def check_runnable_before_planning(spec: ReleaseSpec) -> None:
    """Refuse, from sizes alone, a central release that every later check would refuse, before
    the (costly) plan is made: planning a 10¹⁴-cell identity workload builds dense Gram matrices
    for seconds and gigabytes only to be refused afterwards.

    Raises :class:`SpecError` (the messages of :func:`check_runnable`): no ``dataset.source``;
    output tables of plain (not derived) items above ``MAX_RELEASE_QUERIES`` rows, which every
    mechanism writes; and, for a named mechanism that counts the full cell vector, a domain above
    ``MAX_RELEASE_CELLS``.  ``auto`` may still choose a marginal-space plan, so its cell count is
    checked after planning.  O(attributes × workload items); reads no data, builds no matrix.
    """
    if spec.model != "central":
        return
    require_source(spec)
    plain = [item for item in spec.workload if item.derived_column is None]
    _check_release_rows(
        {item.name: item_num_queries(spec, item) for item in plain}, lower_bound=True
    )
    if (
        spec.mechanism != registry.AUTO
        and registry.get(spec.mechanism, model=spec.model).input_kind == "cells"
    ):
        check_runnable(spec)
