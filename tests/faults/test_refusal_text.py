"""What a peer is told about a database failure: the cause, never the driver's text."""

from __future__ import annotations

import re

import pytest

from mdeci.errors import MdeciError, StorageFull, StoreError, StoreUnavailable

# What a store error's message carries and a peer must not see.
DRIVER_TEXT = (
    "publish failed: OperationalError: (sqlite3.OperationalError) database or disk is full "
    "[SQL: INSERT INTO published_messages (publisher_uri, msg_id) VALUES (?, ?)] "
    "[parameters: ('sip:bob@localhost', '1424f03e')]"
)
INTERNAL = re.compile(r"OperationalError|sqlite|psycopg|\bSQL\b|INSERT|parameters|sip:")


@pytest.mark.parametrize(
    ("error", "cause"),
    [
        (StoreError(DRIVER_TEXT), "storage unavailable"),
        (StoreUnavailable(DRIVER_TEXT), "storage unavailable"),
        (StorageFull(DRIVER_TEXT), "storage full"),
    ],
)
def test_public_text_names_the_cause_without_the_drivers_text(
    error: StoreError, cause: str
) -> None:
    assert cause in error.public
    assert not INTERNAL.search(error.public)
    assert str(error) == DRIVER_TEXT  # the details stay in the message, for the log


def test_every_store_failure_is_caught_as_a_store_error() -> None:
    for kind in (StoreUnavailable, StorageFull):
        with pytest.raises(StoreError):
            raise kind(DRIVER_TEXT)
        assert issubclass(kind, MdeciError)
