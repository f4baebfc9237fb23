"""The local model: the workload factorization mechanism of [McKenna20] and its numerics.

* :mod:`~mechanisms.local.mechanism` — the registered mechanism (plan, evaluate, measure,
  reconstruct) and its public strategy record;
* :mod:`~mechanisms.local.randomizer` — the ε-LDP strategy ``Q``, its fingerprint, and the client
  step :func:`~mechanisms.local.randomizer.randomize` (the only one that runs on a device);
* :mod:`~mechanisms.local.baselines` — randomized response, RAPPOR, Hadamard, hierarchical, Fourier;
* :mod:`~mechanisms.local.estimation` — the reconstruction ``V``, variances, lower bound, and the
  server's estimates from response counts;
* :mod:`~mechanisms.local.optimizer` — the strategy optimiser of Problem 3.12 and its cost model.

References:
R. McKenna, R. K. Maity, A. Mazumdar, G. Miklau, "A workload-adaptive mechanism for linear queries
under local differential privacy", PVLDB 13(11), 2020 ([McKenna20]).
"""

from dprelease.mechanisms.local.mechanism import MECHANISM

__all__ = ["MECHANISM"]
