"""Where dprelease keeps its state: ``$DPRELEASE_HOME``, else ``./.dprelease``.

Its own module so that code needing only the path (the strategy store, ``dprelease plan``) does
not import the ledger and SQLAlchemy (an import cost on every ``plan``).
"""

from __future__ import annotations

import os
from pathlib import Path


def default_home() -> Path:
    return Path(os.environ.get("DPRELEASE_HOME", ".dprelease")).resolve()
