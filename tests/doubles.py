"""Test doubles for the services a mechanism is given: an in-memory strategy store and an
accountant that charges nothing (for tests that exercise the noise, not the ledger)."""

from __future__ import annotations

from dprelease.mechanisms.primitives.privacy import PrivacyCost
from dprelease.mechanisms.primitives.protocol import StoredStrategy


class MemoryStore:
    """An in-memory :class:`~mechanisms.primitives.protocol.StrategyCache`."""

    def __init__(self) -> None:
        self.store: dict[str, StoredStrategy] = {}

    def load(self, key: str) -> StoredStrategy | None:
        return self.store.get(key)

    def save(self, key: str, stored: StoredStrategy) -> None:
        self.store[key] = stored


class FreeAccountant:
    """Accepts every charge and holds no receipt (nothing is ever reused)."""

    def charge(self, cost: PrivacyCost, *, label: str) -> str:
        return "receipt"

    def holds(self, receipt_id: str) -> bool:
        return False
