"""What a peer is told when the store failed its request: a stable code and reason and a
public text, never the database's own words (docs/security.md, the error boundary)."""

from __future__ import annotations

from dataclasses import dataclass

from mdeci.errors import StorageFull, StoreError

STORAGE_UNAVAILABLE = 503  # the database is unreachable or failed: retry later
STORAGE_FULL = 507  # the database has no space for the write: retry later


@dataclass(frozen=True)
class Refusal:
    """What a peer is told about a store failure: ``code`` (an ``error`` frame's and a SIP
    answer's status), ``reason`` (a stable token) and the public ``text``."""

    code: int
    reason: str
    text: str

    @property
    def message(self) -> str:
        """The ``error`` frame's message: ``<reason>: <text>``."""
        return f"{self.reason}: {self.text}"


def refusal(exc: StoreError) -> Refusal:
    """The answer to a peer whose request failed with ``exc``."""
    if isinstance(exc, StorageFull):
        return Refusal(STORAGE_FULL, "storage-full", exc.public)
    return Refusal(STORAGE_UNAVAILABLE, "storage-unavailable", exc.public)
