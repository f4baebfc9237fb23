"""``kill -9`` at each stage of a charge loses no charge, on SQLite and on a real PostgreSQL server.

A real process registers a release, charges once (committed), then charges again and is killed
with SIGKILL at one stage of that second charge: inside the transaction just before COMMIT, right
after COMMIT (before the anchor outside the database moves), or after the charge returned (while
noise would be drawn).  Privacy: noise is drawn only after ``charge`` returned, so every charge a
process could have drawn noise for must be in the ledger afterwards; a charge killed before its
COMMIT may vanish (no noise was drawn for it).  The locks die with the process: another process
charges right afterwards, and the hash chain and its anchor still verify.

The same holds for a whole release on the real release path (register, ingest, measure,
reconstruct; no Prefect): killed after each stage, it keeps exactly the charges it made, ``recover``
moves it to ``failed``, and the cap still counts them.
"""

from __future__ import annotations

import json
import signal
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from dprelease.catalog.errors import BudgetExceededError
from dprelease.catalog.ledger.store import Catalog
from dprelease.mechanisms.primitives.privacy import PrivacyCost
from tests.privacy.test_ledger_concurrency import python

CHILD = """
import os, signal, sys
import sqlalchemy as sa
from dprelease.catalog import keys
from dprelease.catalog.ledger.store import Catalog
from dprelease.mechanisms.primitives.privacy import PrivacyCost

url, stage = sys.argv[1:3]
armed = False

def die(*_args, **_kwargs):
    if armed:
        os.kill(os.getpid(), signal.SIGKILL)

catalog = Catalog(url)
if stage == "before-commit":
    sa.event.listen(catalog.engine, "commit", die)  # fires before the database commits
elif stage == "after-commit":
    original = keys.CatalogKey.write_anchor
    def write_anchor(self, **kwargs):
        die()
        return original(self, **kwargs)
    keys.CatalogKey.write_anchor = write_anchor
catalog.create_release(
    release_id="victim", name="n", dataset_id="ds", spec_fingerprint="f" * 64, mechanism="identity"
)
cost = PrivacyCost(measure="pure", epsilon=0.5)
print("charged", catalog.charge("ds", cost, release_id="victim", label="first"), flush=True)
armed = True
print("charged", catalog.charge("ds", cost, release_id="victim", label="second"), flush=True)
die()  # the noise stage
"""

STAGES = {
    # stage: (charges committed by the killed process, the anchor lags one entry behind)
    "before-commit": (1, False),
    "after-commit": (2, True),
    "after-charge": (2, False),
}


def pure(epsilon: float) -> PrivacyCost:
    return PrivacyCost(measure="pure", epsilon=epsilon)


@pytest.mark.parametrize("stage", sorted(STAGES))
def test_kill_at_each_stage_of_a_charge_loses_no_charge(catalog_url: str, stage: str) -> None:
    catalog = Catalog(catalog_url)
    catalog.ensure_dataset("ds", cap=pure(5.0))
    process = python("-c", CHILD, catalog_url, stage)
    stdout, stderr = process.communicate(timeout=120)
    assert process.returncode == -signal.SIGKILL, stderr
    reported = [line.split()[1] for line in stdout.splitlines() if line.startswith("charged")]
    committed, anchor_lags = STAGES[stage]

    entries = catalog.ledger_entries("ds")
    # every receipt the process saw (and might have drawn noise for) is in the ledger
    assert set(reported) <= {e.receipt_id for e in entries}
    assert len(reported) == (2 if stage == "after-charge" else 1)
    assert [e.label for e in entries] == ["first", "second"][:committed]
    assert catalog.spent("ds") == pure(0.5 * committed)
    anchor = catalog.key.read_anchor()
    assert anchor is not None and anchor.entries == committed - anchor_lags
    assert catalog.verify_chain() == []  # a lagging anchor (one entry) is accepted

    # the killed process's locks are gone: this process charges at once, and the anchor catches up
    catalog.charge("ds", pure(0.5), release_id="next", label="after the crash")
    assert catalog.verify_chain() == []
    anchor = catalog.key.read_anchor()
    assert anchor is not None and anchor.entries == committed + 1
    [moved] = catalog.recover(lease_seconds=3600)  # its pid is gone
    assert (moved.release_id, moved.status, moved.charges) == ("victim", "failed", committed)
    assert catalog.spent("ds") == pure(0.5 * (committed + 1))


RELEASE_CHILD = """
import json, os, signal, sys
from pathlib import Path
from dprelease.catalog import release
from dprelease.catalog.ledger.store import Catalog
from dprelease.catalog.planning.planner import make_plan
from dprelease.catalog.spec.load import parse_spec

url, spec_path, stop_after = sys.argv[1:4]
spec = parse_spec(json.loads(Path(spec_path).read_text()))
plan = make_plan(spec)
catalog = Catalog(url)

def stage(name):
    print(name, flush=True)
    if name == stop_after:
        os.kill(os.getpid(), signal.SIGKILL)

release.register(spec, plan, catalog, release_id="victim")
stage("registered")
ingested = release.ingest(spec, plan, catalog)
stage("ingested")
measurement = release.measure(ingested, spec, plan, catalog, release_id="victim")
print("receipts", *measurement.receipts, flush=True)
stage("measured")
release.reconstruct(spec, plan, measurement)
stage("reconstructed")
"""

# stage the release is killed after: the ledger entries it keeps
RELEASE_STAGES = {"registered": 0, "ingested": 0, "measured": 1, "reconstructed": 1}


@pytest.mark.parametrize("stop_after", sorted(RELEASE_STAGES))
def test_a_release_killed_after_each_stage_keeps_exactly_its_charges(
    catalog_url: str, tmp_path: Path, stop_after: str
) -> None:
    rng = np.random.default_rng(5)  # public randomness: synthetic test data
    source = tmp_path / "data.parquet"
    pq.write_table(pa.table({"v": pa.array(rng.integers(0, 8, 200), pa.int16())}), source)
    spec = {
        "name": "victim",
        "dataset": {"id": "ds", "source": str(source), "budget": {"epsilon": 1.5}},
        "domain": {"v": {"min": 0, "max": 7}},
        "workload": [{"name": "hist", "marginal": ["v"]}],
        "mechanism": "identity",
        "privacy": {"epsilon": 1.0},
    }
    spec_path = tmp_path / "spec.json"
    spec_path.write_text(json.dumps(spec))
    process = python("-c", RELEASE_CHILD, catalog_url, str(spec_path), stop_after)
    stdout, stderr = process.communicate(timeout=300)
    assert process.returncode == -signal.SIGKILL, stderr
    assert stdout.split()[-1] == stop_after  # it died right after that stage
    reported = [
        w for line in stdout.splitlines() if line.startswith("receipts") for w in line.split()[1:]
    ]

    catalog = Catalog(catalog_url)
    entries = catalog.ledger_entries("ds")
    assert len(entries) == RELEASE_STAGES[stop_after]
    assert [e.receipt_id for e in entries] == reported  # every receipt noise was drawn for
    assert all(e.release_id == "victim" for e in entries)
    spent = catalog.spent("ds").epsilon
    assert spent == sum(e.cost.epsilon for e in entries)
    assert spent == pytest.approx(1.0 * len(entries), abs=1e-9)  # epsilon 1 per release
    assert catalog.verify_chain() == []
    [moved] = catalog.recover(lease_seconds=3600)
    assert (moved.release_id, moved.status, moved.charges) == ("victim", "failed", len(entries))
    # the cap (1.5) still counts the dead release's charge: another epsilon 1 fits only if the
    # killed release charged nothing
    if entries:
        with pytest.raises(BudgetExceededError, match=r"would be exceeded"):
            catalog.charge("ds", pure(1.0), release_id="next", label="next")
    else:
        catalog.charge("ds", pure(1.0), release_id="next", label="next")
