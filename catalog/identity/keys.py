"""Ed25519 signing keys: ``$DPRELEASE_HOME/keys/<name>.key`` (PKCS#8 PEM, mode 0600) and
``<name>.pub`` (JSON: name, key id, base64 raw public key, creation time).

The key id is the hex SHA-256 of the 32 raw public-key bytes: anyone holding the public key can
recompute it, and it is the ``keyid`` of every DSSE signature the key makes.  A private key file
readable or writable by group or others is refused (as ssh does), and a :class:`SigningKey`
never shows its private material (``repr`` and ``str`` name the key id only).
"""

from __future__ import annotations

import base64
import binascii
import datetime as dt
import hashlib
import json
import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from dprelease.catalog.errors import DprReleaseError
from dprelease.catalog.home import default_home

KEYS_FOLDER = "keys"
PUBLIC_FORMAT = "dprelease-public-key/1"
RAW_KEY_BYTES = 32
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


class IdentityError(DprReleaseError):
    """A key, envelope or attestation is refused: the message names the field, value and rule."""


@dataclass(frozen=True)
class PublicKey:
    """An Ed25519 public key (the 32 raw bytes)."""

    raw: bytes

    def __post_init__(self) -> None:
        if not isinstance(self.raw, bytes) or len(self.raw) != RAW_KEY_BYTES:
            raise IdentityError(
                f"public key: {self.raw!r} is not {RAW_KEY_BYTES} raw Ed25519 bytes"
            )

    @property
    def key_id(self) -> str:
        return hashlib.sha256(self.raw).hexdigest()

    @property
    def base64(self) -> str:
        return base64.b64encode(self.raw).decode("ascii")

    @classmethod
    def from_base64(cls, text: str) -> PublicKey:
        try:
            return cls(base64.b64decode(text, validate=True))
        except (binascii.Error, TypeError, ValueError) as exc:
            raise IdentityError(f"public key: {text!r} is not base64 ({exc})") from None

    def verify(self, signature: bytes, data: bytes) -> bool:
        """Is ``signature`` this key's Ed25519 signature of ``data``?  O(len(data))."""
        try:
            Ed25519PublicKey.from_public_bytes(self.raw).verify(signature, data)
        except InvalidSignature:
            return False
        return True


class SigningKey:
    """An Ed25519 private key; only :meth:`sign` and :meth:`write` use the private material."""

    __slots__ = ("_private", "public")

    def __init__(self, private: Ed25519PrivateKey) -> None:
        self._private = private
        raw = private.public_key().public_bytes(
            serialization.Encoding.Raw, serialization.PublicFormat.Raw
        )
        self.public = PublicKey(raw)

    @classmethod
    def generate(cls) -> SigningKey:
        return cls(Ed25519PrivateKey.generate())

    @property
    def key_id(self) -> str:
        return self.public.key_id

    def __repr__(self) -> str:
        return f"SigningKey(key_id={self.key_id!r})"

    __str__ = __repr__

    def sign(self, data: bytes) -> bytes:
        return self._private.sign(data)

    def write(self, path: Path) -> None:
        """PKCS#8 PEM, created with mode 0600; an existing file is never overwritten."""
        pem = self._private.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
        try:
            descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            raise IdentityError(f"key file {path} exists; keys are never overwritten") from None
        with os.fdopen(descriptor, "wb") as handle:
            os.fchmod(handle.fileno(), 0o600)  # whatever the umask
            handle.write(pem)

    @classmethod
    def load(cls, path: Path) -> SigningKey:
        """Refused unless ``path`` is a regular file that group and others cannot access."""
        try:
            descriptor = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
        except FileNotFoundError:
            raise IdentityError(f"private key {path} does not exist") from None
        except OSError as exc:  # ELOOP: a symbolic link
            raise IdentityError(f"private key {path} cannot be opened ({exc})") from None
        mode = os.fstat(descriptor).st_mode  # of the file opened, not of a path that may change
        if not stat.S_ISREG(mode):
            os.close(descriptor)
            raise IdentityError(f"private key {path} is not a regular file")
        with os.fdopen(descriptor, "rb") as handle:
            if mode & 0o077:
                raise IdentityError(
                    f"private key {path} has mode {stat.S_IMODE(mode):04o}: a private key must "
                    f"not be accessible by group or others (mode 0600; run chmod 600 {path})"
                )
            pem = handle.read()
        try:
            private = serialization.load_pem_private_key(pem, password=None)
        except (ValueError, TypeError) as exc:
            raise IdentityError(
                f"private key {path} is not an unencrypted PEM key ({exc})"
            ) from None
        if not isinstance(private, Ed25519PrivateKey):
            raise IdentityError(
                f"private key {path} is a {type(private).__name__}; dprelease keys are Ed25519"
            )
        return cls(private)


@dataclass(frozen=True, kw_only=True)
class KeyInfo:
    """A key pair in the key folder, as its public file describes it."""

    name: str
    public: PublicKey
    created: str
    public_path: Path

    @property
    def key_id(self) -> str:
        return self.public.key_id


def keys_folder(*, home: Path | None = None) -> Path:
    return (default_home() if home is None else home) / KEYS_FOLDER


def _check_name(name: str) -> str:
    if not isinstance(name, str) or not NAME.fullmatch(name):
        raise IdentityError(
            f"key name {name!r} must be 1-64 letters, digits, '.', '_' or '-', starting with a "
            "letter or digit"
        )
    return name


def create_key(name: str, *, home: Path | None = None) -> tuple[SigningKey, KeyInfo]:
    """A new pair ``<name>.key`` (0600) and ``<name>.pub``; refused when either exists."""
    folder = keys_folder(home=home)
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    private_path = folder / f"{_check_name(name)}.key"
    public_path = folder / f"{name}.pub"
    if public_path.exists() or private_path.exists():
        raise IdentityError(f"key {name!r} exists in {folder}; keys are never overwritten")
    key = SigningKey.generate()
    key.write(private_path)
    created = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
    document = {
        "format": PUBLIC_FORMAT,
        "name": name,
        "keyid": key.key_id,
        "scheme": "ed25519",
        "public": key.public.base64,
        "created": created,
    }
    try:
        public_path.write_text(json.dumps(document, indent=2, sort_keys=True) + "\n")
    except OSError:
        private_path.unlink(missing_ok=True)  # never a private key without its public half
        raise
    return key, KeyInfo(name=name, public=key.public, created=created, public_path=public_path)


def load_signing_key(name: str, *, home: Path | None = None) -> SigningKey:
    return SigningKey.load(keys_folder(home=home) / f"{_check_name(name)}.key")


def read_public_key(path: Path) -> KeyInfo:
    """A ``.pub`` file, checked: its key id must be the SHA-256 of its public key."""
    try:
        document = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise IdentityError(f"public key file {path} cannot be read as JSON ({exc})") from None
    if not isinstance(document, dict) or document.get("format") != PUBLIC_FORMAT:
        raise IdentityError(f"public key file {path}: format must be {PUBLIC_FORMAT!r}")
    public = PublicKey.from_base64(document.get("public"))
    if document.get("keyid") != public.key_id:
        raise IdentityError(
            f"public key file {path}: keyid {document.get('keyid')!r} is not the SHA-256 of its "
            f"public key ({public.key_id})"
        )
    return KeyInfo(
        name=str(document.get("name", path.stem)),
        public=public,
        created=str(document.get("created", "")),
        public_path=path,
    )


def list_keys(*, home: Path | None = None) -> list[KeyInfo]:
    """Every ``.pub`` in the key folder, by name.  O(keys)."""
    folder = keys_folder(home=home)
    return (
        [read_public_key(path) for path in sorted(folder.glob("*.pub"))] if folder.is_dir() else []
    )


def show_key(name: str, *, home: Path | None = None) -> KeyInfo:
    path = keys_folder(home=home) / f"{_check_name(name)}.pub"
    if not path.is_file():
        raise IdentityError(f"key {name!r}: no public key file {path}")
    return read_public_key(path)
