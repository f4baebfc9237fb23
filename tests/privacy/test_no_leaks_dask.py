"""No confidential value leaves the choke point when counting runs on a Dask cluster.

The planted cases and the scanner of :mod:`tests.privacy.test_no_leaks` (exact counts and raw
values that occur nowhere else) are counted by ``catalog.confidential.dask_count`` on a real cluster (a
``dask scheduler`` and two ``dask worker`` processes): the error (str, repr, pickle), the
driver's log records and every log file the scheduler and the workers wrote must carry none of
the sentinels, and the error is exactly the local path's.
"""

from __future__ import annotations

import logging
import pickle
from pathlib import Path

import pytest

from dprelease.catalog.confidential.dask_count import count_cells_dask
from dprelease.catalog.confidential.source import count_cells
from dprelease.catalog.errors import DataError
from dprelease.catalog.spec.load import load_spec
from tests.privacy.test_no_leaks import CASES, Case, leaks, leaks_in, read_tree, write_case


def _on_cluster(tmp_path: Path, case: Case, address: str):
    spec = load_spec(write_case(tmp_path, case))
    unit = spec.privacy_unit
    if unit.person_column is not None:  # one file: every person's rows are in it
        unit = unit.model_copy(update={"persons_colocated": True})
    execution = spec.execution.model_copy(update={"engine": "dask", "address": address})
    return spec.model_copy(update={"privacy_unit": unit, "execution": execution})


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_counting_on_the_cluster_carries_no_sentinel(
    tmp_path: Path,
    case: Case,
    dask_address: str,
    dask_logs: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    spec = _on_cluster(tmp_path, case, dask_address)
    caplog.set_level(logging.DEBUG)
    if not case.rule:
        result = count_cells_dask(spec)
        assert not leaks(repr(result).encode(), case.sentinels)
    else:
        with pytest.raises(DataError) as raised:
            count_cells_dask(spec)
        error = raised.value
        with pytest.raises(DataError) as local:
            count_cells(spec)
        assert str(error) == str(local.value)
        assert case.rule in str(error)
        for text in (str(error), repr(error), repr(error.args)):
            assert not leaks(text.encode(), case.sentinels), text
        assert not leaks(pickle.dumps(error), case.sentinels)
    assert not leaks(caplog.text.encode(), case.sentinels), caplog.text
    logs = read_tree(dask_logs)
    assert any(b"Start worker" in content for content in logs.values())  # the logs were read
    assert not leaks_in(logs, sentinels=case.sentinels)
