"""The deployed path with keys, against a real Prefect server and process worker: the worker runs
with a service key in the operator role (``DPRELEASE_KEY``), the custodian registers keys with
``dprelease keys register --spec``; a file arrives and the run the arrival trigger starts
(``dprelease watch``) signs its run and charges and pauses for
review; the service key may not approve; two reviewers' keys decide through the paused run
(``dprelease review --key``), the second publishes; the published copy carries both attestation
files and ``dprelease verify`` lists both signatures."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from dprelease.catalog.identity import signing
from dprelease.catalog.identity.keys import create_key
from dprelease.catalog.ledger.store import Catalog
from dprelease.catalog.watch_state import ReviewRuns
from tests.flows.test_operations import (
    Operations,
    _deployment,
    _only_release,
    _runs_of,
    _spec,
    _wait_final,
    _wait_for,
    _wait_paused,
    _write_tiny_parquet,
    serve,
)

pytestmark = [pytest.mark.flow]
RUN_TIMEOUT = 240.0


@pytest.fixture(scope="module")
def signed_ops(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Operations]:
    base = tmp_path_factory.mktemp("signed")
    landing = base / "landing"
    (landing / "ops-signed").mkdir(parents=True)
    specs_dir = base / "specs"
    specs_dir.mkdir()
    spec = _spec(
        "ops-signed", "ops-signed", landing / "ops-signed", cap=5.0, review={"approvers": 2},
        trigger="arrival",
    )  # fmt: skip
    path = specs_dir / "ops-signed.yaml"
    path.write_text(yaml.safe_dump(spec))
    with serve(
        base,
        specs={"signed": path},
        landing=landing,
        deploy=[str(specs_dir)],
        worker_env={signing.KEY_ENV: "svc"},
    ) as operations:
        yield operations


def test_a_worker_with_a_service_key_runs_and_two_reviewer_keys_publish(
    signed_ops: Operations,
) -> None:
    ops = signed_ops
    home = Path(ops.env["DPRELEASE_HOME"])
    keys = {name: create_key(name, home=home)[0] for name in ("cara", "svc", "ada", "bob")}
    spec = str(ops.specs["signed"])
    first = ops.cli("keys", "register", "cara", "--spec", spec, "--role", "custodian")
    assert first.returncode == 0, first.stdout + first.stderr
    for name, role in [("svc", "operator"), ("ada", "reviewer"), ("bob", "reviewer")]:
        done = ops.cli(
            "keys", "register", name, "--dataset", "ops-signed", "--role", role, "--as", "cara"
        )
        assert done.returncode == 0, done.stdout + done.stderr

    _write_tiny_parquet(ops.landing / "ops-signed" / "2026-11.parquet", seed=11)
    watched = ops.cli(
        "watch", str(ops.landing), "--spec-dir", str(ops.specs["signed"].parent), "--once",
        "--interval", "1",
    )  # fmt: skip
    assert watched.returncode == 0 and "announced 1 file(s)" in watched.stdout, watched.stderr
    deployment = _deployment(ops, "ops-signed")
    [created] = _wait_for(
        lambda: _runs_of(ops, deployment.id, scheduled=True),
        what="the triggered run",
        timeout=RUN_TIMEOUT,
        ops=ops,
    )
    assert created.parameters["source_override"].endswith("2026-11.parquet")
    _wait_paused(ops, created.id)
    record = _only_release(ops, "ops-signed")
    catalog = Catalog(ops.catalog_url)
    steps = signing.steps(catalog, record.id)
    assert steps and {s.key_id for s in steps} == {keys["svc"].key_id}
    assert steps[0].step == "run" and "charge" in [s.step for s in steps]

    own = ops.cli("review", record.id, "--approve", "--key", "svc", "--reviewer", "Not Svc")
    assert own.returncode == 2 and "signed the run" in own.stderr + own.stdout
    ada = ops.cli("review", record.id, "--approve", "--key", "ada")
    assert ada.returncode == 0, ada.stdout + ada.stderr + ops.diagnostics()
    assert "through flow run" in ada.stdout
    again = ops.cli("review", record.id, "--approve", "--key", "ada", "--reviewer", "Someone")
    assert again.returncode == 2 and "already approved" in again.stderr + again.stdout

    def paused_with_one() -> bool:
        run = _wait_paused(ops, created.id)
        return run.state.state_details.pause_key == "review-2"

    _wait_for(paused_with_one, what="the second pause", timeout=RUN_TIMEOUT, ops=ops)
    bob = ops.cli("review", record.id, "--approve", "--key", "bob")
    assert bob.returncode == 0, bob.stdout + bob.stderr + ops.diagnostics()
    assert _wait_final(ops, created.id).state.is_completed()
    published = catalog.release(record.id)
    assert published.status == "published"
    target = Path(str(published.published_directory))
    assert len(list((target / "attestations").glob("*.json"))) == 2
    verified = ops.cli("verify", str(target), "--json")
    report = json.loads(verified.stdout)
    assert report["ok"], report
    assert [note.rsplit(" (", 1)[1] for note in report["signatures"]] == ["reviewer)"] * 2
    assert ReviewRuns(ops.catalog_url).get(record.id).status == "decided"
    pem = {
        name: "".join((home / "keys" / f"{name}.key").read_text().splitlines()[1:-1])
        for name in keys
    }
    logs = ops.logs["worker"].read_text() + ops.logs["server"].read_text()
    for text in [logs] + [r.stdout + r.stderr for r in (first, own, ada, again, bob, verified)]:
        assert "PRIVATE KEY" not in text and not any(body in text for body in pem.values())
    assert keys["svc"].key_id in json.dumps([s._asdict() for s in steps])  # only the id
