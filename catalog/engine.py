"""Where a release runs: in this process (``local``) or on a Dask cluster (``dask``).

``execution: {engine: local | dask, address: tcp://host:port}`` in the spec, or ``--engine`` /
``--address`` on ``dprelease run`` (the CLI wins).  With ``dask`` and no address, a
``distributed.LocalCluster`` sized to this machine is started for the run and closed after it;
with an address, the run joins that cluster (and leaves it running).

Dask is imported lazily: a ``local`` run never imports it.  Everything here is public (an engine
name, a scheduler address); no count or row passes through this module.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError, field_validator, model_validator

from dprelease.catalog.errors import DprReleaseError, SpecError

if TYPE_CHECKING:
    from distributed import Client

_ADDRESS = re.compile(r"^(tcp|tls)://[A-Za-z0-9_.\-\[\]:]+:[0-9]{1,5}$")
CONNECT_TIMEOUT_S = 30
"""Bounded wait for joining a cluster (a wrong address fails instead of hanging)."""


class ClusterUnreachableError(DprReleaseError, ConnectionError):
    """No Dask scheduler answered at ``execution.address`` within the bounded wait."""


class Execution(BaseModel):
    """The engine a release runs on (public).  Validated on construction:

    >>> Execution(engine="dask", address="tcp://127.0.0.1:8786").address
    'tcp://127.0.0.1:8786'
    """

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    engine: Literal["local", "dask"] = "local"
    address: str | None = None
    """A running Dask scheduler (``tcp://host:port``); only with ``engine: dask``."""

    @field_validator("address")
    @classmethod
    def _check_address(cls, address: str | None) -> str | None:
        if address is not None and not _ADDRESS.match(address):
            raise ValueError(
                f"execution.address ({address!r}) must be a Dask scheduler address "
                "tcp://host:port or tls://host:port"
            )
        if address is not None and not 0 < int(address.rsplit(":", 1)[1]) < 65536:
            raise ValueError(f"execution.address ({address!r}): the port must be 1..65535")
        return address

    @model_validator(mode="after")
    def _check_engine(self) -> Execution:
        if self.address is not None and self.engine != "dask":
            raise ValueError(
                f"execution.address ({self.address!r}) needs execution.engine: dask "
                f"(engine is {self.engine!r}; a local run has no cluster to join)"
            )
        return self


LOCAL = Execution()


def resolve_execution(
    spec_execution: Execution | None, *, engine: str | None = None, address: str | None = None
) -> Execution:
    """The spec's setting overridden field by field by the CLI's (``--engine``, ``--address``): an
    ``--address`` alone implies ``engine: dask``; ``--engine local`` drops the spec's address.
    Raises :class:`SpecError` naming the option and the rule."""
    base = spec_execution or LOCAL
    if engine is None and address is None:
        return base
    try:
        if engine == "local":
            # an explicit --address with --engine local is refused (names both fields)
            return LOCAL if address is None else Execution(engine="local", address=address)
        return Execution(
            engine=engine or "dask", address=address if address is not None else base.address
        )
    except ValidationError as exc:
        problems = "; ".join(
            f"execution.{'.'.join(map(str, error['loc'])) or 'engine'}: "
            + str(error["msg"]).removeprefix("Value error, ")
            for error in exc.errors(include_url=False)
        )
        raise SpecError(f"--engine/--address: {problems}") from None


def local_cluster_size() -> tuple[int, int]:
    """(workers, bytes of memory per worker) for a LocalCluster sized to this machine: one
    single-threaded worker per core, sharing the machine's memory evenly."""
    import psutil

    workers = max(1, os.cpu_count() or 1)
    return workers, int(psutil.virtual_memory().total // workers)


@contextmanager
def open_cluster(execution: Execution) -> Iterator[Client | None]:
    """A Dask client for the run: ``None`` for ``local``; a new LocalCluster (closed on exit) when
    no address is given; else a client of the cluster at ``address`` (the cluster stays up).
    Closes only what it started, also when the body raises."""
    if execution.engine == "local":
        yield None
        return
    from distributed import Client, LocalCluster

    if execution.address is None:
        workers, memory = local_cluster_size()
        with (
            LocalCluster(
                n_workers=workers,
                threads_per_worker=1,
                memory_limit=memory,
                processes=True,
                dashboard_address=":0",  # a free port on host: never a clash with another run
                host="127.0.0.1",
            ) as cluster,
            Client(cluster) as client,
        ):
            yield client
        return
    try:
        client = Client(execution.address, timeout=CONNECT_TIMEOUT_S, set_as_default=False)
    except (OSError, TimeoutError) as exc:
        raise ClusterUnreachableError(
            f"execution.address ({execution.address!r}): no Dask scheduler answered within "
            f"{CONNECT_TIMEOUT_S} s ({type(exc).__name__}); start one with `dask scheduler` or "
            "fix the address"
        ) from None
    try:
        yield client
    finally:
        client.close()


SpecT = TypeVar("SpecT", bound=BaseModel)


def with_execution(spec: SpecT, *, engine: str | None, address: str | None) -> SpecT:
    """``spec`` with its ``execution`` overridden by the CLI's ``engine``/``address`` (if given)."""
    current = getattr(spec, "execution", None)
    resolved = resolve_execution(current, engine=engine, address=address)
    return spec if resolved == current else spec.model_copy(update={"execution": resolved})
