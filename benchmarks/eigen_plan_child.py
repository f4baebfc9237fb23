"""Child process: the ``eigen`` mechanism's planning path on all ranges of n cells under a memory cap.

Usage: ``python benchmarks/eigen_plan_child.py N LIMIT_GIB`` (from the repository root).  Sets
RLIMIT_AS to LIMIT_GIB before importing NumPy, then runs what the planner runs for
``mechanism: eigen`` (workload Gram from closed-form factor Grams, Eigen-Design, the support check,
the expected error and the SVD bound) and prints one line: TOTAL/SVDB, identity/SVDB, the support
residual, wall seconds and the peak resident memory in GiB.  Used by ``eigen_bench.py`` (table 3)
and by ``tests/unit/mechanisms/test_gram.py``.
"""

from __future__ import annotations

import resource
import sys
import time
from pathlib import Path


def main() -> None:
    n, limit_gib = int(sys.argv[1]), int(sys.argv[2])
    resource.setrlimit(resource.RLIMIT_AS, (limit_gib << 30, limit_gib << 30))
    started = time.perf_counter()
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from dprelease.mechanisms.eigen import MECHANISM
    from dprelease.mechanisms.primitives.lower_bound import svd_bound
    from dprelease.mechanisms.primitives.operators import AllRanges
    from dprelease.mechanisms.primitives.privacy import PrivacyCost
    from dprelease.mechanisms.primitives.protocol import PlanRequest, StoredStrategy
    from dprelease.mechanisms.primitives.workload import Workload, WorkloadItem

    class NoCache:
        def load(self, key: str) -> StoredStrategy | None:
            return None

        def save(self, key: str, stored: StoredStrategy) -> None:
            return None

    ranges = AllRanges(n)
    workload = Workload(domain_shape=(n,), items=(WorkloadItem(name="r", factors=(ranges,)),))
    request = PlanRequest(
        workload=workload,
        ordered=(True,),
        target=PrivacyCost(measure="zcdp", rho=0.5),
        contribution_bound=1,
        options={},
        workload_fingerprint="0" * 64,
        requested=True,
    )
    strategy = MECHANISM.plan(request, cache=NoCache())
    residual = strategy.support_residual(workload)
    MECHANISM.evaluate(strategy, request)
    total = sum(strategy.item_unit_total(item, workload) for item in workload.items)
    bound = svd_bound(workload)
    if bound is None:
        raise SystemExit("no SVD bound")
    ratio = strategy.sensitivity(noise="gaussian") ** 2 * total / bound
    seconds = time.perf_counter() - started
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    print(ratio, ranges.gram_trace() / bound, residual, seconds, peak)


if __name__ == "__main__":
    main()
