"""``dprelease keys``: Ed25519 signing keys under ``$DPRELEASE_HOME/keys`` (:mod:`catalog.identity`).

A private key (``<name>.key``, mode 0600) never leaves this folder and is never printed; the
public key (``<name>.pub``) is what a custodian registers and a verifier trusts."""

from __future__ import annotations

from typing import Annotated

import typer

from dprelease.flows.cli.common import command_group, stdout

keys_app = command_group(
    "keys",
    "Signing keys for reviewers, operators and services: create, list and show them "
    "($DPRELEASE_HOME/keys; private keys mode 0600, never printed).",
)

_NAME = typer.Argument(help="Key name: letters, digits, '.', '_' or '-' (at most 64).")


@keys_app.command()
def create(name: Annotated[str, _NAME]) -> None:
    """Create an Ed25519 key pair NAME.key (mode 0600) and NAME.pub; never overwrites a key."""
    from dprelease.catalog.identity.keys import create_key

    _, info = create_key(name)
    stdout.print(f"created key {info.name}: key id {info.key_id}")
    stdout.print(f"public key: {info.public_path}")


@keys_app.command("list")
def list_() -> None:
    """Every key pair: name, key id and when it was created."""
    from dprelease.catalog.identity.keys import keys_folder, list_keys

    found = list_keys()
    if not found:
        stdout.print(f"no keys in {keys_folder()} (create one: dprelease keys create NAME)")
    for info in found:
        stdout.print(f"{info.name}  {info.key_id}  {info.created}")


@keys_app.command()
def show(name: Annotated[str, _NAME]) -> None:
    """The public key NAME: key id, scheme and base64 raw key (never the private key)."""
    from dprelease.catalog.identity.keys import show_key

    info = show_key(name)
    stdout.print(f"name: {info.name}\nkeyid: {info.key_id}\nscheme: ed25519")
    stdout.print(f"public: {info.public.base64}\ncreated: {info.created}\nfile: {info.public_path}")
