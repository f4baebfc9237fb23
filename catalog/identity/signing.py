"""Signed steps of a release: its run and every charge it pays, signed by the operator's key.

The key is chosen by name (``DPRELEASE_KEY``, or a command's ``--key`` which sets it) and loaded
in the process that signs, from ``$DPRELEASE_HOME/keys``: only its public key id is ever recorded,
passed between processes or shown.  A step is an in-toto-style JSON document in a DSSE envelope
(:data:`PAYLOAD_TYPE`) kept in table ``signed_steps`` (its own ``MetaData``): ``run`` binds the
release id, dataset and spec fingerprint; ``charge`` binds a ledger entry's receipt id and hash.
Each records the ledger's head ``seq`` when it was signed, the point of the chain whose roles
(:mod:`.roles`) it is checked against.  On a dataset that requires signatures, a run without an
operator key holding the ``operator`` role is refused before anything is charged.
"""

from __future__ import annotations

import json
import os
from dataclasses import KW_ONLY, dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from dprelease.catalog.identity.dsse import Envelope, sign_envelope, verify_envelope
from dprelease.catalog.identity.keys import IdentityError, SigningKey, load_signing_key
from dprelease.catalog.identity.roles import Roster, requires_signatures, roster
from dprelease.catalog.ledger.budget import DatasetAccountant
from dprelease.catalog.ledger.schema import ledger, now, release_rows, with_tables
from dprelease.catalog.ledger.store import Catalog

KEY_ENV = "DPRELEASE_KEY"
PAYLOAD_TYPE = "application/vnd.dprelease.step+json"
STEP_TYPE = "https://dprelease.dev/step/v1"
STEPS = ("run", "charge")

steps_metadata = sa.MetaData()

signed_steps = sa.Table(
    "signed_steps",
    steps_metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("release_id", sa.String(128), nullable=False, index=True),
    sa.Column("dataset_id", sa.String(64), nullable=False),
    sa.Column("step", sa.String(16), nullable=False),
    sa.Column("receipt_id", sa.String(64), unique=True),  # the charge's; None for a run
    sa.Column("key_id", sa.String(64), nullable=False),
    sa.Column("ledger_seq", sa.Integer, nullable=False),
    sa.Column("signed_at", sa.String(40), nullable=False),
    sa.Column("envelope", sa.Text, nullable=False),
)


def _engine(catalog: Catalog) -> Engine:
    return with_tables(catalog.engine, steps_metadata)


def chosen_key_name() -> str | None:
    """The name of the key this process signs with (``DPRELEASE_KEY``), or None."""
    return os.environ.get(KEY_ENV, "").strip() or None


def load_chosen_key() -> SigningKey | None:
    name = chosen_key_name()
    return None if name is None else load_signing_key(name)


def check_operator(catalog: Catalog, dataset_id: str, *, key: SigningKey | None) -> None:
    """Refuse a run of ``dataset_id`` when it requires signatures and ``key`` (the chosen key) is
    missing or does not hold the operator role now.  Reads only."""
    if not requires_signatures(catalog, dataset_id):
        return
    if key is None:
        raise IdentityError(
            f"dataset {dataset_id!r} requires signed runs: choose an operator key with --key NAME "
            f"or {KEY_ENV}=NAME (see dprelease keys roles --dataset {dataset_id})"
        )
    refusal = roster(catalog, dataset_id).refusal(
        key.key_id, "operator", doing=f"run releases of dataset {dataset_id!r}"
    )
    if refusal is not None:
        raise IdentityError(refusal)


def _sign(
    catalog: Catalog, *, key: SigningKey, release_id: str, dataset_id: str, step: str, **bound: Any
) -> None:
    seq = catalog.chain_head().seq
    statement = {
        "_type": STEP_TYPE,
        "step": step,
        "release_id": release_id,
        "dataset_id": dataset_id,
        "ledger_seq": seq,
        **bound,
    }
    payload = json.dumps(statement, sort_keys=True, separators=(",", ":")).encode()
    envelope = sign_envelope(payload, payload_type=PAYLOAD_TYPE, keys=key)
    with _engine(catalog).begin() as conn:
        conn.execute(
            signed_steps.insert().values(
                release_id=release_id,
                dataset_id=dataset_id,
                step=step,
                receipt_id=bound.get("receipt_id"),
                key_id=key.key_id,
                ledger_seq=seq,
                signed_at=now(),
                envelope=json.dumps(envelope.as_dict(), sort_keys=True),
            )
        )


def sign_run(
    catalog: Catalog, *, key: SigningKey, release_id: str, dataset_id: str, spec_fingerprint: str
) -> None:
    """Record that ``key`` runs ``release_id`` (its operator key)."""
    _sign(
        catalog,
        key=key,
        release_id=release_id,
        dataset_id=dataset_id,
        step="run",
        spec_fingerprint=spec_fingerprint,
    )


def sign_charges(catalog: Catalog, *, key: SigningKey, release_id: str, dataset_id: str) -> int:
    """Sign every charge entry of ``release_id`` not signed yet (its entry hash); how many.
    O(entries of the release)."""
    engine = _engine(catalog)
    with engine.connect() as conn:
        unsigned = conn.execute(
            sa.select(ledger.c.receipt_id, ledger.c.entry_hash)
            .where(
                ledger.c.release_id == release_id,
                ledger.c.entry_kind == "charge",
                ledger.c.receipt_id.not_in(
                    sa.select(signed_steps.c.receipt_id).where(
                        signed_steps.c.receipt_id.is_not(None)
                    )
                ),
            )
            .order_by(ledger.c.seq)
        ).all()
    for receipt_id, entry_hash in unsigned:
        _sign(
            catalog,
            key=key,
            release_id=release_id,
            dataset_id=dataset_id,
            step="charge",
            receipt_id=receipt_id,
            entry_hash=entry_hash,
        )
    return len(unsigned)


def sign_unsigned(
    catalog: Catalog, *, release_id: str, dataset_id: str, spec_fingerprint: str
) -> int:
    """With a chosen key: sign ``release_id``'s run if unsigned and every charge not signed yet
    (a charging path other than :class:`SignedAccountant`, e.g. a series period); how many
    charges.  Without one: nothing (``verify`` names unsigned charges on a dataset with keys)."""
    key = load_chosen_key()
    if key is None:
        return 0
    if not any(row.step == "run" for row in steps(catalog, release_id)):
        sign_run(
            catalog,
            key=key,
            release_id=release_id,
            dataset_id=dataset_id,
            spec_fingerprint=spec_fingerprint,
        )
    return sign_charges(catalog, key=key, release_id=release_id, dataset_id=dataset_id)


@dataclass(eq=False)
class SignedAccountant(DatasetAccountant):
    """A :class:`DatasetAccountant` whose every charge is then signed by the operator's key (the
    key is loaded in the process that charges; only its id is kept)."""

    _: KW_ONLY
    key_name: str | None = None

    def charge(self, cost: Any, *, label: str) -> str:
        receipt = super().charge(cost, label=label)
        if self.key_name is not None and isinstance(self.catalog, Catalog):
            key = load_signing_key(self.key_name)
            sign_charges(
                self.catalog, key=key, release_id=self.release_id, dataset_id=self.dataset_id
            )
        return receipt


def steps(catalog: Catalog, release_id: str) -> list[Any]:
    """The stored signed-step rows of ``release_id`` in the order they were signed."""
    return release_rows(_engine(catalog), signed_steps, release_id)


def operator_keys(catalog: Catalog, release_id: str) -> set[str]:
    """The key ids that signed ``release_id``'s run or charges (its operator's keys)."""
    return {row.key_id for row in steps(catalog, release_id)}


def _role_problem(rosters: dict[int, Roster], catalog: Catalog, row: Any, role: str) -> str | None:
    if row.ledger_seq not in rosters:
        rosters[row.ledger_seq] = roster(catalog, row.dataset_id, upto=row.ledger_seq)
    return rosters[row.ledger_seq].refusal(row.key_id, role, doing=f"sign a {row.step}")


def step_problems(catalog: Catalog, release_id: str, dataset_id: str) -> list[str]:
    """Every signed step of ``release_id`` that does not verify (signature, what it binds, the
    operator role when it was signed), and every charge of it left unsigned on a dataset that
    required signatures then.  O(steps · identity entries)."""
    problems: list[str] = []
    rosters: dict[int, Roster] = {}
    signed_receipts = set()
    with catalog.engine.connect() as conn:
        hashes = dict(
            conn.execute(
                sa.select(ledger.c.receipt_id, ledger.c.entry_hash).where(
                    ledger.c.release_id == release_id, ledger.c.entry_kind == "charge"
                )
            ).all()
        )
    for row in steps(catalog, release_id):
        where = f"signed {row.step} of {release_id} by key {row.key_id}"
        problem = _role_problem(rosters, catalog, row, "operator")
        state = rosters[row.ledger_seq].keys.get(row.key_id)
        try:
            envelope = Envelope.from_dict(json.loads(row.envelope))
            statement = json.loads(envelope.payload)
        except (IdentityError, ValueError) as exc:
            problems.append(f"{where}: its envelope cannot be read ({exc})")
            continue
        trusted = {} if state is None else {row.key_id: state.public}
        if row.key_id not in verify_envelope(envelope, trusted, payload_type=PAYLOAD_TYPE):
            problem = problem or "its signature does not verify"
        expected = {"release_id": release_id, "ledger_seq": row.ledger_seq, "step": row.step}
        if row.step == "charge":
            expected |= {"receipt_id": row.receipt_id, "entry_hash": hashes.get(row.receipt_id)}
            signed_receipts.add(row.receipt_id)
        if not isinstance(statement, dict) or any(
            statement.get(k) != v for k, v in expected.items()
        ):
            problem = problem or "it does not sign this release's step (edited or moved)"
        if problem is not None:
            problems.append(f"{where}: {problem}")
    if requires_signatures(catalog, dataset_id):
        first_key = min(
            (s.registered_seq for s in roster(catalog, dataset_id).keys.values()), default=None
        )
        with catalog.engine.connect() as conn:
            charges = conn.execute(
                sa.select(ledger.c.receipt_id, ledger.c.seq).where(
                    ledger.c.release_id == release_id, ledger.c.entry_kind == "charge"
                )
            ).all()
        problems += [
            f"charge {receipt} of {release_id} is not signed by an operator key"
            for receipt, seq in charges
            if receipt not in signed_receipts and first_key is not None and seq > first_key
        ]
    return problems
