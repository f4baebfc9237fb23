"""The local model: the workload factorization mechanism of [McKenna20] and its numerics.

``mechanism`` (the registered mechanism), ``randomizer`` (the ε-LDP strategy ``Q`` and the client
step :func:`~mechanisms.local.randomizer.randomize`, the only one that runs on a device),
``baselines`` (randomized response, RAPPOR, Hadamard, hierarchical, Fourier), ``estimation``
(``V``, variances, lower bound, estimates) and ``optimizer`` (Problem 3.12).

[McKenna20]: R. McKenna, R. K. Maity, A. Mazumdar, G. Miklau, "A workload-adaptive mechanism for
linear queries under local differential privacy", PVLDB 13(11), 2020.
"""

from dprelease.mechanisms.local.mechanism import MECHANISM

__all__ = ["MECHANISM"]
