"""DSSE v1 envelopes (github.com/secure-systems-lab/dsse, ``envelope.md`` and ``protocol.md``).

An envelope is ``{"payloadType", "payload": base64, "signatures": [{"keyid", "sig": base64}]}``;
each signature is over the pre-authentication encoding

    PAE(type, body) = "DSSEv1" SP LEN(type) SP type SP LEN(body) SP body

(LEN: the byte length in ASCII decimal), so a signature binds the payload type as well as the
bytes.  Envelopes come from files and are untrusted: :meth:`Envelope.from_dict` refuses anything
malformed; :func:`verify_envelope` reports which trusted keys signed, never trusting a keyid alone.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from dprelease.catalog.identity.keys import IdentityError, PublicKey, SigningKey


def pae(payload_type: str, payload: bytes) -> bytes:
    kind = payload_type.encode("utf-8")
    return b"DSSEv1 %d %b %d %b" % (len(kind), kind, len(payload), payload)


def _b64decode(text: Any, field: str) -> bytes:
    """Standard or URL-safe base64 (DSSE verifiers accept both), padding required."""
    if not isinstance(text, str):
        raise IdentityError(f"envelope {field}: {text!r} is not a base64 string")
    try:
        return base64.b64decode(text.translate(str.maketrans("-_", "+/")), validate=True)
    except (binascii.Error, ValueError) as exc:
        raise IdentityError(f"envelope {field}: {text[:40]!r} is not base64 ({exc})") from None


@dataclass(frozen=True)
class Signature:
    keyid: str
    sig: bytes


@dataclass(frozen=True)
class Envelope:
    payload_type: str
    payload: bytes
    signatures: tuple[Signature, ...]

    def as_dict(self) -> dict[str, Any]:
        return {
            "payloadType": self.payload_type,
            "payload": base64.b64encode(self.payload).decode("ascii"),
            "signatures": [
                {"keyid": s.keyid, "sig": base64.b64encode(s.sig).decode("ascii")}
                for s in self.signatures
            ],
        }

    @classmethod
    def from_dict(cls, data: Any) -> Envelope:
        if not isinstance(data, Mapping):
            raise IdentityError(f"envelope: {type(data).__name__} is not a JSON object")
        missing = {"payloadType", "payload", "signatures"} - set(data)
        if missing:
            raise IdentityError(f"envelope: missing field(s) {', '.join(sorted(missing))}")
        payload_type = data["payloadType"]
        if not isinstance(payload_type, str) or not payload_type:
            raise IdentityError(f"envelope payloadType: {payload_type!r} is not a non-empty string")
        entries = data["signatures"]
        if not isinstance(entries, list) or not entries:
            raise IdentityError(f"envelope signatures: {entries!r} is not a non-empty list")
        signatures = []
        for k, entry in enumerate(entries):
            if not isinstance(entry, Mapping) or not isinstance(entry.get("keyid"), str):
                raise IdentityError(f"envelope signatures[{k}]: {entry!r} has no string keyid")
            signatures.append(
                Signature(entry["keyid"], _b64decode(entry.get("sig"), f"signatures[{k}].sig"))
            )
        return cls(payload_type, _b64decode(data["payload"], "payload"), tuple(signatures))


def sign_envelope(
    payload: bytes, *, payload_type: str, keys: SigningKey | Iterable[SigningKey]
) -> Envelope:
    """``payload`` signed by each key (one signature per key).  O(len(payload) · keys)."""
    if not isinstance(payload, bytes):
        raise IdentityError(f"payload: {type(payload).__name__} is not bytes")
    if not isinstance(payload_type, str) or not payload_type:
        raise IdentityError(f"payload_type: {payload_type!r} is not a non-empty string")
    signers = [keys] if isinstance(keys, SigningKey) else list(keys)
    if not signers:
        raise IdentityError("keys: an envelope needs at least one signing key")
    message = pae(payload_type, payload)
    return Envelope(
        payload_type, payload, tuple(Signature(k.key_id, k.sign(message)) for k in signers)
    )


def verify_envelope(
    envelope: Envelope, trusted: Mapping[str, PublicKey], *, payload_type: str | None = None
) -> list[str]:
    """The key ids in ``trusted`` whose signature on ``envelope`` is valid, each once, in the
    envelope's order; signatures by unknown keys or not verifying are left out.  A
    ``payload_type`` other than the expected one is refused.  O(len(payload) · signatures)."""
    for keyid, public in trusted.items():
        if not isinstance(public, PublicKey) or public.key_id != keyid:
            raise IdentityError(
                f"trusted[{keyid!r}]: the key id must be the SHA-256 of its PublicKey"
            )
    if payload_type is not None and envelope.payload_type != payload_type:
        raise IdentityError(
            f"envelope payloadType {envelope.payload_type!r} is not the expected {payload_type!r}"
        )
    message = pae(envelope.payload_type, envelope.payload)
    valid: list[str] = []
    for signature in envelope.signatures:
        public = trusted.get(signature.keyid)
        if (
            public is not None
            and signature.keyid not in valid
            and public.verify(signature.sig, message)
        ):
            valid.append(signature.keyid)
    return valid
