"""The per-catalog secret: keyed input fingerprints and the ledger's anchor outside the database.

Privacy rule: a fingerprint of a confidential file is an HMAC-SHA256 under a secret
of the catalog, never a plain hash; whoever holds a candidate file cannot confirm it against a
published manifest without the key.  The manifest names only the key id (the first 16 hex digits
of the SHA-256 of the key), which reveals nothing about the key.

Where the secret lives: beside an SQLite catalog (``catalog.db`` → ``catalog.key``); for any other
URL (PostgreSQL, ...) in ``$DPRELEASE_HOME`` as ``catalog-<hash of the URL>.key``.  It is created
at first use with mode 0600 and never overwritten; a key file readable by others is refused.
Hosts that share a catalog must share this file (put ``$DPRELEASE_HOME`` on shared storage), or
their fingerprints and anchors differ.

The anchor (``catalog.anchor`` beside the key) records how many ledger entries exist and the hash
of the last one, authenticated with the key (:class:`Anchor`): a catalog database that was
deleted, replaced by an empty or another one, or lost entries at its end no longer matches it.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import hmac
import json
import os
import secrets
import stat
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from dprelease.catalog.errors import CatalogError
from dprelease.catalog.home import default_home

KEY_BYTES = 32
KEY_ID_HEX = 16
ANCHOR_FORMAT = "dprelease-ledger-anchor/1"
_EPHEMERAL: dict[str, bytes] = {}  # in-memory catalogs: one secret per URL for this process


@dataclass(frozen=True, kw_only=True)
class Anchor:
    """The ledger's length and head hash as last written by dprelease (authenticated)."""

    entries: int
    head: str
    written_at: str
    adopted: tuple[dict[str, Any], ...] = ()


@dataclass(frozen=True, kw_only=True)
class CatalogKey:
    """The secret of one catalog (``path`` is None for an in-memory catalog: nothing persists)."""

    key_id: str
    path: Path | None
    secret: bytes = field(repr=False)

    def fingerprint(self, parts: Iterable[bytes]) -> str:
        """HMAC-SHA256 over the concatenated ``parts`` (streamed). O(total bytes)."""
        mac = hmac.new(self.secret, digestmod="sha256")  # OpenSSL HMAC: releases the GIL
        for part in parts:
            mac.update(part)
        return mac.hexdigest()

    @property
    def anchor_path(self) -> Path | None:
        return None if self.path is None else self.path.with_suffix(".anchor")

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        """Exclusive lock (on this host) over ledger writes and anchor updates; released by the
        kernel if the process dies."""
        if self.path is None:
            yield
            return
        fd = os.open(self.path, os.O_RDONLY)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # closing releases the lock

    def read_anchor(self) -> Anchor | None:
        """The anchor, or None when there is none yet; a forged or damaged one raises."""
        path = self.anchor_path
        if path is None or not path.exists():
            return None
        try:
            data = json.loads(path.read_text())
            body = {k: v for k, v in data.items() if k != "mac"}
            valid = (
                data.get("format") == ANCHOR_FORMAT
                and data.get("key_id") == self.key_id
                and hmac.compare_digest(str(data.get("mac")), self.fingerprint([_canonical(body)]))
            )
        except (OSError, UnicodeDecodeError, json.JSONDecodeError, AttributeError) as exc:
            raise CatalogError(f"ledger anchor {path} cannot be read ({exc})") from None
        if not valid:
            raise CatalogError(
                f"ledger anchor {path} does not verify under catalog key {self.key_id} "
                "(it was edited, or written with another key)"
            )
        return Anchor(
            entries=int(data["entries"]),
            head=str(data["head"]),
            written_at=str(data["written_at"]),
            adopted=tuple(data.get("adopted", [])),
        )

    def write_anchor(
        self, *, entries: int, head: str, written_at: str, adopted: Iterable[dict[str, Any]] = ()
    ) -> None:
        """Atomically replace the anchor (temporary file + rename, mode 0600)."""
        path = self.anchor_path
        if path is None:
            return
        body = {
            "format": ANCHOR_FORMAT,
            "key_id": self.key_id,
            "entries": entries,
            "head": head,
            "written_at": written_at,
            "adopted": list(adopted),
        }
        text = json.dumps(
            {**body, "mac": self.fingerprint([_canonical(body)])}, indent=2, sort_keys=True
        )
        _write_private(path, text.encode(), replace=True)


def _canonical(value: Any) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()


def key_path(url: str) -> Path | None:
    """Where the key of the catalog at ``url`` lives (None: an in-memory catalog)."""
    parsed = sa.engine.make_url(url)
    if parsed.get_backend_name() == "sqlite":
        database = parsed.database
        if not database or database == ":memory:" or database.startswith("file::memory:"):
            return None
        return Path(database).resolve().with_suffix(".key")
    safe = parsed.render_as_string(hide_password=True)
    return default_home() / f"catalog-{hashlib.sha256(safe.encode()).hexdigest()[:12]}.key"


def key_present(url: str) -> bool:
    path = key_path(url)
    return path is None or path.exists()


def catalog_key(url: str) -> CatalogKey:
    """The key of the catalog at ``url``, created (mode 0600) at first use; never created where an
    anchor exists (written with a key now missing: a new key would change every fingerprint)."""
    path = key_path(url)
    if path is None:
        secret = _EPHEMERAL.setdefault(url, secrets.token_bytes(KEY_BYTES))
        return CatalogKey(key_id=key_id(secret), path=None, secret=secret)
    if not path.exists():
        anchor = path.with_suffix(".anchor")
        if anchor.exists():
            raise CatalogError(
                f"catalog key {path} is missing but its ledger anchor {anchor} exists; restore "
                "the key file (a new key would change every input fingerprint and cannot check "
                "the anchor)"
            )
        path.parent.mkdir(parents=True, exist_ok=True)
        _write_private(path, secrets.token_bytes(KEY_BYTES).hex().encode() + b"\n", replace=False)
    return _read_key(path)


def key_id(secret: bytes) -> str:
    """Public name of a key: the first 16 hex digits of its SHA-256."""
    return hashlib.sha256(secret).hexdigest()[:KEY_ID_HEX]


def _read_key(path: Path) -> CatalogKey:
    mode = stat.S_IMODE(path.stat().st_mode)
    if mode & 0o077:
        raise CatalogError(
            f"catalog key {path} has mode {mode:04o}; it must be readable by its owner only "
            f"(run: chmod 600 {path})"
        )
    text = path.read_text().strip()
    try:
        secret = bytes.fromhex(text)
    except ValueError:
        secret = b""
    if len(secret) != KEY_BYTES:
        raise CatalogError(
            f"catalog key {path} is damaged: it must hold {KEY_BYTES} bytes as hex; restore it "
            "from a backup"
        )
    return CatalogKey(key_id=key_id(secret), path=path, secret=secret)


def _write_private(path: Path, data: bytes, *, replace: bool) -> None:
    """Write ``data`` to ``path`` with mode 0600 via a temporary file; ``replace=False`` never
    overwrites: of two processes creating the file, the first wins and both keep its content."""
    temporary = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.fchmod(fd, 0o600)
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    try:
        if replace:
            os.replace(temporary, path)
        else:
            with contextlib.suppress(FileExistsError):
                os.link(temporary, path)
    finally:
        temporary.unlink(missing_ok=True)
