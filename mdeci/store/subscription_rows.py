"""The record of the subscription store: plain data, no SQL (the broker's sans-IO core
reads it without importing the store)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Subscription:
    """One stored subscription; ``sub_id`` is assigned by the store and never reused."""

    sub_id: int
    uri: str
    subject: str
    filter: str
    created_at: float
    expires_at: float
    qclass: str | None = None  # the queue class it asked for, if any
    in_order: bool = False  # its notifications never overtake one held for a network
