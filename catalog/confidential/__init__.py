"""The confidential boundary: every module that reads input rows or holds true counts.

The rule: **no count, row or raw value leaves this package except through the noise**: the
choke point's in the central model (``choke_point``, which charges the ledger first), or the
respondent's own randomiser in the local model (simulated clients only; real items never leave a
device).  Everything else that leaves is public by construction: file names, keyed fingerprints,
the domain, and errors that name a column and a rule, never a value.
``tests/architecture/test_confidential_boundary.py`` fails when a module outside this package
opens Parquet/Arrow data or reaches the noise sampler."""
