"""The one registry of mechanisms: the pipeline plans, measures and reports by iterating over it.

Adding a mechanism = one module that defines a class following
:class:`mechanisms.primitives.protocol.Mechanism` and a ``MECHANISM`` instance, plus one line in
:data:`BUILTIN` (or a call to :func:`register`, e.g. from a plugin or a test)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from dprelease.mechanisms import (
    dawa,
    eigen,
    hierarchical,
    identity,
    local,
    lrm,
    marginal_space,
    optimized,
    wavelet,
)
from dprelease.mechanisms.primitives.protocol import Mechanism, OptionsError

AUTO = "auto"

BUILTIN: tuple[Mechanism, ...] = (
    identity.MECHANISM,
    hierarchical.MECHANISM,
    wavelet.MECHANISM,
    optimized.MECHANISM,
    marginal_space.MECHANISM,
    eigen.MECHANISM,
    lrm.MECHANISM,
    dawa.MECHANISM,
    local.MECHANISM,
)

_REGISTRY: dict[tuple[str, str], Mechanism] = {(m.model, m.name): m for m in BUILTIN}


class UnknownMechanism(ValueError):
    """A spec names a mechanism the registry does not know (for its privacy model)."""


def register(mechanism: Mechanism) -> None:
    """Add ``mechanism``; its name must be new within its privacy model."""
    key = (mechanism.model, mechanism.name)
    if key in _REGISTRY or mechanism.name == AUTO:
        raise ValueError(
            f"a {mechanism.model}-model mechanism named {mechanism.name!r} is already registered"
        )
    _REGISTRY[key] = mechanism


def unregister(mechanism: Mechanism) -> None:
    """Remove a mechanism added with :func:`register` (built-in ones stay)."""
    if mechanism in BUILTIN:
        raise ValueError(f"built-in mechanism {mechanism.name!r} cannot be unregistered")
    _REGISTRY.pop((mechanism.model, mechanism.name), None)


def mechanisms(*, model: str | None = None) -> Iterator[Mechanism]:
    return (m for m in _REGISTRY.values() if model is None or m.model == model)


def names(*, model: str | None = None) -> tuple[str, ...]:
    return tuple(dict.fromkeys(m.name for m in mechanisms(model=model)))


def get(name: str, *, model: str) -> Mechanism:
    """The mechanism called ``name`` in privacy model ``model``.

    >>> get("hierarchical", model="central").options.parse({"branching": 4})
    TreeOptions(branching=4)
    """
    try:
        return _REGISTRY[(model, name)]
    except KeyError:
        raise UnknownMechanism(
            f"unknown mechanism {name!r} for model: {model}; choose one of "
            f"{', '.join((AUTO, *names(model=model)))}"
        ) from None


def candidates(*, requested: str, model: str) -> tuple[Mechanism, ...]:
    """The mechanisms a plan considers: the requested one, or every one of the model for auto."""
    if requested == AUTO:
        return tuple(mechanisms(model=model))
    return (get(requested, model=model),)


def check_options(*, requested: str, model: str, options: Mapping[str, Any]) -> None:
    """Every option is declared by a candidate and valid for each candidate that declares it."""
    chosen = candidates(requested=requested, model=model)
    declared = {name for m in chosen for name in m.options.names()}
    unknown = sorted(set(options) - declared)
    if unknown:
        raise OptionsError(
            f"mechanism_options {unknown} do not apply to mechanism {requested!r}; "
            f"allowed: {sorted(declared) or 'none'}"
        )
    for mechanism in chosen:
        mechanism.options.parse(options)
