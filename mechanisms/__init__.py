"""Pure numerical core of dprelease: operators, strategies, error, noise and privacy arithmetic.

No Prefect, no pyarrow, no catalog, no I/O.  Import submodules directly (``mechanisms.primitives.strategies``,
``mechanisms.primitives.dense``, ...); this package keeps its import cheap."""
