"""Who may do what on a dataset: public keys registered with roles, as entries of the hash-chained
ledger.

A registration (a key with its roles; registering a registered key again changes its roles) or a
revocation is a zero-cost ledger entry of kind ``key`` whose label anchors the SHA-256 of a
signed payload kept in table ``identity_entries`` (its own ``MetaData``).  The payload, an
:data:`PAYLOAD_TYPE` JSON document in a DSSE envelope, is signed by a key holding the
``custodian`` role on the dataset at that point of the chain; the first registration of a dataset
is its custodian's, signed by the key it registers.  Rotation (:func:`rotate_key`) is a
registration of the new key and a revocation of the old one, in one transaction.  A revoked key stays known (its earlier signatures still verify) and
holds no role after its revocation.

Roles: ``custodian`` (registers and revokes keys), ``operator`` (runs releases and spends),
``reviewer`` (approves or rejects), ``auditor`` (reads).  A dataset with at least one registered
key requires signatures: see :func:`requires_signatures`.  Everything stored here is public.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from dprelease.catalog.identity.dsse import Envelope, sign_envelope, verify_envelope
from dprelease.catalog.identity.keys import NAME, IdentityError, PublicKey, SigningKey
from dprelease.catalog.ledger.budget import ZeroCostRecord
from dprelease.catalog.ledger.schema import ledger, now, with_tables
from dprelease.catalog.ledger.store import Catalog

ROLES = ("custodian", "operator", "reviewer", "auditor")
ACTIONS = ("register", "revoke")
ENTRY_KIND = "key"
PAYLOAD_TYPE = "application/vnd.dprelease.identity+json"
STATEMENT_TYPE = "https://dprelease.dev/identity/v1"
LEDGER_RELEASE_ID = "keys"  # the ledger's release_id of identity entries (no release pays them)

identity_metadata = sa.MetaData()

identity_entries = sa.Table(
    "identity_entries",
    identity_metadata,
    sa.Column("receipt_id", sa.String(64), primary_key=True),
    sa.Column("dataset_id", sa.String(64), nullable=False, index=True),
    sa.Column("action", sa.String(16), nullable=False),
    sa.Column("key_id", sa.String(64), nullable=False),
    sa.Column("public_key", sa.String(64), nullable=False),
    sa.Column("key_name", sa.String(64), nullable=False),
    sa.Column("roles", sa.String(128), nullable=False),
    sa.Column("signer_key_id", sa.String(64), nullable=False),
    sa.Column("payload_sha256", sa.String(64), nullable=False),
    sa.Column("envelope", sa.Text, nullable=False),
)


def prepared(catalog: Catalog) -> Engine:
    """The catalog's engine, with the identity table created on first use (once per engine)."""
    return with_tables(catalog.engine, identity_metadata)


def check_roles(roles: Iterable[str]) -> tuple[str, ...]:
    """``roles`` in :data:`ROLES` order; refused when empty or unknown."""
    given = set(roles)
    unknown = sorted(given - set(ROLES))
    if unknown or not given:
        raise IdentityError(
            f"roles {sorted(given)!r} must be one or more of {', '.join(ROLES)}"
            + (f" (unknown: {', '.join(unknown)})" if unknown else "")
        )
    return tuple(role for role in ROLES if role in given)


@dataclass
class KeyState:
    """One key as the ledger knows it at some point: its roles, when registered and revoked."""

    key_id: str
    public: PublicKey
    name: str
    roles: tuple[str, ...]
    registered_seq: int
    registered_at: str
    revoked_seq: int | None = None
    revoked_at: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "key_id": self.key_id,
            "name": self.name,
            "roles": list(self.roles),
            "registered_seq": self.registered_seq,
            "registered_at": self.registered_at,
            "revoked_seq": self.revoked_seq,
            "revoked_at": self.revoked_at,
        }


@dataclass
class Roster:
    """The keys of one dataset as of ledger entry ``upto`` (None: now)."""

    dataset_id: str
    keys: dict[str, KeyState] = field(default_factory=dict)

    def holds(self, key_id: str, role: str) -> bool:
        state = self.keys.get(key_id)
        return state is not None and state.revoked_seq is None and role in state.roles

    def holders(self, role: str) -> list[str]:
        return [key_id for key_id in self.keys if self.holds(key_id, role)]

    def refusal(self, key_id: str, role: str, *, doing: str) -> str | None:
        """Why ``key_id`` may not ``doing`` (which needs ``role``), or None when it may."""
        state = self.keys.get(key_id)
        if state is None:
            return (
                f"key {key_id} is not registered on dataset {self.dataset_id!r}; {doing} needs a "
                f"key with the {role} role (its custodian registers one: dprelease keys register)"
            )
        if state.revoked_seq is not None:
            return (
                f"key {key_id} ({state.name}) was revoked on dataset {self.dataset_id!r} at "
                f"ledger entry #{state.revoked_seq} ({state.revoked_at}); it may not {doing}"
            )
        if role not in state.roles:
            return (
                f"key {key_id} ({state.name}) holds the role(s) {', '.join(state.roles)} on "
                f"dataset {self.dataset_id!r}, not {role}: it may not {doing}"
            )
        return None


@dataclass(frozen=True, kw_only=True)
class IdentityEntry:
    """An identity entry of the ledger with its signed payload (as stored; not yet verified)."""

    seq: int
    receipt_id: str
    label: str
    created_at: str
    row: Any  # the identity_entries row, or None when it is missing


def payload_digest(payload: bytes) -> str:
    return hashlib.sha256(payload).hexdigest()


def _label(action: str, key_id: str, roles: tuple[str, ...], digest: str) -> str:
    what = f"as {','.join(roles)}" if action == "register" else "revoked"
    return f"key {action} {key_id} {what}; payload sha256 {digest}"


def entries(catalog: Catalog, dataset_id: str) -> list[IdentityEntry]:
    """The dataset's identity entries in chain order, each with its stored payload row.
    O(entries of the dataset)."""
    engine = prepared(catalog)
    query = (
        sa.select(
            ledger.c.seq,
            ledger.c.receipt_id,
            ledger.c.label,
            ledger.c.created_at,
            *identity_entries.c,
        )
        .select_from(
            ledger.outerjoin(identity_entries, identity_entries.c.receipt_id == ledger.c.receipt_id)
        )
        .where(ledger.c.dataset_id == dataset_id, ledger.c.entry_kind == ENTRY_KIND)
        .order_by(ledger.c.seq)
    )
    with engine.connect() as conn:
        rows = conn.execute(query).all()
    return [
        IdentityEntry(
            seq=row[0],
            receipt_id=row[1],
            label=row[2],
            created_at=row[3],
            row=None if row.key_id is None else row,
        )
        for row in rows
    ]


def _apply(roster: Roster, entry: IdentityEntry) -> None:
    row = entry.row
    if row.action == "register":
        state = roster.keys.get(row.key_id)
        if state is not None and state.revoked_seq is None:
            state.roles = tuple(row.roles.split(","))
            state.name = row.key_name
        else:
            roster.keys[row.key_id] = KeyState(
                key_id=row.key_id,
                public=PublicKey.from_base64(row.public_key),
                name=row.key_name,
                roles=tuple(row.roles.split(",")),
                registered_seq=entry.seq,
                registered_at=entry.created_at,
            )
    elif row.key_id in roster.keys:
        roster.keys[row.key_id].revoked_seq = entry.seq
        roster.keys[row.key_id].revoked_at = entry.created_at


def roster(catalog: Catalog, dataset_id: str, *, upto: int | None = None) -> Roster:
    """The dataset's keys and roles as of ledger entry ``upto`` (inclusive; None: now), replayed
    from the identity entries that verify (:func:`identity_problems` names the others).
    O(entries of the dataset)."""
    result = Roster(dataset_id)
    for entry in entries(catalog, dataset_id):
        if upto is not None and entry.seq > upto:
            break
        if _entry_problem(result, entry) is None:
            _apply(result, entry)
    return result


def requires_signatures(catalog: Catalog, dataset_id: str) -> bool:
    """Does ``dataset_id`` require signed steps (its custodian registered at least one key)?"""
    return bool(entries(catalog, dataset_id))


def _entry_problem(current: Roster, entry: IdentityEntry) -> str | None:
    """Why ``entry`` does not verify against the roster before it, or None.  O(1)."""
    row = entry.row
    where = f"identity entry #{entry.seq} (receipt {entry.receipt_id})"
    if row is None:
        return f"{where} has no signed payload in table identity_entries"
    try:
        envelope = Envelope.from_dict(json.loads(row.envelope))
    except (IdentityError, ValueError) as exc:
        return f"{where}: its envelope cannot be read ({exc})"
    digest = payload_digest(envelope.payload)
    if digest != row.payload_sha256 or not entry.label.endswith(f"payload sha256 {digest}"):
        return f"{where}: its payload is not the one the ledger entry anchors"
    try:
        payload = json.loads(envelope.payload)
    except ValueError:
        return f"{where}: its payload is not JSON"
    stored = {
        "_type": STATEMENT_TYPE,
        "dataset_id": current.dataset_id,
        "action": row.action,
        "key_id": row.key_id,
        "public_key": row.public_key,
        "name": row.key_name,
        "roles": row.roles.split(",") if row.action == "register" else [],
    }
    if not isinstance(payload, dict) or {k: payload.get(k) for k in stored} != stored:
        return f"{where}: its signed payload does not match its stored row"
    try:
        public = PublicKey.from_base64(row.public_key)
    except IdentityError as exc:
        return f"{where}: {exc}"
    if public.key_id != row.key_id:
        return f"{where}: key id {row.key_id} is not the SHA-256 of its public key"
    trusted = {k: current.keys[k].public for k in current.holders("custodian")}
    if not current.keys and row.action == "register" and "custodian" in stored["roles"]:
        trusted = {row.key_id: public}  # a dataset's first key: its custodian, self-signed
    if row.signer_key_id not in verify_envelope(envelope, trusted, payload_type=PAYLOAD_TYPE):
        return (
            f"{where}: not signed by a key holding the custodian role on dataset "
            f"{current.dataset_id!r} at that point"
        )
    return None


def identity_problems(catalog: Catalog, dataset_id: str) -> list[str]:
    """Every identity entry of ``dataset_id`` that does not verify (its payload, anchor and
    custodian signature), in chain order.  O(entries of the dataset)."""
    problems = []
    current = Roster(dataset_id)
    for entry in entries(catalog, dataset_id):
        problem = _entry_problem(current, entry)
        if problem is None:
            _apply(current, entry)
        else:
            problems.append(problem)
    return problems


def _append_entries(catalog: Catalog, dataset_id: str, records: list[ZeroCostRecord]) -> list[str]:
    """Append identity entries to ``dataset_id``'s ledger in one transaction (all or none);
    their receipt ids, in order."""
    prepared(catalog)
    return catalog.append_records(
        dataset_id=dataset_id, release_id=LEDGER_RELEASE_ID, records=records
    )


def _signed_record(
    *,
    dataset_id: str,
    action: str,
    public: PublicKey,
    name: str,
    roles: tuple[str, ...],
    signer: SigningKey,
) -> ZeroCostRecord:
    """The signed payload of one identity entry, as the ledger record that anchors it."""
    payload = json.dumps(
        {
            "_type": STATEMENT_TYPE,
            "dataset_id": dataset_id,
            "action": action,
            "key_id": public.key_id,
            "public_key": public.base64,
            "name": name,
            "roles": list(roles),
            "at": now(),
        },
        sort_keys=True,
        separators=(",", ":"),
    ).encode()
    envelope = sign_envelope(payload, payload_type=PAYLOAD_TYPE, keys=signer)
    digest = payload_digest(payload)

    def store(conn: Connection, receipt_id: str) -> None:
        conn.execute(
            identity_entries.insert().values(
                receipt_id=receipt_id,
                dataset_id=dataset_id,
                action=action,
                key_id=public.key_id,
                public_key=public.base64,
                key_name=name,
                roles=",".join(roles),
                signer_key_id=signer.key_id,
                payload_sha256=digest,
                envelope=json.dumps(envelope.as_dict(), sort_keys=True),
            )
        )

    return ZeroCostRecord(
        label=_label(action, public.key_id, roles, digest), kind=ENTRY_KIND, also=store
    )


def _check_custodian(current: Roster, signer: SigningKey, *, doing: str) -> None:
    refusal = current.refusal(signer.key_id, "custodian", doing=doing)
    if refusal is not None:
        raise IdentityError(refusal)


def _check_key_name(name: str) -> None:
    if not isinstance(name, str) or not NAME.fullmatch(name):
        raise IdentityError(
            f"key name {name!r} must be 1-64 letters, digits, '.', '_' or '-', starting with a "
            "letter or digit"
        )


def _unrevoked_key(current: Roster, key_id: str, *, if_revoked: str = "") -> KeyState:
    """``key_id``'s state on ``current``'s dataset; refused when it is not registered there or is
    revoked already (``if_revoked``: what to do instead, appended to that message)."""
    state = current.keys.get(key_id)
    if state is None:
        raise IdentityError(f"key {key_id} is not registered on dataset {current.dataset_id!r}")
    if state.revoked_seq is not None:
        raise IdentityError(
            f"key {key_id} ({state.name}) is already revoked on dataset {current.dataset_id!r} "
            f"(ledger entry #{state.revoked_seq}){if_revoked}"
        )
    return state


def register_key(
    catalog: Catalog,
    *,
    dataset_id: str,
    public: PublicKey,
    name: str,
    roles: Iterable[str],
    signer: SigningKey,
) -> str:
    """Register ``public`` with ``roles`` on ``dataset_id`` (or change a registered key's roles),
    signed by ``signer``, a custodian of the dataset; the dataset's first key must be its
    custodian, signed by itself.  Returns the ledger receipt id."""
    wanted = check_roles(roles)
    _check_key_name(name)
    catalog.cap(dataset_id)  # refused for a dataset the catalog does not hold
    current = roster(catalog, dataset_id)
    if not current.keys:
        if "custodian" not in wanted or signer.key_id != public.key_id:
            raise IdentityError(
                f"dataset {dataset_id!r} has no registered keys yet: its first key must be its "
                "custodian's (--role custodian), registered and signed by that same key"
            )
    else:
        _check_custodian(current, signer, doing=f"register keys on dataset {dataset_id!r}")
        state = current.keys.get(public.key_id)
        if state is not None and state.revoked_seq is not None:
            raise IdentityError(
                f"key {public.key_id} ({state.name}) was revoked on dataset {dataset_id!r}; a "
                "revoked key is never registered again: create a new key"
            )
        others = [k for k in current.holders("custodian") if k != public.key_id]
        if "custodian" not in wanted and not others:
            raise IdentityError(
                f"key {public.key_id} is the only custodian of dataset {dataset_id!r}: register "
                "another custodian before taking the role away"
            )
    record = _signed_record(
        dataset_id=dataset_id,
        action="register",
        public=public,
        name=name,
        roles=wanted,
        signer=signer,
    )
    return _append_entries(catalog, dataset_id, [record])[0]


def revoke_key(catalog: Catalog, *, dataset_id: str, key_id: str, signer: SigningKey) -> str:
    """Revoke ``key_id`` on ``dataset_id`` (signed by a custodian; a custodian may revoke its own
    key when another custodian remains).  Its earlier signatures still verify; from this entry on
    it holds no role.  Returns the ledger receipt id."""
    current = roster(catalog, dataset_id)
    state = _unrevoked_key(current, key_id)
    _check_custodian(current, signer, doing=f"revoke keys on dataset {dataset_id!r}")
    if [k for k in current.holders("custodian") if k != key_id] == []:
        raise IdentityError(
            f"key {key_id} is the only custodian of dataset {dataset_id!r}: register another "
            "custodian before revoking it"
        )
    record = _signed_record(
        dataset_id=dataset_id,
        action="revoke",
        public=state.public,
        name=state.name,
        roles=(),
        signer=signer,
    )
    return _append_entries(catalog, dataset_id, [record])[0]


def rotate_key(
    catalog: Catalog,
    *,
    dataset_id: str,
    old_key_id: str,
    new_public: PublicKey,
    new_name: str,
    signer: SigningKey,
) -> tuple[str, str]:
    """Replace ``old_key_id`` on ``dataset_id`` by ``new_public``: register the new key with the
    old key's roles and revoke the old key, two entries signed by ``signer`` (a custodian of the
    dataset; the old key itself when it is one) appended in one transaction, so the dataset never
    holds both or neither.  Returns the two ledger receipt ids (registration, revocation)."""
    _check_key_name(new_name)
    current = roster(catalog, dataset_id)
    old = _unrevoked_key(
        current, old_key_id, if_revoked=": register the new key with its roles instead"
    )
    if new_public.key_id in current.keys:
        raise IdentityError(
            f"key {new_public.key_id} is already registered on dataset {dataset_id!r}: a rotation "
            "replaces a key by a new one (create a new key)"
        )
    _check_custodian(current, signer, doing=f"rotate keys on dataset {dataset_id!r}")
    records = [
        _signed_record(
            dataset_id=dataset_id,
            action=action,
            public=public,
            name=name,
            roles=granted,
            signer=signer,
        )
        for action, public, name, granted in (
            ("register", new_public, new_name, old.roles),
            ("revoke", old.public, old.name, ()),
        )
    ]
    registered, revoked = _append_entries(catalog, dataset_id, records)
    return registered, revoked
