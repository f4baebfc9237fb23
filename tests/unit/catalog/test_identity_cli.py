"""``dprelease keys create|list|show`` (no Prefect): the pair is written, the private key is
never printed, an existing key is never overwritten."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dprelease.catalog.identity.keys import load_signing_key
from dprelease.flows.cli import app

runner = CliRunner()


def test_keys_create_list_show(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DPRELEASE_HOME", str(tmp_path))
    assert "no keys in" in runner.invoke(app, ["keys", "list"]).output
    created = runner.invoke(app, ["keys", "create", "ada"])
    assert created.exit_code == 0, created.output
    key = load_signing_key("ada", home=tmp_path)
    private = tmp_path / "keys" / "ada.key"
    assert stat.S_IMODE(private.stat().st_mode) == 0o600
    assert key.key_id in created.output and str(tmp_path / "keys" / "ada.pub") in created.output
    listed = runner.invoke(app, ["keys", "list"])
    assert listed.exit_code == 0 and f"ada  {key.key_id}" in listed.output
    shown = runner.invoke(app, ["keys", "show", "ada"])
    assert shown.exit_code == 0 and f"public: {key.public.base64}" in shown.output
    pem_body = "".join(private.read_text().splitlines()[1:-1])
    for result in (created, listed, shown):
        assert pem_body not in result.output and "PRIVATE" not in result.output
    again = runner.invoke(app, ["keys", "create", "ada"])
    assert again.exit_code == 2 and "never overwritten" in again.output
    assert load_signing_key("ada", home=tmp_path).key_id == key.key_id
    missing = runner.invoke(app, ["keys", "show", "grace"])
    assert missing.exit_code == 2 and "no public key file" in missing.output
