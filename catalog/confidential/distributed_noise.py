"""Noise on a Dask cluster: the shard mapper the choke point uses for ``execution.engine: dask``.

The privacy rule lives in ``choke_point`` (charge once before any shard, every shard
noised exactly once by the vetted sampler, no retry with fresh noise, any failure fails the whole
measurement and the charge stands).  This module only moves shards to workers and back:

* shards are scattered straight to workers and gathered straight back (``direct=True``): their
  confidential answers cross to workers inside the cluster, never through the scheduler, a task
  graph, a Prefect result, a log line or a message (a shard's ``repr`` is redacted and a failure
  is reported by shard index and exception type only);
* each shard is one task, ``pure=False`` (a unique key, never shared with another computation),
  ``retries=0``;
* after the results are gathered, the scheduler's transition log is read: a shard that entered
  ``processing`` more than once (a worker was lost and the scheduler re-ran it) is refused.  The
  log is bounded (``distributed.admin.low-level-log-length``); a shard whose transitions were
  already evicted cannot be checked and is accepted on the other guarantees (a re-run after a
  lost worker only replaces values that never left that worker).

Dask is imported lazily (a ``local`` run never imports it)."""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from dprelease.catalog.confidential.choke_point import ShardFailedError, ShardMapper
from dprelease.catalog.engine import Execution, open_cluster
from dprelease.mechanisms.primitives.noise import NoiseShard, NoisyShard

if TYPE_CHECKING:
    from distributed import Client


class DaskShardMapper:
    """Runs a pure shard function once per shard on the workers of ``client``'s cluster."""

    def __init__(self, client: Client) -> None:
        self.client = client

    def __repr__(self) -> str:
        return f"DaskShardMapper(scheduler={self.client.scheduler.address!r})"

    def __call__(
        self, function: Callable[[NoiseShard], NoisyShard], shards: Sequence[NoiseShard], /
    ) -> list[NoisyShard]:
        """Scatter, map (one task per shard, no retry), gather in order. O(answers) transfer."""
        client = self.client
        run = uuid.uuid4().hex
        keys = [f"dprelease-noise-{run}-{index}" for index in range(len(shards))]
        data = client.scatter(list(shards), hash=False, direct=True)  # not via the scheduler
        futures = client.map(function, data, key=keys, pure=False, retries=0)
        try:
            results = client.gather(futures, direct=True)
        except Exception as exc:
            failed = next((i for i, f in enumerate(futures) if f.status == "error"), None)
            raise ShardFailedError(failed, f"{type(exc).__name__} on the cluster") from None
        finally:
            client.cancel([*futures, *data])  # nothing confidential stays on the workers
        for index, runs in enumerate(processing_counts(client, keys)):
            if runs > 1:
                raise ShardFailedError(
                    index,
                    f"the scheduler ran it {runs} times (a worker was lost); its noise is not "
                    "re-drawn",
                )
        return results


def processing_counts(client: Client, keys: Sequence[str]) -> list[int]:
    """How many times the scheduler sent each key to a worker (0: its log no longer holds it)."""
    story: list[Any] = client.sync(client.scheduler.get_story, keys_or_stimuli=list(keys))
    started = Counter(entry[0] for entry in story if entry[2] == "processing")
    return [started[key] for key in keys]


@contextmanager
def noise_cluster(execution: Execution) -> Iterator[ShardMapper | None]:
    """The shard mapper for ``execution``: ``None`` for ``local`` (noise in this process, as
    always); a :class:`DaskShardMapper` on the run's cluster for ``dask`` (closed on exit)."""
    with open_cluster(execution) as client:
        yield None if client is None else DaskShardMapper(client)


def sharded(data: Any, mapper: ShardMapper | None) -> Any:
    """``data`` noised through ``mapper`` when it is a choke point that shards (protected cells or
    marginals); other inputs (local-model responses) and ``mapper=None`` are returned unchanged."""
    if mapper is None or not hasattr(data, "with_shard_mapper"):
        return data
    return data.with_shard_mapper(mapper)
