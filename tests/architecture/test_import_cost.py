"""Entry points stay cheap to import: every flow run and every ``dprelease`` command is a fresh
process, so a module-level import of a heavy library is paid each time.

``scipy.optimize`` is needed only by the mechanisms' optimisers, ``scipy.special`` only by interval
widths, ``pyarrow.dataset`` (which loads pandas) only when input data is read, pandas only when
tables are validated and Great Expectations only by the validation service.  Importing the flow-run
entry point, the CLI, or what the commands that read no data import (review, budget, show, verify,
watch, deploy) must load none of them; a module-level import of one fails here, naming the modules
that were being imported when it loaded.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

HEAVY = (
    "scipy.optimize",
    "scipy.special",
    "pyarrow.dataset",
    "pandas",
    "great_expectations",
)

ENTRY_POINTS = {
    "flow run": (
        "dprelease.flows.deployed_release",
        "dprelease.flows.deployments",
    ),
    "commands reading no data": (
        "dprelease.flows.cli",
        "dprelease.catalog.ledger.store",
        "dprelease.catalog.ledger.spending",
        "dprelease.catalog.review.decisions",
        "dprelease.catalog.review.policy",
        "dprelease.catalog.review.signatures",
        "dprelease.catalog.identity.roles",
        "dprelease.catalog.series_audit",
        "dprelease.catalog.show",
        "dprelease.catalog.watch_state",
        "dprelease.flows.watch",
        "dprelease.catalog.spec.load",
    ),
}

# Runs in a fresh interpreter: records, for each heavy module, the dprelease modules whose
# top-level code was running when it was first looked up.
_PROBE = """
import importlib, json, sys

heavy, modules = json.loads(sys.argv[1]), json.loads(sys.argv[2])
importers = {}


class ImportSpy:
    @staticmethod
    def find_spec(name, path=None, target=None):
        if name in heavy and name not in importers:
            frame, chain = sys._getframe(1), []
            while frame is not None:
                module = frame.f_globals.get("__name__", "")
                if module.startswith("dprelease") and module not in chain:
                    chain.append(module)
                frame = frame.f_back
            importers[name] = chain
        return None


sys.meta_path.insert(0, ImportSpy)
for module in modules:
    importlib.import_module(module)
print(json.dumps({name: importers.get(name, []) for name in heavy if name in sys.modules}))
"""


def heavy_imports(modules: tuple[str, ...]) -> dict[str, list[str]]:
    """Which of :data:`HEAVY` a fresh interpreter holds after importing ``modules``, each with
    the dprelease modules that were importing when it loaded (innermost first)."""
    done = subprocess.run(
        [sys.executable, "-c", _PROBE, json.dumps(HEAVY), json.dumps(modules)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("entry", list(ENTRY_POINTS))
def test_entry_points_do_not_import_heavy_libraries(entry: str) -> None:
    loaded = heavy_imports(ENTRY_POINTS[entry])
    assert not loaded, "\n".join(
        f"{name} loaded at import, by {' <- '.join(chain) or 'a non-dprelease module'}"
        for name, chain in loaded.items()
    )


def test_the_probe_sees_a_heavy_import_and_who_made_it() -> None:
    """The probe is not blind: the cluster counter, which reads data and so imports pyarrow's
    dataset API at module level, is reported with the module that imported it."""
    loaded = heavy_imports(("dprelease.catalog.confidential.dask_count",))
    assert set(loaded) >= {"pyarrow.dataset", "pandas"}
    assert loaded["pyarrow.dataset"][0] == "dprelease.catalog.confidential.dask_count"
