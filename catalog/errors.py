"""The project's error hierarchy: every user-facing failure is one of these, with the numbers in it."""

from __future__ import annotations

# Raised by the privacy arithmetic below the catalog; part of this hierarchy (PrivacyError).
from dprelease.mechanisms.primitives.privacy import BudgetExceededError as BudgetExceededError
from dprelease.mechanisms.primitives.privacy import MeasureMismatchError as MeasureMismatchError
from dprelease.mechanisms.primitives.privacy import PrivacyError as PrivacyError


class DprReleaseError(Exception):
    """Base class of errors the CLI reports as a clear message (no traceback)."""


class SpecError(DprReleaseError, ValueError):
    """The release spec is invalid: the message names the field, the value and the rule."""


class DataError(DprReleaseError, ValueError):
    """The input data does not match the spec (missing column, wrong type, nulls, out of domain)."""


class CatalogError(DprReleaseError):
    """The catalog refuses an operation (unknown release, conflicting dataset registration, ...)."""


class VerificationError(DprReleaseError):
    """A release directory does not match its manifest, the ledger or its validation results."""

    def __init__(self, message: str, *, problems: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.problems = problems or (message,)
        """Each mismatch as one line (``dprelease verify --json``)."""


class ValidationFailedError(DprReleaseError):
    """A release's outputs failed validation; the budget stays spent, nothing is staged."""


class SettingError(DprReleaseError, ValueError):
    """An environment setting (``DPRELEASE_MEMORY_LIMIT``, ``DPRELEASE_STAGE_TIMEOUT``) is not
    usable: the message names the variable, its value and the rule."""


class MemoryLimitError(DprReleaseError):
    """A release predicted to need more memory than the limit; refused before any data is read or
    any budget charged.  The message names the stage and the size that drives it."""


class StageTimeLimitExceeded(DprReleaseError):
    """A release stage ran past its time limit, or did not stop after SIGTERM/SIGINT.

    Raised asynchronously by the stage watchdog (the class, without arguments): the message is
    then the one the watchdog logged for the stage."""

    last_message = "a stage ran past its time limit"

    def __init__(self, message: str | None = None) -> None:
        super().__init__(message or StageTimeLimitExceeded.last_message)
