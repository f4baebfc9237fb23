"""``dprelease keys``: Ed25519 signing keys under ``$DPRELEASE_HOME/keys`` (:mod:`catalog.identity`).

A private key (``<name>.key``, mode 0600) never leaves this folder and is never printed; the
public key (``<name>.pub``) is what a custodian registers and a verifier trusts."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Annotated, Any

import typer

from dprelease.flows.cli.common import JsonOption, command_group, console, print_json, stdout

keys_app = command_group(
    "keys",
    "Signing keys for reviewers, operators and services: create, list and show them "
    "($DPRELEASE_HOME/keys; private keys mode 0600, never printed); register and revoke them "
    "with roles on a dataset (signed ledger entries).",
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


_DATASET = typer.Option("--dataset", help="The dataset id the roles are for.")
_SIGNER = typer.Option(
    "--as",
    help="Your key (a custodian of the dataset) that signs this change; default $DPRELEASE_KEY, "
    "or for a dataset's first key the key itself.",
)
_SPEC = typer.Option(
    "--spec",
    help="A spec of the dataset: registers the dataset (with its budget cap) in the catalog if "
    "no release of it ran yet.",
)


def _public_key(key: str) -> tuple[str, Any]:
    """A key named on the command line: a local key name or a path to a ``.pub`` file."""
    from dprelease.catalog.identity.keys import NAME, read_public_key, show_key

    info = show_key(key) if NAME.fullmatch(key) and "/" not in key else None
    if info is None:
        info = read_public_key(Path(key))
    return info.name, info.public


def _signer(name: str | None) -> Any:
    from dprelease.catalog.identity.keys import IdentityError, load_signing_key
    from dprelease.catalog.identity.signing import KEY_ENV

    chosen = name or os.environ.get(KEY_ENV, "").strip()
    if not chosen:
        raise IdentityError(f"--as NAME (or {KEY_ENV}): which of your keys signs this change")
    return load_signing_key(chosen)


def _catalog_with(dataset: str | None, spec: Path | None) -> tuple[Any, str]:
    from dprelease.catalog.errors import DprReleaseError
    from dprelease.catalog.ledger.store import Catalog

    catalog = Catalog()
    if spec is None:
        if dataset is None:
            raise DprReleaseError("--dataset ID (or --spec SPEC) names the dataset")
        if dataset not in catalog.dataset_ids():
            raise DprReleaseError(
                f"dataset {dataset!r} is not in the catalog (no release of it ran yet): add "
                "--spec SPEC, its spec, to register it with its budget cap"
            )
        return catalog, dataset
    from dprelease.catalog import partitions
    from dprelease.catalog.spec.load import load_spec

    loaded = load_spec(spec)
    if dataset is not None and dataset != loaded.dataset.id:
        raise DprReleaseError(f"--dataset {dataset!r} is not the spec's ({loaded.dataset.id!r})")
    catalog.ensure_dataset(
        loaded.dataset.id,
        cap=loaded.dataset.budget_cap(),
        partitioned_by=partitions.declaration(loaded),
    )
    return catalog, loaded.dataset.id


@keys_app.command()
def register(
    key: Annotated[str, typer.Argument(help="A local key name or a path to a NAME.pub file.")],
    role: Annotated[
        list[str],
        typer.Option(help="custodian, operator, reviewer or auditor (repeatable)."),
    ],
    dataset: Annotated[str | None, _DATASET] = None,
    signer: Annotated[str | None, _SIGNER] = None,
    spec: Annotated[Path | None, _SPEC] = None,
) -> None:
    """Register a public key with roles on a dataset (or change a registered key's roles): a
    signed ledger entry.  From its first key on, the dataset requires signed runs and reviews."""
    from dprelease.catalog.identity import roles

    name, public = _public_key(key)
    catalog, dataset_id = _catalog_with(dataset, spec)
    first = not roles.requires_signatures(catalog, dataset_id)
    # a dataset's first key signs its own registration, whatever DPRELEASE_KEY names
    signing = _signer(signer or (name if first else None))
    receipt = roles.register_key(
        catalog, dataset_id=dataset_id, public=public, name=name, roles=role, signer=signing
    )
    granted = ", ".join(roles.check_roles(role))
    stdout.print(f"registered key {public.key_id} ({name}) on {dataset_id} as {granted}")
    stdout.print(f"ledger receipt {receipt}, signed by {signing.key_id}")
    if first:
        stdout.print(f"dataset {dataset_id} now requires signed runs and reviews")


@keys_app.command()
def revoke(
    key: Annotated[str, typer.Argument(help="A key id, a local key name or a NAME.pub path.")],
    dataset: Annotated[str, _DATASET],
    signer: Annotated[str | None, _SIGNER] = None,
) -> None:
    """Revoke a key on a dataset: it holds no role from this ledger entry on; its earlier
    signatures still verify."""
    from dprelease.catalog.identity import roles
    from dprelease.catalog.ledger.store import Catalog

    key_id = key if re.fullmatch(r"[0-9a-f]{64}", key) else _public_key(key)[1].key_id
    signing = _signer(signer)
    receipt = roles.revoke_key(Catalog(), dataset_id=dataset, key_id=key_id, signer=signing)
    stdout.print(f"revoked key {key_id} on {dataset}: ledger receipt {receipt}")


@keys_app.command()
def rotate(
    old: Annotated[
        str, typer.Argument(help="The key replaced: a key id, a local key name or a NAME.pub path.")
    ],
    new: Annotated[str, typer.Argument(help="The new key: a local key name or a NAME.pub path.")],
    dataset: Annotated[str, _DATASET],
    signer: Annotated[str | None, _SIGNER] = None,
) -> None:
    """Replace a key on a dataset: register NEW with OLD's roles and revoke OLD, in one signed,
    atomic step (two ledger entries, one transaction).  OLD's earlier signatures still verify."""
    from dprelease.catalog.identity import roles
    from dprelease.catalog.ledger.store import Catalog

    old_id = old if re.fullmatch(r"[0-9a-f]{64}", old) else _public_key(old)[1].key_id
    name, public = _public_key(new)
    signing = _signer(signer)
    registered, revoked = roles.rotate_key(
        Catalog(),
        dataset_id=dataset,
        old_key_id=old_id,
        new_public=public,
        new_name=name,
        signer=signing,
    )
    stdout.print(f"rotated on {dataset}: key {old_id} replaced by {public.key_id} ({name})")
    stdout.print(
        f"ledger receipts {registered} (register), {revoked} (revoke), signed by {signing.key_id}"
    )


@keys_app.command("roles")
def roles_(
    dataset: Annotated[str, _DATASET],
    as_json: JsonOption = False,
) -> None:
    """Every key registered on a dataset with its roles, and whether it was revoked; and whether
    the dataset requires signatures."""
    from dprelease.catalog.identity import roles
    from dprelease.catalog.ledger.store import Catalog

    catalog = Catalog()
    current = roles.roster(catalog, dataset)
    problems = roles.identity_problems(catalog, dataset)
    if as_json:
        print_json(
            {
                "dataset_id": dataset,
                "requires_signatures": bool(current.keys) or bool(problems),
                "keys": [state.as_dict() for state in current.keys.values()],
                "problems": problems,
            }
        )
        return
    if not current.keys:
        stdout.print(f"{dataset}: no registered keys; runs and reviews are not signed")
    for state in current.keys.values():
        revoked = f"  revoked #{state.revoked_seq} {state.revoked_at}" if state.revoked_seq else ""
        stdout.print(
            f"{state.key_id}  {state.name}  {','.join(state.roles)}  "
            f"registered #{state.registered_seq} {state.registered_at}{revoked}"
        )
    for problem in problems:
        console.print(f"warning: {problem}")
