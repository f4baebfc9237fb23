"""Thin Prefect task wrappers, one pipeline stage each (the logic lives in ``catalog`` and ``mechanisms``)."""
