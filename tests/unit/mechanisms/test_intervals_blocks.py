"""Row-blocked single-term detection of range factors equals the dense computation."""

import numpy as np

from dprelease.mechanisms.primitives import intervals
from dprelease.mechanisms.primitives.intervals import kron_single_term_rows, single_term_rows
from dprelease.mechanisms.primitives.operators import AllRanges, Identity, Ranges
from dprelease.mechanisms.primitives.strategies import hierarchical_strategy, identity_strategy


def test_blocked_range_rows_match_dense(monkeypatch) -> None:
    monkeypatch.setattr(intervals, "ROW_BLOCK_ENTRIES", 7)  # many blocks
    for workload in (AllRanges(9), Ranges(9, [0, 3, 8], [0, 5, 8])):
        for strategy in (hierarchical_strategy(9), identity_strategy(9)):
            pinv = np.linalg.pinv(strategy.gram())
            dense = single_term_rows(workload.dense() @ pinv @ strategy.dense().T)
            got = kron_single_term_rows(
                [workload, Identity(2)], [strategy, identity_strategy(2)], [pinv, np.eye(2)]
            )
            assert np.array_equal(got, np.repeat(dense, 2))
