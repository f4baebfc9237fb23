"""Keys registered with roles on a dataset (``catalog.identity.roles``): signed, hash-chained
ledger entries that never count as spending; the custodian alone changes them; a revoked key
holds no role after its revocation; and ``dprelease keys register|revoke|roles``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import sqlalchemy as sa
from typer.testing import CliRunner

from dprelease.catalog.errors import CatalogError
from dprelease.catalog.identity import roles
from dprelease.catalog.identity.keys import IdentityError, SigningKey
from dprelease.catalog.ledger.store import Catalog
from dprelease.flows.cli import app
from dprelease.mechanisms.primitives.privacy import PrivacyCost

runner = CliRunner()


@pytest.fixture
def catalog(catalog_url: str) -> Catalog:
    """On SQLite and on a real PostgreSQL server (``catalog_url``)."""
    catalog = Catalog(catalog_url)
    catalog.ensure_dataset("ds", cap=PrivacyCost(measure="pure", epsilon=2.0))
    return catalog


def register(catalog: Catalog, key: SigningKey, *role: str, by: SigningKey, name: str = "k") -> str:
    return roles.register_key(
        catalog, dataset_id="ds", public=key.public, name=name, roles=role, signer=by
    )


def test_the_first_key_is_a_self_signed_custodian_then_the_dataset_requires_signatures(
    catalog: Catalog,
) -> None:
    cara, ray = SigningKey.generate(), SigningKey.generate()
    assert not roles.requires_signatures(catalog, "ds")
    with pytest.raises(IdentityError, match="its first key must be its custodian's"):
        register(catalog, ray, "reviewer", by=ray)
    with pytest.raises(IdentityError, match="its first key must be its custodian's"):
        register(catalog, cara, "custodian", by=ray)  # signed by another key
    register(catalog, cara, "custodian", by=cara, name="cara")
    register(catalog, ray, "reviewer", by=cara, name="ray")
    assert roles.requires_signatures(catalog, "ds")
    current = roles.roster(catalog, "ds")
    assert current.holds(cara.key_id, "custodian") and current.holds(ray.key_id, "reviewer")
    assert not current.holds(ray.key_id, "custodian")
    assert roles.identity_problems(catalog, "ds") == []
    # zero-cost, chained, and never spending
    entries = [e for e in catalog.ledger_entries("ds") if e.kind == "key"]
    assert len(entries) == 2 and all(e.cost.epsilon == 0 for e in entries)
    assert catalog.spent("ds").epsilon == 0 and catalog.verify_chain() == []


def test_only_a_custodian_registers_or_revokes(catalog: Catalog) -> None:
    cara, ray, mallory = (SigningKey.generate() for _ in range(3))
    register(catalog, cara, "custodian", by=cara)
    register(catalog, ray, "reviewer", by=cara)
    with pytest.raises(IdentityError, match=r"holds the role\(s\) reviewer .* not custodian"):
        register(catalog, mallory, "reviewer", by=ray)
    with pytest.raises(IdentityError, match="is not registered on dataset 'ds'"):
        register(catalog, mallory, "reviewer", by=mallory)
    with pytest.raises(IdentityError, match=r"holds the role\(s\) reviewer"):
        roles.revoke_key(catalog, dataset_id="ds", key_id=cara.key_id, signer=ray)
    with pytest.raises(IdentityError, match="the only custodian"):
        roles.revoke_key(catalog, dataset_id="ds", key_id=cara.key_id, signer=cara)
    with pytest.raises(IdentityError, match="the only custodian"):
        register(catalog, cara, "reviewer", by=cara)
    with pytest.raises(IdentityError, match=r"roles \['boss'\] must be one or more of"):
        register(catalog, ray, "boss", by=cara)
    with pytest.raises(IdentityError, match=r"roles \[\] must be one or more of"):
        register(catalog, ray, by=cara)
    with pytest.raises(IdentityError, match="key name 'a b' must be 1-64 letters"):
        register(catalog, ray, "reviewer", by=cara, name="a b")


def test_role_change_and_revocation_replay_by_ledger_point(catalog: Catalog) -> None:
    cara, ray = SigningKey.generate(), SigningKey.generate()
    register(catalog, cara, "custodian", by=cara)
    register(catalog, ray, "reviewer", by=cara)
    before = catalog.chain_head().seq
    register(catalog, ray, "reviewer", "operator", by=cara)  # a role change
    changed = catalog.chain_head().seq
    roles.revoke_key(catalog, dataset_id="ds", key_id=ray.key_id, signer=cara)
    assert roles.roster(catalog, "ds", upto=before).keys[ray.key_id].roles == ("reviewer",)
    assert roles.roster(catalog, "ds", upto=changed).holds(ray.key_id, "operator")
    now = roles.roster(catalog, "ds")
    assert not now.holds(ray.key_id, "reviewer")
    assert "was revoked" in str(now.refusal(ray.key_id, "reviewer", doing="approve"))
    with pytest.raises(IdentityError, match="already revoked"):
        roles.revoke_key(catalog, dataset_id="ds", key_id=ray.key_id, signer=cara)
    with pytest.raises(IdentityError, match="never registered again"):
        register(catalog, ray, "reviewer", by=cara)


def test_an_edited_identity_payload_no_longer_verifies(catalog: Catalog) -> None:
    cara, ray = SigningKey.generate(), SigningKey.generate()
    register(catalog, cara, "custodian", by=cara)
    register(catalog, ray, "reviewer", by=cara)
    with catalog.engine.begin() as conn:
        conn.execute(
            roles.identity_entries.update()
            .where(roles.identity_entries.c.key_id == ray.key_id)
            .values(roles="reviewer,custodian")
        )
    [problem] = roles.identity_problems(catalog, "ds")
    assert "does not match its stored row" in problem
    assert not roles.roster(catalog, "ds").holds(ray.key_id, "custodian")
    with catalog.engine.begin() as conn:
        conn.execute(
            sa.delete(roles.identity_entries).where(roles.identity_entries.c.key_id == ray.key_id)
        )
    [problem] = roles.identity_problems(catalog, "ds")
    assert "has no signed payload" in problem


def test_registration_needs_a_dataset_in_the_catalog(catalog: Catalog) -> None:
    key = SigningKey.generate()
    with pytest.raises(CatalogError, match="dataset 'other' is not in the catalog"):
        roles.register_key(
            catalog,
            dataset_id="other",
            public=key.public,
            name="k",
            roles=["custodian"],
            signer=key,
        )


def test_keys_register_revoke_roles_cli(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DPRELEASE_HOME", str(tmp_path))
    monkeypatch.delenv("DPRELEASE_KEY", raising=False)
    monkeypatch.delenv("DPRELEASE_CATALOG_URL", raising=False)
    for name in ("cara", "ray"):
        assert runner.invoke(app, ["keys", "create", name]).exit_code == 0
    absent = runner.invoke(
        app, ["keys", "register", "cara", "--dataset", "ds", "--role", "custodian"]
    )
    assert absent.exit_code == 2 and "add --spec SPEC" in absent.output
    Catalog().ensure_dataset("ds", cap=PrivacyCost(measure="pure", epsilon=2.0))
    monkeypatch.setenv("DPRELEASE_KEY", "ray")  # the first key signs itself all the same
    first = runner.invoke(
        app, ["keys", "register", "cara", "--dataset", "ds", "--role", "custodian"]
    )
    assert first.exit_code == 0, first.output
    monkeypatch.delenv("DPRELEASE_KEY")
    assert "now requires signed runs and reviews" in first.output
    refused = runner.invoke(
        app, ["keys", "register", "ray", "--dataset", "ds", "--role", "reviewer"]
    )
    assert refused.exit_code == 2 and "--as NAME" in refused.output
    pub = str(tmp_path / "keys" / "ray.pub")
    ok = runner.invoke(
        app, ["keys", "register", pub, "--dataset", "ds", "--role", "reviewer", "--as", "cara"]
    )
    assert ok.exit_code == 0, ok.output
    listed = runner.invoke(app, ["keys", "roles", "--dataset", "ds", "--json"])
    document = json.loads(listed.output)
    assert document["requires_signatures"] and document["problems"] == []
    assert {k["name"]: k["roles"] for k in document["keys"]} == {
        "cara": ["custodian"],
        "ray": ["reviewer"],
    }
    monkeypatch.setenv("DPRELEASE_KEY", "cara")
    revoked = runner.invoke(app, ["keys", "revoke", "ray", "--dataset", "ds"])
    assert revoked.exit_code == 0, revoked.output
    shown = runner.invoke(app, ["keys", "roles", "--dataset", "ds"])
    assert "revoked #" in shown.output
    for result in (first, ok, revoked, shown):
        assert "PRIVATE" not in result.output


def test_rotation_registers_the_new_key_with_the_old_roles_and_revokes_the_old_atomically(
    catalog: Catalog,
) -> None:
    cara, ray, ray2, other = (SigningKey.generate() for _ in range(4))
    register(catalog, cara, "custodian", by=cara, name="cara")
    register(catalog, ray, "reviewer", "auditor", by=cara, name="ray")
    before = len(catalog.ledger_entries("ds"))
    with pytest.raises(IdentityError, match="custodian"):  # only a custodian rotates
        roles.rotate_key(
            catalog, dataset_id="ds", old_key_id=ray.key_id, new_public=ray2.public,
            new_name="ray2", signer=ray,
        )  # fmt: skip
    with pytest.raises(IdentityError, match="already registered"):
        roles.rotate_key(
            catalog, dataset_id="ds", old_key_id=ray.key_id, new_public=cara.public,
            new_name="cara", signer=cara,
        )  # fmt: skip
    with pytest.raises(IdentityError, match="is not registered"):
        roles.rotate_key(
            catalog, dataset_id="ds", old_key_id=other.key_id, new_public=ray2.public,
            new_name="ray2", signer=cara,
        )  # fmt: skip
    with pytest.raises(IdentityError, match="key name 'ray 2' must be 1-64 letters"):
        roles.rotate_key(
            catalog, dataset_id="ds", old_key_id=ray.key_id, new_public=ray2.public,
            new_name="ray 2", signer=cara,
        )  # fmt: skip
    assert len(catalog.ledger_entries("ds")) == before  # refusals append nothing
    registered, revoked = roles.rotate_key(
        catalog, dataset_id="ds", old_key_id=ray.key_id, new_public=ray2.public,
        new_name="ray2", signer=cara,
    )  # fmt: skip
    entries = catalog.ledger_entries("ds")
    assert [e.receipt_id for e in entries[-2:]] == [registered, revoked]
    assert entries[-1].seq == entries[-2].seq + 1  # adjacent: nothing between them
    current = roles.roster(catalog, "ds")
    assert current.keys[ray2.key_id].roles == ("reviewer", "auditor")
    assert not current.holds(ray.key_id, "reviewer") and current.keys[ray.key_id].revoked_seq
    with pytest.raises(IdentityError, match=r"\(ledger entry #\d+\): register the new key"):
        roles.rotate_key(
            catalog, dataset_id="ds", old_key_id=ray.key_id, new_public=other.public,
            new_name="ray3", signer=cara,
        )  # fmt: skip
    assert roles.identity_problems(catalog, "ds") == [] and catalog.verify_chain() == []
    # the sole custodian rotates its own key, signing both entries with it
    roles.rotate_key(
        catalog, dataset_id="ds", old_key_id=cara.key_id, new_public=other.public,
        new_name="cara2", signer=cara,
    )  # fmt: skip
    current = roles.roster(catalog, "ds")
    assert current.holders("custodian") == [other.key_id]
    assert roles.identity_problems(catalog, "ds") == []


def test_a_rotation_that_fails_midway_appends_neither_entry(
    catalog: Catalog, monkeypatch: pytest.MonkeyPatch
) -> None:
    cara, ray, ray2 = (SigningKey.generate() for _ in range(3))
    register(catalog, cara, "custodian", by=cara, name="cara")
    register(catalog, ray, "reviewer", by=cara, name="ray")
    before = catalog.ledger_entries("ds")
    real = roles._signed_record
    made = []

    def failing_second(**kwargs: object) -> object:
        record = real(**kwargs)  # type: ignore[arg-type]
        made.append(record)
        if len(made) < 2:
            return record

        def broken(conn: object, receipt: str) -> None:
            raise RuntimeError("the database went away after the registration was written")

        return type(record)(label=record.label, kind=record.kind, also=broken)

    monkeypatch.setattr(roles, "_signed_record", failing_second)
    with pytest.raises(RuntimeError, match="went away"):
        roles.rotate_key(
            catalog, dataset_id="ds", old_key_id=ray.key_id, new_public=ray2.public,
            new_name="ray2", signer=cara,
        )  # fmt: skip
    assert catalog.ledger_entries("ds") == before
    assert ray2.key_id not in roles.roster(catalog, "ds").keys


def test_keys_rotate_cli(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DPRELEASE_HOME", str(tmp_path))
    monkeypatch.delenv("DPRELEASE_KEY", raising=False)
    monkeypatch.delenv("DPRELEASE_CATALOG_URL", raising=False)
    for name in ("cara", "ray", "ray2"):
        assert runner.invoke(app, ["keys", "create", name]).exit_code == 0
    Catalog().ensure_dataset("ds", cap=PrivacyCost(measure="pure", epsilon=2.0))
    for name, role in (("cara", "custodian"), ("ray", "reviewer")):
        done = runner.invoke(
            app, ["keys", "register", name, "--dataset", "ds", "--role", role, "--as", "cara"]
        )
        assert done.exit_code == 0, done.output
    refused = runner.invoke(app, ["keys", "rotate", "ray", "ray2", "--dataset", "ds"])
    assert refused.exit_code == 2 and "--as NAME" in refused.output
    rotated = runner.invoke(
        app, ["keys", "rotate", "ray", "ray2", "--dataset", "ds", "--as", "cara"]
    )
    assert rotated.exit_code == 0, rotated.output
    assert "(register)" in rotated.output and "(revoke)" in rotated.output
    document = json.loads(runner.invoke(app, ["keys", "roles", "--dataset", "ds", "--json"]).output)
    states = {k["name"]: k for k in document["keys"]}
    assert states["ray2"]["roles"] == ["reviewer"] and states["ray2"]["revoked_seq"] is None
    assert states["ray"]["revoked_seq"] == states["ray2"]["registered_seq"] + 1
    again = runner.invoke(app, ["keys", "rotate", "ray", "ray2", "--dataset", "ds", "--as", "cara"])
    assert again.exit_code == 2 and "already revoked" in again.output
    assert "PRIVATE" not in rotated.output + again.output
