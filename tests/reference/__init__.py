"""Reference implementations: paper reproductions the product's results are checked against.

Nothing here is part of ``dprelease``: the release pipeline never imports this package.  Code that
adds noise here does so to a raw vector, without the choke point or the ledger, and is only for
tests and benchmarks.
"""
