"""The confidential boundary: every module that reads input rows or holds true counts.

The rule: **no count, row or raw value leaves this package except through the noise**: the
choke point's in the central model (``choke_point``, which charges the ledger first), or the
respondent's own randomiser in the local model (simulated clients only; real items never leave a
device).  Everything else that leaves is public by construction: file names, keyed fingerprints,
the domain, and errors that name a column and a rule, never a value.

* ``inputs`` — the ingest stage's one reader per input kind;
* ``source`` — Parquet rows → checked, bounded cells (the one read path);
* ``marginal_source`` — the marginals a plan measures, from the same read;
* ``dask_count`` — the same counts on a Dask cluster;
* ``responses`` — local-model response files and simulated clients;
* ``check`` — ``dprelease check``: the custodian's exact, unstored view;
* ``choke_point`` — ``ProtectedCells``/``ProtectedMarginals``: charge, then ``A·x`` + noise, the
  only caller of the vetted sampler;
* ``distributed_noise`` — the Dask shard mapper the choke point noises through.

``tests/architecture/test_confidential_boundary.py`` fails when a module outside this package
opens Parquet/Arrow data or reaches the noise sampler.
"""
