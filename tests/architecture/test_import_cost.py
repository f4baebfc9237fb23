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

HEAVY = (
    "scipy.optimize",
    "scipy.special",
    "pyarrow.dataset",
    "pandas",
    "great_expectations",
)

# The flow-run entry point, the CLI, and what its review, budget, show, verify, watch and deploy
# commands import (flows/cli/*.py import them inside the commands).
ENTRY_MODULES = (
    "dprelease.flows.deployed_release",
    "dprelease.flows.deployments",
    "dprelease.flows.cli",
    "dprelease.flows.watch",
    "dprelease.catalog.ledger.store",
    "dprelease.catalog.ledger.spending",
    "dprelease.catalog.review.decisions",
    "dprelease.catalog.review.policy",
    "dprelease.catalog.review.signatures",
    "dprelease.catalog.identity.roles",
    "dprelease.catalog.series_audit",
    "dprelease.catalog.show",
    "dprelease.catalog.watch_state",
)
CONTROL_MODULE = "dprelease.catalog.confidential.dask_count"
"""Reads data on a cluster, so it imports pyarrow's dataset API at module level: the probe must
see it (imported after the entry modules, in the same interpreter)."""

# Runs in a fresh interpreter: for each heavy module, the dprelease modules whose code was running
# when it was first looked up; once after the entry modules, once after the control module.
_PROBE = """
import importlib, json, sys

heavy, modules, control = json.loads(sys.argv[1]), json.loads(sys.argv[2]), sys.argv[3]
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


def loaded():
    return {name: importers.get(name, []) for name in heavy if name in sys.modules}


sys.meta_path.insert(0, ImportSpy)
for module in modules:
    importlib.import_module(module)
entry = loaded()
importlib.import_module(control)
print(json.dumps({"entry": entry, "control": loaded()}))
"""


def test_entry_points_do_not_import_heavy_libraries() -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            _PROBE,
            json.dumps(HEAVY),
            json.dumps(ENTRY_MODULES),
            CONTROL_MODULE,
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert not report["entry"], "\n".join(
        f"{name} loaded at import, by {' <- '.join(chain) or 'a non-dprelease module'}"
        for name, chain in report["entry"].items()
    )
    control = report["control"]
    assert {"pyarrow.dataset", "pandas"} <= set(control), f"the probe is blind: {control}"
    assert control["pyarrow.dataset"][0] == CONTROL_MODULE
