"""The catalog database: datasets with lifetime budget caps, the append-only privacy ledger,
releases and their reviews (:class:`catalog.ledger.store.Catalog`).

SQLite under ``$DPRELEASE_HOME/catalog.db`` by default (``./.dprelease``); any SQLAlchemy URL
(``DPRELEASE_CATALOG_URL``, e.g. PostgreSQL) for shared deployments.  One module per concern, each
importing only the ones listed before it (``tests/architecture/test_ledger_layering.py``):

* ``database``: where the catalog lives, its engine, URL redaction;
* ``chain``: the hash chain of ledger entries and its anchor (pure: no database);
* ``names``: reviewer names;
* ``leases``: release records and the lease of a release that is measuring;
* ``schema``: the tables, timestamps, schema versions and their migrations;
* ``spending``: what a dataset and each of its partitions have spent; budget refusals;
* ``budget``: ``Ledger``, datasets, caps and charges, behind the integrity check;
* ``store``: ``Catalog``, the ledger plus releases (skipped, leased, recovered) and reviews."""
