"""The catalog database: datasets with lifetime budget caps, the append-only privacy ledger,
releases and their reviews (:class:`catalog.ledger.store.Catalog`).

SQLite under ``$DPRELEASE_HOME/catalog.db`` by default, any SQLAlchemy URL
(``DPRELEASE_CATALOG_URL``) for shared deployments.  One module per concern, each importing only
those before it (``tests/architecture/test_ledger_layering.py``): ``database``, ``chain``,
``names``, ``leases``, ``schema``, ``spending``, ``budget`` (``Ledger``), ``store`` (``Catalog``);
``pg_roles``: the database roles of a PostgreSQL catalog (who may write which table).
"""
